"""Baselines beyond eager and torch.compile, for the starter benchmark (GPU only, run as a child).

    python -m autokernel.harness.baselines --out baselines.json [--types rmsnorm,softmax]

Times the measured ceilings of the device (a large device-to-device copy, a large matmul), PyTorch's
fused ops where they exist (F.rms_norm), Liger-Kernel where it is installed, and each type's extra timing (its
registry entry's extra_timing: rotary on a model's q and k together), all through autokernel.harness.timing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path

import torch

from autokernel import registry
from autokernel.harness import gpu, timing
from autokernel.harness.perf import INPUT_SETS, compiled_reference, gpu_input_sets  # noqa: F401  (INPUT_SETS: the type modules time by it)
from autokernel.kernelfile import import_kernel
from autokernel.registry import get_spec

ROOT = Path(__file__).resolve().parents[2]


def liger_functional():
    """Liger-Kernel's functional module where it is installed, else None."""
    try:
        from liger_kernel.transformers import functional as liger

        return liger
    except ImportError:
        return None


def extra_baselines(liger) -> dict:
    """type -> {baseline name: fn with the reference's signature}, from each registry entry's extra_baselines."""
    found = {}
    for ktype, spec in registry.specs_where("extra_baselines").items():
        fns = spec.extra_baselines(liger)
        if fns:
            found[ktype] = fns
    return found


def time_extras(types, liger) -> dict:
    out = {}
    for ktype, fns in extra_baselines(liger).items():
        if ktype not in types:
            continue
        spec = get_spec(ktype)
        sets = gpu_input_sets(spec, spec.bench_shape, torch.float16)
        out[ktype] = median_times(fns, sets)
    return out


def _median_or_error(fn, sets):
    try:
        return round(timing.time_gpu(fn, sets).median_us, 2)
    except Exception as e:  # a baseline that cannot run is reported, not fatal
        return f"failed: {type(e).__name__}: {str(e)[:120]}"


def median_times(fns: dict, sets) -> dict:
    """{name: median us, or why it failed} of each fn over the input sets."""
    return {name: _median_or_error(fn, sets) for name, fn in fns.items()}


def starter_eager_compile(spec) -> dict:
    """{"kernel", "eager", "compile"}: the type's shipped starter, its reference, and the reference compiled."""
    starter = import_kernel(ROOT / "kernels" / f"{spec.name}.py")
    return {"kernel": starter.kernel_fn, "eager": spec.reference, "compile": compiled_reference(spec)}


def extra_timings(types, liger) -> dict:
    """type -> its registry entry's extra_timing (a measurement the bench shape misses), for the wanted types."""
    this = sys.modules[__name__]
    return {name: spec.extra_timing(liger, this) for name, spec in registry.specs_where("extra_timing").items()
            if types is None or name in types}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--types", default="", help="comma-separated kernel types (default: all)")
    args = p.parse_args(argv)
    liger = liger_functional()
    types = set(filter(None, args.types.split(","))) or None
    ceil = gpu.measure_ceilings()
    result = {
        "gpu": gpu.device_name(), "torch": torch.__version__, "triton": _triton_version(),
        "liger": importlib.metadata.version("liger-kernel") if liger else None,
        "copy_gb_s": ceil.bandwidth_gb_s, "matmul_bf16_tflops": ceil.fp16_tflops,
        "extras": time_extras(types or set(extra_baselines(liger)), liger),
    }
    result["extra_timings"] = extra_timings(types, liger)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def _triton_version():
    import triton

    return triton.__version__


if __name__ == "__main__":
    sys.exit(main())
