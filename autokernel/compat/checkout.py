"""The checkout autokernel lives in, and its top-level modules (reference.py) when the checkout is not on sys.path.

A difference between environments: run from the checkout, `import reference` finds it; with autokernel
pip-installed in editable mode and imported from the user's own directory, it does not.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent  # the checkout autokernel/ lives in


def load_root_module(name: str):
    """A top-level module of the checkout (reference.py) when the checkout is not on sys.path: autokernel
    was pip-installed in editable mode and is imported from the user's own directory."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    if spec is None or not (ROOT / f"{name}.py").is_file():
        raise ModuleNotFoundError(f"no module named {name!r} (nor {ROOT / name}.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
