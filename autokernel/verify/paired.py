"""--against: the optimized model with this run's kernels against the same model with other kernel files of the same
types, timed in turns in one process (verify.py --against); where the model is deployed under torch.compile, also
each side compiled with its own kernels (compile_graph)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from autokernel.harness import timing
from autokernel.ops import customops
from autokernel.verify.endtoend import TIMING_INPUTS, TIMING_SEED, _error_line, backend_for, wrong_output
from autokernel.verify.noise import paired_verdict

PAIRED_ROUNDS = 200  # turns of a paired comparison: each times one run of both kernel sets
CPU_PAIRED_ROUNDS = 2  # in the interpreter: enough to run the path, the figures mean nothing there


def paired(model, module, ours: dict, theirs: dict, inputs: Callable, device: str,
           rounds: int = PAIRED_ROUNDS, compiled: bool = False) -> dict:
    """The optimized model with our kernels against the same model with theirs (customops.installed() of the
    same types), timed in turns in one process (timing.time_turns: one run of each per turn), so that a
    difference of a few tenths of a percent is not lost in the drift between two runs. On a GPU each side is
    replayed from its own CUDA graph (GPU time, what the loop optimizes), captured while its kernels were
    installed. Each side's output is checked against the original's first: a wrong one is an error, not a
    figure. compiled: the same again with each side compiled (torch.compile, then graphed on a GPU), under
    "compiled" in the result."""
    sets = [inputs(TIMING_SEED + i) for i in range(TIMING_INPUTS)]
    sides = {"ours": ours, "theirs": theirs}
    eager = _in_turns(lambda kernels: _made(module, kernels, sets[0], device), model, sides, sets, device, rounds,
                      "graph" if device == "cuda" else "eager")
    if not compiled:
        return eager
    try:
        return {**eager, "compiled": _in_turns(lambda kernels: _compiled(module, kernels, sets[0], device), model,
                                               sides, sets, device, rounds,
                                               "compile_graph" if device == "cuda" else "compile")}
    finally:
        torch._dynamo.reset()  # what runs after compiles its own


def _in_turns(make: Callable, model, sides: dict, sets: list, device: str, rounds: int, mode: str) -> dict:
    """Each side made (make(its kernels), with them installed) and checked, then both timed in turns: the verdict,
    or the error."""
    fns = {}
    try:
        for name, kernels in sides.items():
            customops.reinstall(kernels)
            fns[name] = make(kernels)
            wrong = wrong_output(fns[name], model, sets[-1])
            if wrong:
                return {"mode": mode, "error": f"{name}: {wrong}"}
        samples = timing.time_turns(fns, sets, device, rounds)
    except Exception as e:
        return {"mode": mode, "error": _error_line(e)}
    finally:
        customops.reinstall(sides["ours"])
    ms = {name: [us / 1e3 for us in runs] for name, runs in samples.items()}
    return {"mode": mode, **paired_verdict(ms["ours"], ms["theirs"])}


def _made(module, kernels: dict, example: tuple, device: str) -> Callable:
    return timing.cuda_graphed(module, example) if device == "cuda" else _installing(kernels, module)


def _compiled(module, kernels: dict, example: tuple, device: str) -> Callable:
    """The module compiled with these kernels installed: dynamo's caches emptied first, for Inductor may launch a
    traced kernel from its own code (device descriptors), so a compile of the other side's would run theirs. On a GPU
    the compiled forward is captured at once and replays what it captured."""
    torch._dynamo.reset()
    fn = torch.compile(module, backend=backend_for(device))
    return timing.cuda_graphed(fn, example) if device == "cuda" else _installing(kernels, fn)


def _installing(kernels: dict, module) -> Callable:
    """The eager module run with these kernels installed (a graph replays what it captured; eager code
    calls whatever is installed at the time)."""
    def run(*args):
        customops.reinstall(kernels)
        return module(*args)
    return run
