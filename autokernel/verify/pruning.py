"""The prune behind verify.py: which kernel types stay in the mode the user deploys the model in.

A kernel that wins at the harness's shape can lose in the model (a Triton matmul against cuBLAS at N=256), or in
the deploy mode (under torch.compile, against Inductor's fused kernels); the whole model's time in that mode is
what counts. Each side of the modes (eager and graph; compile and compile_graph) is pruned on its own: greedy, one
type at a time, the likeliest to leave first, each trial timed in turns with the model it would replace
(endtoend.Trials) and decided only outside the noise (noise.py); then the types that may lean out inside the noise,
together; then the kept set against the original. docs/deploy-and-prune.md says why.
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
from collections.abc import Callable

import torch

from autokernel.ops import swap
from autokernel.verify import ahead as compiling_ahead
from autokernel.verify import endtoend, noise, recall, regional, rivals
from autokernel.verify.endtoend import PRUNE_MARGIN, Trials, compiling_each_once
from autokernel.verify.pruneclock import Clock
from autokernel.verify.verification import DEPLOY_MODES, sides

__all__ = ["deciding_modes", "prune", "prune_deployed"]

# dynamo traces a compiled prune makes of one kernel set: the model and its cut copies, cut again deeper where
# the trials read too wide (regional.ShallowTrials.deepen)
TRACES_PER_MODEL = (1 + len(regional.DEPTHS)) * (1 + len(regional.DEEPER))
# an eager forward whose GPU works this part of its wall time or more is timed in GPU time (_settled_losses): HF's
# Gemma-2 2B at 1x8192 ran 113 ms eagerly, 107 ms compiled and graphed
DEVICE_BOUND = 0.9


def prune_deployed(model, optimized: swap.Optimized, inputs: Callable, device: str, modes: list[str],
                   progress: Callable[[str], None] | None = None, decisions: dict | None = None,
                   reuse: dict | None = None, shallow_trials: bool = False,
                   ahead: compiling_ahead.Ahead | None = None, memory: recall.Recall | None = None):
    """prune() on each side of `modes` (verification.deploy_modes): the types kept in the eager modes (eager,
    graph) run eagerly, those kept in the compiled ones (compile, compile_graph) where torch.compile traces the
    model. Returns (optimized, {type: why} left out eagerly, {type: why} left out under torch.compile); modes of
    one side decide both. progress: called with a line per type tried, with the time spent and an estimate of
    what is left; decisions, if given, gets {side's modes: prune()'s decisions}; reuse, shallow_trials and ahead:
    prune()'s, for the compiled side (the helper compiles its first trials' models while the eager side is timed);
    memory: prune()'s, for both sides."""
    eager, compiled = sides(modes)
    types = optimized.swapped_types()
    clock = Clock(progress, trials=(len(types) + 1) * (2 if eager and compiled else 1))
    decisions = {} if decisions is None else decisions
    if ahead is not None and compiled:
        _plan_compiled_side(ahead, model, optimized, shallow_trials, types)
    with clock:
        return _prune_sides(model, optimized, inputs, device, modes, clock, decisions, reuse, shallow_trials, ahead,
                            memory)


def plan_ahead(ahead: compiling_ahead.Ahead, model, optimized: swap.Optimized, shallow_trials: bool) -> None:
    """The helpers' first plan, before the outputs are checked (prune_deployed plans again as it begins): the
    compiled side's first models, of every type with a site swapped in (the check then runs them, most often all)."""
    _plan_compiled_side(ahead, model, optimized, shallow_trials,
                        sorted({s.kernel_type for s in optimized.sites() if s.swapped}))


def _plan_compiled_side(ahead: compiling_ahead.Ahead, model, optimized: swap.Optimized, shallow_trials: bool,
                        types: list[str], decided: dict | None = None):
    """Tell the helper what the compiled side's prune will compile first, as far as it is known before it begins
    (ahead.jobs): the kept set and its trials, of every type but those the eager side left out so far (most often
    left out untried: _settled_losses), in the order the eager side's verdicts so far (decided) give them
    (_trial_order). A copy with a type the eager side leaves out later is compiled in vain, but most of a process's
    first compile is what every later one reads from the cache (Inductor's own kernels, its C++ checks)."""
    blocks = regional.repeated_blocks(model) if shallow_trials else None
    depths, deeper = (regional.DEPTHS, regional.deepest(len(blocks[1]))) if blocks else ((None,), None)
    order = _trial_order(optimized, types, _costs(decided or {}))
    ahead.plan(compiling_ahead.jobs(types, [[t] for t in order], depths, deeper))


