"""A kernel's time in the model: every model shape timed, weighted by how often the model calls it.

A kernel file extracted from a profile carries `MODEL_SHAPES` and `MODEL_CALLS` (calls per forward
pass of each shape). Its score is the sum over shapes of calls x time per call: what the kernel costs
one forward pass of the model, the loop's objective. A file without MODEL_CALLS weighs each shape once.

At the model's sizes one call is a few microseconds, less than the host needs to launch it, so timing
one call between two events measures the launch gap as much as the GPU. Here each function (the
kernel, PyTorch eager, torch.compile) is captured in a CUDA graph per input set (timing.cuda_graphed)
and the replays are timed by the one protocol (timing.time_gpu: events, L2 flushed, median): GPU
time without launch gaps. The replays' outputs are checked against the oracle, and a graph replayed
on fresh inputs must give their answer, so a kernel that launches nothing while captured and returns
an old tensor fails. The host's cost per call is measured on its own (timing.host_cost_us: calls enqueued without
a sync) and reported beside it: a kernel faster on the GPU but slower to launch can lose in an eager
model. A kernel that cannot be captured is timed call by call instead (`graphed: false`).

On the CPU (Triton's interpreter) the same path runs with the host clock: the figures show that the
path works, not performance.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import torch

from autokernel.harness import checking, gpu, perf, timing
from autokernel.registry import dtype_name, shape_label

GRAPH_CACHE = perf.BASELINE_CACHE.with_name("model_baseline_cache.json")  # torch.compile's graphed times
# What the L2 holds before each replay at the model's shapes (timing.FLUSHES): the protocol's dirty flush. In a
# model a memory-bound kernel runs nearer its DRAM roofline than that: Pythia-410M's residual + two norms region ran
# 7.1 us a call in the compiled forward and 15.3 us here (H100, BENCHMARKS.md, the region night at fc0f269), and
# the night ranked looping programs slower that a warm L2 ranked faster. scripts/l2_regimes.py times a kernel's
# configurations under each flush, to be held against the compiled model's own profile (scripts/region_profile.py);
# "inputs" (the dirty flush, then the inputs written again as their producers leave them) is the likeliest match.
# AUTOKERNEL_L2_FLUSH sets it for a whole run (a night's benches and screens inherit the environment).
L2_FLUSH = os.environ.get("AUTOKERNEL_L2_FLUSH", "dirty")
if L2_FLUSH not in timing.FLUSHES:
    raise ValueError(f"AUTOKERNEL_L2_FLUSH={L2_FLUSH!r}: one of {', '.join(timing.FLUSHES)}")
METHOD = {"cuda": "cuda_graph", "cpu": "cpu_host_clock"}


@dataclass
class ShapeTime:
    shape: dict
    calls: int  # per forward pass of the model
    arg_shapes: list  # shapes of the tensor arguments: how a per-shape table in kernel.py recognises it
    us: float  # per call: GPU time from graph replay (host clock on the CPU)
    noise_pct: float
    eager_us: float | None
    compile_us: float | None
    host_us: float  # host time to launch one call, no sync
    graphed: bool  # False: not capturable, timed call by call (launch gap included)
    floor_us: float | None = None  # the roofline's time per call at this shape on this GPU (None on the CPU)

    @property
    def pct_peak(self) -> float | None:
        return 100.0 * self.floor_us / self.us if self.floor_us and self.us else None


@dataclass
class ModelTime:
    shapes: list[ShapeTime] = field(default_factory=list)
    method: str = "cuda_graph"

    @property
    def model_us(self) -> float:
        return sum(s.calls * s.us for s in self.shapes)

    def _weighted(self, name: str) -> float | None:
        values = [getattr(s, name) for s in self.shapes]
        return None if any(v is None for v in values) else sum(s.calls * v for s, v in zip(self.shapes, values))

    @property
    def calls(self) -> int:
        return sum(s.calls for s in self.shapes)

    def to_result(self) -> dict:
        """The harness result's model keys (the loop's objective is model_us)."""
        eager, compiled, host = self._weighted("eager_us"), self._weighted("compile_us"), self._weighted("host_us")
        total = self.model_us
        noise = sum(s.calls * s.us * s.noise_pct for s in self.shapes) / total if total else 0.0
        floor = self._weighted("floor_us")
        return {"model_floor_us": floor, "model_pct_peak": 100.0 * floor / total if floor and total else None,
                "model_us": total, "model_eager_us": eager, "model_compile_us": compiled,
                "model_vs_pytorch": eager / total if eager and total else None,
                "model_vs_compile": compiled / total if compiled and total else None,
                "host_us": host / self.calls if self.calls else None, "model_host_us": host,
                "model_noise_pct": noise, "model_timing": self.method, "model_l2_flush": L2_FLUSH,
                "model_shapes": [{**asdict(s), "pct_peak": s.pct_peak} for s in self.shapes]}


def weighted_shapes(module, kept: list[dict]) -> list[tuple[dict, int]]:
    """(shape, calls per forward) for each of the kernel's MODEL_SHAPES that the harness kept."""
    shapes = list(getattr(module, "MODEL_SHAPES", None) or [])
    calls = list(getattr(module, "MODEL_CALLS", None) or [])
    if len(calls) != len(shapes) or not all(isinstance(c, int) and c > 0 for c in calls):
        calls = [1] * len(shapes)  # no call counts (a hand-written list): every shape once
    return [(s, c) for s, c in zip(shapes, calls) if s in kept]


