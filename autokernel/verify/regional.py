"""Regional compilation for the compiled side of a prune: each trial compiles the model's repeated block, not the
whole model.

A compiled prune times one model per kernel type (the kept set without that type), each compiled: on a deep model,
a minute per compile and most of verify.py's wall time. A decoder is one block repeated (its layers): torch.compile
applied to each block compiles the block's code once and every layer reuses it, so a trial costs one block's
compile. What it decides on is each layer fused as Inductor fuses a layer; what it misses is fusion across two
layers (a residual add with the next layer's first norm), so the last check of a prune (the kept set against the
original) and verify's rows still compile the whole model.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

MIN_BLOCKS = 2  # a list of fewer blocks saves nothing over compiling the whole model


def repeated_blocks(module: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """(its path, the module's longest nn.ModuleList whose entries all share one class: a decoder's layers), or None
    when there is none of MIN_BLOCKS or more."""
    lists = [(path, m) for path, m in module.named_modules() if isinstance(m, nn.ModuleList)
             and len(m) >= MIN_BLOCKS and len({type(b) for b in m}) == 1]
    return max(lists, key=lambda item: len(item[1])) if lists else None


def with_compiled_blocks(module: nn.Module, backend) -> nn.Module | None:
    """A copy of the module (over the same weights, nothing of it changed) whose repeated blocks are each
    torch.compile'd, or None when it has none. The copy is shallow along the path to the blocks' list."""
    found = repeated_blocks(module)
    if found is None:
        return None
    path, _ = found
    top = _copy(module)
    node = top
    for name in filter(None, path.split(".")):
        node._modules[name] = _copy(node._modules[name])
        node = node._modules[name]
    for key, block in list(node._modules.items()):
        node._modules[key] = torch.compile(block, backend=backend)
    optimized = vars(module).get("autokernel")  # optimize()'s model: its forward, with the patches, over the copy
    return optimized.over(top) if optimized is not None else top


def _copy(module: nn.Module) -> nn.Module:
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone
