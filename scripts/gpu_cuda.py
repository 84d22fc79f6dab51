"""GPU check of the CUDA C++ backend: build and run every kernels/cuda starter through the harness.

    python3 scripts/gpu_cuda.py                     # every type in TYPES, full stages and timing, fp16 (minutes)
    python3 scripts/gpu_cuda.py --types reduce,matmul --quick --json /tmp/cuda.json
    python3 scripts/gpu_cuda.py --types matmul --variant matmul:STAGES=4,BLOCK_K=64 --no-row-sweep

In order: the yardsticks (device copy bandwidth, cuBLAS at 4096^3 fp16); every build at once, in parallel (the
starters and their tunable variants, into the shared cache, so the harness children later import them), with
ptxas's registers / spills / shared memory per kernel; the row kernels (softmax, rmsnorm, layernorm, reduce,
cross_entropy) straight against reference.py over row lengths 1 to 262144 in fp16 and fp32, reduce also over
4099 rows for its one-row-per-warp kernels (every register-cache size and the streaming kernels are
exercised); each starter and its variants timed directly at the bench shape (kernel_fn with CUDA events, no
harness: a quick A/B of tunables, also compile-time ones); then `run_bench(kernel, device="cuda")` per starter
in its own child with a per-kernel time limit, flash_attention last; last a summary against the yardsticks (%
of copy bandwidth for the memory-bound kernels, fraction of cuBLAS for the GEMMs) and what falls short. Exit
status 0 only when every starter passes, no variant fails its quick check and the row sweep has no failure;
the full harness log of a failing starter is printed so it can be fixed from this output.
"""

import argparse
import concurrent.futures as futures
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autokernel.kernelfile import import_kernel  # noqa: E402

TYPES = ["rmsnorm", "layernorm", "softmax", "reduce", "cross_entropy", "rotary_embedding", "matmul", "fused_mlp",
         "flash_attention"]  # flash_attention last: the slowest, it must not starve the others of time
MEMORY_BOUND = {"rmsnorm", "layernorm", "softmax", "reduce", "cross_entropy", "rotary_embedding"}
GEMMS = {"matmul", "fused_mlp"}
COPY_TARGET = 0.85  # the target for memory-bound kernels: this fraction of device copy bandwidth
CUBLAS_TARGET = 0.5  # ... and for the GEMMs: this fraction of cuBLAS's rate
VARIANT_MARGIN = 0.03  # a variant this much faster than its starter (direct timing) is reported as better
# Tunable variants timed next to each starter (compile-time ones are their own builds, made in parallel).
VARIANTS = {
    "rmsnorm": [{"PACKS_PER_THREAD": 4}],
    "layernorm": [{"ONE_REDUCTION": 1}, {"PACKS_PER_THREAD": 8}],
    "softmax": [{"PACKS_PER_THREAD": 4}],
    "reduce": [{"STREAM_LOADS": 0}, {"WARP_BLOCK_THREADS": 128}, {"WARP_ROWS_FROM": 1_000_000_000}],
    "cross_entropy": [{"ONE_REDUCTION": 0}, {"PACKS_PER_THREAD": 16}],
    "rotary_embedding": [{"PLANES": 1}, {"THREADS": 64}, {"PLANES": 1, "THREADS": 64}],
    "matmul": [{"BLOCK_K": 32}, {"GROUP_M": 4}],
    "fused_mlp": [{"STAGES": 3}, {"GROUP_M": 4}],
}
BENCH_TIMEOUT_S = 90  # s per starter in the harness (flash_attention: FLASH_TIMEOUT_S)
FLASH_TIMEOUT_S = 150  # s
BUILD_TIMEOUT_S = 600  # s for one build in a child process
LOAD_SNIPPET = ("import importlib.util, sys, time; t = time.time(); "
                "s = importlib.util.spec_from_file_location('k', sys.argv[1]); m = importlib.util.module_from_spec(s); "
                "s.loader.exec_module(m); m._module(); print(f'{time.time() - t:.2f}')")