# ------------------------------------------------------------------------------ measuring
def graph_time(fn, input_sets: list[tuple], reps: int | None = None) -> tuple[timing.Timing, list]:
    """fn's GPU time replayed from CUDA graphs (one per input set), by timing.time_gpu (reps: its runs, default
    as many as its target time takes); and the graphs, whose replay(*inputs) runs the captured work on new inputs."""
    graphs = [timing.cuda_graphed(fn, inputs) for inputs in input_sets]
    timed = timing.time_gpu(lambda k: graphs[k](), [(k,) for k in range(len(graphs))], reps=reps, keep_outputs=True,
                            **_flushing(lambda k: input_sets[k]))
    return timed, graphs


def _flushing(tensors_of) -> dict:
    """time_gpu's flush arguments for L2_FLUSH: "inputs" is the dirty flush and then the run's inputs written again
    (tensors_of(*the run's arguments): the tensors a graph replays on)."""
    if L2_FLUSH != "inputs":
        return {"flush": L2_FLUSH}
    return {"flush": "dirty", "before": lambda args: timing.rewrite(tensors_of(*args))}


def _from_dram(nbytes: int) -> int:
    """The bytes a call must move from or to DRAM under L2_FLUSH, for the physical floor the guard holds a time to:
    all of them after a flush; where the L2 may hold the inputs ("inputs", "none"), what the L2 cannot."""
    if L2_FLUSH in ("dirty", "clean"):
        return nbytes
    return max(0, nbytes - torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size)


def _time(fn, input_sets: list[tuple], device: str, fresh=None) -> tuple[timing.Timing, list | None]:
    """(timing, graphs): graph replay on a GPU when fn can be captured, else call by call (graphs None).
    With fresh (the kernel, untrusted) the call-by-call runs each get a fresh input set and a few drawn at
    random are kept for the oracle, as perf.measure times a kernel, and on a GPU the events must agree with
    the host clock. A graph replays the work captured once: no cache on the host can skip it."""
    by_call = {"fresh": fresh, "check_runs": perf.CHECKED_RUNS} if fresh else {"keep_outputs": True}
    sets = None if fresh else input_sets
    if device != "cuda":
        return timing.time_cpu(fn, sets, **by_call), None
    try:
        timed, graphs = graph_time(fn, input_sets)
    except Exception as e:  # noqa: BLE001  (a launcher that syncs or reads a value cannot be captured)
        torch.cuda.synchronize()
        print(f"  note: not capturable in a CUDA graph ({type(e).__name__}: {str(e)[:120]}); timed call by call")
        timed, graphs = timing.time_gpu(fn, sets, **_flushing(lambda *args: args), **by_call), None
    if fresh and graphs:
        perf._host_clock_guard(lambda k: graphs[k](), [(k,) for k in range(len(graphs))], timed.median_us)
    elif fresh:
        perf._host_clock_guard(fn, [fresh() for _ in range(perf.INPUT_SETS)], timed.median_us)
    return timed, graphs


def _check(fn, spec, pristine: list[tuple], timed: timing.Timing, graphs, fresh: tuple, what: str) -> None:
    """The timed outputs against the oracle of the inputs as they were before any call (a kernel that wrote
    its inputs fails), then fresh inputs through the graph (or a plain call)."""
    if graphs is None:
        for inputs, before, out in timed.checked:
            checking.verify_output(out, spec, inputs, f"{what}: output of a timed run on fresh inputs, drawn "
                                   "at random", pristine=before)
        checking.checked_call(fn, spec, fresh, f"{what}: fresh inputs after timing")
        return
    for k, out in timed.last_outputs.items():
        checking.verify_output(out, spec, graphs[k].inputs, f"{what}: output of timed replay on input set {k}",
                               pristine=pristine[k])
    before = checking.pristine_copies(fresh)
    out = graphs[0](*fresh)
    torch.cuda.synchronize()
    checking.verify_output(out, spec, graphs[0].inputs, f"{what}: CUDA graph replayed on fresh inputs (does the "
                           "kernel launch its work while captured?)", pristine=before)


