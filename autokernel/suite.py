"""The starter benchmark: every starter through the harness on a GPU, against every baseline, in one run.

`python bench.py --suite` runs each kernels/<type>.py through the five stages and timing (eager and
torch.compile), then the extra baselines (F.rms_norm, Liger-Kernel, rotary on q and k, the device's
copy bandwidth) in one more child, and writes benchmarks/starters.json (raw numbers with their provenance, read
by profile.py for expected speedups); then benchmarks/render.py makes BENCHMARKS.md from the data again.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from autokernel import registry
from autokernel.harness import runner
from autokernel.kerneltype import SuiteTarget
from autokernel.registry import kernel_types

ROOT = Path(__file__).resolve().parent.parent
JSON_PATH = ROOT / "benchmarks" / "starters.json"
RENDER = ROOT / "benchmarks" / "render.py"  # BENCHMARKS.md from benchmarks/starters.json and benchmarks/tables/
MEMORY_BOUND_PCT_OF_COPY = 92.0

# the target of a type whose registry entry names none (suite_target): a memory-bound kernel's
MEMORY_TARGET = SuiteTarget(f">= {MEMORY_BOUND_PCT_OF_COPY:.0f}% of copy, faster than compile",
                            lambda r, b: min(100 * r["bandwidth_gb_s"] / b["copy_gb_s"] / MEMORY_BOUND_PCT_OF_COPY,
                                             r["speedup_vs_compile"] or 0))


def target(type_: str) -> SuiteTarget:
    """The type's suite target from its registry entry (MEMORY_TARGET where it names none)."""
    try:
        return registry.get_spec(type_).suite_target or MEMORY_TARGET
    except KeyError:
        return MEMORY_TARGET


def run_suite(types: list[str] | None, command: str) -> int:
    """Bench the starters of `types` (all by default); rows of other types from an earlier run stay."""
    types = types or kernel_types()
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    runs = []
    for ktype in types:
        for dtype in target(ktype).dtypes:
            print(f"[suite] {ktype} {dtype} ...", flush=True)
            result = runner.run_bench(ROOT / "kernels" / f"{ktype}.py", device="cuda", dtype=dtype)
            result.pop("log", None)
            result.update(kernel_type=ktype, dtype=dtype, date=date, command=command)
            print(f"[suite] {ktype} {dtype}: {result['status']} {result.get('latency_us') or result['reason']}")
            runs.append(result)
    base = {**_baselines(types), "python": platform.python_version()}
    stamp = _provenance(base, date, command)
    for r in runs:
        r["copy_gb_s"] = base["copy_gb_s"]
        goal = target(r["kernel_type"])
        r.update(stamp, target=goal.label, met=r["status"] == "pass" and goal.ratio(r, r) >= 1.0)
        print(f"[suite] {r['kernel_type']} {r['dtype']}: target {goal.label}: {'met' if r['met'] else 'MISSED'}")
    for found in base.get("extra_timings", {}).values():
        found.update(stamp, gpu=base["gpu"])
        found.setdefault("dtype", "fp16")
    data = _merge(_previous(), base, runs)
    JSON_PATH.parent.mkdir(exist_ok=True)
    JSON_PATH.write_text(json.dumps(data, indent=1, default=str))
    subprocess.run([sys.executable, str(RENDER)], cwd=ROOT, check=True)  # BENCHMARKS.md from all the data
    return 0 if all(r["status"] == "pass" for r in runs) else 1


def _provenance(base: dict, date: str, command: str) -> dict:
    """What every row of this run carries besides its figures (benchmarks/render.py prints it under the table):
    the versions, the driver, and the commit (git's HEAD, "-dirty" with uncommitted changes; in a copy of the tree
    without .git, $AUTOKERNEL_COMMIT)."""
    def out(*cmd):
        try:
            return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    commit = out("git", "rev-parse", "--short", "HEAD")
    if commit and out("git", "status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    commit = commit or os.environ.get("AUTOKERNEL_COMMIT", "")
    if not commit:
        print("[suite] warning: no git here and no $AUTOKERNEL_COMMIT: the rows' commit reads 'unknown', which "
              "tests/test_benchmarks_doc.py refuses; set it in benchmarks/starters.json", file=sys.stderr)
    driver = out("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").splitlines()
    return {"torch": base["torch"], "triton": base["triton"], "driver": driver[0] if driver else None,
            "commit": commit or "unknown", "date": date, "command": command}


def _previous() -> dict:
    return json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else {}


def _merge(old: dict, base: dict, runs: list[dict]) -> dict:
    fresh = {(r["kernel_type"], r["dtype"]) for r in runs}
    kept = [r for r in old.get("runs", []) if (r.get("kernel_type"), r.get("dtype")) not in fresh
            and r.get("copy_gb_s") and r.get("date")]
    data = {**base, "runs": kept + runs,
            "extras": {**old.get("extras", {}), **base.get("extras", {})},
            "extra_timings": {**old.get("extra_timings", {}), **base.get("extra_timings", {})}}
    # per type, the fp16 figures profile.py reads as the expected speedup s of its plan
    for r in data["runs"]:
        if r["status"] == "pass" and r["dtype"] == "fp16":
            data[r["kernel_type"]] = {k: r[k] for k in ("speedup_vs_pytorch", "speedup_vs_compile", "latency_us")}
    return data


def _baselines(types) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "baselines.json"
        cmd = [sys.executable, "-m", "autokernel.harness.baselines", "--out", str(out), "--types", ",".join(types)]
        proc = subprocess.run(cmd, cwd=ROOT, env=runner.child_env("cuda"), capture_output=True, text=True,
                              timeout=1200)
        if proc.returncode != 0:
            raise RuntimeError(f"baselines failed:\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())
