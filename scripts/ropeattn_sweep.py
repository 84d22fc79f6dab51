"""Developer tool (GPU): rope_attention against its yardsticks at the models' attention shapes, and a sweep of its
main tunables at one of them, in one process.

    python scripts/ropeattn_sweep.py [--kernel kernels/rope_attention.py] [--json ropeattn.json]
                                     [--shapes all|tinyllama,...] [--sweep tinyllama] [--configs fused/64x64/w4/s3,...]

Rows per shape, fp16 causal, each checked before it is timed (the harness's check: the registry's tolerances
against the float64 oracle) with the project's timing protocol:
  kernel            the file's defaults (and, at the --sweep shape, each VARIANT/BMxBN/wWARPS/sSTAGES config)
  eager             reference.py: HF's RoPE ops, repeat_kv, SDPA
  compile           torch.compile of the reference
  sdpa_gqa+rope     the yardstick of issue #19: RoPE as eager ops, then SDPA on the grouped K/V (enable_gqa)
  rotary+sdpa_gqa   our rotary_embedding starter on q and k, then SDPA (enable_gqa)
  sdpa_only         SDPA alone on q and k already rotated (enable_gqa): what the attention itself costs
  cudnn_only        the same on K/V repeated beforehand, cuDNN's backend forced (the fastest SDPA on Hopper)
x_yardstick is sdpa_gqa+rope's time over the row's; TFLOP/s count the registry's FLOPs (causal: half).
"""

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import reference  # noqa: E402
from autokernel.harness import checking, gpu, timing  # noqa: E402
from autokernel.harness.perf import compiled_reference, gpu_input_sets  # noqa: E402
from autokernel.kernelfile import import_kernel  # noqa: E402
from autokernel.registry import get_spec  # noqa: E402

HEADS = {"tinyllama": {"Hq": 32, "Hkv": 4, "D": 64}, "llama3": {"Hq": 32, "Hkv": 8, "D": 128},
         "qwen2": {"Hq": 12, "Hkv": 2, "D": 128}}
SHAPES = {f"{model}{'' if b == 1 else f'_b{b}'}": {"B": b, **HEADS[model], "S": 2048}  # the registry's, S 2048
          for model, batches in (("tinyllama", (1, 4)), ("llama3", (1, 2)), ("qwen2", (1, 4))) for b in batches}
DEVICE = "cuda"
KNOBS = ("VARIANT", "BLOCK_M", "BLOCK_N", "NUM_WARPS", "NUM_STAGES")
DEFAULT_CONFIGS = ([f"fused/{bm}x{bn}/w{w}/s{s}" for bm, bn in ((64, 64), (128, 64), (128, 32), (64, 32), (128, 128))
                    for w in (4, 8) for s in (2, 3)]
                   + [f"rotate_k_first/{bm}x{bn}/w{w}/s{s}" for bm, bn in ((64, 64), (128, 64), (64, 32), (128, 128))
                      for w in (4, 8) for s in (2, 3)])


def parse_config(text: str) -> dict:
    """'fused/64x64/w4/s3' -> {VARIANT: 'fused', BLOCK_M: 64, BLOCK_N: 64, NUM_WARPS: 4, NUM_STAGES: 3}."""
    variant, tile, warps, stages = text.split("/")
    block_m, block_n = tile.split("x")
    return dict(zip(KNOBS, (variant, int(block_m), int(block_n), int(warps.lstrip("w")), int(stages.lstrip("s")))))


def _rotated(q, k, cos, sin):
    return tuple(x * cos + reference._rotate_half(x) * sin for x in (q, k))  # [S, D] tables broadcast


def yardsticks(spec, rotary) -> dict:
    """name -> fn with the reference's signature (see the docstring)."""
    def rotary_sdpa(q, k, v, cos, sin, causal, scale):
        half = cos.shape[-1] // 2
        c, s = cos[:, :half], sin[:, :half]
        q, k = rotary.kernel_fn(q, c, s), rotary.kernel_fn(k, c, s)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
    return {"eager": spec.reference, "compile": compiled_reference(spec),
            "sdpa_gqa+rope": spec.extra_baselines(None)["sdpa_gqa+rope"], "rotary+sdpa_gqa": rotary_sdpa}