def _prune_sides(model, optimized, inputs, device, modes, clock, decisions, reuse, shallow_trials, ahead, memory):
    """prune_deployed()'s work, its progress through clock."""
    eager, compiled = sides(modes)
    if not eager or not compiled:
        side = deciding_modes(modes)
        optimized, dropped = prune(model, optimized, inputs, device, side, clock, decisions.setdefault(
            ",".join(side), {}), reuse, shallow_trials, ahead=ahead, memory=memory)
        kept = optimized.types
        apart = _eager_alone(model, kept, inputs, device, clock, decisions, side, memory)
        if apart:
            return split_eagerly(model, kept, kept, apart), dropped, dropped
        optimized.left_out_eagerly = apart
        return optimized, dropped, dropped
    replan = functools.partial(_plan_compiled_side, ahead, model, optimized, shallow_trials) \
        if ahead is not None else None
    eagerly, dropped = prune(model, optimized, inputs, device, eager, clock,
                             decisions.setdefault(",".join(eager), {}), after_trial=replan, memory=memory)
    side = deciding_modes(compiled)
    bound = functools.cache(lambda: _device_bound(model, inputs, device, ahead, memory))
    settled = _settled_losses(decisions[",".join(eager)], dropped, bound) if side == ["compile_graph"] else {}
    traced, dropped_traced = prune(model, optimized, inputs, device, side, clock,
                                   decisions.setdefault(",".join(side), {}), reuse, shallow_trials,
                                   prior=_costs(decisions[",".join(eager)]), settled=settled, ahead=ahead,
                                   memory=memory)
    ran = optimized.swapped_types()
    kept, traced = sorted(eagerly.types), sorted(traced.types)  # with the rivals each side took (rivals.py)
    dropped = {**_standing_by(traced, kept, ran, "torch.compile", "eager"), **dropped}
    dropped_traced = {**_standing_by(kept, traced, ran, "eager", "torch.compile"), **dropped_traced}
    apart = _eager_alone(model, kept, inputs, device, clock, decisions, eager, memory)
    return split_eagerly(model, kept, traced, apart), dropped, dropped_traced


def _standing_by(taken: list[str], kept: list[str], ran: list[str], where: str, here: str) -> dict[str, str]:
    """{type: why} for the types no site ran (`ran`: those that did) that one side's prune took in a kept type's
    place (rivals.py) and the other side's did not: left out there, as that side timed its model."""
    return {t: f"taken in a kept type's place under {where} alone (rivals.py); the {here} modes' prune did not "
               "take it" for t in taken if t not in kept and t not in ran}


def split_eagerly(model, kept: list[str], traced: list[str], apart: dict[str, str]) -> swap.Optimized:
    """The model with `kept` where a CUDA graph captures it, those of them not `apart` in plain eager calls
    (_eager_alone's), `traced` under torch.compile; apart ({type: why}) recorded as its left_out_eagerly."""
    built = swap.build(model, [t for t in kept if t not in apart], traced=traced, graphed=kept)
    built.left_out_eagerly = apart
    return built


def _eager_alone(model, kept: list[str], inputs: Callable, device: str, clock: Clock, decisions: dict,
                 side: list[str], memory: recall.Recall | None) -> dict[str, str]:
    """{type: why} of the eager side's kept types that the model runs slower with eagerly, where eager and graph
    mode disagreed: a trial of the side's prune (or its last check) read faster without in eager mode, outside the
    noise, and graph mode, which decides a conflict (noise.deciding_mode), kept them. The kept types are then pruned
    again in eager mode alone, the user's forward without graphs: what that prune leaves out runs only where a CUDA
    graph captures the model (swap.build's graphed). ViT-B/16 at 32x3x224x224 on an H100 ran 0.87x eagerly with
    layernorm, kept for its 1.07x graphed: a launch of ours costs the host more than torch's, and a host-bound
    forward pays it. memory: prune()'s (a trial timed on the eager side too keeps both readings)."""
    if set(side) != {"eager", "graph"} or not kept or not _lost_eagerly(decisions.get(",".join(side), {}), kept):
        return {}
    clock.note("prune (eager): eager and graph mode disagree; the kept kernels pruned again in eager mode alone "
               "(CUDA graphs run them all the same)")
    ran = swap.build(model, kept)
    with torch.no_grad():  # its sites count their calls: the prune starts from the types that ran
        ran.module()(*inputs(endtoend.CHECK_SEED))
    _, apart = prune(model, ran, inputs, device, ["eager"], clock, decisions.setdefault("eager", {}), memory=memory)
    return {t: f"{why}; CUDA graphs run it" for t, why in apart.items()}


