"""`autokernel.optimize(model)`: the model with the night's verified kernels in place, in the user's own code.

    import autokernel
    model = autokernel.optimize(model)                    # workspace/kernels, every type
    model = torch.compile(autokernel.optimize(model))     # the kernels are graph nodes: no graph break

For each kernel type the best file is taken (the loop's winner, else the extracted starter, else the
shipped starter: autokernel/ops/customops.py), plugged into its op, and swapped into the model site by
site (autokernel/ops/swap.py), with the same per-site fallbacks verify.py reports: a module or call the
kernel does not cover runs the original code. The returned module is a copy of the model's module
tree over the same weights (no weight is copied): the original keeps working unchanged beside it.
One line says what was swapped (`quiet=True` keeps it for `model.autokernel.summary`).

verify.py proves the result correct and faster; this function trusts the files it is given, and follows
the prune of verify.py's report beside them (workspace/verify.json) when it is about this model's class. It
warns (Python's warnings, unless quiet; `model.autokernel.warnings` either way) of a kernel file extracted for
another model (its MODEL_SOURCE, compared as verify.py compares it: autokernel.profile.plan.other_model) and of
a report about another model, whose prune it does not follow. On a
machine without a GPU the kernels run only through Triton's interpreter (TRITON_INTERPRET=1, set
before any kernel file is imported); without it a CPU model is returned as it is, and the line says why.
"""

from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import Iterable
from pathlib import Path

import torch.nn as nn

from autokernel import compat
from autokernel.ops import customops, swap

DEFAULT_KERNELS = Path("workspace") / "kernels"  # relative to the working directory, where the loop writes
STARTERS = compat.ROOT / "kernels"  # the shipped starters, for types without a file in the kernels directory


def optimize(model: nn.Module, kernels: str | Path = DEFAULT_KERNELS, types: Iterable[str] | None = None, *,
             exclude: Iterable[str] = (), compiled_types: Iterable[str] | None = None,
             graphed_types: Iterable[str] | None = None, verified: str | Path | None = "auto",
             starters: str | Path | None = STARTERS, quiet: bool = False) -> nn.Module:
    """The model with the kernels of `types` (default: every type with a file) in place; see the module doc.

    exclude: types to leave out. compiled_types: the types that run where torch.compile traces the model
    (default: `types`; a kernel can win eagerly and lose against Inductor's fused code). graphed_types: the types
    that run where a CUDA graph captures an eager forward (default: `types`; a kernel can save GPU time and cost a
    host-bound forward more launch time than it saves). verified: a verify.py report (workspace/verify.json) whose
    prune to follow: the types it left out for this model class are left out too, eagerly, in CUDA graphs and
    under torch.compile as it decided for each (default "auto": the report beside
    the kernels directory, if it is about this model's class; None: none). starters: where types without a
    file in `kernels` fall back to (None: no fallback, only the files in `kernels`)."""
    if isinstance(getattr(model, "autokernel", None), swap.Optimized):  # optimized before: start from the original
        model = model.autokernel.original
    if _device_type(model) == "cpu" and not compat.interpreting():
        why = "left as it is: Triton kernels need a CUDA device (or TRITON_INTERPRET=1 for the CPU interpreter)"
        _say(f"autokernel: {type(model).__name__} {why}", quiet)
        return model
    if verified == "auto":  # the report verify.py writes beside its kernels directory, if there is one
        verified = Path(kernels).parent / "verify.json"
        verified = verified if verified.is_file() else None
    report = json.loads(Path(verified).read_text()) if verified is not None else None  # read once, used twice
    pruned, pruned_traced, eagerly = verified_prune(model, report) if report is not None else ({}, {}, {})
    types = None if types is None else list(types)
    compiled_types = types if compiled_types is None else list(compiled_types)
    graphed_types = types if graphed_types is None else list(graphed_types)
    wanted = None if types is None else list(dict.fromkeys([*types, *compiled_types, *graphed_types]))  # each once
    choices = load_kernels(kernels, wanted, starters, [*exclude, *(set(pruned) & set(pruned_traced))])
    graphed = [t for t in choices if (graphed_types is None or t in graphed_types) and t not in pruned]
    eager = [t for t in choices if (types is None or t in types) and t not in pruned and t not in eagerly]
    traced = [t for t in choices if (compiled_types is None or t in compiled_types) and t not in pruned_traced]
    optimized = swap.build(model, eager, traced=traced, graphed=graphed).module()
    optimized.autokernel.choices = choices  # type -> KernelChoice: which file, and from where
    optimized.autokernel.left_out = pruned  # type -> why verify.py left it out
    optimized.autokernel.left_out_eagerly = eagerly  # type -> why verify.py left it out of eager calls (graphs run it)
    optimized.autokernel.left_out_compiled = pruned_traced  # type -> why verify.py left it out under compile
    optimized.autokernel.summary = summary_line(model, optimized.autokernel, choices)
    optimized.autokernel.warnings = origin_lines(model, choices) + report_lines(model, verified, report)
    _say(optimized.autokernel.summary, quiet)
    for line in optimized.autokernel.warnings if not quiet else ():
        warnings.warn(line, UserWarning, stacklevel=2)
    return optimized


