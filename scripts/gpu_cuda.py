"""GPU check of the CUDA C++ backend: build and run every kernels/cuda starter through the harness.

    python3 scripts/gpu_cuda.py                     # all nine, full stages and timing, fp16
    python3 scripts/gpu_cuda.py --types rmsnorm,matmul --quick --json /tmp/cuda.json

First it prints each kernel's registers, spills and shared memory from ptxas, and runs every row kernel
(softmax, rmsnorm, layernorm, reduce, cross_entropy) straight against reference.py over row lengths from
1 to 262144 in fp16 and fp32 (the launchers pick a register-cached kernel or the streaming one by row
length: every choice is exercised). Then it times one build cold (an empty cache) and then cached (a
fresh process importing the cached library), and runs `run_bench(kernel, device="cuda")` on each starter
in its own child process, printing per type: status, failed stage, reason (the compiler's message for a
build failure), latency, speedups and % of peak. Exit status 0 only when every starter passes and the
row sweep has no failure; the full harness log of a failing starter is printed so that it can be fixed
from this output alone.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TYPES = ["rmsnorm", "layernorm", "softmax", "reduce", "cross_entropy", "rotary_embedding", "matmul", "fused_mlp",
         "flash_attention"]
BUILD_TIMEOUT_S = 600  # s for one cold build in a child process
LOAD_SNIPPET = ("import importlib.util, sys, time; t = time.time(); "
                "s = importlib.util.spec_from_file_location('k', sys.argv[1]); m = importlib.util.module_from_spec(s); "
                "s.loader.exec_module(m); m._module(); print(f'{time.time() - t:.2f}')")


ROW_TYPES = ["softmax", "rmsnorm", "layernorm", "reduce", "cross_entropy"]
ROW_LENGTHS = [1, 8, 100, 1023, 1024, 4096, 8191, 8192, 16384, 32000, 32768, 50257, 65536, 131072, 262144]
ROW_COUNT = 37  # rows per sweep case: odd, so no size is a lucky multiple
TOLERANCE = {"fp16": 2e-2, "fp32": 1e-4}  # rtol = atol of the sweep's comparison with reference.py


def _load(type_: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_cuda_{type_}", ROOT / "kernels" / "cuda" / f"{type_}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row_inputs(type_: str, n: int, dtype):
    import torch

    x = torch.randn(ROW_COUNT, n, device="cuda", dtype=dtype) * 3
    w, b = torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype)
    return {"softmax": (x,), "reduce": (x,), "rmsnorm": (x, w), "layernorm": (x, w, b),
            "cross_entropy": (x, torch.randint(0, n, (ROW_COUNT,), device="cuda"))}[type_]


def row_sweep(types: list[str]) -> list[str]:
    """Each row kernel against reference.py at every ROW_LENGTHS; returns the failures (printed as they come)."""
    import torch

    import reference

    failures = []
    for type_ in [t for t in ROW_TYPES if t in types]:
        fn, ref = _load(type_).kernel_fn, getattr(reference, f"{type_}_ref")
        for dname, dtype in (("fp16", torch.float16), ("fp32", torch.float32)):
            for n in ROW_LENGTHS:
                inputs = _row_inputs(type_, n, dtype)
                try:
                    got, want = fn(*inputs), ref(*inputs)
                    torch.cuda.synchronize()
                    tol = TOLERANCE[dname]
                    atol = tol * 3 * n ** 0.5 if type_ == "reduce" else tol  # a sum of n values ~3: error ~ sqrt(n)
                    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=atol)
                except Exception as e:  # a launch failure or a mismatch: report it and go on
                    failures.append(f"{type_} {dname} N={n}")
                    print(f"row sweep {type_:<14} {dname} N={n:<7} FAIL {type(e).__name__}: {str(e)[:300]}")
        print(f"row sweep {type_:<14} done ({len(ROW_LENGTHS)} lengths x fp16/fp32)")
    return failures


def print_resources(types: list[str]) -> None:
    """ptxas's registers / spills / shared memory per kernel, for the GPU's architecture."""
    from autokernel import cuda_build

    arch = cuda_build.detect_arch()
    for type_ in types:
        try:
            usage = cuda_build.resource_usage(type_, _load(type_).cuda_source(), arch)
        except cuda_build.CudaBuildError as e:
            print(f"resources {type_}: {e}")
            continue
        for name, use in usage.items():
            print(f"resources {type_:<17} regs={use['registers']:<3} spill={use['spill_bytes']:<4} "
                  f"smem={use['smem_bytes']:<6} {name[:110]}")


def time_build(kernel: Path, cache: str) -> float:
    """Seconds for a fresh process to import the kernel and build (or load) its module with this cache."""
    env = {**os.environ, "AUTOKERNEL_CUDA_CACHE": cache, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", LOAD_SNIPPET, str(kernel)], capture_output=True, text=True,
                          env=env, timeout=BUILD_TIMEOUT_S, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"building {kernel.name} failed:\n{proc.stderr[-4000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def report_build_times(type_: str) -> dict:
    kernel = ROOT / "kernels" / "cuda" / f"{type_}.py"
    with tempfile.TemporaryDirectory(prefix="autokernel-cuda-cache-") as cache:
        try:
            cold = time_build(kernel, cache)
            cached = time_build(kernel, cache)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"build timing of {type_}: FAILED\n{e}")
            return {"type": type_, "error": str(e)}
    print(f"build timing of {type_}: cold {cold:.1f} s, cached {cached:.2f} s (fresh process, import included)")
    return {"type": type_, "cold_s": cold, "cached_s": cached}


def run_one(type_: str, quick: bool, dtype: str) -> dict:
    from autokernel.runner import run_bench

    result = run_bench(ROOT / "kernels" / "cuda" / f"{type_}.py", device="cuda", quick=quick, dtype=dtype)
    fmt = (lambda v: f"{v:.4g}" if isinstance(v, (int, float)) else "-")
    print(f"{type_:<17} {result['status']:<8} stage={result.get('failed_stage') or '-':<12} "
          f"latency_us={fmt(result.get('latency_us'))} vs_eager={fmt(result.get('speedup_vs_pytorch'))} "
          f"vs_compile={fmt(result.get('speedup_vs_compile'))} pct_peak={fmt(result.get('pct_peak'))} "
          f"bandwidth_gb_s={fmt(result.get('bandwidth_gb_s'))} tflops={fmt(result.get('throughput_tflops'))} "
          f"wall_s={result.get('wall_s')}")
    if result["status"] != "pass":
        print(f"  reason: {result.get('reason')}")
        print("  ---- harness log ----\n" + result.get("log", "") + "  ---- stderr tail ----\n"
              + result.get("stderr_tail", ""))
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--types", default=",".join(TYPES), help="comma-separated kernel types (default: all nine)")
    p.add_argument("--quick", action="store_true", help="3 shapes per stage instead of all")
    p.add_argument("--dtype", default="fp16", help="dtype of the timing run (default fp16)")
    p.add_argument("--build-timing", default="rmsnorm", help="type whose cold/cached build is timed ('' = none)")
    p.add_argument("--json", type=Path, help="write every result here")
    p.add_argument("--no-row-sweep", action="store_true", help="skip the direct row-length sweep of the row kernels")
    p.add_argument("--no-resources", action="store_true", help="skip printing ptxas's per-kernel resource usage")
    args = p.parse_args(argv)
    types = [t for t in args.types.split(",") if t]
    unknown = [t for t in types if t not in TYPES]
    if unknown:
        p.error(f"unknown types {unknown}; choose from {', '.join(TYPES)}")
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU here; this script checks the CUDA backend on a GPU machine", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()} (cc {torch.cuda.get_device_capability()}), torch "
          f"{torch.__version__}, CUDA {torch.version.cuda}")
    if not args.no_resources:
        print_resources(types)
    sweep_failures = [] if args.no_row_sweep else row_sweep(types)
    builds = report_build_times(args.build_timing) if args.build_timing else {}
    start = time.time()
    results = {t: run_one(t, args.quick, args.dtype) for t in types}
    failed = [t for t, r in results.items() if r["status"] != "pass"]
    if sweep_failures:
        print(f"--- row sweep: {len(sweep_failures)} failures: {', '.join(sweep_failures)}")
    print(f"--- {len(types) - len(failed)}/{len(types)} CUDA starters pass ({time.time() - start:.0f} s)"
          + (f"; failing: {', '.join(failed)}" if failed else ""))
    if args.json:
        slim = {t: {k: v for k, v in r.items() if k not in ("log",)} for t, r in results.items()}
        args.json.write_text(json.dumps({"build": builds, "results": slim}, indent=1, default=str))
    return 1 if failed or sweep_failures or "error" in builds else 0


if __name__ == "__main__":
    sys.exit(main())
