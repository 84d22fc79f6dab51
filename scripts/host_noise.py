"""Developer tool (GPU): why a host-bound forward's latency wanders, original eager and compiled (#17).

    python scripts/host_noise.py [--config benchmarks/hf/tinyllama] [--input-shape 1,2048] [--recompiles 6]

Without CUDA graphs a compiled model is host-bound, and verify.py read the same compiled TinyLlama at 8.95 to
18.47 ms across runs on the H200 host, an eager model 20-70% slower once a compile had run. This times the
eager and the compiled forward (latency: as a caller waits for it) in rounds, Python's cyclic garbage collector
on, off, and with the heap frozen (gc.freeze), fresh and after the model was compiled again and again as the
prune does, and counts the collections that ran inside the timed forwards and their time (gc.callbacks).
"""

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autokernel.harness import timing  # noqa: E402
from autokernel.models import example_inputs, load_model, parse_shape  # noqa: E402


class Collections:
    """Time spent in each generation's collections while active (gc.callbacks)."""

    def __init__(self):
        self.ms, self.count, self._t0, self.active = [0.0] * 3, [0] * 3, 0.0, False
        gc.callbacks.append(self._hear)

    def _hear(self, phase, info):
        if not self.active:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.ms[info["generation"]] += (time.perf_counter() - self._t0) * 1e3
            self.count[info["generation"]] += 1

    def reset(self):
        self.ms, self.count = [0.0] * 3, [0] * 3


def timed(fn, sets, collections: Collections, gc_mode: str) -> dict:
    """fn's latency (ms, median of timing.time_fn) with the collector `gc_mode` (on, off, frozen)."""
    if gc_mode == "frozen":
        gc.collect()
        gc.freeze()
    elif gc_mode == "off":
        gc.disable()
    collections.reset()
    collections.active = True
    try:
        t = timing.time_fn(fn, sets, "cuda", latency=True)
    finally:
        collections.active = False
        gc.enable()
        gc.unfreeze()
    q = statistics.quantiles(t.samples_us, n=10)
    return {"ms": t.median_us / 1e3, "p10": q[0] / 1e3, "p90": q[-1] / 1e3, "runs": len(t.samples_us),
            "gc_count": list(collections.count), "gc_ms": [round(x, 2) for x in collections.ms]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "benchmarks" / "hf" / "tinyllama"))
    p.add_argument("--input-shape", default="1,2048")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--recompiles", type=int, default=6, help="compiles before the last stage, as a prune's trials")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args()
    model = load_model("AutoModelForCausalLM", module="transformers", config=a.config, device="cuda",
                       dtype=torch.float16)
    shape = parse_shape(a.input_shape)
    sets = [example_inputs(model, shape, "cuda", torch.float16, seed=i) for i in range(3)]
    collections, rows = Collections(), []

    def stage(name: str, fns: dict) -> None:
        print(f"== {name}: {len(gc.get_objects())} objects tracked by the collector", flush=True)
        for r in range(a.rounds):
            for what, fn in fns.items():
                for gc_mode in ("on", "off", "frozen"):
                    row = {"stage": name, "model": what, "gc": gc_mode, "round": r,
                           **timed(fn, sets, collections, gc_mode)}
                    rows.append(row)
                    print(f"{name:22} {what:9} gc {gc_mode:6} round {r}: {row['ms']:7.3f} ms "
                          f"(p10 {row['p10']:.3f}, p90 {row['p90']:.3f}); collections in the runs: "
                          f"{row['gc_count']} taking {row['gc_ms']} ms", flush=True)

    with torch.no_grad():
        stage("before any compile", {"eager": model})
        compiled = torch.compile(model)
        compiled(*sets[0])
        stage("compiled once", {"eager": model, "compiled": compiled})
        for _ in range(a.recompiles):
            torch._dynamo.reset()
            compiled = torch.compile(model)
            compiled(*sets[0])
        stage(f"after {a.recompiles} more compiles", {"eager": model, "compiled": compiled})
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print("\nmedian ms by stage, model and collector:")
    keys = list(dict.fromkeys((r["stage"], r["model"], r["gc"]) for r in rows))
    for key in keys:
        ms = [r["ms"] for r in rows if (r["stage"], r["model"], r["gc"]) == key]
        print(f"  {key[0]:22} {key[1]:9} gc {key[2]:6} {statistics.median(ms):7.3f} ms  "
              f"rounds {', '.join(f'{x:.2f}' for x in ms)}")


if __name__ == "__main__":
    main()
