"""The end-to-end measurement behind verify.py: the optimized model against the original, correct and faster.

Correctness: the optimized model's output (and, for a language model, the next-token loss, which runs
the cross_entropy kernel) is compared with the original's on fresh inputs by relative L2 error, within
swap.REL_L2_TOLERANCE (verify.py's docstring says where those numbers come from); on a mismatch each
type is swapped in alone and the types that alone exceed the tolerance are blamed.

Timing: one protocol (autokernel.harness.timing) for every row, in the four modes a user deploys a model in:
eager, graphed (replayed from a CUDA graph), compiled (torch.compile) and compiled + graphed. The
prune decides in the mode the user deploys (`DEPLOY_MODES`): a kernel that wins eager, where it saves
launches, can lose under torch.compile, whose own kernels fuse across what ours cannot. Deployed in eager
and compiled modes (verify.py's default: every mode it times), each side decides its own types, and the model
runs the compiled side's where torch.compile traces it (swap.build's `traced`).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from autokernel import cli, compat
from autokernel.harness import timing
from autokernel.kernelfile import KernelFileError, declarations
from autokernel.ops import customops, swap
from autokernel.profile.extraction import model_origin, model_shapes
from autokernel.verify.verification import DEPLOY_MODES, sides

CHECK_INPUTS = 3  # fresh inputs the optimized model must match the original on
TIMING_INPUTS = 2  # input sets the timed runs rotate through
CHECK_SEED, TIMING_SEED = 1, 1000  # seeds of the checked and of the timed inputs (distinct sets)
GPU_BACKEND, CPU_BACKEND = "inductor", "aot_eager"  # compile backends (a C++ build would dominate a CPU run)
PRUNE_MARGIN = 0.01  # a kernel type is left out when the model runs this much faster without it
# a model's forward timed in turns for about this long: a host-bound forward (a compiled Qwen2-1.5B without graphs
# enqueues 8.3 ms of its 8.8) drifts for seconds at a time, and 0.3 s windows in turns read 0.94 to 0.97x and
# 0.89 to 1.05x for one pair of models on the H200 host
LATENCY_TURNS_MS = 1000
LATENCY_MAX_TURNS = 400
PAIRED_ROUNDS = 200  # turns of a paired comparison: each times one run of both kernel sets (~5 s at 12 ms)
CPU_PAIRED_ROUNDS = 2  # in the interpreter: enough to run the path, the figures mean nothing there
PAIRED_P = 0.05  # a side is faster when it won this improbably many rounds for a coin (two-sided sign test)


def backend_for(device: str) -> str:
    return GPU_BACKEND if device == "cuda" else CPU_BACKEND


# ------------------------------------------------------------------------------ which model the kernels are for
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
                lines.append(f"warning: {name} carries none of the shapes profiled for {_describe(verified)} "
                             "(workspace/plan.json): it was extracted for another model or input")
            continue
        if _model_key(origin) != _model_key(verified):
            lines.append(f"warning: {name} was extracted for {_describe(origin)}, not for {_describe(verified)}: "
                         "its shapes and tuning are another model's (run profile.py and extract.py for this one)")
        elif _input_key(origin) != _input_key(verified):
            lines.append(f"warning: {name} was extracted for this model at input {_describe_input(origin)}, "
                         f"verified at {_describe_input(verified)}: its shapes and tuning are another input's")
    return lines


def _profiled_elsewhere(decl: dict, verified: dict, plan: dict | None) -> bool:
    """A file's MODEL_SHAPES are none of the shapes a plan of this very model and input profiled for its type."""
    planned = model_origin(plan or {})
    if not decl.get("MODEL_SHAPES") or planned is None or (_model_key(planned), _input_key(planned)) != (
            _model_key(verified), _input_key(verified)):
        return False
    shapes = [s for e in plan.get("entries", []) if e.get("type") == decl.get("KERNEL_TYPE") for s in model_shapes(e)]
    return bool(shapes) and not any(s in shapes for s in decl["MODEL_SHAPES"])


def _model_key(origin: dict) -> tuple:
    source, _, class_name = str(origin.get("model", "")).rpartition(":")
    return Path(source).name, class_name, origin.get("config")  # models/llama.py and /abs/models/llama.py alike


