"""Developer tool (GPU): an attention kernel's causal orders (CAUSAL_ORDER) at a few tiles and model shapes, in turns.

    python scripts/causal_orders.py [--type rope_attention|flash_attention] [--rounds 3] [--contiguous]
                                    [--shapes 1,8,4,2048,256 ...]

Each shape is B,Hq,Hkv,S,D (causal, fp16, HF's [B, S, H, D] projections viewed as [B, H, S, D]); each line one tile
configuration, its time (do_bench's best of the rounds, the orders interleaved) in each order and its ratio to
"longest_first", the yardstick SDPA is_causal on q and k rotated (BENCHMARKS.md, rope_attention's causal orders).
flash_attention takes q and k rotated and times "longest_first", "launch" and "fold" (its tiles' K and V through TMA
where its "tma" variant applies: D 64 and 128, contiguous; the strided views here run its pointer loop; --contiguous
makes q, k and v [B, H, S, D] contiguous).
"""

import argparse
import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

SHAPES = ["1,8,4,2048,256", "1,8,4,4096,256", "1,32,4,2048,64", "1,16,8,2048,128", "1,8,8,2048,128",
          "1,12,2,2048,128", "2,32,8,2048,128"]
TILES = {"default tile": {}, "64x32 w4 s2 tma": dict(BLOCK_M=64, BLOCK_N=32, NUM_WARPS=4, NUM_STAGES=2),
         "128x64 w8 s2 tma": dict(BLOCK_M=128, BLOCK_N=64, NUM_WARPS=8, NUM_STAGES=2),
         "64x64 w4 s1 tma": dict(BLOCK_M=64, BLOCK_N=64, NUM_WARPS=4, NUM_STAGES=1)}
ORDERS = {"rope_attention": ("longest_first", "paired", "fold"), "flash_attention": ("longest_first", "launch", "fold")}


def inputs(b, hq, hkv, s, d, contiguous=False):
    def made(h):
        x = torch.randn(b, s, h, d, device="cuda", dtype=torch.float16).transpose(1, 2)
        return x.contiguous() if contiguous else x
    q, k, v = made(hq), made(hkv), made(hkv)
    freqs = torch.outer(torch.arange(s, device="cuda").float(),
                        1.0 / (10000 ** (torch.arange(0, d, 2, device="cuda").float() / d)))
    cos, sin = (torch.cat((f, f), -1).half()[None] for f in (freqs.cos(), freqs.sin()))
    rotated = [x * cos + torch.cat((-x[..., d // 2:], x[..., :d // 2]), -1) * sin for x in (q, k)]
    return (q, k, v, cos, sin), (*rotated, v)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--type", choices=sorted(ORDERS), default="rope_attention")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", nargs="+", default=SHAPES, help="B,Hq,Hkv,S,D each")
    parser.add_argument("--contiguous", action="store_true", help="q, k, v contiguous [B, H, S, D], not HF's views")
    args = parser.parse_args()
    path = Path(__file__).resolve().parent.parent / "kernels" / f"{args.type}.py"
    spec = importlib.util.spec_from_file_location("ra", path)
    ra = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ra)
    for text in args.shapes:
        b, hq, hkv, s, d = (int(x) for x in text.split(","))
        call, (qr, kr, v) = inputs(b, hq, hkv, s, d, args.contiguous)
        call = call if args.type == "rope_attention" else (qr, kr, v)
        ref = F.scaled_dot_product_attention(qr, kr, v, is_causal=True, enable_gqa=True)
        sdpa = triton.testing.do_bench(
            lambda qr=qr, kr=kr, v=v: F.scaled_dot_product_attention(qr, kr, v, is_causal=True, enable_gqa=True),
            warmup=10, rep=50)
        print(f"B{b} Hq{hq} Hkv{hkv} S{s} D{d}: SDPA is_causal {sdpa * 1e3:.1f} us", flush=True)
        for name, tile in TILES.items():
            for key in ("BLOCK_M", "BLOCK_N", "NUM_WARPS", "NUM_STAGES"):
                setattr(ra, key, tile.get(key, 0))
            ra.KV_LOADS = "tma" if tile else "pointers"  # rope_attention's; flash_attention has none
            best = {}
            for _ in range(args.rounds):
                for order in ORDERS[args.type]:
                    ra.CAUSAL_ORDER = order
                    torch.testing.assert_close(ra.kernel_fn(*call), ref, atol=4e-3, rtol=4e-3)
                    ms = triton.testing.do_bench(lambda call=call: ra.kernel_fn(*call), warmup=10, rep=50)
                    best[order] = min(best.get(order, ms), ms)
            print(f"  {name}: " + ", ".join(f"{o} {t * 1e3:.1f} us ({best['longest_first'] / t:.3f}x)"
                                            for o, t in best.items()), flush=True)


if __name__ == "__main__":
    main()
