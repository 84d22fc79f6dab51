"""verify.py's work as a library call: check the model with the kernels plugged in against the original, prune
the types it is faster without in the mode it is deployed in, time every row, compare with other kernel
files in turns, export the kept kernels. `verify(Request(...))` returns the report verify.py prints and writes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from autokernel import cli, compat
from autokernel.cli import DEPLOY_MODES
from autokernel.compat import ROOT
from autokernel.verify import noise

CHECK_INPUTS = 3  # fresh inputs the optimized model must match the original on (endtoend.CHECK_INPUTS)
DEFAULT_KERNELS = ROOT / "workspace" / "kernels"


@dataclass
class Request:
    """What to verify, with verify.py's defaults: the model (a file and class, or a package), its input, where
    the kernels are, what to time and in which deploy mode, and what to compare and export."""
    class_name: str
    model: str | None = None
    module: str | None = None
    config: str | None = None
    pretrained: bool = False
    input_shape: str = "1,512"
    dtype: str = "fp16"
    device: str = "auto"
    kernels: Path = DEFAULT_KERNELS
    types: str = ""  # comma-separated; empty: every type
    checks: int = CHECK_INPUTS
    no_timing: bool = False
    compile: bool = False
    cuda_graph: bool = False
    deploy: str | None = None  # a mode, or an eager and a compiled one ("eager,compile"); None: from the flags
    keep_all: bool = False
    fresh: bool = False  # decide every prune verdict afresh, holding none from earlier runs (recall.py)
    shallow_trials: bool = True  # the compiled prune's trials compile the model cut to 1 and 2 blocks
    compile_ahead: bool = True  # with compile: a second process compiles the compiled prune's next models (ahead.py)
    against: str | None = None  # "extracted", "starters" or a directory
    generate: int = 0  # new tokens of a timed generate() with a static cache (generation.py); 0: none
    export: Path | None = None
    package_name: str = "autokernel_kernels"
    command: str = ""  # how the run was asked for, recorded in the report


def _pick_device(requested) -> str:
    """cuda or cpu; on the CPU, Triton's interpreter is switched on before any kernel file is imported."""
    from autokernel.harness import gpu

    device = gpu.pick_device(requested)
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # read when a kernel file's @triton.jit runs: set it first
        from autokernel.compat import prepare_interpreter

        prepare_interpreter()
    return device


def deploy_mode(request: Request) -> str:
    """The modes the prune times: --deploy, else every mode the flags time (eager; graph with --cuda-graph;
    compile with --compile; compile_graph with both): the optimized model is never slower in any row verify
    reports."""
    if request.deploy:
        return ",".join(deploy_modes(request.deploy))
    modes = ["eager", "graph"] if request.cuda_graph else ["eager"]
    if request.compile:
        modes += ["compile", "compile_graph"] if request.cuda_graph else ["compile"]
    return ",".join(modes)


def deploy_modes(modes: str) -> list[str]:
    """"eager", "eager,compile_graph", "eager,graph,compile,compile_graph", ...: the modes the model runs in, each
    once, in DEPLOY_MODES' order. The eager ones (eager, graph) decide the kernels that run eagerly, the compiled
    ones (compile, compile_graph) those that run where torch.compile traces the model; modes of one side alone
    decide both."""
    found = [m.strip() for m in modes.split(",") if m.strip()]
    unknown = [m for m in found if m not in DEPLOY_MODES]
    if unknown or not found:
        raise ValueError(f"deploy mode {unknown[0] if unknown else modes!r}: one or more of "
                         f"{', '.join(DEPLOY_MODES)}, joined by commas")
    if len(set(found)) != len(found):
        raise ValueError(f"deploy modes {modes!r}: each mode once")
    return sorted(found, key=DEPLOY_MODES.index)


def sides(modes: list[str]) -> tuple[list[str], list[str]]:
    """(the eager modes, the compiled modes) of deploy modes: each side decides the kernels that run in it."""
    return [m for m in modes if not m.startswith("compile")], [m for m in modes if m.startswith("compile")]


