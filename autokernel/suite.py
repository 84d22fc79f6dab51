"""The starter benchmark: every starter through the harness on a GPU, against every baseline, in one run.

`python bench.py --suite` runs each kernels/<type>.py through the five stages and timing (eager and
torch.compile), then the extra baselines (F.rms_norm, Liger-Kernel, rotary on q and k, the device's
copy bandwidth) in one more child, and writes benchmarks/starters.json (raw numbers, read by
profile.py for expected speedups) and the starter section of BENCHMARKS.md.
"""

from __future__ import annotations

import json
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
MD_PATH = ROOT / "BENCHMARKS.md"
BEGIN, END = "<!-- starters:begin -->", "<!-- starters:end -->"
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
    for r in runs:
        r["copy_gb_s"] = base["copy_gb_s"]
    data = _merge(_previous(), base, runs)
    JSON_PATH.parent.mkdir(exist_ok=True)
    JSON_PATH.write_text(json.dumps(data, indent=1, default=str))
    _write_markdown(data)
    print(MD_PATH.read_text().split(BEGIN)[1].split(END)[0])
    return 0 if all(r["status"] == "pass" for r in runs) else 1


def _previous() -> dict:
    return json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else {}


def _merge(old: dict, base: dict, runs: list[dict]) -> dict:
    fresh = {(r["kernel_type"], r["dtype"]) for r in runs}
    kept = [r for r in old.get("runs", []) if (r.get("kernel_type"), r.get("dtype")) not in fresh
            and r.get("copy_gb_s") and r.get("date")]
    data = {**base, "runs": kept + runs,
            "extras": {**old.get("extras", {}), **base.get("extras", {})},
            "rope_qk": base.get("rope_qk") or old.get("rope_qk")}
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


def _fmt(value, spec=".1f"):
    return format(value, spec) if isinstance(value, (int, float)) else ("-" if value is None else str(value))


def _table(data) -> list[str]:
    extras = data.get("extras", {})
    lines = ["| type | shape | dtype | kernel us | eager us | compile us | other us | GB/s | % of copy | "
             "TFLOP/s | vs eager | vs compile | target | met |",
             "|" + "---|" * 14]
    for r in data["runs"]:
        t = r.get("kernel_type") or Path(r["kernel_file"]).stem
        if r["status"] != "pass":
            lines.append(f"| {t} | | {r.get('dtype', '')} | {r['status'].upper()}: {r['reason'][:80]} |" + " |" * 10)
            continue
        goal = target(t)
        met = goal.ratio(r, r) >= 1.0
        other = ", ".join(f"{k} {_fmt(v)}" for k, v in extras.get(t, {}).items())
        lines.append(
            f"| {t} | {r['shape']} | {r['dtype']} | {_fmt(r['latency_us'])} | {_fmt(r['eager_us'])} | "
            f"{_fmt(r['compile_us'])} | {other or '-'} | {_fmt(r['bandwidth_gb_s'], '.0f')} | "
            f"{_fmt(100 * r['bandwidth_gb_s'] / r['copy_gb_s'])} | {_fmt(r['throughput_tflops'])} | "
            f"{_fmt(r['speedup_vs_pytorch'], '.2f')}x | {_fmt(r['speedup_vs_compile'], '.2f')}x | {goal.label} | "
            f"{'yes' if met else 'NO'} |")
    return lines


def _rope_line(data) -> list[str]:
    rope = data.get("rope_qk")
    if not rope:
        return []
    times = ", ".join(f"{k} {_fmt(rope[k])} us" for k in ("kernel", "eager", "compile", "liger") if k in rope)
    gbs = rope["bytes"] / (rope["kernel"] * 1e-6) / 1e9 if isinstance(rope.get("kernel"), float) else None
    return ["", f"Rotary on q {rope['shapes'][0]} and k {rope['shapes'][1]} together (fp16): {times}; "
                f"kernel {_fmt(gbs, '.0f')} GB/s."]


def _write_markdown(data):
    runs = sorted({(r["date"], r["command"], r["copy_gb_s"]) for r in data["runs"]})
    header = [
        BEGIN, "## Starter kernels", "",
        f"- GPU: {data['gpu']}; torch {data['torch']}, triton {data['triton']}, "
        f"Liger-Kernel {data.get('liger') or 'not installed'}, Python {data['python']}",
        *(f"- Run {date}: `{command}`; device-to-device copy measured {copy} GB/s (read + write)"
          for date, command, copy in runs),
        f"- bf16 matmul measured {data['matmul_bf16_tflops']} TFLOP/s (cuBLAS, 8192^3) in the latest run",
        "- Each kernel passed the five correctness stages in the same run before it was timed. Times are "
        "medians over CUDA events with L2 flushed and inputs rotated (autokernel/harness/timing.py); compile is "
        "torch.compile(mode='max-autotune-no-cudagraphs') of reference.py; eager is reference.py itself "
        "(for matmul: cuBLAS, for flash_attention: F.scaled_dot_product_attention). % of copy is against "
        "the copy bandwidth measured in the row's own run.", "",
    ]
    section = "\n".join(header + _table(data) + _rope_line(data) + ["", END])
    text = MD_PATH.read_text() if MD_PATH.exists() else "# Benchmarks\n\n"
    if BEGIN in text:
        text = text.split(BEGIN)[0] + section + text.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    MD_PATH.write_text(text)