def _input_key(origin: dict) -> tuple:
    dtype = str(origin.get("dtype"))
    return list(origin.get("input_shape") or []), cli.DTYPE_ALIASES.get(dtype.lower(), dtype)


def _describe(origin: dict) -> str:
    config = f" (config {origin['config']})" if origin.get("config") else ""
    return f"{origin.get('model')}{config}"


def _describe_input(origin: dict) -> str:
    shape, dtype = _input_key(origin)
    return f"{','.join(map(str, shape))} {dtype}"


# ------------------------------------------------------------------------------ correctness
def check(model, optimized: swap.Optimized, inputs: Callable, dtype, n_inputs: int = CHECK_INPUTS) -> dict:
    """Compare the optimized model with the original on n_inputs fresh inputs; blame on a mismatch."""
    tol = swap.REL_L2_TOLERANCE[dtype]
    runs, cases = [], []
    for i in range(n_inputs):
        args = inputs(CHECK_SEED + i)
        want = forward(model, args)
        try:
            got = forward(optimized.module(), args, optimized.patched)  # the loss, too, in the patches' scope
        except customops.KernelCallError as e:
            return {"status": "FAIL", "tolerance_rel_l2": tol, "inputs": runs, "blamed": [e.kernel_type],
                    "reason": str(e).splitlines()[0], "forwards": i}
        runs.append(compare_outputs(got, want, tol))
        cases.append((args, want))
    failed = [c for c, r in zip(cases, runs) if not r["ok"]]
    result = {"status": "FAIL" if failed else "PASS", "tolerance_rel_l2": tol, "inputs": runs,
              "worst_rel_l2": max(r["rel_l2"] for r in runs), "forwards": n_inputs}
    if failed:
        result["blame"] = blame(model, optimized.swapped_types(), failed[:1], tol)
        result["blamed"] = [t for t, r in result["blame"].items() if not r["ok"]]
        result["reason"] = _mismatch_reason(result)
    return result


def forward(model, args, scope=None):
    """(main output, next-token loss or None) of one forward, inside `scope` (a context) if given."""
    with (scope or contextlib.nullcontext)():
        out = main_output(model(*args))
        return out, _lm_loss(model, args, out)


def main_output(out):
    """The tensor to compare: the output itself, or the logits / last hidden state / first tensor."""
    for name in ("logits", "last_hidden_state"):
        if getattr(out, name, None) is not None:
            return getattr(out, name)
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        out = next((o for o in out if isinstance(o, torch.Tensor)), None)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the model returned {type(out).__name__}: verify.py compares tensors or logits")
    return out


def _lm_loss(model, args, logits):
    """The loss a training step computes on a language model's logits: next-token cross-entropy.

    Computed through F.cross_entropy, so that inside the optimized model's scope it runs the cross_entropy kernel;
    where linear_cross_entropy replaced the model's output embedding (swap.KernelLMHead), computed there instead,
    in a forward of its own that stops at the head: the LM head and the loss are one kernel call on the hidden
    states, and no logits are built for it."""
    import torch.nn.functional as F

    from autokernel.models import config_value

    vocab, ids = config_value(model, "vocab_size"), args[0] if args else None
    if (vocab is None or ids is None or ids.is_floating_point() or ids.dim() != 2 or ids.shape[1] < 2
            or logits.dim() != 3 or tuple(logits.shape) != (*ids.shape, vocab)):
        return None
    head = swap.fused_lm_head(model)
    if head is not None:
        return head.next_token_loss(model, args, ids)
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))


def compare_outputs(got, want, tol: float) -> dict:
    """Norm-wise and elementwise errors of (output, loss) against the original's."""
    (out, loss), (ref, ref_loss) = got, want
    if out.shape != ref.shape:
        return {"ok": False, "rel_l2": float("inf"), "reason": f"output shape {tuple(out.shape)}, "
                                                              f"expected {tuple(ref.shape)}"}
    bad = int((~torch.isfinite(out) & torch.isfinite(ref)).sum())
    diff = (out.double() - ref.double()).abs().nan_to_num(float("inf"))
    scale = float(ref.double().abs().max()) or 1.0
    r = {"rel_l2": float("inf") if bad else swap.rel_l2(out, ref), "max_abs": float(diff.max()),
         "max_rel": float(diff.max()) / scale, "nonfinite": bad}
    if loss is not None and ref_loss is not None:
        r["loss"], r["ref_loss"] = float(loss), float(ref_loss)
        r["loss_rel"] = abs(float(loss) - float(ref_loss)) / max(abs(float(ref_loss)), 1e-12)
    r["ok"] = r["rel_l2"] <= tol and r.get("loss_rel", 0.0) <= tol
    return r


