"""Developer tool (GPU): one kernel type's op under torch.compile, alone: does Inductor launch the kernel from its
own code, and do its kernels take the GPU time they take eagerly? (#17)

    python scripts/traced_op.py rope_attention [--file kernels/rope_attention.py] [--shape '{"B": 1, ...}']

Prints whether the compiled code calls the opaque op (a Python dispatch per call) or launches the file's Triton
kernels itself, the compiled output's error against the type's reference, and the GPU time of every kernel of ten
calls, eager and compiled (torch.profiler: a single call timed with events would count the host's delay before the
first launch). The shape is the type's first benchmark shape unless given (JSON).
"""

import argparse
import inspect
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autokernel.harness.checking import outputs  # noqa: E402
from autokernel.kernelfile import import_kernel  # noqa: E402
from autokernel.ops import customops, swap  # noqa: E402
from autokernel.registry import get_spec  # noqa: E402

CALLS = 10


def kernel_times(fn) -> dict[str, float]:
    """GPU microseconds per call of each kernel fn launches, over CALLS calls."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / CALLS for e in prof.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kernel_type")
    p.add_argument("--file", type=Path, help="the kernel file (default: the starter, kernels/TYPE.py)")
    p.add_argument("--shape", help="the shape as JSON (default: the type's first benchmark shape)")
    p.add_argument("--dtype", default="float16")
    a = p.parse_args()
    from torch._inductor.utils import run_and_get_code

    spec = get_spec(a.kernel_type)
    path = a.file or ROOT / "kernels" / f"{a.kernel_type}.py"
    module = import_kernel(path)
    customops.install(a.kernel_type, module.kernel_fn, str(path), spec.deployment)
    op = customops.op(a.kernel_type)
    shape = json.loads(a.shape) if a.shape else spec.shapes[0]
    args = spec.make_inputs(shape, getattr(torch, a.dtype), "cuda", torch.Generator("cuda").manual_seed(0))
    # The op's schema names every argument (rmsnorm's eps too): pass the ones the inputs leave to their defaults.
    bound = inspect.signature(module.kernel_fn).bind(*args)
    bound.apply_defaults()
    args = tuple(bound.arguments.values())
    with torch.no_grad():
        compiled = torch.compile(lambda *inputs: op(*inputs))
        got, codes = run_and_get_code(compiled, *args)
        opaque = f"{a.kernel_type}_opaque" in "\n".join(codes)
        error = max(swap.rel_l2(g, w) for g, w in zip(outputs(got), outputs(spec.reference(*args))))
        print(f"{a.kernel_type} {shape}: {'an opaque op' if opaque else 'launched by Inductor'} under torch.compile, "
              f"rel L2 {error:.2e} against the reference")
        for name, fn in {"eager": lambda: module.kernel_fn(*args), "compiled": lambda: compiled(*args)}.items():
            fn()
            for kernel, us in kernel_times(fn).items():
                print(f"  {name:8s} {kernel[:60]:60s} {us:8.1f} us")


if __name__ == "__main__":
    main()
