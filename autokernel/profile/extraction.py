"""Turning a plan into kernel files: a starter per planned type, carrying the model's own shapes.

The starter kernels/<type>.py (or kernels/cuda/<type>.py) is copied to workspace/kernels/NN_<type>.py,
NN being the type's rank in the plan, with its `MODEL_SHAPES = [...]` line set to the shapes the
profile recorded, the most expensive first, `MODEL_CALLS = [...]` to how often the model calls each
per forward pass, and `MODEL_SOURCE = {...}` to the model and input they were profiled on (verify.py
warns when it checks another): bench.py adds the shapes to its sweep, times the first as the primary
shape, and scores the kernel by its time in the model (sum of calls x time per call, modeltime.py).
The lines are found with `ast` (so a multi-line literal is replaced whole) and inserted after
KERNEL_TYPE when the starter has none. Nothing else in the file changes. When the plan lives in the
workspace, each extracted entry records its `kernel_file` there, which is what the loop takes.
"""

from __future__ import annotations

import ast
import pprint
from dataclasses import dataclass
from pathlib import Path

from autokernel.kernelfile import declarations
from autokernel.profile.plan import amdahl_gain

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


CALLS_NOTE = "calls per forward pass of each MODEL_SHAPES entry: the weights of the kernel's time in the model"
SOURCE_NOTE = "the model and input these shapes were profiled on (verify.py warns when it checks another)"


def model_shapes(entry: dict) -> list[dict]:
    """The entry's shapes as registry shape dicts, the most time first (plan order)."""
    return [s["shape"] for s in entry.get("shapes", []) if isinstance(s, dict) and s.get("shape")]


def model_calls(entry: dict) -> list[int]:
    """Calls per forward pass of each of model_shapes(entry); 1 where the profile recorded none."""
    return [int(s.get("calls") or 1) for s in entry.get("shapes", []) if isinstance(s, dict) and s.get("shape")]


def model_origin(plan: dict) -> dict | None:
    """MODEL_SOURCE of the kernels extracted from a plan: "<file or package>:<class>", the config, the input
    shape and dtype profile.py ran the model with. None for a plan that does not say (written by hand)."""
    if not plan.get("source") or not plan.get("class_name"):
        return None
    return {"model": f"{plan['source']}:{plan['class_name']}", "config": plan.get("config"),
            "input_shape": list(plan.get("input_shape") or []), "dtype": plan.get("dtype")}


def set_model_source(source: str, origin: dict) -> str:
    """The source with `MODEL_SOURCE = origin`, after MODEL_CALLS (or KERNEL_TYPE when it has none)."""
    anchor = "MODEL_CALLS" if _assignment(ast.parse(source), "MODEL_CALLS") else "KERNEL_TYPE"
    return _set_literal(source, "MODEL_SOURCE", origin, SOURCE_NOTE, anchor)


def set_model_shapes(source: str, shapes: list[dict], note: str = "", calls: list[int] | None = None) -> str:
    """The source with `MODEL_SHAPES = shapes` (and `MODEL_CALLS = calls`) replacing the old assignments,
    or added after KERNEL_TYPE."""
    source = _set_literal(source, "MODEL_SHAPES", shapes, note, "KERNEL_TYPE")
    if calls is not None:
        if len(calls) != len(shapes):
            raise ExtractError(f"{len(calls)} call counts for {len(shapes)} model shapes")
        source = _set_literal(source, "MODEL_CALLS", list(calls), CALLS_NOTE, "MODEL_SHAPES")
    return source


def _set_literal(source: str, name: str, value, note: str, anchor_name: str) -> str:
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    literal = pprint.pformat(value, width=100, sort_dicts=False)
    block = (f"# {note}\n" if note else "") + f"{name} = {literal}\n"
    old = _assignment(tree, name)
    if old is not None:
        first, last = _with_comment_above(lines, old.lineno - 1), old.end_lineno
        return "".join(lines[:first]) + block + "".join(lines[last:])
    anchor = _assignment(tree, anchor_name)
    if anchor is None:
        raise ExtractError(f"the starter declares no {anchor_name}")
    at = anchor.end_lineno
    gap = "\n" if anchor_name == "KERNEL_TYPE" else ""
    return "".join(lines[:at]) + gap + block + "".join(lines[at:])


def _assignment(tree: ast.Module, name: str) -> ast.Assign | None:
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node
    return None


def _with_comment_above(lines: list[str], index: int) -> int:
    """Include the "# from ..." note an earlier extraction wrote above the assignment."""
    if index > 0 and lines[index - 1].startswith(("# shapes of ", f"# {CALLS_NOTE}", f"# {SOURCE_NOTE}")):
        return index - 1
    return index