def blame(model, types, cases, tol) -> dict:
    """Each swapped type alone in the model: its error on the failing inputs."""
    found = {}
    for t in types:
        single = swap.build(model, [t])
        results = []
        for args, want in cases:
            try:
                results.append(compare_outputs(forward(single.model, args, single.patched), want, tol))
            except customops.KernelCallError as e:
                results.append({"ok": False, "rel_l2": float("inf"), "reason": str(e).splitlines()[0]})
        found[t] = max(results, key=lambda r: (not r["ok"], r["rel_l2"]))
    return found


def _mismatch_reason(result) -> str:
    worst = max(result["inputs"], key=lambda r: r["rel_l2"])
    what = f"relative L2 error {worst['rel_l2']:.3g} > {result['tolerance_rel_l2']:g}"
    if worst.get("nonfinite"):
        what = f"{worst['nonfinite']} NaN/Inf outputs where the original is finite"
    elif worst.get("loss_rel", 0) > result["tolerance_rel_l2"]:
        what = f"loss off by {worst['loss_rel']:.3g} (relative)"
    if result["blamed"]:
        return f"{what}; alone over the tolerance: {', '.join(result['blamed'])}"
    errors = {t: r["rel_l2"] for t, r in result["blame"].items()}
    top = max(errors, key=errors.get) if errors else "none"
    return f"{what}; no kernel alone exceeds the tolerance, their errors add up (largest alone: {top})"


# ------------------------------------------------------------------------------ timing
def time_models(model, optimized: swap.Optimized, inputs: Callable, device: str, with_compile: bool,
                with_graphs: bool = False) -> tuple[dict, dict]:
    """Median latency of the original (eager, compiled) and the optimized model, one process, one protocol.

    Rows: eager, compile, optimized, optimized_compile (with_compile), and each again as <row>_graph
    replayed from a CUDA graph (with_graphs); each with its speedup over the original in its mode. The
    original and the optimized model of one mode are timed in turns (timing.time_turns), as latency (the
    host's cost counts: without a CUDA graph a model's forward can wait on its launches): a host that runs
    slower for a while slows both alike. Run one after the other, a host-bound compiled Qwen2's forward
    measured 8.6 to 17.4 ms in one process on the H200 host. Returns (rows, {row: error}): a mode that
    fails (a compile error, a capture error) is reported, and the other rows are still timed."""
    backend = backend_for(device)
    sets = [inputs(TIMING_SEED + i) for i in range(TIMING_INPUTS)]
    module = optimized.module()
    makers = {"eager": lambda: model, "compile": lambda: torch.compile(model, backend=backend),
              "optimized": lambda: module}
    if with_compile:
        makers["optimized_compile"] = lambda: torch.compile(module, backend=backend)
    names = list(makers) + ([f"{name}_graph" for name in makers] if with_graphs else [])
    pairs = [(name, f"optimized{name.removeprefix('eager')}" if name.startswith("eager") else f"optimized_{name}")
             for name in names if not name.startswith("optimized")]
    result, errors = {}, {}
    # Modes without torch.compile first: once a compile ran, the process holds its compiler's objects, and an
    # eager model timed after it ran 20-70% slower and noisier on the H200 host (a TinyLlama's optimized
    # eager forward: 12.8 ms timed before any compile, 22.3 ms after). A user running eager compiles nothing.
    for pair in sorted(pairs, key=lambda p: "compile" in p[0]):
        fns = {}
        for name in pair:
            if name not in names:
                continue
            try:
                fn = makers[name.removesuffix("_graph")]()
                if name.endswith("_graph"):  # replayed from a CUDA graph, compared with its graphed original
                    fn = timing.cuda_graphed(fn, sets[0])
                wrong = wrong_output(fn, model, sets[-1]) if name.startswith("optimized") else None
                if wrong:
                    errors[name] = wrong
                    continue
                fns[name] = fn
            except Exception as e:  # one failing mode must not hide the others
                errors[name] = _error_line(e)
        try:
            samples = latency_turns(fns, sets, device) if fns else {}
        except Exception as e:
            errors.update({name: _error_line(e) for name in fns})
            continue
        for name, us in samples.items():
            t = timing.Timing(statistics.median(us), us)
            result[name] = {"ms": t.median_us / 1e3, "noise_pct": t.spread_pct, "runs": len(us)}
    result = {name: result[name] for name in names if name in result}  # back in the table's order
    for name, r in result.items():
        mode = "_graph" if name.endswith("_graph") else ""
        for base in ("eager", "compile"):
            if base + mode in result:
                r[f"speedup_vs_{base}"] = result[base + mode]["ms"] / r["ms"]
    return result, errors


