"""The one timing protocol. Every number the project reports goes through here.

On a GPU: warm-up, then each run is timed with CUDA events around one call, the L2 cache is flushed
before every run (so repeated runs over one buffer do not measure the cache), the GPU is kept busy while
the host queues the call (so the events see GPU time, not the host's launch cost), inputs are rotated
among several sets, and the median is reported together with the spread. On the CPU (Triton's
interpreter) the host clock is used, and the number is not a performance figure. The host's own cost of
a call (host_cost_us: calls enqueued without a sync) is measured here too.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

PROTOCOL = 2  # bumped when what a figure means changes (2: the spin before each timed GPU call); keys cached figures
WARMUP_RUNS = 5  # compile, autotune and cache warm-up stay out of the numbers
MIN_RUNS = 20  # at least this many timed runs, even for slow kernels
MAX_RUNS = 500  # at most this many, even for fast kernels
TARGET_MS = 300  # aim to spend about this long timing one function
L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current GPU's L2 (H100 50 MB, B200 126 MB)
FLUSHES = ("dirty", "clean", "none", "inputs")  # what the L2 holds before a timed run (_flush_l2)
CPU_RUNS = 2  # the interpreter is slow (a second per call at 64x1024): these timings only show that timing works
HOST_CALLS = 100  # calls enqueued per host-cost sample, far below the ~1000 launches a CUDA queue holds
HOST_ROUNDS = 5  # host-cost samples; the least is reported (the host clock's noise only ever adds time)
CPU_HOST_CALLS = 1  # in the interpreter: enough to run the path, the figure means nothing there
QUEUE_SPIN_FACTOR = 3  # the spin before a timed call outlasts this many times the host's cost of queueing it
QUEUE_SPIN_PAD_US = 20  # plus this (the two event records, a slow moment of the host)
QUEUE_SPIN_MAX_US = 5000  # a call that takes the host longer is timed as it is (its host cost shows)


@dataclass
class Timing:
    median_us: float
    samples_us: list[float]
    last_outputs: dict = field(default_factory=dict)  # input-set index -> output of its last run
    checked: list = field(default_factory=list)  # (inputs, pristine copies, output) of sampled fresh-input runs

    @property
    def spread_pct(self) -> float:
        """Half the inter-quartile range over the median: the noise of this measurement."""
        if len(self.samples_us) < 4:
            return 0.0
        q = statistics.quantiles(self.samples_us, n=4)
        return 50.0 * (q[2] - q[0]) / self.median_us


class _Inputs:
    """Where each run's inputs come from: rotated fixed sets, or (untrusted code) a fresh set every run,
    whose contents no cache keyed by pointer, version counter or id has seen; `check_runs` timed runs
    drawn at random keep copies of their inputs and their output for the oracle."""

    def __init__(self, input_sets, fresh, check_runs: int, reps: int):
        self.sets, self.fresh = input_sets, fresh
        self.check = set(random.SystemRandom().sample(range(reps), min(check_runs, reps))) if fresh else set()
        self.checked = []

    def get(self, i: int) -> tuple:
        return self.fresh() if self.fresh else self.sets[i % len(self.sets)]

    def keep(self, i: int, inputs, pristine, out) -> None:
        if i in self.check:
            self.checked.append((inputs, pristine, out))

    def pristine(self, i: int, inputs):
        if i not in self.check:
            return None
        return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs)


_flush_buffer: torch.Tensor | None = None


def _flush_l2(how: str = "dirty"):
    """Evict the L2 before a timed run. "dirty" (the protocol's): write a buffer larger than it (as
    triton.testing.do_bench does). Every line is left dirty, so the timed call also pays for writing back an L2's
    worth of data it never touched, as a kernel after another kernel's writes does in a model; a kernel that only
    reads pays it without the credit a writing kernel gets (BENCHMARKS.md, the L2 flush table; docs/timing.md).
    "clean": read the buffer instead, leaving clean lines the call can drop for free. "none": no flush, the L2 as
    the previous run left it. "inputs": the dirty flush, and then (time_gpu's `before`) the call's inputs written
    again, as the kernels that made them in a model leave them (FLUSHES; modeltime.L2_FLUSH says which the model's
    shapes are timed under)."""
    global _flush_buffer
    if how == "none":
        return
    if _flush_buffer is None:
        _flush_buffer = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    if how == "clean":
        _flush_buffer.max()  # every line read, none written: the dirty ones are written back here, untimed
    else:
        _flush_buffer.zero_()


def rewrite(tensors) -> None:
    """Write each tensor again with its own values (x * 1: every bit kept for numbers, NaN's payload aside), leaving
    its lines dirty in the L2 as the kernel that made it in a model would ("inputs")."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dtype != torch.bool and t.numel():
            t.mul_(1)


def runs_for(estimate_ms: float, target_ms: float = TARGET_MS, most: int = MAX_RUNS) -> int:
    """Timed runs for a call of about estimate_ms: about target_ms of them, within MIN_RUNS..most."""
    return int(min(most, max(MIN_RUNS, target_ms / max(estimate_ms, 1e-3))))


def _warm_up(fn: Callable, source) -> float:
    """Run fn WARMUP_RUNS times, queued back to back (the first may compile); the least host microseconds of
    one call after the first: what the host takes to queue it."""
    host_us = []
    for i in range(WARMUP_RUNS):
        inputs = source.get(i)
        t0 = time.perf_counter()
        fn(*inputs)
        host_us.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return min(host_us[1:])


def _queue_spin(host_us: float) -> int:
    """Spin cycles that keep the GPU busy while the host queues one timed call. Without the spin a call whose
    host cost exceeds its GPU time is timed from the start event to its last launch, so a small kernel behind
    a slow Python launcher reads several times its GPU time whenever the host runs slow (docs/timing.md)."""
    return int(_spin_cycles_per_us() * min(QUEUE_SPIN_MAX_US, QUEUE_SPIN_FACTOR * host_us + QUEUE_SPIN_PAD_US))


def _timed_run(fn: Callable, inputs: tuple, start, end, spin_cycles: int, flush: str = "dirty", before=None):
    """One run of fn between two events, after an L2 flush (and before(inputs)) and a spin that outlasts the host's
    queueing."""
    _flush_l2(flush)
    if before is not None:
        before(inputs)
    if spin_cycles:
        torch.cuda._sleep(spin_cycles)
    start.record()
    out = fn(*inputs)
    end.record()
    return out


def time_gpu(fn: Callable, input_sets: Sequence[tuple] | None, reps: int | None = None,
             keep_outputs: bool = False, fresh: Callable[[], tuple] | None = None,
             check_runs: int = 0, latency: bool = False, flush: str = "dirty", before=None) -> Timing:
    """Median GPU time of fn(*inputs) with the L2 flushed before each run (flush: how, _flush_l2). Inputs rotate
    over input_sets, or, with fresh, are a new set every run (made outside the timed region). latency: no spin
    before the call, so that a host slower than the GPU counts (a whole model's forward as its caller waits).
    before(inputs), if given, runs after each flush, untimed."""
    source = _Inputs(input_sets, fresh, 0, 1)
    host_us = _warm_up(fn, source)
    spin = 0 if latency else _queue_spin(host_us)
    if reps is None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _timed_run(fn, source.get(0), start, end, spin, flush, before)
        torch.cuda.synchronize()
        reps = runs_for(start.elapsed_time(end))
    source = _Inputs(input_sets, fresh, check_runs, reps)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    outputs = {}
    for i in range(reps):
        inputs = source.get(i)
        pristine = source.pristine(i, inputs)
        out = _timed_run(fn, inputs, starts[i], ends[i], spin, flush, before)
        source.keep(i, inputs, pristine, out)
        if keep_outputs:
            outputs[i % len(input_sets)] = out
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return Timing(statistics.median(samples), samples, outputs, source.checked)


def time_turns(fns: dict[str, Callable], input_sets: Sequence[tuple], device: str,
               turns: int, latency: bool = False) -> dict[str, list[float]]:
    """Microseconds of each of several functions timed in turns: one run of each per turn, the order reversed
    every other turn, the L2 flushed before every run on a GPU. Comparing the samples turn by turn cancels
    the drift of clocks and temperature between two measurements taken one after the other, which is larger
    than a difference of a few tenths of a percent between two kernel sets of one model.
    latency: as in time_gpu, each run timed as its caller waits for it (no spin hides the host's cost)."""
    cuda = device == "cuda"
    if cuda:
        hosts = {name: _warm_up(fn, _Inputs(input_sets, None, 0, 1)) for name, fn in fns.items()}
        spins = {name: 0 if latency else _queue_spin(us) for name, us in hosts.items()}
    else:
        for fn in fns.values():
            fn(*input_sets[0])
    runs: dict[str, list] = {name: [] for name in fns}
    for turn in range(turns):
        inputs = input_sets[turn % len(input_sets)]
        for name in list(fns) if turn % 2 == 0 else list(fns)[::-1]:
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                _timed_run(fns[name], inputs, start, end, spins[name])
                runs[name].append((start, end))
            else:
                t0 = time.perf_counter()
                fns[name](*inputs)
                runs[name].append((time.perf_counter() - t0) * 1e6)
    if not cuda:
        return runs
    torch.cuda.synchronize()
    return {name: [start.elapsed_time(end) * 1e3 for start, end in pairs] for name, pairs in runs.items()}


def time_cpu(fn: Callable, input_sets: Sequence[tuple] | None, reps: int = CPU_RUNS,
             keep_outputs: bool = False, fresh: Callable[[], tuple] | None = None, check_runs: int = 0) -> Timing:
    source = _Inputs(input_sets, fresh, check_runs, reps)
    fn(*source.get(0))
    samples, outputs = [], {}
    for i in range(reps):
        inputs = source.get(i)
        pristine = source.pristine(i, inputs)
        t0 = time.perf_counter()
        out = fn(*inputs)
        samples.append((time.perf_counter() - t0) * 1e6)
        source.keep(i, inputs, pristine, out)
        if keep_outputs:
            outputs[i % len(input_sets)] = out
    return Timing(statistics.median(samples), samples, outputs, source.checked)


def time_fn(fn: Callable, input_sets: Sequence[tuple] | None, device: str, keep_outputs: bool = False,
            fresh: Callable[[], tuple] | None = None, check_runs: int = 0, latency: bool = False) -> Timing:
    if device == "cuda":
        return time_gpu(fn, input_sets, keep_outputs=keep_outputs, fresh=fresh, check_runs=check_runs,
                        latency=latency)
    return time_cpu(fn, input_sets, keep_outputs=keep_outputs, fresh=fresh, check_runs=check_runs)


def host_cost_us(fn, args: tuple, device: str, calls: int = HOST_CALLS, rounds: int = HOST_ROUNDS) -> float:
    """Host microseconds per call: `calls` calls enqueued back to back without a sync (the GPU runs behind),
    the least of `rounds`. What a launch-bound eager model pays per call whatever the GPU does. Interrupts,
    the garbage collector and other processes only ever add to a round, and a median still moves by tens of
    percent between benches of the same kernel."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device != "cuda":
        calls, rounds = CPU_HOST_CALLS, 1
    samples = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    sync()
    return min(samples)


def host_clock_us(fn: Callable, input_sets: Sequence[tuple], calls: int) -> float | None:
    """GPU time per call of fn by the host clock, with no CUDA event involved: the GPU spins while the host
    queues the calls, which then run back to back, so launch costs are hidden; the spin alone is timed
    the same way and subtracted. The device-wide synchronize waits for work on every stream. The batch is
    cut to what the host can queue within SPIN_MAX_US. None when even that spin did not hide the queueing."""
    queue_us = _spin_batch_us(fn, input_sets, HOST_PROBE_CALLS, 0)[1] / HOST_PROBE_CALLS
    calls = max(1, min(calls, int(SPIN_COVER * SPIN_MAX_US / max(queue_us, 1.0) / 2)))
    spin_us = min(SPIN_MAX_US, max(SPIN_MIN_US, 2 * calls * queue_us))
    for _ in range(SPIN_TRIES):
        cycles = _spin_cycles_per_us() * spin_us
        alone_us = statistics.median(_spin_batch_us(None, (), 0, cycles)[0] for _ in range(3))
        batch_us, queued_us = _spin_batch_us(fn, input_sets, calls, cycles)
        if queued_us < SPIN_COVER * alone_us:
            return max(batch_us - alone_us, 0.0) / calls
        spin_us = min(SPIN_MAX_US, spin_us * 4)  # the host was slower than the probe said: spin longer
    return None


HOST_PROBE_CALLS = 3  # calls queued (not synchronized) to learn the host's cost per call
SPIN_MIN_US = 2000  # the shortest spin that hides the queueing
SPIN_MAX_US = 500_000  # the longest; the batch is cut to what the host queues within it
SPIN_TRIES = 3
SPIN_COVER = 0.8  # the calls must be queued within this part of the spin, else it did not hide them
_spin_rate: float | None = None


def _spin_cycles_per_us() -> float:
    global _spin_rate
    if _spin_rate is None:
        probe = 1_000_000
        _spin_batch_us(None, (), 0, probe)  # the spin kernel's first launch loads it
        _spin_rate = probe / statistics.median(_spin_batch_us(None, (), 0, probe)[0] for _ in range(3))
    return _spin_rate


def _spin_batch_us(fn, input_sets, calls: int, cycles: float) -> tuple[float, float]:
    """(wall time from the spin's launch to the device being idle, time to queue the calls), in us."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if cycles:
        torch.cuda._sleep(int(cycles))
    for i in range(calls):
        fn(*input_sets[i % len(input_sets)])
    queued = time.perf_counter()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6, (queued - t0) * 1e6


def cuda_graphed(fn: Callable, example: tuple, warmup: int = 3, pool: tuple | None = None) -> Callable:
    """fn captured once in a CUDA graph: the returned callable copies its tensor arguments into the
    captured input buffers and replays the graph, so no Python or launch overhead is left in the loop.

    What a deployment that serves fixed shapes does (vLLM, TensorRT-LLM): timing both the original
    and the optimized model this way separates GPU time from host overhead. The output tensor is
    the graph's own buffer, overwritten by the next replay; `replay.inputs` are the captured input
    buffers (what the graph reads, and what a kernel that writes its inputs leaves changed). pool: the id of a
    torch.cuda.MemPool the caller holds (a bare graph_pool_handle() dies with its last graph), shared with other graphs
    that replay one at a time, each output read before another replays (a graph holds its forward's peak memory for
    as long as it lives, in its own pool without one).
    """
    static = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in example)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph requires
        for _ in range(warmup):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn(*static)

    def replay(*args):
        for dst, src in zip(static, args):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        graph.replay()
        return out

    replay.inputs = static
    return replay