def starter_path(type_: str, backend: str, root: Path) -> Path:
    if backend not in BACKEND_DIRS:
        raise ExtractError(f"unknown backend {backend!r}; use one of {', '.join(BACKEND_DIRS)}")
    return root / BACKEND_DIRS[backend] / f"{type_}.py"


def extract(plan: dict, top: int, backend: str, out_dir: Path, root: Path) -> list[Extracted]:
    """Write kernel files for the plan's `top` best-ranked types, and for the rivals among its entries
    (with_rivals) of those chosen; a missing starter is reported, not fatal."""
    entries = _chosen(plan, top)
    chosen = {e["type"] for e in entries}
    rivals = {r["type"] for r in _rivals_of(plan, chosen)} - chosen
    entries += [e for e in plan["entries"] if e["type"] in rivals]
    if not entries:
        raise ExtractError("the plan has no kernel types to extract (did the profile attribute any time?)")
    note = (f"shapes of {plan.get('model', 'the model')}, input {plan.get('input_shape')} "
            f"{plan.get('dtype', '')}, from the profile (most time first)")
    origin = model_origin(plan)
    starters = [(entry, _starter_text(entry["type"], backend, root)) for entry in entries]  # all read, then written
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for entry, (text, problem) in starters:
        type_, rank, shapes = entry["type"], entry["rank"], model_shapes(entry)
        if text is None:
            results.append(Extracted(type_, rank, None, shapes, problem))
            continue
        out = out_dir / f"{rank:02d}_{type_}.py"
        text = set_model_shapes(text, shapes, note, model_calls(entry)) if shapes else text
        out.write_text(set_model_source(text, origin) if origin else text)
        results.append(Extracted(type_, rank, out, shapes))
    return results


def _starter_text(type_: str, backend: str, root: Path) -> tuple[str | None, str | None]:
    """(the starter's source, None), or (None, why there is none); ExtractError for a starter of another type, before
    extract() writes anything."""
    src = starter_path(type_, backend, root)
    if not src.is_file():
        return None, f"no {backend} starter for {type_} yet: {src.relative_to(root)} does not exist"
    text = src.read_text()
    declared = declarations(text, str(src)).get("KERNEL_TYPE")
    if declared != type_:
        raise ExtractError(f"{src} declares KERNEL_TYPE = {declared!r}, expected {type_!r}")
    return text, None


def with_rivals(plan: dict, top: int) -> dict:
    """The plan with entries for the rivals (plan.py's "rivals") of the opt-in types among its `top` best-ranked:
    extract() writes them beside the type they rival and the loop optimizes both, so that the night has worked on
    whichever verify's prune deploys (an HF Llama's plan holds rope_attention, and under torch.compile the prune put
    flash_attention and rotary_embedding in its place on TinyLlama, Qwen3 and GPT-NeoX). A rival the plan ranks
    already takes the rival's work into its entry (merged_rival): TinyLlama's plan ranked rotary_embedding for the
    2.9 us of one shapeless call, while the rival's 22 calls at two model shapes went unextracted and the prune then
    kept an extracted file the night had timed at its own shapes. New rivals are ranked after the plan's types."""
    chosen = {e["type"] for e in _chosen(plan, top)}
    rivals = {r["type"]: r for r in _rivals_of(plan, chosen)}
    entries = [_merged(e, rivals[e["type"]]) if e["type"] in rivals else e for e in plan["entries"]]
    listed = {e["type"] for e in entries}
    rank = max((e["rank"] for e in entries), default=0)
    added = [r for t, r in rivals.items() if t not in listed]
    return {**plan, "entries": entries + [{**r, "rank": rank + k} for k, r in enumerate(added, start=1)]}


def _merged(entry: dict, rival: dict) -> dict:
    """A ranked entry with its rival's work added (once: a plan extract.py wrote is not merged again): the time,
    share, calls and roofline's time summed, the shapes of both (the most time first), the gain of the summed share."""
    if entry.get("merged_rival") or entry.get("rival_of"):
        return entry
    shapes = list(entry.get("shapes") or [])
    own = [s.get("shape") for s in shapes]
    shapes += [s for s in rival.get("shapes") or [] if s.get("shape") not in own]
    shapes.sort(key=lambda s: -(s.get("time_us") or 0.0))  # the most time first, as the plan orders them
    total = sum(s.get("time_us") or 0.0 for s in shapes)
    shapes = [{**s, "share_of_type": (s.get("time_us") or 0.0) / total} if total else s for s in shapes]
    summed = {k: (entry.get(k) or 0) + (rival.get(k) or 0) for k in ("f", "time_us", "calls")}
    floors = [e["floor_us"] for e in (entry, rival) if e.get("floor_us") is not None]
    speedup = entry.get("s") or rival.get("s")
    gain = {"gain": amdahl_gain(summed["f"], speedup)} if speedup else {}
    return {**entry, **summed, **gain, **({"floor_us": sum(floors)} if floors else {}), "shapes": shapes,
            "rival_of": rival.get("rival_of") or [], "merged_rival": True}