def load_kernels(kernels: str | Path, types: Iterable[str] | None = None, starters: str | Path | None = STARTERS,
                 exclude: Iterable[str] = (), winners: bool = True) -> dict[str, customops.KernelChoice]:
    """The best file of every type, each imported and plugged into its op (type -> KernelChoice); winners=False
    takes the files the loop began from, not its *_optimized winners."""
    types = [t for t in types if t not in exclude] if types is not None else None
    nowhere = Path(kernels) / "__no_starters__"  # no starters wanted: a directory that holds none
    choices = customops.find_kernels(Path(kernels), Path(starters) if starters else nowhere, types, entries(),
                                     winners)
    choices = {t: c for t, c in choices.items() if t not in set(exclude)}
    for choice in choices.values():
        customops.load(choice)
    return choices


def entries() -> dict:
    """Type -> registry entry of every type verify.py can plug in (its entry has a deployment). The exported
    package has no registry: there the built-in types its runtime carries (autokernel/types/) are all."""
    try:
        from autokernel import registry
    except ImportError:
        from autokernel import types

        return {spec.name: spec for spec in types.builtin() if spec.deployment is not None}
    return registry.specs_where("deployment")


def verified_prune(model: nn.Module, found: dict) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """({type: why} left out eagerly and in CUDA graphs, {type: why} left out under torch.compile, {type: why} left
    out of eager calls alone, CUDA graphs running it) by a verify.py report (its JSON) for this model's class (({},
    {}, {}) if the report is about another).

    A report is followed only when it is about a model of this class that passed: the prune was timed
    on that model in the mode it is deployed in, and a kernel it left out makes the model slower there.
    A prune in modes of one side (eager, graph; compile, compile_graph) decided both sets, one in modes of both
    sides decided each set in its own."""
    if _report_model(found) != type(model).__name__ or found.get("correctness", {}).get("status") != "PASS":
        return {}, {}, {}
    prune = found.get("prune", {})
    modes = prune.get("mode", "eager").split(",")
    # verification.sides(), which this module cannot import: it is copied into exported packages without it
    sides = [[m for m in modes if m.startswith("compile") == compiled] for compiled in (False, True)]
    # types no site of the model ran when it was checked: verify timed the model without them, so it runs without them
    idle = dict.fromkeys(found.get("unused_types", []), "no site of this model ran it when verify.py checked it")
    eagerly = _left_out(prune.get("left_out_eagerly", {}), ["eager"])
    if not all(sides):  # modes of one side decided both
        return (*({**idle, **_left_out(found.get("pruned", {}), modes)},) * 2, eagerly)
    return ({**idle, **_left_out(found.get("pruned", {}), sides[0])},
            {**idle, **_left_out(prune.get("left_out_compiled", {}), sides[1])}, eagerly)


def _report_model(found: dict) -> str:
    """The class of the model a verify.py report is about ("LlamaModel (1.1M parameters)" -> LlamaModel)."""
    return str(found.get("model", "")).split(" (")[0]