ROW_TYPES = ["softmax", "rmsnorm", "layernorm", "reduce", "cross_entropy"]
ROW_LENGTHS = [1, 8, 100, 1023, 1024, 4096, 8191, 8192, 16384, 32000, 32768, 50257, 65536, 131072, 262144]
ROW_COUNT = 37  # rows per sweep case: odd, so no size is a lucky multiple
MANY_ROWS = 4099  # reduce's rows for its one-row-per-warp kernels (WARP_ROWS_FROM = 4096 or more): odd again
MANY_ROWS_MAX_N = 16384  # longest row of those cases (4099 x 16384 fp32 = 269 MB)


def _load(type_: str):
    return import_kernel(ROOT / "kernels" / "cuda" / f"{type_}.py")


def _label(type_: str, config: dict) -> str:
    return type_ + ("[" + ",".join(f"{k}={v}" for k, v in config.items()) + "]" if config else "")


def write_variants(types: list[str], variants: dict, directory: Path) -> dict[str, list[tuple[dict, Path]]]:
    """Per type: (config, kernel file) for the starter itself ({}) and each variant, written under directory."""
    from autokernel.loop.agents.builtin import apply_config, tunable_space

    files = {}
    for type_ in types:
        path = ROOT / "kernels" / "cuda" / f"{type_}.py"
        files[type_] = [({}, path)]
        space, _ = tunable_space(path.read_text())
        for i, config in enumerate(variants.get(type_, [])):
            unknown = sorted(set(config) - set(space))
            if unknown:
                raise ValueError(f"{type_} has no tunables {unknown} (its TUNABLES: {sorted(space)})")
            variant = directory / f"{type_}_v{i}.py"
            variant.write_text(apply_config(path.read_text(), config))
            files[type_].append((config, variant))
    return files


def build_all(files: dict) -> dict[Path, str]:
    """Every kernel file built, one process each, as many at once as there are cores (into the shared cache,
    where the harness children find them); returns the failures' compiler output by path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def build(path: Path):
        try:
            proc = subprocess.run([sys.executable, "-c", LOAD_SNIPPET, str(path)], cwd=ROOT, env=env, text=True,
                                  capture_output=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, f"build timed out after {BUILD_TIMEOUT_S} s"
        return (proc.stdout, None) if proc.returncode == 0 else (None, proc.stderr[-4000:])

    jobs = [(_label(t, c), path) for t, pairs in files.items() for c, path in pairs]
    failed = {}
    with futures.ThreadPoolExecutor(max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        for (label, path), (out, err) in zip(jobs, pool.map(build, [path for _, path in jobs])):
            if err is None:
                print(f"build {label:<48} {float(out.strip().splitlines()[-1]):6.1f} s (in parallel, import included)")
            else:
                failed[path] = err
                print(f"build {label:<48} FAILED\n{err}")
    return failed


def resources(types: list[str]) -> list[str]:
    """ptxas's registers / spills / shared memory per kernel, one line each (nvcc runs in parallel)."""
    from autokernel.cuda import cuda_build

    arch = cuda_build.detect_arch()

    def one(type_):
        try:
            usage = cuda_build.resource_usage(type_, _load(type_).cuda_source(), arch)
        except cuda_build.CudaBuildError as e:
            return [f"resources {type_}: {e}"]
        return [f"resources {type_:<17} regs={u['registers']:<3} spill={u['spill_bytes']:<4} smem={u['smem_bytes']:<6} "
                f"{name[:110]}" for name, u in usage.items()]

    with futures.ThreadPoolExecutor(len(types)) as pool:
        return [line for lines in pool.map(one, types) for line in lines]


def _row_inputs(type_: str, n: int, dtype, rows: int = ROW_COUNT):
    """The registry's inputs of the type for `rows` rows of length n (cross_entropy: rows tokens, n classes)."""
    import torch

    from autokernel.registry import get_spec

    shape = {"N": rows, "V": n} if type_ == "cross_entropy" else {"M": rows, "N": n}
    return get_spec(type_).make_inputs(shape, dtype, "cuda", torch.Generator(device="cuda").manual_seed(n))


