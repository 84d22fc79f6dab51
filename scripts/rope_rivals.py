"""Developer tool (GPU): rope_attention against its rivals, rotary_embedding on q and k then flash_attention, at model
shapes in the model's layout (q, k, v views of HF's [B, S, H, D] projections), one call each, CUDA-graphed
do_bench medians; rope_attention at its defaults and at each configuration given.

    python scripts/rope_rivals.py                                   # Qwen3-0.6B, TinyLlama, Llama-3.2-1B shapes
    python scripts/rope_rivals.py --shape 1,16,8,2048,128 --config CAUSAL_ORDER=fold --config PACK_GQA=True

What the prune weighs when it puts the rivals in rope_attention's place (verify.py), kernel for kernel: the fused
call saves the rotated q and k's round trip and two launches, and must not lose it in its attention loop.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autokernel.kernelfile import apply_config, import_kernel  # noqa: E402
from autokernel.registry import get_spec  # noqa: E402

SHAPES = {"Qwen3-0.6B": (1, 16, 8, 2048, 128), "TinyLlama": (1, 32, 4, 2048, 64), "Llama-3.2-1B": (1, 32, 8, 2048, 64)}
CONFIGS = ["CAUSAL_ORDER=fold", "PACK_GQA=True", "PACK_GQA=True,CAUSAL_ORDER=fold", "KV_LOADS=tma,CAUSAL_ORDER=fold",
           "BLOCK_M=128,NUM_WARPS=8,CAUSAL_ORDER=fold", "BLOCK_M=128,NUM_WARPS=8,KV_LOADS=tma,CAUSAL_ORDER=fold"]
KERNELS = Path(__file__).resolve().parent.parent / "kernels"


def _us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=60) * 1e3


def _inputs(batch, heads, kv_heads, seq, dim):
    """q, k, v, cos and sin as the harness times rope_attention at a model shape (its make_inputs in its model_layout:
    the projections' views, HF's [1, S, D] tables)."""
    spec = get_spec("rope_attention")
    shape = {"B": batch, "Hq": heads, "Hkv": kv_heads, "S": seq, "D": dim, "causal": True}
    return spec.model_layout(spec.make_inputs(shape, torch.float16, "cuda", torch.Generator("cuda").manual_seed(0)))[:5]


def _value(text: str):
    return int(text) if text.isdigit() else {"True": True, "False": False}.get(text, text)


def _parsed(config: str) -> dict:
    return {k: _value(v) for k, v in (kv.split("=") for kv in config.split(",") if kv)}


def compare(name: str, shape: tuple, configs: list[str]) -> None:
    batch, heads, _, seq, dim = shape
    q, k, v, cos, sin = _inputs(*shape)
    flash, rotary = (import_kernel(KERNELS / f"{t}.py").kernel_fn for t in ("flash_attention", "rotary_embedding"))
    half_tables = cos[0, :, :dim // 2].contiguous(), sin[0, :, :dim // 2].contiguous()
    q_rot, k_rot = rotary(q, *half_tables), rotary(k, *half_tables)
    want = flash(q_rot, k_rot, v)
    t_rotary = _us(lambda: (rotary(q, *half_tables), rotary(k, *half_tables)))
    t_flash = _us(lambda: flash(q_rot, k_rot, v))
    rivals = t_rotary + t_flash
    flops = 2 * batch * heads * seq * seq * dim  # causal: half of 4 B H S^2 D
    print(f"== {name} B{shape[0]} Hq{heads} Hkv{shape[2]} S{seq} D{dim}: rotary q+k {t_rotary:.1f} us, flash "
          f"{t_flash:.1f} us ({flops / t_flash / 1e6:.0f} TFLOP/s): the rivals {rivals:.1f} us", flush=True)
    source = (KERNELS / "rope_attention.py").read_text()
    for i, config in enumerate(["", *configs]):
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / f"rope_attention_{i}.py"
            path.write_text(apply_config(source, _parsed(config)) if config else source)
            rope = import_kernel(path).kernel_fn
        got = rope(q, k, v, cos, sin)
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        t = _us(lambda rope=rope: rope(q, k, v, cos, sin))
        print(f"   rope_attention {config or 'defaults'}: {t:.1f} us ({flops / t / 1e6:.0f} TFLOP/s), rel. L2 against "
              f"the rivals' {err:.1e}, {rivals / t:.3f}x the rivals", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", help="B,Hq,Hkv,S,D (repeatable; default: three model shapes)")
    ap.add_argument("--config", action="append", help="rope_attention's tunables, NAME=VALUE,... (repeatable)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("rope_rivals.py: needs a CUDA GPU")
    shapes = {s: tuple(int(n) for n in s.split(",")) for s in args.shape} if args.shape else SHAPES
    for name, shape in shapes.items():
        torch.manual_seed(0)
        compare(name, shape, args.config or CONFIGS)


if __name__ == "__main__":
    main()
