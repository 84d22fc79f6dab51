"""bench.py: the fixed harness. Checks one kernel file in five stages, times it, logs one row.

    python bench.py                      # kernel.py, on the GPU if there is one
    python bench.py kernels/softmax.py --device cpu --quick

Stages: smoke, shape sweep (fp16/bf16/fp32), numerical stability, determinism, edge cases. Then
timing against PyTorch eager and torch.compile with the roofline. The kernel runs in a child process
with a time limit. The report ends with greppable `key: value` lines after `---`, and one row is
appended to results.tsv.

Exit status: 0 for a correct kernel, 1 for an incorrect one (a crash or a timeout included), 2 when
nothing was benched (bad arguments, a missing kernel file, an unknown dtype or kernel type, --device cuda
without a GPU): then no row is written.
"""

import argparse
import json
import sys
from pathlib import Path

from autokernel import cli, kernelfile, results

SUMMARY_KEYS = ["correctness", "status", "kernel_type", "failed_stage", "model_us", "model_vs_pytorch",
                "model_vs_compile", "host_us", "latency_us", "throughput_tflops",
                "bandwidth_gb_s", "pct_peak", "speedup_vs_pytorch", "speedup_vs_compile", "eager_us",
                "compile_us", "noise_pct", "peak_vram_mb", "eager_peak_vram_mb", "shape", "dtype", "device", "gpu",
                "wall_s"]


def build_parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="bench.py",
        description="Check a kernel file in five correctness stages, time it against PyTorch, log the result.",
        epilog="Exit code 0 for a correct kernel, 1 for an incorrect one, 2 for bad input. Without a GPU it runs "
               "through Triton's CPU interpreter on small shapes: those timings are not performance figures.")
    p.add_argument("kernel", nargs="?", default="kernel.py", help="kernel file (default: kernel.py)")
    p.add_argument("--quick", action="store_true", help="fewer shapes per stage (all five stages still run)")
    cli.add_device_argument(p)
    p.add_argument("--dtype", default="fp16", help=f"dtype of the timing run: {cli.DTYPE_HELP} (default fp16)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds before the run counts as a hang (default 300 on a GPU, 600 on the CPU)")
    p.add_argument("--seed", type=int, default=None, help="input seed (default: fresh each run)")
    p.add_argument("--reuse-baselines", action="store_true",
                   help="take torch.compile's time from an earlier run on this GPU and shape (saves seconds)")
    p.add_argument("--json", metavar="PATH", help="also write the full result as JSON")
    p.add_argument("--results", default="results.tsv", help="the experiment log (default results.tsv)")
    p.add_argument("--tag", default="", help="tag recorded in the results row")
    p.add_argument("--no-log", action="store_true", help="do not append a row to results.tsv")
    p.add_argument("--suite", action="store_true",
                   help="benchmark every starter in kernels/ against eager, torch.compile and Liger on the GPU, "
                        "and write BENCHMARKS.md and benchmarks/starters.json")
    p.add_argument("--types", default="", help="with --suite: comma-separated kernel types (default: all)")
    cli.add_debug_argument(p)
    return p


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def summary_lines(result: dict) -> list[str]:
    lines = []
    for key in SUMMARY_KEYS:
        value = result.get(key)
        if key == "correctness" and value == "FAIL":
            value = f"FAIL ({result.get('failed_stage') or result['status']}: {first_line(result.get('reason'))})"
        if isinstance(value, float):
            value = f"{value:.4g}"
        lines.append(f"{key}: {'' if value is None else value}")
    return lines


def first_line(text) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def results_row(result: dict, tag: str) -> dict:
    return {
        "tag": tag, "kernel_type": result.get("kernel_type", ""), "kernel_file": result.get("kernel_file", ""),
        "status": result["status"], **results.metrics(result), "agent": "manual",
        "description": first_line(result.get("reason")) or "bench.py",
    }


def run_suite(args) -> int:
    from autokernel import registry, suite
    from autokernel.harness import gpu

    if not gpu.has_cuda():
        raise cli.UsageError("--suite measures performance and needs a CUDA GPU")
    types = cli.kernel_types(args.types, registry.kernel_types())
    command = "python bench.py --suite" + (f" --types {args.types}" if args.types else "")
    return suite.run_suite(types, command)


def check_kernel_file(path: Path) -> None:
    """KernelFileError for a missing file or one that declares no KERNEL_TYPE: no experiment, no row. A file
    that does not parse is one, the kernel's own error: the harness reports it as a crash."""
    source = kernelfile.read_source(path)
    try:
        kernelfile.declarations(source, path.name)
    except kernelfile.KernelFileError:
        return
    kernelfile.kernel_type(source, path.name)


def main(argv=None) -> int:
    args = parse_args(argv)
    known = ("KernelFileError", "ValueError", "RuntimeError")  # e.g. --device cuda without a GPU
    return cli.run_main("bench.py", lambda: run(args), args.debug, known=known)


def run(args) -> int:
    cli.check_limits(args, positive=("timeout",))
    if args.suite:
        return run_suite(args)
    if args.types:
        raise cli.UsageError("--types chooses the kernel types of --suite; a kernel file declares its own")
    cli.dtype_name(args.dtype)  # an unknown dtype is no experiment: no row
    cli.check_output_files(json=args.json, results=None if args.no_log else args.results)
    path = Path(args.kernel)
    check_kernel_file(path)
    from autokernel.harness import runner  # torch: after the checks that need none

    result = runner.run_bench(path, device=args.device, quick=args.quick, timeout=args.timeout,
                              dtype=args.dtype, seed=args.seed, echo=True,
                              reuse_baselines=args.reuse_baselines)
    if result["status"] == "invalid":  # not a kernel the harness can bench (an unknown type): no experiment
        raise cli.UsageError(first_line(result["reason"]))
    if result["status"] in ("crash", "timeout"):
        print(f"{result['status'].upper()}: {result['reason']}")
    print("---")
    print("\n".join(summary_lines(result)))
    if result.get("cpu_mode"):
        print("note: CPU mode (Triton interpreter): timings are not performance figures")
    if not args.no_log:
        row = results.append_row(results_row(result, args.tag), args.results)
        print(f"logged: experiment {row['experiment']} in {args.results}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0 if result["correctness"] == "PASS" else cli.EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