def _row_cases(type_: str):
    """(rows, n) of the sweep: reduce also with enough rows for its one-row-per-warp kernels (shorter rows)."""
    cases = [(ROW_COUNT, n) for n in ROW_LENGTHS]
    if type_ == "reduce":
        cases += [(MANY_ROWS, n) for n in ROW_LENGTHS if n <= MANY_ROWS_MAX_N]
    return cases


def row_sweep(types: list[str]) -> list[str]:
    """Each row kernel against the registry's float64 oracle and tolerances (the harness's check,
    autokernel/harness/checking.py) at every ROW_LENGTHS; returns the failures (printed as they come)."""
    import torch

    from autokernel.harness import checking
    from autokernel.registry import get_spec

    failures = []
    for type_ in [t for t in ROW_TYPES if t in types]:
        fn, spec = _load(type_).kernel_fn, get_spec(type_)
        for dname, dtype in (("fp16", torch.float16), ("fp32", torch.float32)):
            for rows, n in _row_cases(type_):
                inputs = _row_inputs(type_, n, dtype, rows)
                try:
                    out = fn(*inputs)
                    torch.cuda.synchronize()
                    checking.verify_output(out, spec, inputs, f"{type_} {dname} {rows}x{n}")
                except Exception as e:  # a launch failure or a mismatch: report it and go on
                    failures.append(f"{type_} {dname} {rows}x{n}")
                    print(f"row sweep {type_:<14} {dname} {rows}x{n:<7} FAIL {type(e).__name__}: {str(e)[:300]}")
        print(f"row sweep {type_:<14} done ({len(_row_cases(type_))} shapes x fp16/fp32)")
    return failures


def yardsticks() -> dict:
    """Device copy bandwidth (GB/s, read + write: the figure the harness's roofline uses) and cuBLAS fp16 at 4096^3
    (TFLOP/s), both by the harness's timing protocol."""
    import torch

    from autokernel.harness import gpu, timing

    copy_gb_s = gpu.measure_ceilings().bandwidth_gb_s
    a = torch.randn(4096, 4096, dtype=torch.float16, device="cuda")
    b = torch.randn(4096, 4096, dtype=torch.float16, device="cuda")
    cublas_tflops = 2 * 4096**3 / (timing.time_gpu(torch.matmul, [(a, b)]).median_us * 1e-6) / 1e12
    print(f"yardsticks: device copy {copy_gb_s:.0f} GB/s, cuBLAS fp16 4096^3 {cublas_tflops:.0f} TFLOP/s")
    return {"copy_gb_s": copy_gb_s, "cublas_tflops": cublas_tflops}


def time_variants(files: dict, failed_builds: dict) -> dict[str, dict]:
    """Each starter and variant checked once at the bench shape (fp16) by the harness's check, then timed (CUDA
    events): label -> {us, gb_s, tflops, max_err (relative to max |ref|)} or {error} (a wrong output included)."""
    import torch

    from autokernel.harness import checking, timing
    from autokernel.harness.perf import gpu_input_sets
    from autokernel.registry import get_spec

    rows = {}
    for type_, pairs in files.items():
        if type_ == "flash_attention":
            continue  # ~9 ms a call: the harness row is enough
        spec = get_spec(type_)
        shape = spec.bench_shape
        inputs = gpu_input_sets(spec, shape, torch.float16)
        want = spec.reference(*inputs[0]).float()
        for config, path in pairs:
            label = _label(type_, config)
            if path in failed_builds:
                rows[label] = {"error": "build failed"}
                continue
            try:
                fn = import_kernel(path).kernel_fn
                out = fn(*inputs[0])
                checking.verify_output(out, spec, inputs[0], f"{label} {checking.describe(shape, torch.float16)}")
                err = ((out.float() - want).abs().max() / want.abs().max().clamp_min(1e-6)).item()
                us = timing.time_fn(fn, inputs, "cuda").median_us
            except Exception as e:  # a launch failure or a wrong output: report it and go on
                rows[label] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"variant {label:<48} FAIL {rows[label]['error']}")
                continue
            rows[label] = {"us": us, "gb_s": spec.bytes_moved(shape, torch.float16) / us / 1e3,
                           "tflops": spec.flops(shape) / us / 1e6, "max_err": err}
            r = rows[label]
            print(f"variant {label:<48} {us:9.1f} us {r['gb_s']:7.0f} GB/s {r['tflops']:7.1f} TFLOP/s "
                  f"max_err/max|ref| {err:.1e}")
    return rows