def _lost_eagerly(decided: dict, kept: list[str]) -> bool:
    """Whether a trial of kept types (or the last check, "kept together") read the model faster without them in
    eager mode, outside the noise, in a side's prune()'s decisions."""
    return any(verdicts.get("eager", {}).get("outcome") == noise.FASTER for key, verdicts in decided.items()
               if key == recall.TOGETHER or set(key.split("+")) <= set(kept))


def _device_bound(model, inputs: Callable, device: str, ahead: compiling_ahead.Ahead | None,
                  memory: recall.Recall | None) -> bool:
    """Whether the original's eager forward is device-bound: endtoend.device_shares over five forwards, their median
    DEVICE_BOUND or more, held to an earlier run's answer where its shares and these overlap (recall.Recall.side_of).
    Read with the helper compiling ahead stopped: its compiles take the host's cores (Gemma-2 2B's at 1x8192, read
    while the helper compiled, settled matmul's trial in three runs and not in a fourth)."""
    with ahead.held() if ahead is not None else contextlib.nullcontext():
        shares = endtoend.device_shares(model, inputs(endtoend.TIMING_SEED), device) or [0.0]
    if memory is None:
        return statistics.median(shares) >= DEVICE_BOUND
    return memory.side_of("device-bound", shares, DEVICE_BOUND)


def _costs(decided: dict) -> dict[str, float]:
    """{type: the lowest without / with ratio of its trial over the modes of one side} from prune()'s decisions."""
    return {t: min(v["ratio"] for v in verdicts.values()) for t, verdicts in decided.items()
            if t != "kept together" and "+" not in t and "->" not in t and verdicts}  # one type's own trials


def _settled_losses(decided: dict, dropped: dict, device_bound: Callable[[], bool]) -> dict[str, dict]:
    """{type: {mode: its verdict}} for the types the eager side left out alone on a clear loss of GPU time, with both
    sides timed: in graph mode, or eagerly where graph mode could not run (the original fails to capture) and the
    eager forward is device-bound (device_bound(), asked only then), so its time is the GPU's. The kernel takes more
    GPU time than the eager code it replaces; under torch.compile, graphed, it takes the same GPU time against
    Inductor's code, never slower than eager's (the same extern GEMMs and attention, fused elementwise work): the
    compiled side leaves it out without compiling a trial (TinyLlama's and GPT-NeoX's matmul, 0.95x and 0.84x
    graphed, lost under torch.compile too; Gemma-2 2B's at 1x8192, 0.965x eagerly, took a 107 s trial to read
    0.974x within noise compiled)."""
    settled = {}
    for kernel_type in dropped:
        verdicts = decided.get(kernel_type, {})
        mode = noise.deciding_mode(verdicts)
        v = verdicts.get(mode) if mode in ("graph", "eager") else None
        if not v or v["outcome"] != noise.FASTER or not (math.isfinite(v["without_ms"]) and
                                                         math.isfinite(v["with_ms"])):
            continue
        if mode == "graph" or ("graph" not in verdicts and device_bound()):
            settled[kernel_type] = {mode: v}
    return settled


def deciding_modes(modes: list[str]) -> list[str]:
    """The modes of one side that decide its kernels: compile_graph alone where the compiled side runs graphed too
    (its figure is GPU time; the compile row without graphs is host-bound and moves with the host, and both run the
    same traced kernels), else every mode given."""
    return ["compile_graph"] if {"compile", "compile_graph"} <= set(modes) else list(modes)