def latency_turns(fns: dict[str, Callable], sets: list, device: str) -> dict[str, list[float]]:
    """Latency samples of each function in turns, about LATENCY_TURNS_MS of each by the slowest one's probe run."""
    if device != "cuda":
        return timing.time_turns(fns, sets, device, timing.CPU_RUNS)
    probe = timing.time_turns(fns, sets, device, 1, latency=True)
    turns = timing.runs_for(max(us[0] for us in probe.values()) / 1e3, LATENCY_TURNS_MS, LATENCY_MAX_TURNS)
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
                   progress: Callable[[str], None] | None = None):
    """prune() on each side of `modes` (verification.deploy_modes): the types kept in the eager modes (eager,
    graph) run eagerly, those kept in the compiled ones (compile, compile_graph) where torch.compile traces the
    model. Returns (optimized, {type: why} left out eagerly, {type: why} left out under torch.compile); modes of
    one side decide both. progress: called with a line per type tried."""
    eager, compiled = sides(modes)
    if not eager or not compiled:
        optimized, dropped = prune(model, optimized, inputs, device, modes, progress)
        return optimized, dropped, dropped
    types = optimized.swapped_types()
    _, dropped = prune(model, optimized, inputs, device, eager, progress)
    _, dropped_traced = prune(model, optimized, inputs, device, compiled, progress)
    both = swap.build(model, [t for t in types if t not in dropped],
                      traced=[t for t in types if t not in dropped_traced])
    return both, dropped, dropped_traced