def verify(request: Request) -> dict:
    """The report of one verification (what verify.py prints, and writes as JSON)."""
    mode, device = _checked(request)  # bad input fails before torch's import, the model's load and any write
    import torch

    from autokernel.models import parse_shape
    from autokernel.registry import parse_dtype
    from autokernel.verify import endtoend, regionverify

    dtype, shape = parse_dtype(request.dtype), parse_shape(request.input_shape)
    step = Steps()
    step("loading the model and placing the kernels")
    if request.compile and device == "cuda":
        compat.check_cpu_isas()  # while the model loads: else in the prune's first compile, one after another
    with torch.no_grad(), contextlib.ExitStack() as stack:
        model, optimized, inputs, helpers = _loaded_with_helpers(request, device, mode, stack)
        choices = optimized.choices
        warnings = _origin_warnings(request, choices, shape, dtype)
        step(f"checking the outputs on {request.checks} input{'s' * (request.checks > 1)}")
        correctness = endtoend.check(model, optimized, inputs, dtype, request.checks)
        sites = [s.to_dict() for s in optimized.sites()]  # calls counted over the checked forwards only
        checked_types = optimized.swapped_types()
        passed = correctness["status"] == "PASS"
        measured = _measure(request, model, optimized, choices, inputs, device, mode, passed, helpers, step)
        checked_types = sorted({*checked_types, *measured["adopted"]})
        step("checking the region kernels under torch.compile" if request.compile and passed else None)
        regions = regionverify.verify_in_report(request, model, checked_types, measured, inputs, device,
                                                compiled_alone=not sides(deploy_modes(mode))[0]) \
            if request.compile and passed else None
    step(None)
    _mark_pruned(sites, measured["pruned"])
    kept = [t for t in checked_types if t not in measured["pruned"]]
    kept_traced = [t for t in checked_types if t not in measured["pruned_traced"]]
    kept_eagerly = [t for t in kept if t not in measured["pruned_eagerly"]]
    exported = _export(request, choices, kept_eagerly, kept_traced, kept) \
        if request.export and correctness["status"] == "PASS" else None
    return {
        **_about(request, model, device, shape, dtype), "origin_warnings": warnings, "sites": sites,
        "kernels": {t: {"path": _rel(c.path), "source": c.source, "passed_over": [_rel(p) for p in c.passed_over]}
                    for t, c in choices.items()},
        "swapped_types": kept, "pruned": measured["pruned"],
        "compiled_types": kept_traced,  # the types that run where torch.compile traces the model
        "prune": {"mode": mode, "decided": measured["decided"], "left_out": measured["pruned"],
                  "left_out_compiled": measured["pruned_traced"],  # under torch.compile: decided apart when `split`
                  # kept for CUDA graphs, left out of eager calls without one (pruning._eager_alone)
                  "left_out_eagerly": measured["pruned_eagerly"],
                  "split": all(sides(mode.split(","))), "decisions": measured["decisions"]},
        "unused_types": sorted(set(choices) - set(checked_types)), "correctness": correctness,
        **{key: measured[key] for key in ("timing", "timing_errors", "against", "graph", "generation")},
        "export": exported,
        "disagreements": disagreements(measured["decisions"], measured["timing"]),
        "regions": regions,  # region kernels under torch.compile (regionverify.py), None without any or --compile
        "compile_backend": endtoend.backend_for(device), "torch": torch.__version__, "triton": _triton_version(),
        "command": request.command, "steps_s": step.seconds,
        "compiling_ahead": helpers.timeline if helpers is not None else None,  # the helper's jobs and the prune's waits
    }


class Steps:
    """verify's steps, each announced as it begins with the time spent so far ("[1m05s] timing the rows"), their
    seconds kept for the report (steps_s): where a long run's time goes. step(None) ends the last one."""

    def __init__(self):
        self.started, self.seconds, self.step, self.at = time.monotonic(), {}, None, 0.0

    def __call__(self, step: str | None) -> None:
        now = time.monotonic()
        if self.step:
            self.seconds[self.step] = round(self.seconds.get(self.step, 0.0) + now - self.at, 1)
        self.step, self.at = step, now
        if step:
            _progress(f"[{duration(now - self.started)}] {step}")


