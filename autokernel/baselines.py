"""Baselines beyond eager and torch.compile, for the starter benchmark (GPU only, run as a child).

    python -m autokernel.baselines --out baselines.json [--types rmsnorm,softmax]

Times the measured ceilings of the device (a large device-to-device copy, a large matmul), PyTorch's
fused ops where they exist (F.rms_norm), Liger-Kernel where it is installed, and rotary embedding on a
model's q and k together, all through autokernel.timing on the registry's bench shapes.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from pathlib import Path

import torch

from autokernel import gpu, registry, timing
from autokernel.kernelfile import import_kernel
from autokernel.perf import INPUT_SETS, compiled_reference, gpu_input_sets
from autokernel.registry import get_spec

ROOT = Path(__file__).resolve().parent.parent
ROPE_K_HEADS = 8  # the k of a grouped-query model beside q's 32 heads (LLaMA-3 8B, TinyLlama)


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
        out[ktype] = {name: _median_or_error(fn, sets) for name, fn in fns.items()}
    return out


def _median_or_error(fn, sets):
    try:
        return round(timing.time_gpu(fn, sets).median_us, 2)
    except Exception as e:  # a baseline that cannot run is reported, not fatal
        return f"failed: {type(e).__name__}: {str(e)[:120]}"


def time_rope_qk(liger) -> dict:
    """Rotary embedding on q [2,32,4096,128] and k [2,8,4096,128] in one step, as a model applies it."""
    spec = get_spec("rotary_embedding")
    starter = import_kernel(ROOT / "kernels" / "rotary_embedding.py")
    q_shape = spec.bench_shape
    k_shape = {**q_shape, "H": ROPE_K_HEADS}
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = []
    for _ in range(INPUT_SETS):
        q, cos, sin = spec.make_inputs(q_shape, torch.float16, "cuda", gen)
        k, _, _ = spec.make_inputs(k_shape, torch.float16, "cuda", gen)
        sets.append((q, k, cos, sin))
    compiled = compiled_reference(spec)
    fns = {
        "kernel": lambda q, k, c, s: (starter.kernel_fn(q, c, s), starter.kernel_fn(k, c, s)),
        "eager": lambda q, k, c, s: (spec.reference(q, c, s), spec.reference(k, c, s)),
        "compile": lambda q, k, c, s: (compiled(q, c, s), compiled(k, c, s)),
    }
    if liger is not None:
        # Liger takes HF-style [1, seq, head_dim] tables with both halves present.
        full = [(torch.cat([c, c], -1)[None], torch.cat([s, s], -1)[None]) for _, _, c, s in sets]
        fns["liger"] = lambda q, k, c, s: liger.liger_rope(q, k, *full[0])
    times = {name: _median_or_error(fn, sets) for name, fn in fns.items()}
    nbytes = sum(spec.bytes_moved(s, torch.float16) for s in (q_shape, k_shape))
    return {"shapes": [q_shape, k_shape], "bytes": nbytes, **times}


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
    if types is None or "rotary_embedding" in types:
        result["rope_qk"] = time_rope_qk(liger)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def _triton_version():
    import triton

    return triton.__version__


if __name__ == "__main__":
    sys.exit(main())