def prune(model, optimized: swap.Optimized, inputs: Callable, device: str, modes: str | list[str] = "eager",
          progress: Callable[[str], None] | None = None):
    """Leave out, one type at a time, each kernel whose removal makes the whole model faster in one of `modes`.

    A kernel that beats PyTorch at the harness's shape can still lose at this model's shapes (a
    Triton matmul against cuBLAS at N=256), or in the mode the model is deployed in (under
    torch.compile, against Inductor's fused kernels); the end-to-end time in that mode is what
    counts. modes: one mode, or the two of one side, which run the same kernels (eager and graph; compile and
    compile_graph, timed on one compile): a kernel stays only if the model is faster without it in none. A
    model that fails to run in a mode counts as infinitely slow there, so a type that breaks a mode is left out
    too. Greedy, in the order of the types, each trial timed in turns with the model it would replace (timed
    alone, one after another, a compiled TinyLlama's trials read 12.6 to 22.8 ms for one set of kernels on the
    H200 host); then, if the original itself is faster still in a mode, timed in turns with what is kept (a
    compiled Qwen2's kept kernels measured 8.91 ms alone and 10.60 ms in turns with the original's 10.12), every
    kernel goes. On the compiled side each model is compiled once, the set kept so far reused by the next trial
    (dynamo's recompile limit raised to hold them all): one compile per trial, minutes on a large model.
    Returns (optimized, {type: why it was left out}); progress, if given, hears each type's verdict as it falls,
    with the figures that decided it.
    """
    modes = [modes] if isinstance(modes, str) else list(modes)
    if not modes or any(m not in DEPLOY_MODES for m in modes):
        raise ValueError(f"deploy mode {','.join(modes)!r}: one of {', '.join(DEPLOY_MODES)}")
    eager_modes, compiled_modes = sides(modes)
    if eager_modes and compiled_modes:
        raise ValueError(f"deploy modes {','.join(modes)!r}: one prune times the modes of one side, eager or compiled")
    compiled = bool(compiled_modes)
    sets = [inputs(TIMING_SEED + i) for i in range(TIMING_INPUTS)]
    backend = backend_for(device)
    failures = {}

    def deployed(fn) -> dict[str, Callable] | None:
        """{mode: fn as deployed in it} (one compile for both compiled modes), each having given the original's
        output; None (the failure kept) otherwise."""
        try:
            ran = torch.compile(fn, backend=backend) if compiled else fn
            ready = {m: timing.cuda_graphed(ran, sets[0]) if m.endswith("graph") else ran for m in modes}
            wrong = None if fn is model else next(
                filter(None, (wrong_output(r, model, sets[-1]) for r in ready.values())), None)
        except Exception as e:
            wrong = _error_line(e)
        if wrong:
            failures[fn] = wrong
            return None
        return ready

    def alone(fn, ready) -> dict[str, float]:
        """fn's ms in each mode, deployed (deployed()'s dict, None: it failed) and timed by itself; a failure is
        infinitely slow."""
        if ready is None:
            return dict.fromkeys(modes, math.inf)
        try:
            return {m: timing.time_fn(r, sets, device, latency=True).median_us / 1e3 for m, r in ready.items()}
        except Exception as e:
            failures[fn] = _error_line(e)
            return dict.fromkeys(modes, math.inf)

    ready = {}  # fn -> deployed(fn): the kept set, deployed for one trial, is the `against` of the next one too

    def deployed_once(fn) -> dict[str, Callable] | None:
        if fn not in ready:
            ready[fn] = deployed(fn)
        return ready[fn]

    def in_turns(fn, against) -> tuple[dict, dict]:
        """(against's ms, fn's ms) in each mode, timed in turns: a host that drifts between two separate timings
        (a compiled TinyLlama without graphs read 12.6 to 22.8 ms for one set of kernels, timed alone one after
        another) does not decide between them. A model that fails counts as infinitely slow, the other timed
        alone."""
        kept, original = deployed_once(fn), deployed_once(against)
        if kept is None or original is None:
            return alone(against, original), alone(fn, kept)
        try:
            samples = {m: latency_turns({"kept": kept[m], "original": original[m]}, sets, device) for m in modes}
        except Exception:  # one of them fails in a mode: each timed alone, to know which
            return alone(against, original), alone(fn, kept)
        return ({m: statistics.median(s["original"]) / 1e3 for m, s in samples.items()},
                {m: statistics.median(s["kept"]) / 1e3 for m, s in samples.items()})

    def faster_in(a: dict, b: dict) -> str | None:
        """The first mode in which a runs faster than b by the margin (None: in none)."""
        return next((m for m in modes if a[m] < b[m] * (1 - PRUNE_MARGIN)), None)

    def why(mode, trial_ms, best_ms, failed) -> str:
        if failed:
            return f"the model fails in {mode} mode with it ({failed})"
        return f"the model is faster without it in {mode} mode ({trial_ms[mode]:.3f} ms vs {best_ms[mode]:.3f} ms)"

    keep, dropped = optimized.swapped_types(), {}
    with _compiling_each_once(len(keep) + 2) if compiled else contextlib.nullcontext():
        for kernel_type in list(keep):
            trial = swap.build(model, [t for t in keep if t != kernel_type])
            best, trial_ms = in_turns(trial.module(), against=optimized.module())
            failed = failures.get(optimized.module())
            mode = faster_in(trial_ms, best)
            if mode:
                dropped[kernel_type] = why(mode, trial_ms, best, failed)
                keep.remove(kernel_type)
                optimized = trial
            for loser in [fn for fn in ready if fn is not optimized.module()]:
                del ready[loser]  # and its CUDA graphs' memory with it
            if progress:
                progress(f"prune ({', '.join(modes)}): {kernel_type} " + (
                    f"left out: {dropped[kernel_type]}" if mode else
                    f"kept: the model is not faster without it ({_versus(modes, trial_ms, best)})"))
        module = optimized.module()
        original_ms, best = in_turns(module, against=model) if keep else ({}, {})
        ready.clear()
    failed = failures.get(module)
    mode = faster_in(original_ms, best) if keep else None
    if mode:
        for kernel_type in keep:
            dropped[kernel_type] = why(mode, original_ms, best, failed) if failed else (
                f"together the kernels lose in {mode} mode (original {original_ms[mode]:.3f} ms vs "
                f"{best[mode]:.3f} ms)")
        if progress and keep:
            progress(f"prune ({', '.join(modes)}): {', '.join(keep)} left out too: {dropped[keep[0]]}")
        optimized = swap.build(model, [])
    elif progress and keep:
        progress(f"prune ({', '.join(modes)}): {', '.join(keep)} kept: together not slower than the original "
                 f"({_versus(modes, original_ms, best)})")
    return optimized, dropped