def duration(seconds: float) -> str:
    """'1m05s'."""
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _loaded_with_helpers(request: Request, device: str, mode: str, stack: contextlib.ExitStack) -> tuple:
    """loaded()'s (model, optimized, inputs), and the helpers that compile ahead (ahead.started, or None) on stack:
    started before the load, where the weights can be counted before (ahead.weights_to_load), so that they load their
    copies while this process loads its own, else after it; told the compiled side's first models once it is loaded,
    so that they compile while the outputs are checked."""
    from autokernel.verify import ahead, pruning

    weights = ahead.weights_to_load(request) if ahead.wanted(request, device, mode) else None
    helpers = None if weights is None else stack.enter_context(ahead.started(request, device, mode, _progress,
                                                                             weights))
    model, optimized, inputs = loaded(request, device)  # optimize()'s choices: the prune decides afresh
    if weights is None:
        helpers = stack.enter_context(ahead.started(request, device, mode, _progress, ahead.weights_bytes(model),
                                                    loaded=True))
    if helpers is not None:
        pruning.plan_ahead(helpers, model, optimized, request.shallow_trials)
    return model, optimized, inputs, helpers


def loaded(request: Request, device: str) -> tuple:
    """(the model, optimize()'s swap.Optimized of it, inputs(seed) -> its forward's arguments) as verify() loads
    them; the helper that compiles ahead (ahead.py) loads them alike, so that it compiles the prune's models."""
    import torch

    from autokernel.models import load_model, parse_shape
    from autokernel.registry import parse_dtype
    from autokernel.verify.deploy import optimize

    dtype, shape = parse_dtype(request.dtype), parse_shape(request.input_shape)
    model = load_model(request.class_name, model_file=request.model, module=request.module, config=request.config,
                       pretrained=request.pretrained, device=device, dtype=dtype)
    with torch.no_grad():
        optimized = optimize(model, request.kernels, _kernel_types(request), starters=ROOT / "kernels", verified=None,
                             quiet=True).autokernel
    return model, optimized, lambda seed: _inputs(model, shape, device, dtype, seed)


def _checked(request: Request) -> tuple[str, str]:
    """(the deploy mode, the device) once every argument that needs no model is checked; UsageError or
    ValueError (one line, verify.py's exit code 2) for the first that is wrong."""
    cli.check_model_arguments(request)  # before torch's import: bad input fails at once
    mode = deploy_mode(request)
    if request.checks < 1:
        raise cli.UsageError("--checks must be at least 1")
    if request.generate < 0:
        raise cli.UsageError("--generate takes a number of new tokens, 0 or more")
    if not request.kernels.is_dir() and request.kernels != DEFAULT_KERNELS:
        raise cli.UsageError(f"--kernels {request.kernels}: no such directory")
    if request.export and not (request.package_name.isidentifier() and request.package_name.isascii()):
        raise cli.UsageError(f"--package-name {request.package_name!r} is not a Python identifier")
    device = _pick_device(request.device)
    if request.against:
        _against_dir(request)
    return mode, device


def _kernel_types(request: Request) -> list[str] | None:
    """--types, each a type verify.py can plug in and named once; None (every type) when not given."""
    from autokernel.verify.deploy import entries

    return cli.kernel_types(request.types, entries()) or None


def _origin_warnings(request: Request, choices: dict, shape, dtype) -> list[str]:
    """A line per kernel file extracted for another model or input than this one (endtoend.origin_warnings, with
    extract.py's plan beside the kernels for files older than MODEL_SOURCE), printed at once: the checks and the
    timing take minutes on a large model."""
    from autokernel.profile.extraction import model_origin
    from autokernel.registry import dtype_name
    from autokernel.verify import endtoend

    this_model = model_origin({"source": request.model or request.module, "class_name": request.class_name,
                               "config": request.config, "input_shape": list(shape), "dtype": dtype_name(dtype)})
    plan_path = request.kernels.parent / "plan.json"
    plan = json.loads(plan_path.read_text()) if plan_path.is_file() else None
    warnings = endtoend.origin_warnings({_rel(c.path): c.path for c in choices.values()}, this_model, plan)
    for line in warnings:
        print(line, flush=True)
    return warnings


