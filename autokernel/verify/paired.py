"""--against: the optimized model with this run's kernels against the same model with other kernel files of the same
types, timed in turns in one process (verify.py --against)."""

from __future__ import annotations

from collections.abc import Callable

from autokernel.harness import timing
from autokernel.ops import customops
from autokernel.verify.endtoend import TIMING_INPUTS, TIMING_SEED, _error_line, wrong_output
from autokernel.verify.noise import paired_verdict

PAIRED_ROUNDS = 200  # turns of a paired comparison: each times one run of both kernel sets
CPU_PAIRED_ROUNDS = 2  # in the interpreter: enough to run the path, the figures mean nothing there


def paired(model, module, ours: dict, theirs: dict, inputs: Callable, device: str,
           rounds: int = PAIRED_ROUNDS) -> dict:
    """The optimized model with our kernels against the same model with theirs (customops.installed() of the
    same types), timed in turns in one process (timing.time_turns: one run of each per turn), so that a
    difference of a few tenths of a percent is not lost in the drift between two runs. On a GPU each side is
    replayed from its own CUDA graph (GPU time, what the loop optimizes), captured while its kernels were
    installed. Each side's output is checked against the original's first: a wrong one is an error, not a
    figure."""
    sets = [inputs(TIMING_SEED + i) for i in range(TIMING_INPUTS)]
    sides = {"ours": ours, "theirs": theirs}
    fns = {}
    try:
        for name, kernels in sides.items():
            customops.reinstall(kernels)
            fns[name] = timing.cuda_graphed(module, sets[0]) if device == "cuda" else _installing(kernels, module)
            wrong = wrong_output(fns[name], model, sets[-1])
            if wrong:
                return {"error": f"{name}: {wrong}"}
        samples = timing.time_turns(fns, sets, device, rounds)
    except Exception as e:
        return {"error": _error_line(e)}
    finally:
        customops.reinstall(ours)
    ms = {name: [us / 1e3 for us in runs] for name, runs in samples.items()}
    return {"mode": "graph" if device == "cuda" else "eager", **paired_verdict(ms["ours"], ms["theirs"])}


def _installing(kernels: dict, module) -> Callable:
    """The eager module run with these kernels installed (a graph replays what it captured; eager code
    calls whatever is installed at the time)."""
    def run(*args):
        customops.reinstall(kernels)
        return module(*args)
    return run
