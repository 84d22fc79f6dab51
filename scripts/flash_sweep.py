"""Developer tool (GPU): flash attention's "split" default and "tma" tile configs against SDPA, in one process.

    python scripts/flash_sweep.py [--kernel kernels/flash_attention.py] [--json flash_sweep.json]

Cases: the bench shape (B=2, H=32, S=2048, D=128) in fp16 causal, fp16 non-causal and bf16 causal. Each
configuration's CAPS constants are set on one imported module. Its output on fresh inputs must pass the
harness's own check (guards, NaN-poisoned allocations, the registry's tolerances against the float64 oracle)
before it is timed with the project's timing protocol beside SDPA itself; the relative L2 distance from SDPA
is reported. TFLOP/s count 4*B*H*S*S*D FLOPs, half when causal (the registry's model).
"""

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autokernel.harness import checking, gpu, timing  # noqa: E402
from autokernel.harness.perf import gpu_input_sets  # noqa: E402
from autokernel.kernelfile import declarations, import_kernel  # noqa: E402
from autokernel.ops.swap import rel_l2  # noqa: E402
from autokernel.registry import get_spec  # noqa: E402

CASES = [("fp16 causal", torch.float16, True), ("fp16 full", torch.float16, False),
         ("bf16 causal", torch.bfloat16, True)]
KNOBS = ("VARIANT", "BLOCK_M", "BLOCK_N", "NUM_WARPS", "NUM_STAGES")
# VARIANT/BLOCK_MxBLOCK_N/wNUM_WARPS/sNUM_STAGES: the tutorial's Hopper space around 128 x {64, 128}
DEFAULT_CONFIGS = [f"tma/128x{bn}/w{w}/s{s}" for bn in (64, 128) for w in (4, 8) for s in (2, 3, 4)]
DEFAULT_CONFIGS.append("tma/64x64/w4/s3")


def parse_config(text: str) -> dict:
    """'tma/64x64/w4/s3' -> {VARIANT: 'tma', BLOCK_M: 64, BLOCK_N: 64, NUM_WARPS: 4, NUM_STAGES: 3}."""
    variant, tile, warps, stages = text.split("/")
    block_m, block_n = tile.split("x")
    return dict(zip(KNOBS, (variant, int(block_m), int(block_n), int(warps.lstrip("w")), int(stages.lstrip("s")))))


def configs(defaults: dict, texts: list[str]) -> list[dict]:
    return [{name: defaults[name] for name in KNOBS}] + [parse_config(t) for t in texts]


def label(config: dict, defaults: dict) -> str:
    if all(config[n] == defaults[n] for n in KNOBS):
        return f"{config['VARIANT']} (file defaults)"
    return "{} {}x{} w{} s{}".format(*(config[n] for n in KNOBS))


def check(module, spec, shape, dtype, gen, config) -> tuple[float, str]:
    """(relative L2 distance from SDPA, note) on fresh inputs; raises CheckFailed on a wrong output."""
    inputs = spec.make_inputs(shape, dtype, "cuda", gen)
    out = checking.checked_call(module.kernel_fn, spec, inputs, checking.describe(shape, dtype))
    err = rel_l2(out, spec.reference(*inputs))
    took_tma = config["VARIANT"] != "tma" or module._tma_applies(*inputs[:3], config["BLOCK_M"], 1.0)
    return err, "" if took_tma else "fell back to split"


def run_case(module, spec, base, name, dtype, causal, defaults, texts, gen) -> list[dict]:
    shape = {**base, "causal": causal}
    sets = gpu_input_sets(spec, shape, dtype)
    flops = spec.flops(shape)
    sdpa = timing.time_gpu(spec.reference, sets)
    rows = [{"case": name, "config": "sdpa", "us": sdpa.median_us, "spread_pct": sdpa.spread_pct, "note": ""}]
    for config in configs(defaults, texts):
        for knob, value in config.items():
            setattr(module, knob, value)
        row = {"case": name, "config": label(config, defaults), "knobs": config}
        try:
            row["rel_l2"], row["note"] = check(module, spec, shape, dtype, gen, config)
            t = timing.time_gpu(module.kernel_fn, sets)
            row["us"], row["spread_pct"] = t.median_us, t.spread_pct
        except Exception as e:  # out of shared memory, a compile error, a wrong result: report, go on
            row["us"], row["note"] = None, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:70]}"
        rows.append(row)
    for row in rows:
        row["tflops"] = flops / row["us"] / 1e6 if row["us"] else None
        row["x_sdpa"] = sdpa.median_us / row["us"] if row["us"] else None
    return rows


def print_table(rows):
    print(f"{'case':<12} {'config':<24} {'us':>8} {'+-%':>5} {'TFLOP/s':>8} {'x SDPA':>7} {'rel L2':>8}  note")
    columns = (("us", ".1f"), ("spread_pct", ".1f"), ("tflops", ".1f"), ("x_sdpa", ".2f"), ("rel_l2", ".1e"))
    for r in rows:
        us, spread, tf, x, err = (f"{r[k]:{f}}" if r.get(k) is not None else "-" for k, f in columns)
        print(f"{r['case']:<12} {r['config']:<24} {us:>8} {spread:>5} {tf:>8} {x:>7} {err:>8}  {r['note']}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", type=Path, default=Path("kernels/flash_attention.py"))
    p.add_argument("--json", type=Path, help="also write the rows and the setup as JSON here")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help="comma-separated VARIANT/BMxBN/wWARPS/sSTAGES, e.g. tma/64x64/w4/s3,split/64x64/w4/s3 "
                        "(default: the tutorial's Hopper grid around 128-row tiles)")
    p.add_argument("--shape", default="", metavar="B=1,H=32,S=2048,D=64",
                   help="override entries of the registry's bench shape (B=2, H=32, S=2048, D=128)")
    p.add_argument("--cases", default=",".join(name for name, _, _ in CASES),
                   help=f"comma-separated cases (default: all of {[name for name, _, _ in CASES]})")
    args = p.parse_args()
    if not gpu.has_cuda():
        print("flash_sweep.py times kernels on a CUDA GPU; none is visible to PyTorch", file=sys.stderr)
        sys.exit(2)
    defaults = declarations(args.kernel.read_text())
    module = import_kernel(args.kernel)
    spec = get_spec("flash_attention")
    gen = torch.Generator(device="cuda").manual_seed(0)
    base = {**spec.bench_shape, **{k: int(v) for k, v in (kv.split("=") for kv in args.shape.split(",") if kv)}}
    setup = {"gpu": gpu.device_name(), "torch": torch.__version__, "triton": triton.__version__,
             "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "shape": base}
    print("  ".join(f"{k}: {v}" for k, v in setup.items()))
    rows = []
    texts = args.configs.split(",")
    for name, dtype, causal in CASES:
        if name in args.cases.split(","):
            rows += run_case(module, spec, base, name, dtype, causal, defaults, texts, gen)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({**setup, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