def _measure(request: Request, model, optimized, choices: dict, inputs, device: str, mode: str, passed: bool,
             ahead=None, step=lambda what: None) -> dict:
    """What is timed of a model that passed its check: the prune (on a GPU, unless --keep-all), the timing rows,
    --against, and under --compile its graph breaks."""
    import torch

    from autokernel.ops import swap
    from autokernel.verify import correctness, endtoend, generation, pruning

    timed = not request.no_timing and passed
    decided = timed and device == "cuda" and not request.keep_all
    pruned = pruned_traced = {}
    decisions = {}  # side's deciding modes -> type -> mode -> the verdict it was decided on
    reuse = {}  # the compiled prune's original and kept set, compiled and captured: the rows time them as they are
    ran = optimized.swapped_types()
    if decided:
        step("the prune: which kernels the model is faster with, in each mode it runs in")
        memory = _memory(request, choices, mode)
        optimized, pruned, pruned_traced = pruning.prune_deployed(model, optimized, inputs, device,
                                                                  deploy_modes(mode), _progress, decisions, reuse,
                                                                  request.shallow_trials, ahead, memory)
        unsaved = memory.save()  # a prune that failed or was stopped stores nothing
        if unsaved:
            _progress(f"warning: {unsaved}")
        if ahead is not None:
            ahead.close()  # the rows compile nothing new: its copy of the weights goes before they run
    elif timed:  # the rows time what optimize() installs by this report: the types a site ran, no others
        optimized = swap.build(model, optimized.swapped_types())
    graphs_only = getattr(optimized, "left_out_eagerly", None) or {}  # kept for CUDA graphs alone (the prune's)
    # types no site ran in the check that the prune took in a kept type's place (pruning's rivals.py)
    adopted = sorted({*optimized.types, *optimized.graphed_types(), *optimized.traced_types()} - set(ran)) \
        if decided else []
    graphs = request.cuda_graph and device == "cuda"
    step("timing the original and the optimized model in turns" if timed else None)
    timings, errors = endtoend.time_models(model, optimized, inputs, device, request.compile, graphs, reuse) \
        if timed else ({}, {})
    if reuse:  # dynamo's cache still held every trial of the prune: what is compiled next starts clean
        reuse.clear()
        torch._dynamo.reset()
    step(f"timing the kept kernels against {request.against}'s" if timed and request.against else None)
    against = _time_against(request, model, optimized, choices, inputs, device) if timed and request.against else None
    step("counting torch.compile's graph breaks" if request.compile and passed else None)
    graph = correctness.graph_breaks(optimized, inputs(endtoend.CHECK_SEED)) if request.compile and passed else None
    generated = None
    if timed and request.generate > 0:  # what optimize() deploys: the types the forward never runs too (decode)
        step(f"timing generate() of {request.generate} new tokens")
        prompt = inputs(endtoend.TIMING_SEED)[0][:1]
        unrun = [t for t in choices if t not in optimized.types and t not in pruned]
        if decided and unrun:  # decided on generation, as the prune decides the others on the forward
            eagerly, traced = generation.decide(model, optimized, unrun, prompt, request.generate, device,
                                                request.compile)
            pruned, pruned_traced = {**pruned, **eagerly}, {**pruned_traced, **traced}
        deployed = pruning.split_eagerly(model, [t for t in choices if t not in pruned],
                                         [t for t in choices if t not in pruned_traced], graphs_only)
        generated = generation.measure(model, deployed.module(), prompt, request.generate, device, request.compile)
    return {"decided": decided, "pruned": pruned, "pruned_traced": pruned_traced, "decisions": decisions,
            "pruned_eagerly": graphs_only, "adopted": adopted,
            "timing": timings, "timing_errors": errors, "against": against, "graph": graph, "generation": generated}


