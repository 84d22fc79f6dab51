"""Which model a kernel file was extracted for, against the model verify.py verifies: a warning per mismatch."""

from __future__ import annotations

from pathlib import Path

from autokernel.kernelfile import KernelFileError, declarations
from autokernel.profile.extraction import model_origin, model_shapes
from autokernel.profile.plan import describe_input, describe_origin, other_model


def origin_warnings(files: dict[str, Path], verified: dict, plan: dict | None = None) -> list[str]:
    """One line per kernel file whose MODEL_SOURCE (extract.py's record, autokernel.profile.extraction.model_origin)
    names another model than the one verified, or this model at another input shape or dtype. files: the
    name to show -> the file; verified: the model being verified, in MODEL_SOURCE's form. A file without
    MODEL_SOURCE (extracted before it existed) is checked by its MODEL_SHAPES against `plan`, when the plan
    (workspace/plan.json) profiled this model: none of them among the plan's shapes of its type is a line
    too. A starter declares neither, and nothing is said of it."""
    lines = []
    for name, path in files.items():
        try:
            decl = declarations(Path(path).read_text(), Path(path).name)
        except (OSError, KernelFileError):
            continue
        origin = decl.get("MODEL_SOURCE")
        if not isinstance(origin, dict):
            if _profiled_elsewhere(decl, verified, plan):
                lines.append(f"warning: {name} carries none of the shapes profiled for {describe_origin(verified)} "
                             "(workspace/plan.json): it was extracted for another model or input")
            continue
        differs = other_model(origin, verified)
        if differs == "model":
            lines.append(f"warning: {name} was extracted for {describe_origin(origin)}, not for "
                         f"{describe_origin(verified)}: its shapes and tuning are another model's (run profile.py "
                         "and extract.py for this one)")
        elif differs == "input":
            lines.append(f"warning: {name} was extracted for this model at input {describe_input(origin)}, "
                         f"verified at {describe_input(verified)}: its shapes and tuning are another input's")
    return lines


def _profiled_elsewhere(decl: dict, verified: dict, plan: dict | None) -> bool:
    """A file's MODEL_SHAPES are none of the shapes a plan of this very model and input profiled for its type."""
    planned = model_origin(plan or {})
    if not decl.get("MODEL_SHAPES") or planned is None or other_model(planned, verified) is not None:
        return False
    shapes = [s for e in plan.get("entries", []) if e.get("type") == decl.get("KERNEL_TYPE") for s in model_shapes(e)]
    return bool(shapes) and not any(s in shapes for s in decl["MODEL_SHAPES"])