def _rivals_of(plan: dict, chosen: set[str]) -> list[dict]:
    """The plan's rivals (plan.py's "rivals") of the opt-in types among `chosen`."""
    return [r for r in plan.get("rivals", []) if chosen & set(r.get("rival_of") or ())]


def _chosen(plan: dict, top: int) -> list[dict]:
    """The plan's `top` best-ranked entries, its rivals' entries (with_rivals) apart."""
    return sorted((e for e in plan["entries"] if not e.get("rival_of")), key=lambda e: e["rank"])[:top]


def record_kernel_files(plan: dict, extracted: list[Extracted], root: Path) -> dict:
    """The plan with each extracted entry's `kernel_file` (relative to root when inside it): the file the
    loop takes for that type. Entries extracted before but not now keep theirs."""
    files = {e.type: e.path for e in extracted if e.path is not None}
    entries = []
    for entry in plan["entries"]:
        path = files.get(entry["type"])
        if path is not None:
            path = path.resolve()
            entry = {**entry, "kernel_file": str(path.relative_to(root)) if path.is_relative_to(root) else str(path)}
        entries.append(entry)
    return {**plan, "entries": entries}


# ------------------------------------------------------------------------------ regions
REGION_SPEEDUP = 1.5  # a region's expected speedup over eager until its kernel is measured: a fused chain of ops


def extract_regions(plan: dict, top: int, out_dir: Path, root: Path) -> list[Extracted]:
    """For the plan's `top` largest regions no type covers (profile.py --regions) that can be made kernels: the
    region's type module, workspace/regions/<name>.py (read-only), and its starter, out_dir/RNN_<name>.py (NN its
    rank among the regions). A larger region without a starter (one that makes tensors of its own, integer inputs,
    too many outputs, so far) is passed over and reported with why (its path None), largest first."""
    from autokernel.profile import regionkernel
    from autokernel.types import _region as regiontype

    model, origin = plan.get("model", "the model"), model_origin(plan)
    results = []
    for k, region in enumerate(cut_regions(plan), start=1):
        if sum(r.path is not None for r in results) == top:
            break
        type_ = regiontype.type_name(region)
        shapes = [{"M": regiontype.rows_of(region)}]
        module = regiontype.module_path(type_, root)
        try:
            starter = regionkernel.starter_source(region, type_, module.stem, model)
            text = regiontype.module_source(region, model)
        except ValueError as e:
            results.append(Extracted(type_, k, None, shapes, f"no starter for region {region['name']}: {e}"))
            continue
        _write_read_only(module, text)
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / f"R{k:02d}_{module.stem}.py"
        starter = set_model_shapes(starter, shapes, f"the region's rows in {model}", [max(1, round(region["calls"]))])
        out.write_text(set_model_source(starter, origin) if origin else starter)
        results.append(Extracted(type_, k, out, shapes))
    return results


def cut_regions(plan: dict) -> list[dict]:
    """The plan's regions whose subgraph could be cut out, the largest first: those extract can make types of (an
    extern call, attention or a GEMM, has none)."""
    return [region for region in plan.get("regions", []) if region.get("code")]


def region_entries(plan: dict, extracted: list[Extracted]) -> list[dict]:
    """Plan entries for the region kernels written, ranked after the plan's types: what the loop takes."""
    from autokernel.profile.plan import amdahl_gain

    regions = {r.type: (r, region) for r, region in zip(extracted, cut_regions(plan)) if r.path is not None}
    rank = max((e["rank"] for e in plan["entries"]), default=0)
    return [{"type": type_, "rank": rank + k, "f": region["f"], "s": REGION_SPEEDUP, "s_source": "default",
             "gain": amdahl_gain(region["f"], REGION_SPEEDUP), "time_us": region["time_us"], "calls": region["calls"],
             "shapes": [{"shape": r.shapes[0], "calls": region["calls"], "time_us": region["time_us"]}],
             "region": region["name"]}
            for k, (type_, (r, region)) in enumerate(regions.items(), start=1)]


def _write_read_only(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.chmod(0o644)
    path.write_text(text)
    path.chmod(0o444)  # the region's oracle: an agent edits kernel files, not this
