"""A starter against eager, torch.compile and the type's extra baselines (Liger, ...) at every shape of its registry
entry, on the GPU: the per-shape table bench.py (one timing shape) does not give.

    python scripts/shape_table.py add_rmsnorm [add_layernorm ...] [--dtype fp16] [--rounds 3] [--json OUT]
    python scripts/shape_table.py rope_attention --against 88c3c29~1   # another version of the kernel, in the rounds

Times through autokernel.harness.timing (the L2 flushed) on the inputs autokernel.harness.perf times; the
kernel's output is checked against the oracle at each shape first. Every function is timed in --rounds
interleaved rounds and the median round is reported: a single round can land on a slow stretch of the host,
which one round per row would report as a speedup or a loss (docs/timing.md). Prints one row per shape:
microseconds, GB/s and TFLOP/s of the kernel and its speedup over compile, the faster of torch.compile's default and
max-autotune-no-cudagraphs modes, both timed (and over --against: a kernel file, or a git revision whose
kernels/<type>.py is timed in the same rounds).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autokernel.harness import baselines, checking, gpu  # noqa: E402
from autokernel.harness.perf import compiled_reference, gpu_input_sets  # noqa: E402
from autokernel.kernelfile import import_kernel  # noqa: E402
from autokernel.kerneltype import parse_dtype, shape_label  # noqa: E402
from autokernel.registry import get_spec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def table(kernel_type: str, dtype: torch.dtype, liger, rounds: int, against: str | None = None) -> list[dict]:
    spec = get_spec(kernel_type)
    kernel = import_kernel(ROOT / "kernels" / f"{kernel_type}.py").kernel_fn
    fns = {"kernel": kernel, "eager": spec.reference, "compile": compiled_reference(spec),
           "compile default": compiled_reference(spec, "default"),  # "vs compile": the faster, as the harness
           **(spec.extra_baselines(liger) if spec.extra_baselines else {}),
           **({"against": _other_version(kernel_type, against)} if against else {})}
    rows = []
    for shape in spec.shapes:
        sets = gpu_input_sets(spec, shape, dtype)
        checking.checked_call(kernel, spec, sets[0], f"{kernel_type} {checking.describe(shape, dtype)}")
        row = {"type": kernel_type, "shape": shape_label(shape), "bytes": spec.bytes_moved(shape, dtype),
               "flops": spec.flops(shape)}
        times = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                times[name].append(baselines._median_or_error(fn, sets))
        row.update({name: _median_round(t) for name, t in times.items()})
        rows.append(row)
        print(_line(row, list(fns)), flush=True)
    return rows


def _other_version(kernel_type: str, against: str):
    """kernel_fn of another version of the type's kernel: the file `against`, or kernels/<type>.py at the git
    revision `against` (written to a file of its own: Triton reads a kernel's source from its file)."""
    path = Path(against)
    if not path.is_file():
        shown = subprocess.run(["git", "show", f"{against}:kernels/{kernel_type}.py"], cwd=ROOT, capture_output=True,
                               text=True)
        if shown.returncode:
            raise SystemExit(f"--against {against}: neither a file nor a revision with kernels/{kernel_type}.py")
        path = Path(tempfile.mkdtemp()) / f"{kernel_type}.py"
        path.write_text(shown.stdout)
    return import_kernel(path).kernel_fn


def _median_round(times: list):
    """The median of a function's rounds, or its first error (a function that fails, fails every round)."""
    errors = [t for t in times if isinstance(t, str)]
    return errors[0] if errors else round(statistics.median(times), 2)


def _line(row: dict, names: list[str]) -> str:
    us = {n: row[n] for n in names}
    cells = "  ".join(f"{n} {v:8.1f} us" if isinstance(v, float) else f"{n} {v}" for n, v in us.items())
    kernel, compiled = us["kernel"], min((t for t in (us["compile"], us["compile default"]) if isinstance(t, float)),
                                         default=None)
    if isinstance(kernel, float) and compiled is not None:
        cells += (f"  | {row['bytes'] / kernel / 1e3:6.0f} GB/s {row['flops'] / kernel / 1e6:6.1f} TFLOP/s"
                  f"  vs compile {compiled / kernel:.2f}x")
    if isinstance(kernel, float) and isinstance(us.get("against"), float):
        cells += f"  vs against {us['against'] / kernel:.2f}x"
    return f"{row['type']:<14} {row['shape']:<16} {cells}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("types", nargs="+")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per shape (default 3)")
    p.add_argument("--json", help="also write the rows as JSON")
    p.add_argument("--against", metavar="FILE|REV", help="also time another version of the kernel in the same rounds: "
                   "a kernel file, or a git revision whose kernels/<type>.py is taken")
    args = p.parse_args(argv)
    if not gpu.has_cuda():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    liger = baselines.liger_functional()
    print(f"{gpu.device_name()}, torch {torch.__version__}, {args.dtype}, liger: {'yes' if liger else 'absent'}")
    rows = [row for t in args.types for row in table(t, parse_dtype(args.dtype), liger, args.rounds, args.against)]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
