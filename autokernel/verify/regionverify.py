"""verify.py's check of region kernels: never wrong, never slower, as for the built-in types.

Region kernels act where the model is compiled (regiondeploy.py). With --compile, verify.py compiles the optimized
model twice with Inductor, once with the region pass and once without: the region kernels must give the original's
output, must be placed somewhere (a pattern that matches nothing is reported), and on a GPU the two are timed in
turns, CUDA-graphed when --cuda-graph is given (the compiled mode a GPU's figure decides; compile alone is
host-bound). The regions stay only where the model is not faster without them, outside the noise (noise.compare);
install_regions() follows the report. A built-in type can hide a region: Pythia-410M's layernorm type swapped the
two norms of its residual + norms region, whose pattern then matched nowhere. Where the kernels are placed at fewer
places than they were profiled at, each kept compiled type is left out in turn; one whose absence places more is
displaced: the region kernels are timed in its place, and where they stay it is left out under torch.compile.
Where there are several region types, each is first timed out of the set in turn and left out where the model is
faster without it (install_regions() then installs the others).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autokernel import kernelfile
from autokernel.harness import timing
from autokernel.verify import endtoend, noise, regiondeploy

BACKEND = "inductor"  # the region pass is Inductor's: it runs on the CPU too


def verify_in_report(request, model, checked_types: list[str], measured: dict, inputs: Callable, device: str,
                     compiled_alone: bool) -> dict | None:
    """verify.py's check (a verification.Request) of the region kernels in the model with the types kept under
    torch.compile; a type whose sites hide their regions goes into measured's left-out sets: the compiled one, and
    the eager one too where the deploy modes are compiled alone (optimize() then follows that one set)."""
    from autokernel.ops import swap

    traced = [t for t in checked_types if t not in measured["pruned_traced"]]
    regions = verify_regions(model, lambda types: swap.build(model, types).module(), traced, request.kernels, inputs,
                             device, not request.no_timing and device == "cuda", request.cuda_graph)
    if regions and regions["displaced"]:
        measured["pruned_traced"] = {**measured["pruned_traced"], **regions["displaced"]}
        if compiled_alone:
            measured["pruned"] = {**measured["pruned"], **regions["displaced"]}
    return regions


def verify_regions(model, build: Callable, traced: list[str], kernels_dir, inputs: Callable, device: str, timed: bool,
                   graphs: bool) -> dict | None:
    """{"types", "matches", "correctness", "timing", "kept", "why", "displaced", "left_out"} for the region kernels of
    `kernels_dir` in the optimized model (`build(types)`: the model with those built-in types, `traced` the ones the
    prune kept under torch.compile; `model` its eager original); None when there are none. A built-in type whose
    sites hide a region (the layernorm type swaps the norms a residual + two norms region is made of) is displaced:
    left out under torch.compile where the region kernels are kept (displaced: {type: why}). Region types the model
    is faster without, timed out of the set one by one, are left out ({region type: why}); the rest are kept or not
    together."""
    made, types = regiondeploy.region_pass(kernels_dir)
    if made is None:
        return None
    sets = [inputs(endtoend.TIMING_SEED + i) for i in range(endtoend.TIMING_INPUTS)]
    report = {"types": types, "matches": 0, "correctness": None, "timing": None, "displaced": {}, "left_out": {}}
    try:
        kept = module = build(traced)
        with_regions, wrong = _checked(kept, made, model, sets[-1])
        placed_all = made.matches >= _places(kernels_dir)
        hiding = [] if placed_all else _hiding(build, traced, made, sets[-1], made.matches)
        if hiding:
            module = build([t for t in traced if t not in hiding])
            with_regions, wrong = _checked(module, made, model, sets[-1])
        report["matches"] = made.matches
        report["correctness"] = f"FAIL: {wrong}" if wrong else "PASS"
        if wrong or not made.matches:
            why = f"wrong output under torch.compile: {wrong}" if wrong else "no region of theirs is in this model"
            return {**report, "kept": False, "why": why}
        report["displaced"] = {t: f"its sites hide regions of {', '.join(types)} (more places without it)"
                               for t in hiding}
        if not timed:
            return {**report, "kept": True, "why": "checked, not timed (timing needs a GPU)"}
        if len(types) > 1:
            with_regions, report["left_out"] = _one_by_one(module, with_regions, types, kernels_dir, model, sets,
                                                           device, graphs)
        without = torch.compile(kept, backend=BACKEND)  # another backend object: dynamo compiles it apart
        report["timing"] = _timed(without, with_regions, sets, device, graphs)
    except Exception as e:  # noqa: BLE001  (a compile or capture that fails: the regions go, the reason kept)
        return {**report, "kept": False, "why": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", "displaced": {}}
    finally:
        torch._dynamo.reset()
    v = report["timing"]
    faster_without = v["outcome"] == noise.FASTER
    why = (f"the model is faster without them in {v['mode']} mode" if faster_without else
           f"kept: not slower in {v['mode']} mode") + f" ({v['text']})"
    return {**report, "kept": not faster_without, "why": why,
            "displaced": {} if faster_without else report["displaced"]}


def _checked(module, made, model, inputs: tuple) -> tuple[Callable, str | None]:
    """(`module` compiled with the region pass, how its output differs from the original's or None); made.matches
    counts the places the pass put the kernels."""
    compiled = _with_pass(module, made)
    return compiled, endtoend.wrong_output(compiled, model, inputs)


def _with_pass(module, made) -> Callable:
    """`module` to be compiled with the region pass (at its first call, which counts the places into made.matches);
    not from the FX graph cache: the pass must run to count them."""
    torch._dynamo.reset()
    made.matches = 0
    return torch.compile(module, backend=BACKEND, options={"post_grad_custom_post_pass": made, "fx_graph_cache": False})


def _hiding(build: Callable, traced: list[str], made, inputs: tuple, matches: int) -> list[str]:
    """The types whose sites hide regions: the model compiled without one of them places more region kernels (one
    call compiles it; its output is not needed)."""
    hiding = []
    for kernel_type in traced:
        with torch.no_grad():
            _with_pass(build([t for t in traced if t != kernel_type]), made)(*inputs)
        if made.matches > matches:
            hiding.append(kernel_type)
    return hiding


def _places(kernels_dir) -> int:
    """The places the region kernels were profiled at: their MODEL_CALLS (a call a place of the compiled graph)."""
    total = 0
    for path in regiondeploy.region_files(kernels_dir).values():
        calls = kernelfile.declarations(path.read_text(), path.name).get("MODEL_CALLS") or [1]
        total += int(sum(calls))
    return total


def _one_by_one(module, with_all, types: list[str], kernels_dir, model, sets: list, device: str,
                graphs: bool) -> tuple[Callable, dict]:
    """Each region type in turn out of the set, timed against the set with it: one the model is faster without,
    outside the noise, is left out (a region whose pattern, placed across the model, breaks a fusion of Inductor's
    costs more than its kernel saves). (`module` compiled with the region kernels left in, {type left out: why})."""
    current, left_out = with_all, {}
    for region_type in types:
        if len(left_out) + 1 == len(types):  # the last one left: the set against none decides it
            break
        made, _ = regiondeploy.region_pass(kernels_dir, without={region_type, *left_out})
        try:
            without, wrong = _checked(module, made, model, sets[-1])
        except Exception:  # noqa: BLE001  (the others alone do not compile, as Pythia's R02 alone did not: it stays)
            continue
        if wrong or not made.matches:
            continue
        v = _timed(without, current, sets, device, graphs)
        if v["outcome"] == noise.FASTER:
            left_out[region_type] = f"the model is faster without it in {v['mode']} mode ({v['text']})"
            current = without
    return current, left_out


def _timed(without, with_regions, sets: list, device: str, graphs: bool) -> dict:
    """The compiled model without the region kernels (or some of them) against it with them (graphed when graphs),
    in turns."""
    with_fn = timing.cuda_graphed(with_regions, sets[0]) if graphs else with_regions
    without_fn = timing.cuda_graphed(without, sets[0]) if graphs else without
    samples = endtoend.latency_turns({"without": without_fn, "with": with_fn}, sets, device)
    v = noise.compare(samples["without"], samples["with"], endtoend.PRUNE_MARGIN)
    return {"mode": "compile_graph" if graphs else "compile", **v.to_dict(), "text": v.text()}