def prune(model, optimized: swap.Optimized, inputs: Callable, device: str, modes: str | list[str] = "eager",
          progress: Callable[[str], None] | None = None, decisions: dict | None = None, reuse: dict | None = None,
          shallow_trials: bool = False, prior: dict[str, float] | None = None, settled: dict[str, dict] | None = None,
          ahead: compiling_ahead.Ahead | None = None, after_trial: Callable | None = None,
          memory: recall.Recall | None = None):
    """Leave out, one type at a time, each kernel whose removal makes the whole model faster in one of `modes`.

    modes: one mode, or the two of one side, which run the same kernels (eager and graph; compile and
    compile_graph, timed on one compile): a kernel leaves when the model is faster without it in one, unless the
    other runs it slower without by more (noise.deciding_mode). A model that fails to run in a mode counts as
    infinitely slow there, so a type that breaks a mode is left out too. Greedy, the types likeliest to leave
    tried first (_trial_order; prior: {type: without / with ratio} from the other side's prune), each trial timed
    in turns with the model it would replace (a host-bound model timed alone drifts by more than the differences
    a prune decides), and decided only outside the noise of its turns (noise.compare); then the kept types that
    may lean out inside the noise, together (_try_together); then, if the original itself is faster still in a
    mode, timed in turns with what is kept, every kernel goes. Modes where the original itself fails (a forward no
    CUDA graph captures) decide nothing on the eager side. On the compiled side each model is compiled once, the
    set kept so far reused by the next trial (dynamo's recompile limit raised to hold them all): one compile a trial.
    Returns (optimized, {type: why it was left out}); progress, if given, hears each type's verdict as it falls,
    with the figures that decided it; decisions, if given, gets {type: {mode: noise.Verdict as a dict}, "kept
    together": ..., "<type>+<type>": the joint trial}. reuse, if given on the compiled side, gets the original
    and the kept set as compiled and graphed for the last comparison ({"original": {mode: fn}, "kept": ...}), for
    time_models' rows to time without compiling them again (dynamo's cache is then kept, not emptied, at the end).
    shallow_trials: on the compiled side each trial compiles copies of the model cut to one and two of its blocks
    (deeper where that reads too wide) and takes the whole model's time from theirs (regional.py); the last check
    compiles both models whole. settled: {type: {mode: verdict}} left out untried on that verdict (_settled_losses).
    ahead: on the compiled side, the helper compiling what comes next (ahead.py); after_trial: _try_each's;
    memory: earlier runs' verdicts, each held where this run's reading agrees with theirs (recall.py)."""
    modes, compiled = _one_side(modes)
    trials = Trials(model, modes, compiled, inputs, device, shallow_trials, ahead if compiled else None, memory)
    _decide_where_the_original_runs(trials, model, progress)
    decided = {} if decisions is None else decisions
    keep, dropped = optimized.swapped_types(), {}
    standby = [t for t in optimized.types if t not in keep]  # loaded, run by no site: a kept type's rivals among them
    _leave_out_settled(keep, dropped, settled or {}, modes, progress, decided)
    optimized = swap.build(model, keep)  # what deploy installs from the report: the types a site ran, no others
    keep = _trial_order(optimized, keep, prior or {})
    reusing, traces = compiled and reuse is not None, (len(keep) + 2) * TRACES_PER_MODEL
    with compiling_each_once(traces, reset_after=not reusing) if compiled else contextlib.nullcontext():
        optimized = _try_each(trials, optimized, keep, dropped, progress, decided, after_trial)
        optimized = _try_together(trials, optimized, keep, dropped, progress, decided)
        optimized = rivals.try_rivals(trials, optimized, keep, standby, dropped, progress, decided, _try_without)
        if trials.shallow is not None:  # the last check and the rows: whole models
            trials.shallow = None
            trials.ready.clear()
        trials.plan_ahead(keep, [])
        module = optimized.module()
        _last_check_begins(progress, modes, compiling=bool(keep) and compiled)
        verdicts = _held(trials, [recall.TOGETHER], keep, trials.compare(model, against=module)) if keep else {}
        if reusing:
            _for_the_rows(trials, model, module if keep else None, reuse)
        trials.ready.clear()
    if keep and _original_wins(trials, module, keep, dropped, verdicts, progress, decided):
        optimized = swap.build(model, [])
        if reuse:  # the rows' optimized model is now the original
            reuse["kept"] = reuse["original"]
    return optimized, dropped


