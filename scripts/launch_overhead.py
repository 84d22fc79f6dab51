"""Developer tool (GPU): how much of a small kernel's time is the host launching it.

    python scripts/launch_overhead.py

For each function: host microseconds per call (enqueue only, no sync), the harness's timing (events,
L2 flushed), and pure device time from a CUDA graph replay: the protocols of autokernel/modeltime.py,
which the harness uses for a kernel's time at the model's shapes. A kernel whose host time exceeds its device
time is launch-bound: in a model's forward it starves the GPU unless the model runs under a graph.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autokernel import modeltime, timing  # noqa: E402
from autokernel.kernelfile import import_kernel  # noqa: E402
from autokernel.registry import get_spec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def host_us(fn, args) -> float:
    return modeltime.host_cost_us(fn, args, "cuda")


def graph_us(fn, args) -> float:
    return modeltime.graph_time(fn, [args])[0].median_us


def report(name, fn, args):
    try:
        row = (host_us(fn, args), timing.time_gpu(fn, [args], reps=100).median_us, graph_us(fn, args))
        print(f"{name:<40} host {row[0]:8.1f} us   harness {row[1]:8.1f} us   graph {row[2]:8.1f} us")
    except Exception as e:
        print(f"{name:<40} failed: {type(e).__name__}: {str(e)[:100]}")


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2048, 768, device="cuda", dtype=torch.float16)
    report("torch.empty_like", torch.empty_like, (x,))
    report("torch.add", torch.add, (x, x))
    cases = [("rmsnorm", {"M": 2048, "N": 768}), ("rotary_embedding", {"B": 1, "H": 12, "S": 2048, "D": 32}),
             ("fused_mlp", {"T": 2048, "H": 768, "I": 2304}), ("matmul", {"M": 2048, "N": 768, "K": 768}),
             ("rmsnorm", {"M": 8192, "N": 8192})]
    for ktype, shape in cases:
        spec = get_spec(ktype)
        args = spec.make_inputs(shape, torch.float16, "cuda", gen)
        module = import_kernel(ROOT / "kernels" / f"{ktype}.py")
        report(f"{ktype} {shape} kernel", module.kernel_fn, args)
        report(f"{ktype} {shape} eager", spec.reference, args)


if __name__ == "__main__":
    main()
