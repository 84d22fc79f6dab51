"""results.tsv: the append-only experiment log.

One row per experiment, tab-separated, header once. A row is written whole or not at all: it is
formatted first, then written with a single write() under an exclusive lock, so that concurrent
writers (several loops, a bench.py beside a loop) never interleave, and a kill leaves no half row.
The file is untracked by git, so `git reset --hard` in the loop never touches it.
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
    "speedup_vs_compile", "peak_vram_mb", "device", "worker", "agent", "description",
]

# the columns a harness result (autokernel.runner.run_bench) fills in by itself
METRIC_COLUMNS = ("correctness", "latency_us", "throughput_tflops", "bandwidth_gb_s", "pct_peak",
                  "speedup_vs_pytorch", "speedup_vs_compile", "peak_vram_mb")

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


def format_row(row: dict) -> str:
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown results.tsv columns: {sorted(unknown)}")
    if row.get("status") not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {row.get('status')!r}")
    return "\t".join(_clean(row.get(col)) for col in COLUMNS) + "\n"


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
                row["experiment"] = max(0, len(existing.splitlines()) - 1) + 1
            text = format_row(row)
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


def read_rows(path: str | Path = DEFAULT_PATH) -> list[dict]:
    """All well-formed rows as dicts of strings (malformed lines are skipped)."""
    path = Path(path)
    if not path.is_file():
        return []
    reader = csv.DictReader(io.StringIO(path.read_text(encoding="utf-8")), delimiter="\t",
                            quoting=csv.QUOTE_NONE)
    return [r for r in reader if None not in r and all(r.get(c) is not None for c in COLUMNS)]