def _memory(request: Request, choices: dict, mode: str):
    """The verdicts earlier runs took on this model and input, in these deploy modes, on this GPU and these versions
    (recall.Recall), with a digest of each kernel file this run swaps in."""
    import torch

    from autokernel.harness import gpu
    from autokernel.verify import recall

    config = Path(request.config) if request.config else None
    identity = {"class_name": request.class_name,  # a model file and a config by their contents, else their names
                "source": recall.path_digest(Path(request.model)) if request.model else request.module,
                "config": recall.path_digest(config) if config and config.exists() else request.config,
                "pretrained": request.pretrained, "input_shape": request.input_shape, "dtype": request.dtype,
                "deploy": mode, "shallow_trials": request.shallow_trials, "gpu": gpu.device_name("cuda"),
                "torch": torch.__version__, "triton": _triton_version()}
    kernels = {t: recall.path_digest(Path(c.path)) for t, c in choices.items()}
    return recall.Recall(identity, kernels, fresh=request.fresh)


def _about(request: Request, model, device: str, shape, dtype) -> dict:
    """The report's head: the model, its input and the device."""
    from autokernel.harness import gpu
    from autokernel.models import describe_model
    from autokernel.registry import dtype_name

    return {"model": describe_model(model), "class_name": request.class_name, "source": request.model or request.module,
            "config": request.config, "input_shape": list(shape), "dtype": dtype_name(dtype), "device": device,
            "gpu": gpu.device_name(device) if device == "cuda" else None, "cpu_mode": device == "cpu"}


def _time_against(request, model, optimized, choices: dict, inputs, device: str) -> dict:
    """The kept types with this run's kernels against the same types with the files --against names
    (paired.paired): did the loop's winners make the model faster than the kernels it began from?"""
    from autokernel.ops import customops
    from autokernel.verify import paired
    from autokernel.verify.deploy import load_kernels

    # the kept sets, as the prune (or the rows) built them from the types a site ran: eagerly, traced and graphed
    types = list(dict.fromkeys([*optimized.types, *optimized.traced_types(), *optimized.graphed_types()]))
    ours = customops.installed(types)
    where = _against_dir(request)
    try:
        theirs_choices = load_kernels(where, types, ROOT / "kernels", winners=request.against != "extracted")
        theirs = customops.installed(types)
    finally:
        customops.reinstall(ours)
    files = {t: _rel(c.path) for t, c in theirs_choices.items()}
    # by content: a type the loop kept nothing for has an _optimized copy equal to its extracted file
    differs = [t for t in types if theirs_choices[t].path.read_bytes() != choices[t].path.read_bytes()]
    result = {"against": request.against, "kernels": files, "differs": differs}
    if not differs:
        return {**result, "note": "the same source for every kept type: nothing to compare"}
    rounds = paired.PAIRED_ROUNDS if device == "cuda" else paired.CPU_PAIRED_ROUNDS  # the interpreter is slow
    compiled = bool(sides(deploy_modes(deploy_mode(request)))[1])  # deployed compiled: compare compiled too
    return {**result, **paired.paired(model, optimized.module(), ours, theirs, inputs, device, rounds, compiled)}


def _against_dir(request) -> Path:
    starters = ROOT / "kernels"
    where = {"extracted": request.kernels, "starters": starters}.get(request.against, Path(request.against or "."))
    if not where.is_dir():
        raise ValueError(f"--against {request.against}: no such directory (nor 'extracted' or 'starters')")
    return where


def _export(request, choices: dict, kept: list[str], kept_traced: list[str], kept_graphed: list[str]) -> dict:
    from autokernel.verify import export

    files = {t: choices[t].path for t in [*kept, *kept_traced, *kept_graphed]}
    package = export.write_package(request.export, files, name=request.package_name, eager=kept, compiled=kept_traced,
                                   graphed=kept_graphed)
    return {"path": str(request.export), "package": package.name, "types": kept, "compiled_types": kept_traced,
            "graphed_types": kept_graphed}


def _inputs(model, shape, device, dtype, seed: int) -> tuple:
    import torch

    from autokernel.models import example_inputs

    torch.manual_seed(seed)  # models with their own example_inputs draw from the global generator
    return example_inputs(model, shape, device, dtype, seed=seed)


