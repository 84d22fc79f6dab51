"""Shallow trials for the compiled side of a prune: each trial compiles copies of the model cut to its first one
and two blocks, not the whole model, and the two times give the whole model's.

A compiled prune times one model per kernel type (the kept set without that type), each compiled: on a deep model,
a minute per compile and most of verify.py's wall time. A decoder is one block repeated (its layers) between a
head and a tail (the embedding; the final norm, the LM head and the loss). Cut to its first d blocks, the model
runs in t(d) = rest + d x block, every part compiled as torch.compile compiles the whole model: the head and the
tail too, and the fusion across two layers (a layer's residual add with the next layer's first norm, which a norm
kernel breaks). So the whole model's time is t(2) + (L - 2) x (t(2) - t(1)) for its L blocks, taken turn by turn
from copies that compile in a fraction of the time. The difference's noise is multiplied by L - 2 with it: on a
deep model whose head and tail weigh a lot (Gemma-2 2B, 26 layers, a 256k vocabulary, 1x8192) the intervals read
+-5-7% and decided nothing, so a trial that reads that wide cuts deeper copies (deepen(): 1 and 4 blocks, or 8,
as deep as the width asks), each step dividing the factor by about three; the kept set's copies, timed against
themselves before the first trial, tell it before any trial compiles (endtoend.Trials._deepened_first). The last
check of a prune (the kept set against the original) and verify's rows still compile the whole model. Compiling
each block on its own would be cheaper still, but it misses the head, the tail and the fusion across layers:
exactly where a kernel can lose under torch.compile.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from autokernel.verify import ahead

MIN_BLOCKS = 3  # a model of fewer blocks compiles as fast as its cut copies
DEPTHS = (1, 2)  # the copies' blocks: t(2) - t(1) is one block and one junction between two
DEEPER = (4, 8)  # the deeper copy's blocks, step by step, where the trials read too wide (at most half the model)


def repeated_blocks(module: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """(its path, the module's longest nn.ModuleList whose entries all share one class: a decoder's layers), or None
    when there is none of MIN_BLOCKS or more."""
    lists = [(path, m) for path, m in module.named_modules() if isinstance(m, nn.ModuleList)
             and len(m) >= MIN_BLOCKS and len({type(b) for b in m}) == 1]
    return max(lists, key=lambda item: len(item[1])) if lists else None


def truncated(module: nn.Module, depth: int) -> nn.Module | None:
    """A copy of the module (over the same weights, nothing of it changed) with only the first `depth` of its
    repeated blocks, or None when it has none. The copy is shallow along the path to the blocks' list; a model
    optimize() made keeps its kernels' patches around the copy's forward (swap.Optimized.over)."""
    found = repeated_blocks(module)
    if found is None:
        return None
    path, blocks = found
    *parents, last = path.split(".")
    top = node = _copy(module)
    for name in parents:
        node._modules[name] = node = _copy(node._modules[name])
    node._modules[last] = nn.ModuleList(list(blocks)[:depth])
    optimized = vars(module).get("autokernel")
    return optimized.over(top) if optimized is not None else top


def deepest(blocks: int, depths: tuple[int, int] = DEPTHS) -> int | None:
    """The deepest copy the trials of a model of `blocks` blocks, cut to `depths`, may be cut to (deepen()), or None."""
    return max(_deeper(blocks, depths), default=None)


def _deeper(blocks: int, depths: tuple[int, int]) -> list[int]:
    return [d for d in DEEPER if depths[1] < d <= blocks // 2]


def _copy(module: nn.Module) -> nn.Module:
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone


class ShallowTrials:
    """The models of a compiled prune's trials as their cut copies, each compiled, graphed in the graphed modes and
    checked against the original cut alike; their times in turns, extrapolated to the whole model turn by turn."""

    def __init__(self, model: nn.Module, backend, sets: list):
        found = repeated_blocks(model)
        self.blocks = len(found[1]) if found else 0
        self.backend, self.sets, self.model = backend, sets, model
        self.depths = DEPTHS
        self.originals = {d: truncated(model, d) for d in DEPTHS} if found else {}
        self.made = {}  # (kernel set's model, depth, modes) -> {mode: its cut copy as deployed}, right ones only
        self.ahead = None  # the helper compiling ahead (ahead.py), if any

    def deepen(self, width: float, wide: float) -> bool:
        """Cut the copies deeper from now on, for a trial whose interval reads `width` wide and must read under
        `wide`: to the shallowest of DEEPER (at most half the model's blocks) whose extrapolation factor brings the
        width under wide / 2 (a deeper copy's own noise grows with it: Gemma-2's trials read 2.4 times narrower on 4
        blocks than on 2, where the factor alone says 3.3), else the deepest. Whether it could. The copies deployed
        before are of the old depth: deploy again."""
        deeper = _deeper(self.blocks, self.depths)
        if not deeper:
            return False
        fits = [d for d in deeper if width * self._factor(d) / self._factor(self.depths[1]) <= wide / 2]
        self.depths = (self.depths[0], (fits or deeper)[0 if fits else -1])
        self.originals = {d: truncated(self.model, d) for d in self.depths}
        self.made = {key: ready for key, ready in self.made.items() if key[1] in self.depths}  # the shallow copies
        return True

    def deepest(self) -> int | None:
        """The deepest copy deepen() may cut to from here, or None."""
        return deepest(self.blocks, self.depths)

    def forget_all_but(self, fn: nn.Module) -> None:
        """Drop the copies of every kernel set but fn's (and their CUDA graphs' memory)."""
        self.made = {key: ready for key, ready in self.made.items() if key[0] is fn}

    def _factor(self, deep: int) -> float:
        """What the difference between the copies' times is multiplied by in the whole model's (whole())."""
        return (self.blocks - deep) / (deep - self.depths[0])

    def usable(self) -> bool:
        """Whether the model has repeated blocks and runs cut (a forward that counts its layers from its config
        does not: its trials compile it whole)."""
        try:
            with torch.no_grad():
                return bool(self.originals) and all(m(*self.sets[0]) is not None for m in self.originals.values())
        except Exception:
            return False

    def deploy(self, fn: nn.Module, modes: list[str], graphed: Callable,
               wrong_output: Callable) -> tuple[dict, str | None]:
        """({mode: {depth: fn's cut copy as deployed in it}}, what is wrong with its output or None). A copy made
        before at a depth still used (the shallow one, after deepen()) is not compiled again."""
        ready = {m: {} for m in modes}
        for d in self.depths:
            key = (fn, d, tuple(modes))
            if key not in self.made:
                cut = truncated(fn, d)
                if cut is None:  # a site replaced some blocks with another class: none repeats
                    raise ValueError("the kernel set's model has no repeated blocks to cut")
                ahead.wait(self.ahead, fn, d)
                ran = torch.compile(cut, backend=ahead.quiet(self.backend, self.ahead))
                made = {m: graphed(ran, self.sets[0]) if m.endswith("graph") else ran for m in modes}
                wrong = next(filter(None, (wrong_output(r, self.originals[d], self.sets[-1]) for r in made.values())),
                             None)
                if wrong:
                    return ready, wrong
                self.made[key] = made
            for m in modes:
                ready[m][d] = self.made[key][m]
        return ready, None

    def turns(self, sides: dict[str, dict], time_turns: Callable) -> dict[str, list[float]]:
        """{side: the whole model's time per turn}, from the cut copies of each side ({side: {depth: fn}}) timed
        in one set of turns."""
        runs = time_turns({f"{side} {d}": fn for side, by_depth in sides.items() for d, fn in by_depth.items()})
        return {side: [self.whole(*t) for t in zip(*(runs[f"{side} {d}"] for d in self.depths))] for side in sides}

    def whole(self, shallow: float, deep: float) -> float:
        """The whole model's time from its copies' (self.depths blocks: one and two, unless deepened)."""
        a, b = self.depths
        return deep + (self.blocks - b) * (deep - shallow) / (b - a)

    def alone(self, by_depth: dict, time_one: Callable) -> float:
        """The whole model's time from its cut copies ({depth: fn}) each timed alone by time_one."""
        return self.whole(*(time_one(by_depth[d]) for d in self.depths))
