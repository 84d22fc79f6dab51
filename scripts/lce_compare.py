"""linear_cross_entropy at loss-evaluation shapes: time and peak memory of the starter against PyTorch eager,
torch.compile and Liger's fused linear cross-entropy (GPU only).

    python scripts/lce_compare.py --json OUT.json [--dtype fp16]

Every row times through autokernel.timing (the harness's protocol: L2 flushed, inputs rotated) and measures the
memory one call allocates beyond its inputs (perf.call_peak_mb); each loss is checked against the float64
oracle with the registry's tolerance. Shapes: TinyLlama (H 2048, V 32000) and Qwen2-1.5B (H 1536, V 151936) at
batch 1 and 4 x 2048 tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autokernel import baselines, checking, gpu, perf, timing  # noqa: E402
from autokernel.kernelfile import import_kernel  # noqa: E402
from autokernel.registry import get_spec, parse_dtype, shape_label  # noqa: E402

LCE = "linear_cross_entropy"
SHAPES = {  # model, batch x sequence -> shape
    "tinyllama B1 S2048": {"N": 2048, "H": 2048, "V": 32000},
    "tinyllama B4 S2048": {"N": 8192, "H": 2048, "V": 32000},
    "qwen2-1.5b B1 S2048": {"N": 2048, "H": 1536, "V": 151936},
    "qwen2-1.5b B4 S2048": {"N": 8192, "H": 1536, "V": 151936},
}


def measure(name: str, fn, spec, sets: list[tuple], dtype) -> dict:
    """Median time, peak memory of one call and the error against the oracle; a failure is a row's reason."""
    try:
        got = fn(*sets[0])
        want = checking.oracle(spec, sets[0])
        atol, rtol = spec.tolerance(dtype)
        wrong = checking.compare(got.float(), want, torch.float32, atol, rtol)
        us = timing.time_gpu(fn, sets).median_us
        return {"us": round(us, 1), "peak_mib": round(perf.call_peak_mb(fn, sets[0]), 1),
                "loss": float(got), "oracle": float(want), "ok": wrong is None, "wrong": wrong}
    except Exception as e:  # one baseline that cannot run (out of memory, a compile error) is reported
        torch.cuda.empty_cache()
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}


def compare_shape(spec, starter, shape: dict, dtype, liger) -> dict:
    sets = perf.gpu_input_sets(spec, shape, dtype)
    fns = {"kernel": starter.kernel_fn, "eager": spec.reference, "compile": perf.compiled_reference(spec)}
    fns.update(spec.extra_baselines(liger))
    rows = {name: measure(name, fn, spec, sets, dtype) for name, fn in fns.items()}
    kernel_us = rows["kernel"].get("us")
    for row in rows.values():
        if kernel_us and "us" in row:
            row["kernel_speedup"] = round(row["us"] / kernel_us, 3)
    del sets
    torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="where the rows go")
    p.add_argument("--dtype", default="fp16")
    args = p.parse_args(argv)
    if not gpu.has_cuda():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype, spec = parse_dtype(args.dtype), get_spec(LCE)
    starter = import_kernel(ROOT / "kernels" / f"{LCE}.py")
    liger = baselines.liger_functional()
    result = {"gpu": gpu.device_name(), "torch": torch.__version__, "dtype": args.dtype,
              "liger": liger is not None, "shapes": {}}
    for label, shape in SHAPES.items():
        rows = compare_shape(spec, starter, shape, dtype, liger)
        result["shapes"][label] = {"shape": shape, "rows": rows}
        print(f"{label} ({shape_label(shape)}, {args.dtype})")
        for name, r in rows.items():
            if "error" in r:
                print(f"  {name:<8} {r['error']}")
                continue
            print(f"  {name:<8} {r['us']:10.1f} us  {r['peak_mib']:9.1f} MiB  loss {r['loss']:.5f} "
                  f"(oracle {r['oracle']:.5f}{'' if r['ok'] else ', WRONG'})  kernel {r.get('kernel_speedup', 0):.2f}x")
        sys.stdout.flush()
    Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