def time_shape(fn, spec, make_inputs, shape: dict, calls: int, dtype, device: str, reuse: bool,
               after_kernel=None) -> ShapeTime:
    """One model shape: the kernel, eager and torch.compile replayed from graphs, and the host's cost.
    after_kernel() runs once the kernel is timed and checked, before the baselines (as in perf.measure).
    The kernel never sees the input sets the baselines run on: graphs capture copies of them."""
    input_sets = [make_inputs() for _ in range(perf.INPUT_SETS)]
    pristine = [checking.pristine_copies(inputs) for inputs in input_sets]
    what = f"model shape {checking.describe(shape, dtype)}"
    timed, graphs = _time(fn, input_sets, device, fresh=make_inputs)
    _check(fn, spec, pristine, timed, graphs, make_inputs(), what)
    floor = None
    if device == "cuda":
        nbytes, nflops = spec.bytes_moved(shape, dtype), spec.flops(shape)
        perf._roofline_guard(timed.median_us * 1e-6, _from_dram(nbytes), nflops)
        floor = perf.roofline_s(nbytes, nflops, dtype) * 1e6
    graphed = graphs is not None
    del graphs  # their memory pools go before the baselines capture theirs
    host = timing.host_cost_us(fn, make_inputs(), device)
    if after_kernel is not None:
        after_kernel()
    eager = _time(spec.reference, pristine, device)[0].median_us
    return ShapeTime(shape=shape, calls=calls, arg_shapes=_arg_shapes(input_sets[0]), us=timed.median_us,
                     noise_pct=timed.spread_pct, eager_us=eager,
                     compile_us=_compile_us(spec, pristine, shape, dtype, device, reuse), host_us=host,
                     graphed=graphed, floor_us=floor)


def _arg_shapes(inputs: tuple) -> list:
    return [list(a.shape) for a in inputs if isinstance(a, torch.Tensor)]


def _compile_us(spec, input_sets, shape, dtype, device, reuse: bool) -> float | None:
    """torch.compile's graphed time on this shape, its fastest mode's; with reuse, the one measured before here."""
    if device != "cuda":
        return None
    key = f"{gpu.device_name()}|torch {torch.__version__}|{spec.name}|{shape_label(shape)}|{dtype_name(dtype)}|graph"
    key += "" if L2_FLUSH == "dirty" else f"|L2 {L2_FLUSH}"  # the cache's older keys: the dirty flush's
    key += f"|{perf.compiled_as()}"
    key += "|model layout" if spec.model_layout is not None else ""  # inputs as the model's sites pass them
    cache = perf.cached_baselines(GRAPH_CACHE)
    if reuse and key in cache:
        return cache[key]["us"]
    try:
        us, mode = perf.fastest_compiled(spec, lambda fn: _time(fn, input_sets, device)[0].median_us)
    except Exception as e:  # noqa: BLE001  (a compiler failure is the baseline's problem, not the kernel's)
        print(f"  note: torch.compile failed on {shape_label(shape)}: {type(e).__name__}: {str(e)[:120]}")
        return None
    perf.cache_baseline(GRAPH_CACHE, key, us, mode)
    return us


def measure_model(harness, module, dtype, reuse_baselines: bool) -> dict:
    """The result keys of the kernel's time in the model ({} for a kernel without MODEL_SHAPES), printed."""
    pairs = weighted_shapes(module, harness.model_shapes)
    if not pairs:
        return {}
    device = harness.device
    model = ModelTime(method=METHOD[device])
    for shape, calls in pairs:
        after = lambda s=shape: harness.check_integrity(f"after the model timing of {shape_label(s)}",
                                                        ignore_threads=True)  # torch.compile's threads came before
        model.shapes.append(time_shape(harness.fn, harness.spec, lambda s=shape: harness.model_inputs(s, dtype),
                                       shape, calls, dtype, device, reuse_baselines, after))
    print_model_time(model, dtype)
    return model.to_result()


def print_model_time(model: ModelTime, dtype) -> None:
    label = "CUDA-graph replay" if model.method == "cuda_graph" else "host clock [CPU: not a performance figure]"
    print(f"time in the model ({dtype_name(dtype)}, per forward pass; {label})")
    for s in model.shapes:
        eager = f"eager {s.eager_us:9.1f} us" if s.eager_us else ""
        compiled = f"  compile {s.compile_us:9.1f} us" if s.compile_us else ""
        ungraphed = "  (not graphed)" if model.method == "cuda_graph" and not s.graphed else ""
        roof = f"  {s.pct_peak:5.1f}% of roofline" if s.pct_peak else ""
        print(f"  {shape_label(s.shape):<28} x{s.calls:<4} kernel {s.us:9.1f} us{roof}  {eager}{compiled}"
              f"  host {s.host_us:7.1f} us/call{ungraphed}")
    r = model.to_result()
    vs = f"  {r['model_vs_pytorch']:.2f}x eager" if r["model_vs_pytorch"] else ""
    vs += f", {r['model_vs_compile']:.2f}x compile" if r["model_vs_compile"] else ""
    print(f"  total          {r['model_us']:12.1f} us per forward{vs}; host {r['host_us']:.1f} us per call")
