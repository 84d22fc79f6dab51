"""Developer tool (GPU): how much of a small kernel's time is the host launching it.

    python scripts/launch_overhead.py [--json FILE] [--types matmul,fused_mlp] [--set "DESCRIPTORS='device'"]

For each function: host microseconds per call (enqueue only, no sync), the harness's timing (events,
L2 flushed), and pure device time from a CUDA graph replay: the protocols of autokernel/harness/modeltime.py,
which the harness uses for a kernel's time at the model's shapes. A kernel whose host time exceeds its device
time is launch-bound: in a model's forward it starves the GPU unless the model runs under a graph.
Each starter is measured three ways at a model's shapes: `kernel` (kernel_fn as the harness calls it,
launched by Triton's JITFunction.run), `fast` (kernel_fn as optimize() plugs it in: its launches
replayed per input signature, autokernel/ops/replay.py) and `op` (what the model's swapped site calls: the op
wrapper's checks and error naming around the fast kernel_fn). Issue 17's target: `op` <= 10 us.
--set NAME=VALUE (a Python literal) sets a module constant in each starter that declares it, before it is timed.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autokernel.cli import settings  # noqa: E402
from autokernel.harness import modeltime, timing  # noqa: E402
from autokernel.kernelfile import import_kernel  # noqa: E402
from autokernel.registry import get_spec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def host_us(fn, args) -> float:
    return timing.host_cost_us(fn, args, "cuda")


def graph_us(fn, args) -> float:
    return modeltime.graph_time(fn, [args])[0].median_us


def report(name, fn, args, rows: dict):
    try:
        row = (host_us(fn, args), timing.time_gpu(fn, [args], reps=100).median_us, graph_us(fn, args))
        print(f"{name:<52} host {row[0]:8.1f} us   harness {row[1]:8.1f} us   graph {row[2]:8.1f} us")
        rows[name] = {"host_us": row[0], "harness_us": row[1], "graph_us": row[2]}
    except Exception as e:
        print(f"{name:<52} failed: {type(e).__name__}: {str(e)[:100]}")
        rows[name] = {"error": f"{type(e).__name__}: {e}"}


CASES = [("rmsnorm", {"M": 2048, "N": 2048}), ("rotary_embedding", {"B": 1, "H": 32, "S": 2048, "D": 64}),
         ("matmul", {"M": 2048, "N": 2048, "K": 2048}), ("fused_mlp", {"T": 2048, "H": 2048, "I": 5632}),
         ("flash_attention", {"B": 1, "H": 32, "S": 2048, "D": 64, "causal": True}),
         ("linear_cross_entropy", {"N": 2048, "H": 2048, "V": 32000}),
         ("rmsnorm", {"M": 2048, "N": 768}), ("rmsnorm", {"M": 8192, "N": 8192})]  # TinyLlama's shapes first


def main():
    import argparse
    import json

    from autokernel.ops import customops

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="also write the rows as JSON")
    p.add_argument("--types", help="comma-separated kernel types to measure (default: every case)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                   help="module constants for the starters that declare them (Python literals)")
    args_ = p.parse_args()
    overrides = {name: value for text in args_.set for name, value in settings(text).items()}
    types = set(args_.types.split(",")) if args_.types else None
    rows = {}
    x = torch.randn(2048, 768, device="cuda", dtype=torch.float16)
    report("torch.empty_like", torch.empty_like, (x,), rows)
    report("torch.add", torch.add, (x, x), rows)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for ktype, shape in CASES:
        if types is not None and ktype not in types:
            continue
        spec = get_spec(ktype)
        args = spec.make_inputs(shape, torch.float16, "cuda", gen)
        module = import_kernel(ROOT / "kernels" / f"{ktype}.py")
        for name, value in overrides.items():
            if hasattr(module, name):
                setattr(module, name, value)
        customops.install(ktype, module.kernel_fn, f"kernels/{ktype}.py", spec.deployment)
        report(f"{ktype} {shape} kernel", module.kernel_fn, args, rows)
        report(f"{ktype} {shape} fast", customops._IMPLS[ktype], args, rows)
        with torch.no_grad():
            report(f"{ktype} {shape} op", customops.op(ktype), args, rows)
        report(f"{ktype} {shape} eager", spec.reference, args, rows)
    if args_.json:
        Path(args_.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