def attention_only(sets) -> dict:
    """SDPA alone on inputs rotated (and for cuDNN repeated) beforehand: (fn, input sets) by name."""
    pre = [(*_rotated(q, k, cos, sin), v, causal) for q, k, v, cos, sin, causal, _ in sets]
    groups = pre[0][0].shape[1] // pre[0][1].shape[1]
    repeated = [(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), c) for q, k, v, c in pre]

    def cudnn(q, k, v, causal):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    sdpa = lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return {"sdpa_only": (sdpa, pre), "cudnn_only": (cudnn, repeated)}


def timed_row(name, fn, sets, spec=None, shape=None, gen=None) -> dict:
    row = {"config": name}
    try:
        if spec is not None:  # a kernel: checked on fresh inputs first
            inputs = spec.make_inputs(shape, torch.float16, DEVICE, gen)
            checking.checked_call(fn, spec, inputs, checking.describe(shape, torch.float16))
        t = timing.time_gpu(fn, sets)
        row.update(us=t.median_us, spread_pct=t.spread_pct, note="")
    except Exception as e:  # out of shared memory, a compile error, a wrong result: report, go on
        row.update(us=None, note=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:90]}")
    return row


def run_shape(module, spec, rotary, name, shape, configs, gen) -> list[dict]:
    sets = gpu_input_sets(spec, shape, torch.float16)
    defaults = {k: getattr(module, k) for k in KNOBS}
    rows = [timed_row("kernel (file defaults)", module.kernel_fn, sets, spec, shape, gen)]
    for config in configs:
        for knob, value in config.items():
            setattr(module, knob, value)
        rows.append(timed_row("{} {}x{} w{} s{}".format(*config.values()), module.kernel_fn, sets, spec, shape, gen))
    for knob, value in defaults.items():
        setattr(module, knob, value)
    rows += [timed_row(n, fn, sets) for n, fn in yardsticks(spec, rotary).items()]
    rows += [timed_row(n, fn, pre) for n, (fn, pre) in attention_only(sets).items()]
    yardstick = next(r["us"] for r in rows if r["config"] == "sdpa_gqa+rope")
    for r in rows:
        r.update(shape=name, tflops=spec.flops(shape) / r["us"] / 1e6 if r["us"] else None,
                 x_yardstick=yardstick / r["us"] if r["us"] and yardstick else None)
    return rows


def print_table(rows):
    print(f"{'shape':<13} {'config':<26} {'us':>8} {'+-%':>5} {'TFLOP/s':>8} {'x yard':>7}  note")
    columns = (("us", ".1f"), ("spread_pct", ".1f"), ("tflops", ".1f"), ("x_yardstick", ".2f"))
    for r in rows:
        us, spread, tf, x = (f"{r[k]:{f}}" if r.get(k) is not None else "-" for k, f in columns)
        print(f"{r['shape']:<13} {r['config']:<26} {us:>8} {spread:>5} {tf:>8} {x:>7}  {r['note']}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", type=Path, default=Path("kernels/rope_attention.py"))
    p.add_argument("--json", type=Path, help="also write the rows and the setup as JSON here")
    p.add_argument("--shapes", default="all", help=f"comma-separated, of {list(SHAPES)} (default all)")
    p.add_argument("--sweep", default="tinyllama",
                   help="comma-separated shapes the tunables are swept at (default tinyllama)")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help="comma-separated VARIANT/BMxBN/wWARPS/sSTAGES")
    args = p.parse_args()
    if not gpu.has_cuda():
        print("ropeattn_sweep.py times kernels on a CUDA GPU; none is visible to PyTorch", file=sys.stderr)
        sys.exit(2)
    module, rotary = import_kernel(args.kernel), import_kernel(Path("kernels/rotary_embedding.py"))
    spec = get_spec("rope_attention")
    gen = torch.Generator(device="cuda").manual_seed(0)
    setup = {"gpu": gpu.device_name(), "torch": torch.__version__, "triton": triton.__version__, "dtype": "fp16",
             "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv)}
    print("  ".join(f"{k}: {v}" for k, v in setup.items()), flush=True)
    names = list(SHAPES) if args.shapes == "all" else args.shapes.split(",")
    rows = []
    for name in names:
        configs = [parse_config(t) for t in args.configs.split(",") if t] if name in args.sweep.split(",") else []
        shape_rows = run_shape(module, spec, rotary, name, {**SHAPES[name], "causal": True}, configs, gen)
        print_table(shape_rows)
        rows += shape_rows
    if args.json:
        args.json.write_text(json.dumps({**setup, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
