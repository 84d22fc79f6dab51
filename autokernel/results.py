"""results.tsv: the append-only experiment log.

One row per experiment, tab-separated, header once. A row is written whole or not at all: it is
formatted first, then written with a single write() under an exclusive lock, so that concurrent
writers (several loops, a bench.py beside a loop) never interleave, and a kill leaves no half row.
The file is untracked by git, so `git reset --hard` in the loop never touches it.

model_us is the kernel's time in the model (sum over the model's shapes of calls per forward x GPU
time per call, autokernel/harness/modeltime.py), the loop's objective when the kernel carries MODEL_SHAPES;
model_vs_pytorch and model_vs_compile compare it with eager's and torch.compile's at the same shapes;
host_us is the host's cost to launch one call. A file begun before a column existed keeps its header:
new rows are written in its columns, and reading fills the missing ones with "".
"""

from __future__ import annotations

import csv
import fcntl
import io
import os
from datetime import datetime, timezone
from pathlib import Path

COLUMNS = [
    "experiment", "timestamp", "tag", "kernel_type", "kernel_file", "commit", "status", "correctness",
    "latency_us", "throughput_tflops", "bandwidth_gb_s", "pct_peak", "speedup_vs_pytorch",
    "speedup_vs_compile", "model_us", "model_vs_pytorch", "model_vs_compile", "host_us", "peak_vram_mb",
    "device", "worker", "agent", "description",
]
MODEL_COLUMNS = ("model_us", "model_vs_pytorch", "model_vs_compile", "host_us")  # added with issue 16

# the columns a harness result (autokernel.harness.runner.run_bench) fills in by itself
METRIC_COLUMNS = ("correctness", "latency_us", "throughput_tflops", "bandwidth_gb_s", "pct_peak",
                  "speedup_vs_pytorch", "speedup_vs_compile", *MODEL_COLUMNS, "peak_vram_mb")

STATUSES = ("baseline", "keep", "revert", "crash", "timeout", "pass", "fail")

DEFAULT_PATH = Path("results.tsv")


def metrics(result: dict) -> dict:
    """The row fields a harness result provides: its measurements, correctness and device."""
    return {**{k: result.get(k) for k in METRIC_COLUMNS}, "device": result.get("gpu", "")}


def _clean(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    # a tab or newline inside a field would break the row apart
    return " ".join(str(value).split())


def objective_us(row: dict) -> float | None:
    """What the loop minimizes, from a row or a harness result: the time in the model when measured,
    else the primary shape's latency."""
    for key in ("model_us", "latency_us"):
        try:
            return float(row[key])
        except (KeyError, TypeError, ValueError):
            continue
    return None


def format_row(row: dict, columns: list[str] = COLUMNS) -> str:
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown results.tsv columns: {sorted(unknown)}")
    if row.get("status") not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {row.get('status')!r}")
    return "\t".join(_clean(row.get(col)) for col in columns) + "\n"


def append_row(row: dict, path: str | Path = DEFAULT_PATH) -> dict:
    """Append one row; fills experiment (next number) and timestamp when absent. Returns the row."""
    path = Path(path)
    row = dict(row)
    row.setdefault("timestamp", datetime.now(timezone.utc).isoformat(timespec="seconds"))
    with open(path, "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.seek(0)
            existing = f.read()
            if not row.get("experiment"):
                row["experiment"] = _highest_experiment(existing) + 1
            header = existing.split("\n", 1)[0].split("\t") if existing else COLUMNS
            text = format_row(row, header if set(header) <= set(COLUMNS) else COLUMNS)
            if not existing:
                text = "\t".join(COLUMNS) + "\n" + text
            elif not existing.endswith("\n"):
                text = "\n" + text  # a torn last line from an older writer stays its own line
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    return row


def _highest_experiment(text: str) -> int:
    """The highest experiment number in a log's text (0 for none): numbers go on from any writer's rows."""
    lines = text.splitlines()
    column = lines[0].split("\t").index("experiment") if lines and "experiment" in lines[0].split("\t") else 0
    numbers = [fields[column] for fields in (line.split("\t") for line in lines[1:]) if len(fields) > column]
    return max((int(n) for n in numbers if n.isdigit()), default=0)


def next_experiment(path: str | Path = DEFAULT_PATH) -> int:
    """The number the next experiment gets: one past the highest in the log, whoever wrote it (the loop,
    bench.py by hand, another tag), so that the column never restarts at 1."""
    path = Path(path)
    return _highest_experiment(path.read_text(encoding="utf-8")) + 1 if path.is_file() else 1


def read_rows(path: str | Path = DEFAULT_PATH) -> list[dict]:
    """All well-formed rows as dicts of strings (malformed lines are skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    reader = csv.DictReader(io.StringIO(path.read_text(encoding="utf-8")), delimiter="\t",
                            quoting=csv.QUOTE_NONE)
    old = [c for c in MODEL_COLUMNS if c not in (reader.fieldnames or [])]  # a file begun before them
    return [{**r, **dict.fromkeys(old, "")} for r in reader
            if None not in r and all(r.get(c) is not None for c in COLUMNS if c not in old)]