def run_one(type_: str, quick: bool, dtype: str) -> dict:
    from autokernel.harness.runner import run_bench

    timeout = FLASH_TIMEOUT_S if type_ == "flash_attention" else BENCH_TIMEOUT_S
    result = run_bench(ROOT / "kernels" / "cuda" / f"{type_}.py", device="cuda", quick=quick, dtype=dtype,
                       timeout=timeout, reuse_baselines=True)
    fmt = (lambda v: f"{v:.4g}" if isinstance(v, (int, float)) else "-")
    print(f"{type_:<17} {result['status']:<8} stage={result.get('failed_stage') or '-':<12} "
          f"latency_us={fmt(result.get('latency_us'))} vs_eager={fmt(result.get('speedup_vs_pytorch'))} "
          f"vs_compile={fmt(result.get('speedup_vs_compile'))} pct_peak={fmt(result.get('pct_peak'))} "
          f"bandwidth_gb_s={fmt(result.get('bandwidth_gb_s'))} tflops={fmt(result.get('throughput_tflops'))} "
          f"wall_s={result.get('wall_s')}", flush=True)
    if result["status"] != "pass":
        print(f"  reason: {result.get('reason')}")
        print("  ---- harness log ----\n" + result.get("log", "") + "  ---- stderr tail ----\n"
              + result.get("stderr_tail", ""))
    return result


def summary(results: dict, refs: dict, timed: dict) -> list[str]:
    """One line per starter against the yardsticks, the variants that beat their starter, what misses a target."""
    lines, short = ["--- summary (fp16, bench shapes; harness numbers)"], []
    for type_, r in results.items():
        if r["status"] != "pass":
            lines.append(f"  {type_:<17} {r['status']} at {r.get('failed_stage')}: {str(r.get('reason'))[:150]}")
            short.append(f"{type_} does not pass")
            continue
        line = f"  {type_:<17} pass {r['latency_us']:9.1f} us"
        if type_ in MEMORY_BOUND and r.get("bandwidth_gb_s"):
            frac = r["bandwidth_gb_s"] / refs["copy_gb_s"]
            line += f" {r['bandwidth_gb_s']:6.0f} GB/s = {100 * frac:3.0f}% of copy"
            if frac < COPY_TARGET:
                short.append(f"{type_} at {100 * frac:.0f}% of copy (target {100 * COPY_TARGET:.0f}%)")
        elif type_ in GEMMS and r.get("throughput_tflops"):
            frac = r["throughput_tflops"] / refs["cublas_tflops"]
            line += f" {r['throughput_tflops']:6.1f} TFLOP/s = {frac:.2f}x cuBLAS"
            if frac < CUBLAS_TARGET:
                short.append(f"{type_} at {frac:.2f}x cuBLAS (target {CUBLAS_TARGET}x)")
        lines.append(line + f"  vs eager {_times(r.get('speedup_vs_pytorch'))}, "
                            f"vs compile {_times(r.get('speedup_vs_compile'))}")
    lines += faster_variants(timed)
    lines.append("--- next round: " + ("; ".join(short) if short else "every starter passes and meets its target"))
    return lines


def _times(v) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) else "-"


def faster_variants(timed: dict) -> list[str]:
    """A line per type whose best tunable variant beat the starter by more than VARIANT_MARGIN (direct timing)."""
    lines = []
    for type_ in TYPES:
        base = timed.get(type_, {}).get("us")
        rows = [(r["us"], label) for label, r in timed.items() if label.startswith(type_ + "[") and "us" in r]
        if base and rows and min(rows)[0] < base * (1 - VARIANT_MARGIN):
            us, label = min(rows)
            lines.append(f"  faster variant: {label} {us:.1f} us vs the starter's {base:.1f} us "
                         f"({100 * (1 - us / base):.0f}% less): worth making the default")
    return lines