def _progress(line: str) -> None:
    print(line, flush=True)


def _mark_pruned(sites: list[dict], pruned: dict) -> None:
    """Sites of a type the prune left out: not swapped, "left_out" (the model is faster without the type), why."""
    for site in sites:
        if site["swapped"] and site["kernel_type"] in pruned:
            site["swapped"], site["left_out"], site["reason"] = False, True, pruned[site["kernel_type"]]


def site_state(site: dict) -> str:
    """What became of one site, as the site table says it: "swapped" (the kernel runs there), "unused" (swapped
    but never called), "left out" (its type was pruned: the model is faster without it), "kept" (the model's
    own code runs there, for the reason the site gives)."""
    if site.get("left_out"):
        return "left out"
    if site["swapped"]:
        return "swapped" if site["calls"] else "unused"
    return "kept"


def _rel(path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _triton_version():
    import triton

    return triton.__version__


def _fate(kernel_type: str, mode: str | None, joint: str | None) -> str:
    """What a prune's verdict made of a type (or, for "kept together", of the kept set against the original)."""
    if kernel_type == "kept together":
        return "the original won" if mode else "not slower than the original"
    if "->" in kernel_type:  # a kept type against its rivals (rivals.py): "without" is the model with the rivals
        return "(the rivals in its place) the rivals taken" if mode else "(the rivals in its place) kept"
    if mode:
        return "left out"
    return f"left out with the others of {joint}, not alone" if joint else "kept"


def decision_lines(decisions: dict) -> list[str]:
    """One line per type and side of a prune's report: what decided it, in which mode, on which figures
    ("decided in compile_graph: rmsnorm kept: 9.100 ms without, 9.000 with (1.011x, ..., within noise)")."""
    lines = []
    for side, types in decisions.items():
        together = {t: joint for joint, verdicts in types.items() if "+" in joint and "->" not in joint
                    and noise.deciding_mode(verdicts) for t in joint.split("+")}  # left out together, each kept alone
        for kernel_type, verdicts in types.items():
            mode = noise.deciding_mode(verdicts)
            fate = _fate(kernel_type, mode, together.get(kernel_type))
            shown = [mode] if mode else list(verdicts)
            figures = "; ".join(f"{m} {v['without_ms']:.3f} ms without, {v['with_ms']:.3f} with ({v['ratio']:.3f}x, "
                                f"interval {v['low']:.3f}-{v['high']:.3f}, {v['turns']} turns, {v['outcome']}"
                                f"{noise.held_from(v.get('earlier'))})"
                                for m, v in verdicts.items() if m in shown)
            lines.append(f"decided in {side}: {kernel_type} {fate}: {figures}")
    return lines


ROWS_OF = {"graph": ("eager_graph", "optimized_graph"), "compile_graph": ("compile_graph", "optimized_compile_graph")}
AGREE_WITHIN = 0.03  # the rows' speedup and the prune's last check, in one graphed mode, differ by less than this


def disagreements(decisions: dict, timing: dict) -> list[str]:
    """A line for each graphed mode where the rows' speedup and the prune's last check (the kept set against the
    original, in turns) differ by more than AGREE_WITHIN: the two timed different models, a defect of verify's own
    (a GPT-NeoX once ran 1.094x in the check and 0.933x in the rows, the prune having timed a type no site ran)."""
    lines = []
    for types in decisions.values():
        together = types.get("kept together", {})
        if noise.deciding_mode(together):
            continue  # the original won: the rows time it on both sides
        for mode, v in together.items():
            original, optimized = (timing.get(row) for row in ROWS_OF.get(mode, ("", "")))
            if not (original and optimized) or math.isinf(v["with_ms"]):
                continue
            rows = original["ms"] / optimized["ms"]
            if abs(rows / v["ratio"] - 1) > AGREE_WITHIN:
                lines.append(f"{mode}: the prune's last check measured the kept kernels at {v['ratio']:.3f}x of the "
                             f"original, the rows at {rows:.3f}x: they timed different models (a defect of verify.py: "
                             "please report it); the rows are what the deployed model runs")
    return lines