def _for_the_rows(trials: Trials, model, kept, reuse: dict) -> None:
    """reuse["original"] and reuse["kept"]: the compiled side's last check's models as the rows time them (kept: the
    kept set's module, None where nothing is kept), or nothing where one of them failed."""
    trials.deployed_once(model)  # compiled by the last check, or here where nothing is kept: the rows' own
    reuse["original"] = trials.as_rows(model)
    reuse["kept"] = trials.as_rows(kept) if kept is not None else reuse["original"]
    if not (reuse["original"] and reuse["kept"]):  # one failed: the rows compile afresh, from a clean cache
        reuse.clear()
        torch._dynamo.reset()


def _try_each(trials: Trials, optimized: swap.Optimized, keep: list[str], dropped: dict,
              progress: Callable[[str], None] | None, decided: dict, after_trial: Callable | None) -> swap.Optimized:
    """The greedy steps of a prune, one type of `keep` at a time in its order (_try_without), the helper compiling
    ahead told what comes next before each (Trials.plan_ahead), after_trial told the outcome after each."""
    order = list(keep)
    for i, kernel_type in enumerate(order):
        trials.plan_ahead(keep, [[t] for t in order[i:] if t in keep])
        optimized = _try_without(trials, optimized, [kernel_type], keep, dropped, progress, decided)
        if after_trial is not None:
            after_trial(list(keep), decided)
    return optimized


def _leave_out_settled(keep: list[str], dropped: dict, settled: dict[str, dict], modes: list[str],
                       progress: Callable[[str], None] | None, decided: dict) -> None:
    """The types of `keep` that `settled` holds a verdict for ({type: {mode: verdict}}), moved to `dropped` untried,
    each verdict kept in `decided` under the mode that gave it."""
    for kernel_type in [t for t in keep if t in settled]:
        keep.remove(kernel_type)
        (mode, verdict), = settled[kernel_type].items()
        dropped[kernel_type] = _why(mode, noise.Verdict(**verdict), None) + "; under torch.compile the same GPU " \
                                                                           "time, untried"
        decided[kernel_type] = dict(settled[kernel_type])
        if progress:
            progress(f"prune ({', '.join(modes)}): {kernel_type} left out without a trial: {dropped[kernel_type]}")


def _decide_where_the_original_runs(trials: Trials, model, progress: Callable[[str], None] | None) -> None:
    """Leave out of the trials' modes those where the original model itself fails (a forward no CUDA graph
    captures): every trial would fail there on both sides and decide nothing, while the others can. On the eager
    side only: the compiled side's original is compiled whole for its last check alone."""
    if trials.compiled or len(trials.modes) < 2:
        return
    failing = trials.modes_that_fail(model)
    if not failing or len(failing) == len(trials.modes):
        return
    modes = trials.modes
    trials.modes = [m for m in modes if m not in failing]
    if progress is not None:
        why = "; ".join(f"{m}: {failing[m]}" for m in failing)
        getattr(progress, "note", progress)(f"prune ({', '.join(modes)}): decided in {', '.join(trials.modes)} "
                                            f"alone, the original fails in {', '.join(failing)} mode ({why})")


def _trial_order(optimized: swap.Optimized, types: list[str], prior: dict[str, float]) -> list[str]:
    """The order a greedy prune tries types in: the likeliest to leave first, so that the others are timed against
    the model they end up in (without linear_gelu, GPT-NeoX's MLP projection falls to the matmul type while it is in,
    not to cuBLAS: timed before matmul, linear_gelu stayed or went by the noise). By the prior's ratio (lowest first),
    then types placed by function patches (they take what module sites leave), then as given (by name)."""
    patched = {t for joined in getattr(optimized, "patch_types", {}).values() for t in joined.split("+")}
    return sorted(types, key=lambda t: (prior.get(t, 1.0), t not in patched))


def _one_side(modes: str | list[str]) -> tuple[list[str], bool]:
    """(the modes as a list, whether they are the compiled side's); a ValueError for an unknown mode or modes of
    both sides (one prune times the modes of one side)."""
    modes = [modes] if isinstance(modes, str) else list(modes)
    if not modes or any(m not in DEPLOY_MODES for m in modes):
        raise ValueError(f"deploy mode {','.join(modes)!r}: one of {', '.join(DEPLOY_MODES)}")
    eager_modes, compiled_modes = sides(modes)
    if eager_modes and compiled_modes:
        raise ValueError(f"deploy modes {','.join(modes)!r}: one prune times the modes of one side, eager or compiled")
    return modes, bool(compiled_modes)


