"""The built-in kernel types, one module each: `autokernel/types/<name>.py` holds everything anyone needs to know
about the type (its reference, inputs, shapes, tolerances, byte/FLOP model, profiler rules, op schema, model sites
and suite target) as a module-level `SPEC`, beside its starter files kernels/<name>.py (and kernels/cuda/<name>.py).
Modules whose name starts with "_" hold what several types share.

Adding a type is adding its module here and its starter: `builtin()` finds every module of this package, and the
registry (autokernel/registry.py) collects them; no other file names a type.
"""

from __future__ import annotations

import importlib
import pkgutil


def builtin() -> list:
    """Every type module's SPEC, in the order of their names."""
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
    return [importlib.import_module(f"{__name__}.{name}").SPEC for name in names]


def module_path(name: str):
    """The file of a built-in type's module (read by the agents' prompts without importing it), or None."""
    from pathlib import Path

    path = Path(__file__).resolve().parent / f"{name}.py"
    return path if path.is_file() and not name.startswith("_") else None