def report_lines(model: nn.Module, path: str | Path | None, found: dict | None) -> list[str]:
    """A warning line when verify.py's report (found, read from path) is about another model's class: its prune is
    not followed."""
    if found is None:
        return []
    about = _report_model(found)
    if about == type(model).__name__:
        return []
    return [f"warning: {path} is verify.py's report on {about or 'an unnamed model'}, not on this "
            f"{_model_name(model)}: its prune is not followed (run verify.py on this model)"]


def origin_lines(model: nn.Module, choices: dict) -> list[str]:
    """One warning line per kernel file extracted for another model than `model` (its MODEL_SOURCE against what
    the model object tells of itself, model_record), naming both. None in an exported package: it carries no
    plan module, and its kernels are the ones verify.py checked."""
    try:
        from autokernel.profile.plan import describe_origin, kernel_origin, other_model
    except ImportError:
        return []
    lines = []
    for choice in choices.values():
        origin = kernel_origin(choice.path)
        if origin is not None and other_model(origin, model_record(model, origin)) == "model":
            lines.append(f"warning: {Path(choice.path).name} was extracted for {describe_origin(origin)}, not for "
                         f"this {_model_name(model)}: its shapes and tuning are another model's (run profile.py "
                         "and extract.py for this model)")
    return lines


def model_record(model: nn.Module, like: dict) -> dict:
    """`model` in MODEL_SOURCE's form, to compare with `like` (a kernel file's MODEL_SOURCE): what the object tells
    of itself (for a model from a file, the file its class is defined in and the class; for one from a package,
    the package and a transformers model's config name), and like's own value for what it cannot tell (a preset's
    name, the class an Auto class stands for, the input), so that only what is known is compared."""
    source, _, class_name = str(like.get("model", "")).rpartition(":")
    cls, config = type(model), like.get("config")
    if source.endswith(".py"):
        source, class_name = _class_file(cls) or source, cls.__name__
    else:
        source = cls.__module__.split(".")[0]
        config = getattr(getattr(model, "config", None), "name_or_path", None) or config
    return {**like, "model": f"{source}:{class_name}", "config": config}


def _class_file(cls: type) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except TypeError:  # defined where no file is (an interactive session)
        return None


def _model_name(model: nn.Module) -> str:
    """"GPT2Model (models/gpt2.py)": the class and where it is defined."""
    where = _class_file(type(model)) or type(model).__module__
    return f"{type(model).__name__} ({_shown_path(where)})"


def _shown_path(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path


def _left_out(pruned: dict, modes: list[str]) -> dict[str, str]:
    return {t: f"verify.py left it out ({' and '.join(modes)} mode): {why}" for t, why in pruned.items()}


def summary_line(model: nn.Module, optimized: swap.Optimized, choices: dict) -> str:
    """One line: each type swapped in (its file's origin) and what it replaces; the types with no site, and
    those verify.py's prune left out."""
    planned = optimized.planned()
    swapped = "; ".join(f"{t} ({choices[t].source}): {', '.join(what)}" for t, what in planned.items())
    others = [o.planned() for o in (optimized.traced, optimized.graphed) if o is not None]
    idle = sorted(set(choices) - set(planned).union(*others))
    tail = f"; no site for {', '.join(idle)}" if idle else ""
    left_out = getattr(optimized, "left_out", {})
    tail += f"; left out as verify.py decided: {', '.join(left_out)}" if left_out else ""
    if sorted(optimized.traced_types()) != sorted(optimized.types):
        tail += f"; under torch.compile: {', '.join(optimized.traced_types()) or 'no kernel'}"
    if sorted(optimized.graphed_types()) != sorted(optimized.types):
        tail += f"; in CUDA graphs: {', '.join(optimized.graphed_types()) or 'no kernel'}"
    return f"autokernel: {type(model).__name__} with {swapped or 'no kernel'}{tail}"


def _device_type(model: nn.Module) -> str:
    p = next(model.parameters(), None)
    return p.device.type if p is not None else "cpu"


def _say(line: str, quiet: bool) -> None:
    if not quiet:
        print(line)