def _try_without(trials: Trials, optimized: swap.Optimized, types: list[str], keep: list[str], dropped: dict,
                 progress: Callable[[str], None] | None, decided: dict) -> swap.Optimized:
    """One step of a prune: the model without `types` (one type: a greedy step; several: _try_together's), timed in
    turns with the kernels kept so far. When it runs faster in one of the modes, outside the noise, they leave
    `keep` for `dropped` (with why) and the trial is what goes on; else `optimized` does. decided gets the trial
    under the types' names joined by '+'."""
    _begin(progress, f"prune ({', '.join(trials.modes)}): the trial without {', '.join(types)}")
    trial, spent = swap.build(trials.model, [t for t in keep if t not in types]), dict(trials.spent)
    verdicts = _held(trials, types, keep, trials.compare(trial.module(), against=optimized.module()))
    decided["+".join(types)] = {m: v.to_dict() for m, v in verdicts.items()}
    failed = trials.failures.get(optimized.module())
    mode = noise.deciding_mode(verdicts)
    if mode:
        for kernel_type in types:
            keep.remove(kernel_type)
            others = ", ".join(t for t in types if t != kernel_type)
            dropped[kernel_type] = (f"left out with {others}: " if others else "") + _why(mode, verdicts[mode], failed)
        optimized = trial
    trials.forget_all_but(optimized.module())
    if progress:
        together = " together" if len(types) > 1 else ""
        progress(f"prune ({', '.join(trials.modes)}): {', '.join(types)} " + (
            f"left out{together}: {_why(mode, verdicts[mode], failed)}" if mode else
            f"kept{together}: {_why_kept(verdicts)} ({_versus(verdicts)}){_failing(trials, trial)}") + _deeper(trials)
            + _took(trials, spent))
    return optimized


def _held(trials: Trials, left_out: list[str], against: list[str], verdicts: dict) -> dict:
    """verdicts, each held to an earlier run's outcome where their readings agree (recall.Recall.hold)."""
    return verdicts if trials.recall is None else trials.recall.hold(left_out, against, verdicts, trials.modes)


def _begin(progress: Callable[[str], None] | None, step: str) -> None:
    """Name the step under way to progress, where it is a Clock (its heartbeat names it); no line of its own."""
    if isinstance(progress, Clock):
        progress.begin(step)


def _last_check_begins(progress: Callable[[str], None] | None, modes: list[str], compiling: bool) -> None:
    """Tell progress the last check is under way; with a line where it compiles two whole models (minutes on a deep
    model)."""
    if progress is None:
        return
    _begin(progress, f"prune ({', '.join(modes)}): the last check, the kept set against the original")
    if compiling:
        getattr(progress, "note", progress)(f"prune ({', '.join(modes)}): compiling the original and the kept set "
                                            "whole for the last check")


def _failing(trials: Trials, trial: swap.Optimized) -> str:
    """' (the model fails without it: why)' for a type kept because its trial failed to run."""
    failed = trials.failures.get(trial.module())
    return f" (the model fails without it: {failed})" if failed else ""


def _took(trials: Trials, before: dict[str, float]) -> str:
    """' [deployed in 21 s, timed in 5 s]': what a trial spent compiling (or waiting for the helper's compiles),
    capturing and checking its models, and in turns, from Trials.spent before it."""
    deploying, timing = (trials.spent[k] - before[k] for k in ("deploying", "timing"))
    return f" [deployed in {deploying:.0f} s, timed in {timing:.0f} s]"


def _deeper(trials: Trials) -> str:
    """' (timed on copies cut to 1 and 4 blocks)' once a trial read too wide on the first cut (regional.deepen)."""
    shallow = trials.shallow
    if shallow is None or shallow.depths == regional.DEPTHS:
        return ""
    return f" (timed on copies cut to {shallow.depths[0]} and {shallow.depths[1]} blocks)"


