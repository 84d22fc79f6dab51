"""The end-to-end measurement behind verify.py: the optimized model against the original, correct and faster.

Correctness (correctness.py): the optimized model's output (and, for a language model, the next-token loss, which
runs the cross_entropy kernel) is compared with the original's on fresh inputs by relative L2 error, within
swap.REL_L2_TOLERANCE; on a mismatch the types that alone exceed the tolerance are blamed. origin.py warns of a
kernel file extracted for another model or input.

Timing (here): one protocol (autokernel.harness.timing) for every row, in the four modes a user deploys a model in:
eager, graphed (replayed from a CUDA graph), compiled (torch.compile) and compiled + graphed; and the trials of
the prune (pruning.py: Trials, each model deployed once and timed in turns with the one it would replace). The
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
from autokernel.verify import ahead as compiling_ahead
from autokernel.verify import noise, regional
from autokernel.verify.correctness import CHECK_INPUTS, CHECK_SEED, blame, check, compare_outputs, forward, main_output
from autokernel.verify.noise import paired_verdict
from autokernel.verify.origin import origin_warnings

__all__ = ["CHECK_INPUTS", "CHECK_SEED", "TIMING_SEED", "backend_for", "blame", "check", "compare_outputs", "forward",
           "latency_turns", "main_output", "origin_warnings", "paired_verdict", "Trials", "compiling_each_once",
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
# an interval this wide that decides nothing is the cut copies' noise: they are cut deeper (regional.deepen); a
# 1B decoder's trials read 0.5-1% wide, Gemma-2 2B's at 1x8192 on copies of one and two of 26 layers 10-13%
WIDE = 0.05


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
            base = pair[0].removesuffix("_graph")  # its speedup over that row: the median of the turns' ratios
            result[pair[1]].update({"speedup_interval": [v.low, v.high], f"speedup_vs_{base}": v.ratio})
    result = {name: result[name] for name in names if name in result}  # back in the table's order
    _host_shares(result)
    for name, r in result.items():
        mode = "_graph" if name.endswith("_graph") else ""
        for base in ("eager", "compile"):
            if base + mode in result:  # over a row not timed in turns with it: the medians' ratio
                r.setdefault(f"speedup_vs_{base}", result[base + mode]["ms"] / r["ms"])
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


def device_shares(fn: Callable, args: tuple, device: str, calls: int = 5) -> list[float] | None:
    """The part of a call's wall time the GPU spends working, once per call: torch.profiler's device events in one
    call over the wall clock of each of `calls` others, which the profiler does not slow. Near 1 for a forward the
    GPU bounds, where an eager timing is GPU time. None off a GPU."""
    if device != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    from autokernel.profile.profiling import device_time_us

    walls = []
    with torch.no_grad():
        fn(*args)  # warm: the first call may load kernels
        for _ in range(calls):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn(*args)
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - start) * 1e6)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn(*args)
            torch.cuda.synchronize()
    busy = device_time_us(prof.events())
    return [min(1.0, busy / wall) for wall in walls]


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


class Trials:
    """The models a prune compares, each deployed in its modes once (one compile for both compiled modes) and
    timed in turns with the model it would replace. A model that fails to deploy, to give the original's output
    or to run counts as infinitely slow; failures[fn] says why."""

    def __init__(self, model, modes: list[str], compiled: bool, inputs: Callable, device: str,
                 shallow_trials: bool = False, ahead: compiling_ahead.Ahead | None = None, recall=None):
        self.model, self.modes, self.compiled, self.device = model, modes, compiled, device
        self.sets = [inputs(TIMING_SEED + i) for i in range(TIMING_INPUTS)]
        self.backend = backend_for(device)
        self.timed = functools.partial(latency_turns, sets=self.sets, device=device)  # fns -> their samples in turns
        shallow = regional.ShallowTrials(model, self.backend, self.sets) if compiled and shallow_trials else None
        self.shallow = shallow if shallow is not None and shallow.usable() else None  # trials on cut copies
        self.ahead, self.upcoming = ahead, None  # the helper compiling ahead (ahead.py); what plan_ahead() told it
        if self.shallow is not None:
            self.shallow.ahead = ahead
        self.failures = {}
        # fn -> deployed(fn): the kept set, deployed for one trial, is the `against` of the next one too
        self.ready = {}
        self.runs = {}  # fn -> fn as it runs before any graph (compiled on the compiled side)
        self.pool = None  # the CUDA graphs' one memory pool (graphed())
        self.probed = False  # whether the cut copies' own noise was read (_deepened_first)
        self.recall = recall  # recall.Recall: earlier runs' verdicts, which agreeing readings hold (pruning._held)
        self.spent = {"deploying": 0.0, "timing": 0.0}  # seconds: compiles (or waits for the helper's), captures,
        # output checks; turns (pruning's progress lines say what each trial took of both)

    def deployed(self, fn) -> dict[str, Callable] | None:
        """{mode: fn as deployed in it} (one compile for both compiled modes), each having given the original's
        output; None (the failure kept) otherwise."""
        try:
            with self._spending("deploying"):
                ready, wrong = self._deploy(fn)
        except Exception as e:
            wrong = _error_line(e)
        if wrong:
            self.failures[fn] = wrong
            return None
        return ready

    def _deploy(self, fn) -> tuple[dict, str | None]:
        """({mode: fn deployed in it}, what is wrong with its output or None)."""
        if self.shallow is not None:  # a trial: the model's cut copies (the original runs in the last check only)
            return self.shallow.deploy(fn, self.modes, self.graphed, wrong_output)
        if self.compiled:
            compiling_ahead.wait(self.ahead, fn)
        ran = torch.compile(fn, backend=compiling_ahead.quiet(self.backend, self.ahead)) if self.compiled else fn
        self.runs[fn] = ran
        ready = {m: self.graphed(ran, self.sets[0]) if m.endswith("graph") else ran for m in self.modes}
        wrong = None if fn is self.model else next(
            filter(None, (wrong_output(r, self.model, self.sets[-1]) for r in ready.values())), None)
        return ready, wrong

    def graphed(self, fn, example: tuple) -> Callable:
        """fn captured in a CUDA graph in the prune's one memory pool. A graph holds its forward's peak memory for as
        long as it lives, and a compiled trial keeps four alive (two models, each cut twice): Gemma-2 2B's at 1x8192
        held 125 GiB of an H200, and a trial failed for the memory the others held. The prune's models replay one at
        a time and each output is read before another replays (wrong_output), as a shared pool asks. The pool is a
        torch.cuda.MemPool held here: a bare graph_pool_handle() dies with the last graph captured into it, and the
        next capture into it fails."""
        if self.pool is None and torch.cuda.is_available():
            self.pool = torch.cuda.MemPool()
        replay = timing.cuda_graphed(fn, example, pool=self.pool.id if self.pool is not None else None)
        replay.pool = self.pool  # outlives the prune with the graph (verify's rows replay the last check's)
        return replay

    def plan_ahead(self, keep: list[str], upcoming: list[list[str]]) -> None:
        """Tell the helper compiling ahead, if any, the models the prune compiles next (ahead.jobs: the kept set
        and keep without each of upcoming, cut as the trials cut them, and the last check's whole models); again once
        the depth of the cut is known (_deepened_first, or a trial cut deeper)."""
        if self.ahead is None:
            return
        self.upcoming, cut = (keep, upcoming), self.shallow
        self.ahead.plan(compiling_ahead.jobs(keep, upcoming, cut.depths if cut else (None,),
                                             cut.deepest() if cut and not self.probed else None))

    def modes_that_fail(self, fn) -> dict[str, str]:
        """{mode: why} for each mode where fn, deployed in it alone, fails: HF's Gemma-2 copies from the host in its
        forward, which no CUDA graph captures, while it runs eagerly."""
        failing, modes = {}, self.modes
        try:
            for mode in modes:
                self.modes = [mode]
                if self.deployed(fn) is None:
                    failing[mode] = self.failures.pop(fn)
        finally:
            self.modes = modes
        return failing

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
        if self.shallow is not None:
            self.shallow.forget_all_but(fn)

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
        of turns, up to PRUNE_ROUNDS; on cut copies that read too wide to decide, the trial starts again cut deeper
        (_too_wide), or before the first trial where the copies' own noise already reads too wide (_deepened_first).
        A model that fails counts as infinitely slow, the other timed alone."""
        with_ = self.deployed_once(against)
        if with_ is not None and self._deepened_first(with_):
            with_ = self.deployed_once(against)
        without = self.deployed_once(fn)
        if without is None or with_ is None:
            return self._failed(fn, without, against, with_)
        samples, deepened = {m: {"without": [], "with": []} for m in self.modes}, False
        margins = {m: noise.margin_for(m, PRUNE_MARGIN, self.modes) for m in self.modes}
        try:
            for done in range(1, PRUNE_ROUNDS + 1):
                for m in _open(samples, margins):
                    turns = self._turns(m, {"without": without[m], "with": with_[m]})
                    for side in ("without", "with"):
                        samples[m][side] += turns[side]
                width = self._too_wide(samples, done, margins)
                if width and (deepened := self.shallow.deepen(width, WIDE)):
                    break
        except Exception:  # one of them fails in a mode: each timed alone, to know which
            return self._failed(fn, without, against, with_)
        if deepened:
            self.ready.clear()  # the copies of the old depth
            self._replan()
            return self.compare(fn, against)
        return {m: noise.compare(s["without"], s["with"], margins[m]) for m, s in samples.items()}

    def _turns(self, mode: str, sides: dict) -> dict[str, list[float]]:
        """One round of turns of the two sides ({side: deployed in mode}): the whole model's times per turn."""
        window = GRAPHED_TURNS_MS if mode.endswith("graph") else LATENCY_TURNS_MS
        timed = functools.partial(self.timed, window_ms=window)
        with self._spending("timing"):
            return self.shallow.turns(sides, timed) if self.shallow is not None else timed(sides)

    @contextlib.contextmanager
    def _spending(self, what: str):
        """The block's seconds added to spent[what], whether it returns or raises."""
        began = time.monotonic()
        try:
            yield
        finally:
            self.spent[what] += time.monotonic() - began

    def _deepened_first(self, with_: dict) -> bool:
        """Before the first trial on cut copies: the kept set's copies timed in turns with themselves for one round.
        Where that alone reads too wide (_too_wide: the copies' noise, whatever a kernel does), they are cut deeper
        before any trial compiles copies of the old depth (Gemma-2 2B at 1x8192 compiled its first trial's copies
        twice, at one and two blocks, then at one and eight). Whether they were."""
        if self.shallow is None or self.probed:
            return False
        self.probed = True
        try:
            samples = {m: self._turns(m, {"without": with_[m], "with": with_[m]}) for m in self.modes}
        except Exception:  # the kept set fails to run: the trial finds it and says why
            return False
        width = self._too_wide(samples, 1, dict.fromkeys(samples, PRUNE_MARGIN))
        deepened = bool(width and self.shallow.deepen(width, WIDE))
        if deepened:
            self.ready.clear()  # the copies of the old depth (the shallow one stays compiled: regional.ShallowTrials)
        self._replan()  # the depth is known: the helper compiles no other
        return deepened

    def _replan(self) -> None:
        if self.upcoming is not None:
            self.plan_ahead(*self.upcoming)

    def _too_wide(self, samples: dict, done: int, margins: dict[str, float]) -> float:
        """On cut copies, the widest interval that cannot be trusted, else 0: the copies' noise, not the kernel's, cut
        deeper now rather than after rounds that cannot decide. A close call's, where every round of turns would
        leave it wider than WIDE and still around 1 (the width falls as one over the square root of the turns); and a
        decided one's, wider than WIDE and than the effect it reads: the copies' difference is multiplied by the
        blocks left out, and where it is that noisy the median of the ratios strays from the truth (Qwen3-0.6B's
        fused_mlp read 0.762x, interval 0.428-0.979, on copies of one and two of its 28 blocks, where the two
        sides' medians were 1.7% apart the other way, and was left out, where another run had kept it)."""
        if self.shallow is None:
            return 0.0
        shrink, still_open = math.sqrt(done / PRUNE_ROUNDS), _open(samples, margins)
        wide = []
        for mode, s in samples.items():
            if not s["without"]:
                continue
            v = noise.compare(s["without"], s["with"], margins[mode])
            width, off = v.high - v.low, abs(v.ratio - 1)
            if mode in still_open:
                too = width * shrink > WIDE and off < width * shrink / 2
            else:
                too = width > WIDE and off < width
            wide += [width] if too else []
        return max(wide, default=0.0)

    def _failed(self, fn, without, against, with_) -> dict[str, noise.Verdict]:
        without_ms, with_ms = self.alone(fn, without), self.alone(against, with_)
        return {m: noise.failed(without_ms[m], with_ms[m]) for m in self.modes}


def _open(samples: dict, margins: dict[str, float]) -> dict[str, noise.Verdict | None]:
    """{mode: its verdict so far, None before its first turns} of the modes of a trial ({mode: {"without", "with"}})
    another round of turns can still decide: the close calls (noise.close_call), but a host-bound one beside graphed
    modes that all read outside the noise, which decide a conflict (noise.deciding_mode): its turns would change no
    verdict. On an H100 TinyLlama's rmsnorm read 1.124x graphed in one round (22 turns) and its eager turns went on to
    44, a second of host-bound forwards per round."""
    now = {m: noise.compare(s["without"], s["with"], margins[m]) if s["without"] else None for m, s in samples.items()}
    graphed = [m for m in now if m in noise.GPU_TIMED]
    settled = bool(graphed) and all(now[m] is not None and now[m].outcome != noise.WITHIN_NOISE for m in graphed)
    return {m: v for m, v in now.items() if (v is None or noise.close_call(v, margins[m]))
            and not (settled and m not in graphed)}


@contextlib.contextmanager
def compiling_each_once(models: int, reset_after: bool = True):
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


def _error_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
