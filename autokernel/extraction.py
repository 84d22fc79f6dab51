"""Turning a plan into kernel files: a starter per planned type, carrying the model's own shapes.

The starter kernels/<type>.py (or kernels/cuda/<type>.py) is copied to workspace/kernels/NN_<type>.py,
NN being the type's rank in the plan, with its `MODEL_SHAPES = [...]` line set to the shapes the
profile recorded, the most expensive first: bench.py adds them to its sweep and times the first as
the primary shape. The line is found with `ast` (so a multi-line literal is replaced whole) and
inserted after KERNEL_TYPE when the starter has none. Nothing else in the file changes.
"""

from __future__ import annotations

import ast
import pprint
from dataclasses import dataclass
from pathlib import Path

from autokernel.kernelfile import declarations

BACKEND_DIRS = {"triton": Path("kernels"), "cuda": Path("kernels/cuda")}


class ExtractError(Exception):
    """The plan or a starter cannot be turned into a kernel file; the message says why."""


@dataclass
class Extracted:
    type: str
    rank: int
    path: Path | None  # None when there is no starter to copy
    shapes: list
    problem: str = ""


def model_shapes(entry: dict) -> list[dict]:
    """The entry's shapes as registry shape dicts, the most time first (plan order)."""
    return [s["shape"] for s in entry.get("shapes", []) if isinstance(s, dict) and s.get("shape")]


def set_model_shapes(source: str, shapes: list[dict], note: str = "") -> str:
    """The source with `MODEL_SHAPES = shapes` replacing the old assignment, or added after KERNEL_TYPE."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    literal = pprint.pformat(shapes, width=100, sort_dicts=False)
    block = (f"# {note}\n" if note else "") + f"MODEL_SHAPES = {literal}\n"
    old = _assignment(tree, "MODEL_SHAPES")
    if old is not None:
        first, last = _with_comment_above(lines, old.lineno - 1), old.end_lineno
        return "".join(lines[:first]) + block + "".join(lines[last:])
    anchor = _assignment(tree, "KERNEL_TYPE")
    if anchor is None:
        raise ExtractError("the starter declares no KERNEL_TYPE")
    at = anchor.end_lineno
    return "".join(lines[:at]) + "\n" + block + "".join(lines[at:])


def _assignment(tree: ast.Module, name: str) -> ast.Assign | None:
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node
    return None


def _with_comment_above(lines: list[str], index: int) -> int:
    """Include the "# from ..." note an earlier extraction wrote above the assignment."""
    if index > 0 and lines[index - 1].startswith("# shapes of "):
        return index - 1
    return index


def starter_path(type_: str, backend: str, root: Path) -> Path:
    if backend not in BACKEND_DIRS:
        raise ExtractError(f"unknown backend {backend!r}; use one of {', '.join(BACKEND_DIRS)}")
    return root / BACKEND_DIRS[backend] / f"{type_}.py"


def extract(plan: dict, top: int, backend: str, out_dir: Path, root: Path) -> list[Extracted]:
    """Write kernel files for the plan's `top` best-ranked types; a missing starter is reported, not fatal."""
    entries = sorted(plan["entries"], key=lambda e: e["rank"])[:top]
    if not entries:
        raise ExtractError("the plan has no kernel types to extract (did the profile attribute any time?)")
    note = (f"shapes of {plan.get('model', 'the model')}, input {plan.get('input_shape')} "
            f"{plan.get('dtype', '')}, from the profile (most time first)")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for entry in entries:
        type_, rank, shapes = entry["type"], entry["rank"], model_shapes(entry)
        src = starter_path(type_, backend, root)
        if not src.is_file():
            problem = f"no {backend} starter for {type_} yet: {src.relative_to(root)} does not exist"
            results.append(Extracted(type_, rank, None, shapes, problem))
            continue
        text = src.read_text()
        declared = declarations(text, str(src)).get("KERNEL_TYPE")
        if declared != type_:
            raise ExtractError(f"{src} declares KERNEL_TYPE = {declared!r}, expected {type_!r}")
        out = out_dir / f"{rank:02d}_{type_}.py"
        out.write_text(set_model_shapes(text, shapes, note) if shapes else text)
        results.append(Extracted(type_, rank, out, shapes))
    return results