@contextlib.contextmanager
def _compiling_each_once(models: int):
    """For the compiled side of a prune: dynamo's caches emptied before and after, and room in between for one
    compiled trace of each of `models` models (the kernel sets share their forward's code, and past dynamo's
    recompile limit, 8 by default, a model would silently run uncompiled)."""
    limit = compat.recompile_limit_option()
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(**{limit: max(getattr(torch._dynamo.config, limit), models)}):
            yield
    finally:
        torch._dynamo.reset()  # what is timed after (verify's rows) compiles from a clean cache


def _versus(modes, without: dict, with_: dict) -> str:
    """'eager 9.100 ms without, 9.000 with; graph ...': what a prune compared, in each mode."""
    return "; ".join(f"{m} {without[m]:.3f} ms without, {with_[m]:.3f} with" for m in modes)


def paired(model, module, ours: dict, theirs: dict, inputs: Callable, device: str,
           rounds: int = PAIRED_ROUNDS) -> dict:
    """The optimized model with our kernels against the same model with theirs (customops.installed() of the
    same types), timed in turns in one process (timing.time_turns: one run of each per turn), so that a
    difference of a few tenths of a percent is not lost in the drift between two runs. On a GPU each side is
    replayed from its own CUDA graph (GPU time, what the loop optimizes), captured while its kernels were
    installed. Each side's output is checked against the original's first: a wrong one is an error, not a
    figure."""
    sets = [inputs(TIMING_SEED + i) for i in range(TIMING_INPUTS)]
    sides = {"ours": ours, "theirs": theirs}
    fns = {}
    try:
        for name, kernels in sides.items():
            customops.reinstall(kernels)
            fns[name] = timing.cuda_graphed(module, sets[0]) if device == "cuda" else _installing(kernels, module)
            wrong = wrong_output(fns[name], model, sets[-1])
            if wrong:
                return {"error": f"{name}: {wrong}"}
        samples = timing.time_turns(fns, sets, device, rounds)
    except Exception as e:
        return {"error": _error_line(e)}
    finally:
        customops.reinstall(ours)
    ms = {name: [us / 1e3 for us in runs] for name, runs in samples.items()}
    return {"mode": "graph" if device == "cuda" else "eager", **paired_verdict(ms["ours"], ms["theirs"])}


def _installing(kernels: dict, module) -> Callable:
    """The eager module run with these kernels installed (a graph replays what it captured; eager code
    calls whatever is installed at the time)."""
    def run(*args):
        customops.reinstall(kernels)
        return module(*args)
    return run


def paired_verdict(ours: list[float], theirs: list[float]) -> dict:
    """Medians, their ratio (theirs / ours: above 1 when ours is faster), the rounds ours won, and the verdict of
    a two-sided sign test over the rounds: faster, slower, or no measurable difference."""
    wins = sum(o < t for o, t in zip(ours, theirs))
    losses = sum(o > t for o, t in zip(ours, theirs))
    n = wins + losses  # ties carry no sign
    tail = sum(math.comb(n, k) for k in range(max(wins, losses), n + 1)) / 2**n if n else 1.0
    p = min(1.0, 2 * tail)
    verdict = "no measurable difference" if p >= PAIRED_P else ("faster" if wins > losses else "slower")
    ms, against_ms = statistics.median(ours), statistics.median(theirs)
    return {"rounds": len(ours), "ms": ms, "against_ms": against_ms, "speedup": against_ms / ms,
            "won_rounds": wins, "p_value": p, "verdict": verdict}


def _error_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def graph_breaks(optimized: swap.Optimized, args) -> dict:
    """Graphs and graph breaks dynamo makes of the optimized model (0 breaks: the kernels are graph nodes)."""
    import torch._dynamo

    explained = torch._dynamo.explain(optimized.module())(*args)
    torch._dynamo.reset()  # explain's traces are not the ones to time
    return {"graphs": explained.graph_count, "graph_breaks": explained.graph_break_count,
            "break_reasons": [str(b.reason) for b in explained.break_reasons][:10]}
