"""Developer tool (GPU): where the host time of a model's forward goes, original and optimized (#17).

    python scripts/host_profile.py [--config benchmarks/hf/tinyllama] [--input-shape 1,2048] [--types T,T]

A forward without CUDA graphs is host-bound when enqueueing its launches takes longer than the GPU takes
to run them. For the original model and for autokernel.optimize(model) (the starters in kernels/), this
prints the host time of enqueueing one forward (the GPU idle at its start, no sync inside) against the
forward's whole time, then the optimized forward's host time by Python function (cProfile, top by own
time) and by operator (torch.profiler's CPU side, top by self time).
"""

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autokernel.harness import timing  # noqa: E402
from autokernel.models import example_inputs, load_model  # noqa: E402
from autokernel.verify import deploy  # noqa: E402

ROWS = 30  # functions / operators shown


def by_function(fn, args) -> str:
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    fn(*args)
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(ROWS)
    return out.getvalue()


def by_operator(fn, args) -> str:
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=ROWS, max_name_column_width=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "benchmarks" / "hf" / "tinyllama"))
    p.add_argument("--input-shape", default="1,2048")
    p.add_argument("--types", help="comma-separated kernel types (default: every type with a starter)")
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    model = load_model("AutoModelForCausalLM", module="transformers", config=a.config, device="cuda",
                       dtype=torch.float16)
    args = example_inputs(model, tuple(int(d) for d in a.input_shape.split(",")), "cuda", torch.float16, seed=0)
    optimized = deploy.optimize(model, ROOT / "kernels", a.types.split(",") if a.types else None, verified=None)
    with torch.no_grad():
        for name, fn in (("original", model), ("optimized", optimized)):
            for _ in range(3):
                fn(*args)
            host, total = (us / 1e3 for us in timing.enqueue_and_total_us(fn, args, "cuda", a.reps))
            print(f"{name:10} host {host:8.3f} ms to enqueue, {total:8.3f} ms to complete "
                  f"({'host' if host > 0.9 * total else 'GPU'}-bound)")
        print("\n######## optimized, host time by function (cProfile, own time)")
        print(by_function(optimized, args))
        print("######## optimized, host time by operator (torch.profiler, self CPU)")
        print(by_operator(optimized, args))


if __name__ == "__main__":
    main()
