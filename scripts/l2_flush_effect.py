"""How much of a memory-bound kernel's time is the write-back of an L2 that the flush left dirty (GPU only).

    python3 scripts/l2_flush_effect.py [--types reduce,rmsnorm] [--json out.json]

The timing protocol flushes the L2 before each run by writing a 256 MB buffer (autokernel/harness/timing.py), so
each timed call starts with an L2 full of dirty lines that its own traffic evicts and writes back: about
one L2 (50-60 MB on Hopper) of extra DRAM writes inside the timed window. A kernel that writes its output
leaves as many dirty lines behind, unpaid, so the two roughly cancel; a kernel that only reads (reduce,
cross_entropy) pays the write-back and gets nothing back. This times each starter, eager and torch.compile
at the bench shape, fp16, with both flushes, against the device's copy bandwidth: the difference is what
the protocol charges that the kernel's own bytes do not.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autokernel.harness import gpu, timing  # noqa: E402
from autokernel.harness.perf import compiled_reference, gpu_input_sets  # noqa: E402
from autokernel.kernelfile import import_kernel  # noqa: E402
from autokernel.registry import get_spec  # noqa: E402

TYPES = ["reduce", "cross_entropy", "rmsnorm", "layernorm", "softmax", "rotary_embedding"]


def time_type(ktype: str) -> dict:
    spec = get_spec(ktype)
    shape = spec.bench_shape
    sets = gpu_input_sets(spec, shape, torch.float16)
    fns = {"kernel": import_kernel(ROOT / "kernels" / f"{ktype}.py").kernel_fn, "eager": spec.reference,
           "compile": compiled_reference(spec)}
    nbytes = spec.bytes_moved(shape, torch.float16)
    row = {"bytes": nbytes}
    for name, fn in fns.items():
        for dirty in (True, False):
            us = timing.time_gpu(fn, sets, dirty_flush=dirty).median_us
            row[f"{name} {'dirty' if dirty else 'clean'} us"] = round(us, 2)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--types", default=",".join(TYPES), help="comma-separated memory-bound kernel types")
    p.add_argument("--json", type=Path, help="write the numbers here too")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("l2_flush_effect.py needs a CUDA GPU", file=sys.stderr)
        return 2
    copy = gpu.measure_ceilings().bandwidth_gb_s
    print(f"{gpu.device_name()}, torch {torch.__version__}; device copy {copy} GB/s (read + write); fp16")
    print(f"{'type':18} {'who':8} {'dirty us':>9} {'clean us':>9} {'% copy dirty':>13} {'% copy clean':>13}")
    rows = {}
    for ktype in args.types.split(","):
        rows[ktype] = row = time_type(ktype)
        for who in ("kernel", "eager", "compile"):
            d, c = row[f"{who} dirty us"], row[f"{who} clean us"]
            pct = [100 * row["bytes"] / (us * 1e-6) / 1e9 / copy for us in (d, c)]
            print(f"{ktype:18} {who:8} {d:9.1f} {c:9.1f} {pct[0]:12.1f}% {pct[1]:12.1f}%")
    if args.json:
        args.json.write_text(json.dumps({"copy_gb_s": copy, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