def _try_together(trials: Trials, optimized: swap.Optimized, keep: list[str], dropped: dict,
                  progress: Callable[[str], None] | None, decided: dict) -> swap.Optimized:
    """The kept types that may lean out inside the noise (_may_lean_out), tried out together: Mistral's fused_mlp
    (0.987x) and rmsnorm (0.992x, timed with fused_mlp in) stayed one by one, and together cost 2.4-4% under
    torch.compile (rmsnorm alone read 0.972x without fused_mlp). They leave together when the model runs faster
    without them outside the noise, by the margin of any trial: which types are tried together moves with each
    run's readings less than a line on each one's ratio did, and a joint loss near the margin reads within noise
    run after run, as a single one does."""
    leaning = [t for t in keep if _may_lean_out(decided.get(t, {}), trials.modes)]
    if len(leaning) < 2:
        return optimized
    trials.plan_ahead(keep, [leaning])
    return _try_without(trials, optimized, leaning, keep, dropped, progress, decided)


def _may_lean_out(verdicts: dict, modes: list[str]) -> bool:
    """A type kept inside the noise whose interval, widened by what the mode's verdicts move between runs
    (noise.between_runs), reaches below half the margin in a deciding mode: one another run could read as leaning out.
    A line on the ratio itself sat on Mistral's rmsnorm (0.996x, 0.990x, 0.995x in three runs against 0.995): the
    pair was tried, and left, in one run of three. A type that reads faster with it by more than that spread is
    never tried out with the others (add_rmsnorm, 1.011x, 1.008-1.015)."""
    deciding = [m for m in verdicts if m in noise.GPU_TIMED] or list(verdicts)  # a graphed mode decides a conflict
    return bool(verdicts) and all(v["outcome"] == noise.WITHIN_NOISE for v in verdicts.values()) and any(
        verdicts[m]["low"] - noise.between_runs(m, modes) < 1 - PRUNE_MARGIN / 2 for m in deciding)


def _original_wins(trials: Trials, module, keep: list[str], dropped: dict, verdicts: dict,
                   progress: Callable[[str], None] | None, decided: dict) -> bool:
    """Whether the original model beats the kept kernels together (module, timed in turns with it: verdicts) in one
    of the modes, outside the noise: then every kept type goes into `dropped`, with why. progress hears it."""
    decided["kept together"] = {m: v.to_dict() for m, v in verdicts.items()}
    failed = trials.failures.get(module)
    mode = noise.deciding_mode(verdicts)
    if not mode:
        if progress:
            together = _conflict(verdicts, "the original is faster") or "together not slower than the original"
            progress(f"prune ({', '.join(trials.modes)}): {', '.join(keep)} kept: {together} ({_versus(verdicts)})")
        return False
    v = verdicts[mode]
    for kernel_type in keep:
        dropped[kernel_type] = _why(mode, v, failed) if failed else (
            f"together the kernels lose in {mode} mode (original {v.without_ms:.3f} ms vs {v.with_ms:.3f} ms, "
            f"{v.ratio:.3f}x, {noise.CONFIDENCE:.0%} interval {v.low:.3f}-{v.high:.3f})")
    if progress:
        progress(f"prune ({', '.join(trials.modes)}): {', '.join(keep)} left out too: {dropped[keep[0]]}")
    return True


def _why_kept(verdicts: dict) -> str:
    return _conflict(verdicts, "the model runs faster without it") or "the model is not faster without it"


def _conflict(verdicts: dict, faster: str) -> str | None:
    """Where a mode ran faster without and noise.deciding_mode kept the kernels all the same, why: '<faster> in
    eager mode, and slower in graph mode, which decides (GPU time)', or slower by more in another mode."""
    gained = [m for m, v in verdicts.items() if v.outcome == noise.FASTER]
    if not gained:
        return None
    graphed = [m for m, v in verdicts.items() if v.outcome == noise.SLOWER and m in noise.GPU_TIMED]
    if graphed:
        return f"{faster} in {gained[0]} mode, and slower in {graphed[0]} mode, which decides (GPU time)"
    return f"{faster} in one mode, and slower by more in another"


def _why(mode: str, verdict: noise.Verdict, failed: str | None) -> str:
    """Why a prune left a type out: the model failed with it in `mode`, or ran faster without it there."""
    if failed:
        return f"the model fails in {mode} mode with it ({failed})"
    return f"the model is faster without it in {mode} mode ({verdict.text()})"


def _versus(verdicts: dict) -> str:
    """'eager 9.100 ms without, 9.000 with (1.011x, ...); graph ...': what a prune compared, in each mode."""
    return "; ".join(f"{m} {v.text()}" for m, v in verdicts.items())
