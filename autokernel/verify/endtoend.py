"""The end-to-end measurement behind verify.py: the optimized model against the original, correct and faster.

Correctness (correctness.py): the optimized model's output (and, for a language model, the next-token loss, which
runs the cross_entropy kernel) is compared with the original's on fresh inputs by relative L2 error, within
swap.REL_L2_TOLERANCE; on a mismatch the types that alone exceed the tolerance are blamed. origin.py warns of a
kernel file extracted for another model or input.

Timing (here): one protocol (autokernel.harness.timing) for every row, in the four modes a user deploys a model in:
eager, graphed (replayed from a CUDA graph), compiled (torch.compile) and compiled + graphed. The
prune decides in the mode the user deploys (`DEPLOY_MODES`): a kernel that wins eager, where it saves
launches, can lose under torch.compile, whose own kernels fuse across what ours cannot. Deployed in eager
and compiled modes (verify.py's default: every mode it times), each side decides its own types, and the model
runs the compiled side's where torch.compile traces it (swap.build's `traced`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
from collections.abc import Callable

import torch

from autokernel import compat
from autokernel.harness import timing
from autokernel.ops import swap
from autokernel.verify import noise, regional
from autokernel.verify.correctness import CHECK_INPUTS, CHECK_SEED, blame, check, compare_outputs, forward, main_output
from autokernel.verify.noise import paired_verdict
from autokernel.verify.origin import origin_warnings
from autokernel.verify.verification import DEPLOY_MODES, sides

__all__ = ["CHECK_INPUTS", "CHECK_SEED", "TIMING_SEED", "backend_for", "blame", "check", "compare_outputs", "forward",
           "latency_turns", "main_output", "origin_warnings", "paired_verdict", "prune", "prune_deployed",
           "time_models", "wrong_output"]

TIMING_INPUTS = 2  # input sets the timed runs rotate through
TIMING_SEED = 1000  # seed of the first timed input set (distinct from the checked ones, correctness.CHECK_SEED)
GPU_BACKEND, CPU_BACKEND = "inductor", "aot_eager"  # compile backends (a C++ build would dominate a CPU run)
PRUNE_MARGIN = 0.01  # a kernel type is left out when the model runs this much faster without it, outside the noise
PRUNE_ROUNDS = 3  # rounds of turns a close call may take (noise.close_call) before it is left undecided
# a model's forward timed in turns for about this long: a host-bound forward (a compiled decoder without graphs
# spends most of its time enqueueing) drifts for seconds at a time, and short windows in turns read ratios several
# percent apart for one pair of models (docs/timing.md)
LATENCY_TURNS_MS = 1000
LATENCY_MAX_TURNS = 400
# a prune's trial in a graphed mode: GPU time replayed, a fraction of a percent of noise (more rounds where close)
GRAPHED_TURNS_MS = 250


def backend_for(device: str) -> str:
    return GPU_BACKEND if device == "cuda" else CPU_BACKEND


# ------------------------------------------------------------------------------ timing
def time_models(model, optimized: swap.Optimized, inputs: Callable, device: str, with_compile: bool,
                with_graphs: bool = False, reuse: dict | None = None) -> tuple[dict, dict]:
    """Median latency of the original (eager, compiled) and the optimized model, one process, one protocol.

    Rows: eager, compile, optimized, optimized_compile (with_compile), and each again as <row>_graph
    replayed from a CUDA graph (with_graphs); each with its speedup over the original in its mode. The
    original and the optimized model of one mode are timed in turns (timing.time_turns), as latency (the
    host's cost counts: without a CUDA graph a model's forward can wait on its launches): a host that runs
    slower for a while slows both alike (run one after the other, a host-bound compiled model's forward
    drifts by far more than the differences these rows show). Returns (rows, {row: error}): a mode that
    fails (a compile error, a capture error) is reported, and the other rows are still timed. reuse: the compiled
    original and kept set of a compiled prune (prune's reuse), timed as they are instead of compiled again."""
    backend = backend_for(device)
    sets = [inputs(TIMING_SEED + i) for i in range(TIMING_INPUTS)]
    module = optimized.module()
    makers = {"eager": lambda: model, "compile": _once(lambda: torch.compile(model, backend=backend)),
              "optimized": lambda: module}
    if with_compile:  # one compile of each model for its two rows: the graphed row captures the compiled one
        makers["optimized_compile"] = _once(lambda: torch.compile(module, backend=backend))
    made = {f"{prefix}{mode}": fn for key, prefix in (("original", ""), ("kept", "optimized_"))
            for mode, fn in (reuse or {}).get(key, {}).items()}
    names = list(makers) + ([f"{name}_graph" for name in makers] if with_graphs else [])
    pairs = [(name, f"optimized{name.removeprefix('eager')}" if name.startswith("eager") else f"optimized_{name}")
             for name in names if not name.startswith("optimized")]
    result, errors = {}, {}
    # Modes without torch.compile first: once a compile ran, the process holds its compiler's objects, and an
    # eager model timed after it ran far slower and noisier (docs/timing.md). A user running eager compiles nothing.
    for pair in sorted(pairs, key=lambda p: "compile" in p[0]):
        fns = _deployed_rows([n for n in pair if n in names], made, makers, model, sets, errors)
        try:
            samples = latency_turns(fns, sets, device) if fns else {}
        except Exception as e:
            errors.update({name: _error_line(e) for name in fns})
            continue
        for name, us in samples.items():
            t = timing.Timing(statistics.median(us), us)
            result[name] = {"ms": t.median_us / 1e3, "noise_pct": t.spread_pct, "runs": len(us)}
        if len(samples) == 2:  # the optimized row's speedup over its original, per turn: its interval is its noise
            v = noise.compare(samples[pair[0]], samples[pair[1]], PRUNE_MARGIN)
            result[pair[1]]["speedup_interval"] = [v.low, v.high]
    result = {name: result[name] for name in names if name in result}  # back in the table's order
    _host_shares(result)
    for name, r in result.items():
        mode = "_graph" if name.endswith("_graph") else ""
        for base in ("eager", "compile"):
            if base + mode in result:
                r[f"speedup_vs_{base}"] = result[base + mode]["ms"] / r["ms"]
    return result, errors


def _deployed_rows(names: list[str], made: dict, makers: dict, model, sets: list, errors: dict) -> dict:
    """{row: the model as the row runs it}: the prune's where it made it (compiled and captured already), else made
    here, a _graph row replayed from a CUDA graph; an optimized row that gives a wrong output, or a row that fails
    to deploy, goes into errors instead (one failing mode must not hide the others)."""
    fns = {}
    for name in names:
        try:
            fn = made.get(name)
            if fn is None:
                fn = makers[name.removesuffix("_graph")]()
                if name.endswith("_graph"):
                    fn = timing.cuda_graphed(fn, sets[0])
            wrong = wrong_output(fn, model, sets[-1]) if name.startswith("optimized") else None
        except Exception as e:
            wrong = _error_line(e)
        if wrong:
            errors[name] = wrong
        else:
            fns[name] = fn
    return fns


def _host_shares(rows: dict) -> None:
    """Each row timed with and without a CUDA graph gets host_share: the part of its latency that the graph's replay
    saves, the host's launches and Python (1 - graphed / not graphed). A high share is a host-bound row: its
    milliseconds move with the host, its ratio in turns holds."""
    for name, row in rows.items():
        graphed = rows.get(f"{name}_graph")
        if graphed is not None and not name.endswith("_graph"):
            row["host_share"] = max(0.0, 1 - graphed["ms"] / row["ms"])


def _once(make: Callable) -> Callable:
    """make, called once: later calls return what the first made."""
    made = []
    return lambda: made[0] if made else made.append(make()) or made[0]


def latency_turns(fns: dict[str, Callable], sets: list, device: str,
                  window_ms: float = LATENCY_TURNS_MS) -> dict[str, list[float]]:
    """Latency samples of each function in turns, about window_ms of each by the slowest one's probe run."""
    if device != "cuda":
        return timing.time_turns(fns, sets, device, timing.CPU_RUNS)
    probe = timing.time_turns(fns, sets, device, 1, latency=True)
    turns = timing.runs_for(max(us[0] for us in probe.values()) / 1e3, window_ms, LATENCY_MAX_TURNS)
    return timing.time_turns(fns, sets, device, turns, latency=True)


def wrong_output(fn: Callable, model, args: tuple) -> str | None:
    """None when fn (the optimized model as deployed: compiled, graphed) gives the original's output on args
    within the tolerance, else what is wrong. check() proves the optimized model eagerly; a mode can still
    break it (Inductor misreading what a kernel writes), and a wrong model is never timed."""
    with torch.no_grad():
        want = main_output(model(*args)).clone()
        got = main_output(fn(*args))
    tol = swap.REL_L2_TOLERANCE.get(want.dtype, 1e-4)
    r = compare_outputs((got, None), (want, None), tol)
    return None if r["ok"] else (f"wrong output in this mode (relative L2 error {r['rel_l2']:.3g}, tolerance {tol:g}"
                                 + (f": {r['reason']})" if "reason" in r else ")"))


def prune_deployed(model, optimized: swap.Optimized, inputs: Callable, device: str, modes: list[str],
                   progress: Callable[[str], None] | None = None, decisions: dict | None = None,
                   reuse: dict | None = None, shallow_trials: bool = False):
    """prune() on each side of `modes` (verification.deploy_modes): the types kept in the eager modes (eager,
    graph) run eagerly, those kept in the compiled ones (compile, compile_graph) where torch.compile traces the
    model. Returns (optimized, {type: why} left out eagerly, {type: why} left out under torch.compile); modes of
    one side decide both. progress: called with a line per type tried, with the time spent and an estimate of
    what is left; decisions, if given, gets {side's modes: prune()'s decisions}; reuse and shallow_trials: prune()'s,
    for the compiled side."""
    eager, compiled = sides(modes)
    types = optimized.swapped_types()
    clock = _Clock(progress, trials=(len(types) + 1) * (2 if eager and compiled else 1))
    decisions = {} if decisions is None else decisions
    if not eager or not compiled:
        side = deciding_modes(modes)
        optimized, dropped = prune(model, optimized, inputs, device, side, clock, decisions.setdefault(
            ",".join(side), {}), reuse, shallow_trials)
        return optimized, dropped, dropped
    _, dropped = prune(model, optimized, inputs, device, eager, clock, decisions.setdefault(",".join(eager), {}))
    side = deciding_modes(compiled)
    _, dropped_traced = prune(model, optimized, inputs, device, side, clock, decisions.setdefault(",".join(side), {}),
                              reuse, shallow_trials, prior=_costs(decisions[",".join(eager)]))
    both = swap.build(model, [t for t in types if t not in dropped],
                      traced=[t for t in types if t not in dropped_traced])
    return both, dropped, dropped_traced


def _costs(decided: dict) -> dict[str, float]:
    """{type: the lowest without / with ratio of its trial over the modes of one side} from prune()'s decisions."""
    return {t: min(v["ratio"] for v in verdicts.values()) for t, verdicts in decided.items()
            if t != "kept together" and verdicts}


def deciding_modes(modes: list[str]) -> list[str]:
    """The modes of one side that decide its kernels: compile_graph alone where the compiled side runs graphed too
    (its figure is GPU time; the compile row without graphs is host-bound and moves with the host, and both run the
    same traced kernels), else every mode given."""
    return ["compile_graph"] if {"compile", "compile_graph"} <= set(modes) else list(modes)


class _Clock:
    """progress() with each line prefixed by the trials done, the time spent and an estimate of what is left."""

    def __init__(self, progress: Callable[[str], None] | None, trials: int):
        self.progress, self.trials, self.done, self.started = progress, max(trials, 1), 0, time.monotonic()

    def __call__(self, line: str) -> None:
        self.done += 1
        if self.progress is None:
            return
        spent = time.monotonic() - self.started
        left = spent / self.done * max(self.trials - self.done, 0)
        self.progress(f"[{self.done}/{self.trials}, {_duration(spent)} spent, ~{_duration(left)} left] {line}")

    def note(self, line: str) -> None:
        """A line about the step under way (a long compile), counted as no trial."""
        if self.progress is not None:
            self.progress(f"[{self.done}/{self.trials}, {_duration(time.monotonic() - self.started)} spent] {line}")


def _duration(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def prune(model, optimized: swap.Optimized, inputs: Callable, device: str, modes: str | list[str] = "eager",
          progress: Callable[[str], None] | None = None, decisions: dict | None = None, reuse: dict | None = None,
          shallow_trials: bool = False, prior: dict[str, float] | None = None):
    """Leave out, one type at a time, each kernel whose removal makes the whole model faster in one of `modes`.

    A kernel that beats PyTorch at the harness's shape can still lose at this model's shapes (a
    Triton matmul against cuBLAS at N=256), or in the mode the model is deployed in (under
    torch.compile, against Inductor's fused kernels); the end-to-end time in that mode is what
    counts. modes: one mode, or the two of one side, which run the same kernels (eager and graph; compile and
    compile_graph, timed on one compile): a kernel leaves when the model is faster without it in one, unless the other
    runs it slower without by more (noise.deciding_mode). A
    model that fails to run in a mode counts as infinitely slow there, so a type that breaks a mode is left out
    too. Greedy, the types likeliest to leave tried first (_trial_order; prior: {type: without / with ratio} from
    the other side's prune), each trial timed in turns with the model it would replace (a
    host-bound model timed alone, one run after another, drifts by more than the differences a prune decides),
    and decided only outside the noise of its turns (noise.compare: a mode within its noise decides nothing);
    then, if the original itself is faster still in a mode, timed in turns with what is kept, every kernel goes.
    On the compiled side each model is compiled once, the set kept so far reused by the next trial (dynamo's
    recompile limit raised to hold them all): one compile per trial, minutes on a large model.
    Returns (optimized, {type: why it was left out}); progress, if given, hears each type's verdict as it falls,
    with the figures that decided it; decisions, if given, gets {type: {mode: noise.Verdict as a dict}, "kept
    together": ...}. reuse, if given on the compiled side, gets the original and the kept set as compiled and
    graphed for the last comparison ({"original": {mode: fn}, "kept": ...}), for time_models' rows to time
    without compiling them again (dynamo's cache is then kept, not emptied, at the end). shallow_trials: on the
    compiled side each trial compiles copies of the model cut to one and two of its blocks and takes the whole
    model's time from theirs (regional.py); the last check compiles both models whole.
    """
    modes, compiled = _one_side(modes)
    trials = _Trials(model, modes, compiled, inputs, device, shallow_trials)
    keep, dropped = optimized.swapped_types(), {}
    optimized = swap.build(model, keep)  # what deploy installs from the report: the types a site ran, no others
    keep = _trial_order(optimized, keep, prior or {})
    decided = {} if decisions is None else decisions
    reusing, traces = compiled and reuse is not None, (len(keep) + 2) * (1 + len(regional.DEPTHS))  # cut copies too
    with _compiling_each_once(traces, reset_after=not reusing) if compiled else contextlib.nullcontext():
        for kernel_type in list(keep):
            optimized = _try_without(trials, optimized, kernel_type, keep, dropped, progress, decided)
        if trials.shallow is not None:  # the last check and the rows: whole models
            trials.shallow = None
            trials.ready.clear()
        module = optimized.module()
        if keep and compiled and progress is not None:  # two whole compiles: minutes on a deep model
            getattr(progress, "note", progress)(f"prune ({', '.join(modes)}): compiling the original and the kept "
                                                "set whole for the last check")
        verdicts = trials.compare(model, against=module) if keep else {}
        if reusing:
            reuse["original"] = trials.as_rows(model)
            reuse["kept"] = trials.as_rows(module) if keep else reuse["original"]
            if not (reuse["original"] and reuse["kept"]):  # one failed: the rows compile afresh, from a clean cache
                reuse.clear()
                torch._dynamo.reset()
        trials.ready.clear()
    if keep and _original_wins(trials, module, keep, dropped, verdicts, progress, decided):
        optimized = swap.build(model, [])
        if reuse:  # the rows' optimized model is now the original
            reuse["kept"] = reuse["original"]
    return optimized, dropped


def _trial_order(optimized: swap.Optimized, types: list[str], prior: dict[str, float]) -> list[str]:
    """The order a greedy prune tries types in: the likeliest to leave first, so that the others are timed against
    the model they end up in (without linear_gelu, GPT-NeoX's MLP projection falls to the matmul type while it is in,
    not to cuBLAS: timed before matmul, linear_gelu stayed or went by the noise). By the prior's ratio (lowest first),
    then types placed by function patches (they take what module sites leave), then as given (by name)."""
    patched = set(getattr(optimized, "patch_types", {}).values())
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


def _try_without(trials: _Trials, optimized: swap.Optimized, kernel_type: str, keep: list[str], dropped: dict,
                 progress: Callable[[str], None] | None, decided: dict) -> swap.Optimized:
    """One greedy step of a prune: the model without kernel_type, timed in turns with the kernels kept so far.
    When it runs faster in one of the modes, outside the noise, kernel_type leaves `keep` for `dropped` (with why)
    and the trial is what goes on; else `optimized` does."""
    trial = swap.build(trials.model, [t for t in keep if t != kernel_type])
    verdicts = trials.compare(trial.module(), against=optimized.module())
    decided[kernel_type] = {m: v.to_dict() for m, v in verdicts.items()}
    failed = trials.failures.get(optimized.module())
    mode = noise.deciding_mode(verdicts)
    if mode:
        dropped[kernel_type] = _why(mode, verdicts[mode], failed)
        keep.remove(kernel_type)
        optimized = trial
    trials.forget_all_but(optimized.module())
    if progress:
        progress(f"prune ({', '.join(trials.modes)}): {kernel_type} " + (
            f"left out: {dropped[kernel_type]}" if mode else f"kept: {_why_kept(verdicts)} ({_versus(verdicts)})"))
    return optimized


def _original_wins(trials: _Trials, module, keep: list[str], dropped: dict, verdicts: dict,
                   progress: Callable[[str], None] | None, decided: dict) -> bool:
    """Whether the original model beats the kept kernels together (module, timed in turns with it: verdicts) in one
    of the modes, outside the noise: then every kept type goes into `dropped`, with why. progress hears it."""
    decided["kept together"] = {m: v.to_dict() for m, v in verdicts.items()}
    failed = trials.failures.get(module)
    mode = noise.deciding_mode(verdicts)
    if not mode:
        if progress:
            together = ("the original is faster in one mode, and slower by more in another" if _outweighed(verdicts)
                        else "together not slower than the original")
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
    if _outweighed(verdicts):
        return "the model runs faster without it in one mode, and slower without it by more in another"
    return "the model is not faster without it"


def _outweighed(verdicts: dict) -> bool:
    """A mode ran faster without, and noise.deciding_mode kept the kernel all the same: another ran slower by more."""
    return any(v.outcome == noise.FASTER for v in verdicts.values())


def _why(mode: str, verdict: noise.Verdict, failed: str | None) -> str:
    """Why a prune left a type out: the model failed with it in `mode`, or ran faster without it there."""
    if failed:
        return f"the model fails in {mode} mode with it ({failed})"
    return f"the model is faster without it in {mode} mode ({verdict.text()})"


class _Trials:
    """The models a prune compares, each deployed in its modes once (one compile for both compiled modes) and
    timed in turns with the model it would replace. A model that fails to deploy, to give the original's output
    or to run counts as infinitely slow; failures[fn] says why."""

    def __init__(self, model, modes: list[str], compiled: bool, inputs: Callable, device: str,
                 shallow_trials: bool = False):
        self.model, self.modes, self.compiled, self.device = model, modes, compiled, device
        self.sets = [inputs(TIMING_SEED + i) for i in range(TIMING_INPUTS)]
        self.backend = backend_for(device)
        self.timed = functools.partial(latency_turns, sets=self.sets, device=device)  # fns -> their samples in turns
        shallow = regional.ShallowTrials(model, self.backend, self.sets) if compiled and shallow_trials else None
        self.shallow = shallow if shallow is not None and shallow.usable() else None  # trials on cut copies
        self.failures = {}
        # fn -> deployed(fn): the kept set, deployed for one trial, is the `against` of the next one too
        self.ready = {}
        self.runs = {}  # fn -> fn as it runs before any graph (compiled on the compiled side)

    def deployed(self, fn) -> dict[str, Callable] | None:
        """{mode: fn as deployed in it} (one compile for both compiled modes), each having given the original's
        output; None (the failure kept) otherwise."""
        try:
            if self.shallow is not None:  # a trial: the model's cut copies (the original runs in the last check only)
                ready, wrong = self.shallow.deploy(fn, self.modes, timing.cuda_graphed, wrong_output)
            else:
                ran = torch.compile(fn, backend=self.backend) if self.compiled else fn
                self.runs[fn] = ran
                ready = {m: timing.cuda_graphed(ran, self.sets[0]) if m.endswith("graph") else ran for m in self.modes}
                wrong = None if fn is self.model else next(
                    filter(None, (wrong_output(r, self.model, self.sets[-1]) for r in ready.values())), None)
        except Exception as e:
            wrong = _error_line(e)
        if wrong:
            self.failures[fn] = wrong
            return None
        return ready

    def as_rows(self, fn) -> dict[str, Callable]:
        """fn deployed for time_models' rows ({"compile": compiled fn, "compile_graph": its graph}, what was made of
        it), {} where it failed."""
        ready = self.ready.get(fn)
        if ready is None:
            return {}
        return {"compile": self.runs[fn], **{m: r for m, r in ready.items() if m.endswith("graph")}}

    def deployed_once(self, fn) -> dict[str, Callable] | None:
        if fn not in self.ready:
            self.ready[fn] = self.deployed(fn)
        return self.ready[fn]

    def forget_all_but(self, fn) -> None:
        """Drop every deployed model but fn's, and their CUDA graphs' memory with them."""
        for loser in [f for f in self.ready if f is not fn]:
            del self.ready[loser]

    def alone(self, fn, ready) -> dict[str, float]:
        """fn's ms in each mode, deployed (deployed()'s dict, None: it failed) and timed by itself; a failure is
        infinitely slow."""
        if ready is None:
            return dict.fromkeys(self.modes, math.inf)
        try:
            return {m: self.shallow.alone(r, self._ms) if isinstance(r, dict) else self._ms(r)
                    for m, r in ready.items()}
        except Exception as e:
            self.failures[fn] = _error_line(e)
            return dict.fromkeys(self.modes, math.inf)

    def _ms(self, fn) -> float:
        return timing.time_fn(fn, self.sets, self.device, latency=True).median_us / 1e3

    def compare(self, fn, against) -> dict[str, noise.Verdict]:
        """{mode: the verdict on fn (the model without a kernel) against `against` (with it)}, timed in turns: a
        host that drifts between two separate timings does not decide between them. A close call gets more rounds
        of turns, up to PRUNE_ROUNDS. A model that fails counts as infinitely slow, the other timed alone."""
        without, with_ = self.deployed_once(fn), self.deployed_once(against)
        if without is None or with_ is None:
            return self._failed(fn, without, against, with_)
        samples = {m: {"without": [], "with": []} for m in self.modes}
        try:
            for _ in range(PRUNE_ROUNDS):
                for m in [m for m in self.modes if _undecided(samples[m])]:
                    sides = {"without": without[m], "with": with_[m]}
                    timed = functools.partial(self.timed, window_ms=GRAPHED_TURNS_MS if m.endswith("graph")
                                              else LATENCY_TURNS_MS)
                    turns = self.shallow.turns(sides, timed) if self.shallow is not None else timed(sides)
                    for side in ("without", "with"):
                        samples[m][side] += turns[side]
        except Exception:  # one of them fails in a mode: each timed alone, to know which
            return self._failed(fn, without, against, with_)
        return {m: noise.compare(s["without"], s["with"], PRUNE_MARGIN) for m, s in samples.items()}

    def _failed(self, fn, without, against, with_) -> dict[str, noise.Verdict]:
        without_ms, with_ms = self.alone(fn, without), self.alone(against, with_)
        return {m: noise.failed(without_ms[m], with_ms[m]) for m in self.modes}


def _undecided(samples: dict) -> bool:
    """Not timed yet, or a close call so far."""
    return not samples["without"] or noise.close_call(noise.compare(samples["without"], samples["with"],
                                                                    PRUNE_MARGIN), PRUNE_MARGIN)


@contextlib.contextmanager
def _compiling_each_once(models: int, reset_after: bool = True):
    """For the compiled side of a prune: dynamo's caches emptied before (and after, with reset_after), and room in
    between for one compiled trace of each of `models` models (the kernel sets share their forward's code, and past
    dynamo's recompile limit, 8 by default, a model would silently run uncompiled)."""
    limit = compat.recompile_limit_option()
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(**{limit: max(getattr(torch._dynamo.config, limit), models)}):
            yield
    finally:
        if reset_after:
            torch._dynamo.reset()  # what is timed after (verify's rows) compiles from a clean cache


def _versus(verdicts: dict) -> str:
    """'eager 9.100 ms without, 9.000 with (1.011x, ...); graph ...': what a prune compared, in each mode."""
    return "; ".join(f"{m} {v.text()}" for m, v in verdicts.items())


def _error_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