def parse_variants(specs: list[str]) -> dict:
    """--variant TYPE:NAME=VALUE[,NAME=VALUE] (repeatable) -> {type: [config, ...]}; values are ints."""
    chosen = {}
    for spec in specs:
        type_, _, body = spec.partition(":")
        if type_ not in TYPES or not body:
            raise ValueError(f"--variant {spec!r}: expected TYPE:NAME=VALUE[,NAME=VALUE] with TYPE among {TYPES}")
        try:
            config = {k.strip(): int(v) for k, v in (item.split("=", 1) for item in body.split(","))}
        except ValueError:
            raise ValueError(f"--variant {spec!r}: each setting is NAME=INTEGER") from None
        chosen.setdefault(type_, []).append(config)
    return chosen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--types", default=",".join(TYPES), help="comma-separated kernel types (default: TYPES)")
    p.add_argument("--quick", action="store_true", help="3 shapes per harness stage instead of all")
    p.add_argument("--dtype", default="fp16", help="dtype of the harness timing run (default fp16)")
    p.add_argument("--variant", action="append", default=[], metavar="TYPE:NAME=VALUE[,NAME=VALUE]",
                   help="a tunable variant to time next to its starter (repeatable; replaces that type's defaults)")
    p.add_argument("--no-variants", action="store_true", help="time the starters only")
    p.add_argument("--json", type=Path, help="write every result here")
    p.add_argument("--no-row-sweep", action="store_true", help="skip the direct row-length sweep of the row kernels")
    p.add_argument("--no-resources", action="store_true", help="skip printing ptxas's per-kernel resource usage")
    args = p.parse_args(argv)
    types = [t for t in TYPES if t in args.types.split(",")]  # flash_attention last whatever the order given
    unknown = [t for t in args.types.split(",") if t and t not in TYPES]
    if unknown or not types:
        p.error(f"unknown or no types {unknown}; choose from {', '.join(TYPES)}")
    try:
        variants = {} if args.no_variants else {**VARIANTS, **parse_variants(args.variant)}
    except ValueError as e:
        p.error(str(e))
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU here; this script checks the CUDA backend on a GPU machine", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()} (cc {torch.cuda.get_device_capability()}), torch "
          f"{torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    start = time.time()
    refs = yardsticks()
    with tempfile.TemporaryDirectory(prefix="autokernel-variants-") as tmp:
        try:
            files = write_variants(types, variants, Path(tmp))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        with futures.ThreadPoolExecutor(1) as pool:  # nvcc for ptxas's numbers while the builds run
            usage = pool.submit(lambda: [] if args.no_resources else resources(types))
            failed_builds = build_all(files)
            print("\n".join(usage.result()), flush=True)
        print(f"--- builds done ({time.time() - start:.0f} s)", flush=True)
        sweep_failures = [] if args.no_row_sweep else row_sweep(types)
        timed = time_variants(files, failed_builds)
    variant_failures = [label for label, r in timed.items() if "error" in r]
    results = {t: run_one(t, args.quick, args.dtype) for t in types}
    failed = [t for t, r in results.items() if r["status"] != "pass"]
    print("\n".join(summary(results, refs, timed)))
    if sweep_failures:
        print(f"--- row sweep: {len(sweep_failures)} failures: {', '.join(sweep_failures)}")
    if variant_failures:
        print(f"--- variants that failed to build or run: {', '.join(variant_failures)}")
    print(f"--- {len(types) - len(failed)}/{len(types)} CUDA starters pass ({time.time() - start:.0f} s in all)"
          + (f"; failing: {', '.join(failed)}" if failed else ""))
    if args.json:
        slim = {t: {k: v for k, v in r.items() if k not in ("log",)} for t, r in results.items()}
        args.json.write_text(json.dumps({"yardsticks": refs, "variants": timed, "results": slim}, indent=1,
                                        default=str))
    return 1 if failed or sweep_failures or variant_failures else 0


if __name__ == "__main__":
    sys.exit(main())
