"""`autokernel.optimize(model)`: the model with the night's verified kernels in place, in the user's own code.

    import autokernel
    model = autokernel.optimize(model)                    # workspace/kernels, every type
    model = torch.compile(autokernel.optimize(model))     # the kernels are graph nodes: no graph break

For each kernel type the best file is taken (the loop's winner, else the extracted starter, else the
shipped starter: autokernel/customops.py), plugged into its op, and swapped into the model site by
site (autokernel/swap.py), with the same per-site fallbacks verify.py reports: a module or call the
kernel does not cover runs the original code. The returned module is a copy of the model's module
tree over the same weights (no weight is copied): the original keeps working unchanged beside it.
One line says what was swapped (`quiet=True` keeps it for `model.autokernel.summary`).

verify.py proves the result correct and faster; this function trusts the files it is given. On a
machine without a GPU the kernels run only through Triton's interpreter (TRITON_INTERPRET=1, set
before any kernel file is imported); without it a CPU model is returned as it is, and the line says why.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch.nn as nn

from autokernel import compat, customops, swap

DEFAULT_KERNELS = Path("workspace") / "kernels"  # relative to the working directory, where the loop writes
STARTERS = compat.ROOT / "kernels"  # the shipped starters, for types without a file in the kernels directory


def optimize(model: nn.Module, kernels: str | Path = DEFAULT_KERNELS, types: Iterable[str] | None = None, *,
             exclude: Iterable[str] = (), starters: str | Path | None = STARTERS, quiet: bool = False) -> nn.Module:
    """The model with the kernels of `types` (default: every type with a file) in place; see the module doc.

    exclude: types to leave out (those verify.py pruned, say); starters: where types without a file in
    `kernels` fall back to (None: no fallback, only the files in `kernels`)."""
    if _device_type(model) == "cpu" and not compat.interpreting():
        why = "left as it is: Triton kernels need a CUDA device (or TRITON_INTERPRET=1 for the CPU interpreter)"
        _say(f"autokernel: {type(model).__name__} {why}", quiet)
        return model
    choices = load_kernels(kernels, types, starters, exclude)
    optimized = swap.build(model, list(choices)).module()
    optimized.autokernel.choices = choices  # type -> KernelChoice: which file, and from where
    optimized.autokernel.summary = summary_line(model, optimized.autokernel, choices)
    _say(optimized.autokernel.summary, quiet)
    return optimized


def load_kernels(kernels: str | Path, types: Iterable[str] | None = None, starters: str | Path | None = STARTERS,
                 exclude: Iterable[str] = ()) -> dict[str, customops.KernelChoice]:
    """The best file of every type, each imported and plugged into its op (type -> KernelChoice)."""
    types = [t for t in types if t not in exclude] if types is not None else None
    nowhere = Path(kernels) / "__no_starters__"  # no starters wanted: a directory that holds none
    choices = customops.find_kernels(Path(kernels), Path(starters) if starters else nowhere, types)
    choices = {t: c for t, c in choices.items() if t not in set(exclude)}
    for choice in choices.values():
        customops.load(choice)
    return choices


def summary_line(model: nn.Module, optimized: swap.Optimized, choices: dict) -> str:
    """One line: each type swapped in (its file's origin) and what it replaces; the types with no site."""
    planned = optimized.planned()
    swapped = "; ".join(f"{t} ({choices[t].source}): {', '.join(what)}" for t, what in planned.items())
    idle = sorted(set(choices) - set(planned))
    tail = f"; no site for {', '.join(idle)}" if idle else ""
    return f"autokernel: {type(model).__name__} with {swapped or 'no kernel'}{tail}"


def _device_type(model: nn.Module) -> str:
    p = next(model.parameters(), None)
    return p.device.type if p is not None else "cpu"


def _say(line: str, quiet: bool) -> None:
    if not quiet:
        print(line)
