"""Developer tool (GPU): a model under torch.compile with sets of kernels, timed in turns with the original (#17).

    python scripts/compiled_sets.py --config benchmarks/hf/qwen2-1.5b --input-shape 1,1024 \\
        --set add_rmsnorm,linear_cross_entropy,rmsnorm,rope_attention --set none \\
        --two-sided add_rmsnorm,fused_mlp,linear_cross_entropy,rmsnorm,rope_attention/add_rmsnorm,rmsnorm

Each --set is a kernel set (the starters in kernels/) run eagerly and traced alike, as a prune's trial builds
it; --two-sided EAGER/TRACED builds the model verify.py deploys, one set eagerly and another where torch.compile
traces it. Every model is compiled (Inductor, no CUDA graph) and timed in turns with the compiled original, in
rounds of verify.py's protocol (endtoend.latency_turns), as latency (as a caller waits: a host-bound forward's
launches count); then every model's host time to enqueue one forward against the forward's whole time, all of
them in turns. (Session 16's figures were taken with rounds of ~0.3 s, before verify.py's turns grew to a second.)
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autokernel.harness import timing  # noqa: E402
from autokernel.models import example_inputs, load_model, parse_shape  # noqa: E402
from autokernel.ops import swap  # noqa: E402
from autokernel.verify import deploy, endtoend  # noqa: E402

ENQUEUE_TURNS = 40  # host time per forward, every model in turns (10 calls of one model alone read 6.6 to 8.6 ms)


def types_of(text: str) -> list[str]:
    return [] if text == "none" else text.split(",")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "benchmarks" / "hf" / "qwen2-1.5b"))
    p.add_argument("--input-shape", default="1,1024")
    p.add_argument("--set", action="append", default=[], help="comma-joined types, or none")
    p.add_argument("--two-sided", action="append", default=[], help="EAGER/TRACED, each comma-joined")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    model = load_model("AutoModelForCausalLM", module="transformers", config=a.config, device="cuda",
                       dtype=torch.float16)
    shape = parse_shape(a.input_shape)
    sets = [example_inputs(model, shape, "cuda", torch.float16, seed=i) for i in range(3)]
    everything = sorted({t for s in a.set for t in types_of(s)}
                        | {t for s in a.two_sided for part in s.split("/") for t in types_of(part)})
    deploy.load_kernels(ROOT / "kernels", everything)  # the starters, plugged into their ops
    builds = {f"set {s}": swap.build(model, types_of(s)) for s in a.set}
    for s in a.two_sided:
        eager, traced = s.split("/")
        builds[f"two-sided {s}"] = swap.build(model, types_of(eager), traced=types_of(traced))
    with torch.no_grad():
        compiled = {"the original": torch.compile(model)}
        for name, built in builds.items():
            compiled[name] = torch.compile(built.module())
            fns = {"original": compiled["the original"], "kernels": compiled[name]}
            ratios = []
            for r in range(a.rounds):
                us = endtoend.latency_turns(fns, sets, "cuda")  # verify.py's protocol: about a second of each
                o, k = statistics.median(us["original"]) / 1e3, statistics.median(us["kernels"]) / 1e3
                ratios.append(o / k)
                print(f"{name}: round {r}: original {o:.3f} ms, with the kernels {k:.3f} ms ({o / k:.3f}x)", flush=True)
            print(f"{name}: median {statistics.median(ratios):.3f}x the compiled original\n", flush=True)
        host = {name: [] for name in compiled}  # every model in turns: a slow stretch of the host slows them all
        for turn in range(ENQUEUE_TURNS):
            for name, fn in (compiled.items() if turn % 2 else reversed(compiled.items())):
                host[name].append(timing.enqueue_and_total_us(fn, sets[0], "cuda", 1))
        for name, runs in host.items():
            enqueued, total = (statistics.median(r[i] for r in runs) / 1e3 for i in (0, 1))
            print(f"{name}: enqueues a forward in {enqueued:.3f} ms, completes it in {total:.3f} ms (median of "
                  f"{ENQUEUE_TURNS} turns)")


if __name__ == "__main__":
    main()
