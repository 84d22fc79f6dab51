"""The one timing protocol. Every number the project reports goes through here.

On a GPU: warm-up, then each run is timed with CUDA events around one call, the L2 cache is flushed
before every run (so repeated runs over one buffer do not measure the cache), inputs are rotated
among several sets, and the median is reported together with the spread. On the CPU (Triton's
interpreter) the host clock is used, and the number is not a performance figure.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

WARMUP_RUNS = 5  # compile, autotune and cache warm-up stay out of the numbers
MIN_RUNS = 20  # at least this many timed runs, even for slow kernels
MAX_RUNS = 500  # at most this many, even for fast kernels
TARGET_MS = 300  # aim to spend about this long timing one function
L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current GPU's L2 (H100 50 MB, B200 126 MB)
CPU_RUNS = 3  # the interpreter is slow; these timings only show that timing works


@dataclass
class Timing:
    median_us: float
    samples_us: list[float]
    last_outputs: dict = field(default_factory=dict)  # input-set index -> output of its last run

    @property
    def spread_pct(self) -> float:
        """Half the inter-quartile range over the median: the noise of this measurement."""
        if len(self.samples_us) < 4:
            return 0.0
        q = statistics.quantiles(self.samples_us, n=4)
        return 50.0 * (q[2] - q[0]) / self.median_us


_flush_buffer: torch.Tensor | None = None


def _flush_l2(dirty: bool = True):
    """Evict the L2. Writing the buffer (the protocol's default, as triton.testing.do_bench does) leaves
    every line dirty, so the timed call also pays for writing back an L2's worth of data it never touched,
    as a kernel after another kernel's writes does in a model. Reading it (dirty=False) leaves the lines
    clean: the timed call pays for its own bytes only (scripts/l2_flush_effect.py compares the two)."""
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    if dirty:
        _flush_buffer.zero_()
    else:
        _flush_buffer.max()


def time_gpu(fn: Callable, input_sets: Sequence[tuple], reps: int | None = None,
             keep_outputs: bool = False, dirty_flush: bool = True) -> Timing:
    """Median time of fn(*inputs) over rotated input sets, with L2 flushed before each run."""
    for i in range(WARMUP_RUNS):
        fn(*input_sets[i % len(input_sets)])
    torch.cuda.synchronize()
    if reps is None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*input_sets[0])
        end.record()
        torch.cuda.synchronize()
        estimate_ms = max(start.elapsed_time(end), 1e-3)
        reps = int(min(MAX_RUNS, max(MIN_RUNS, TARGET_MS / estimate_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    outputs = {}
    for i in range(reps):
        k = i % len(input_sets)
        _flush_l2(dirty_flush)
        starts[i].record()
        out = fn(*input_sets[k])
        ends[i].record()
        if keep_outputs:
            outputs[k] = out
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return Timing(statistics.median(samples), samples, outputs)


def time_cpu(fn: Callable, input_sets: Sequence[tuple], reps: int = CPU_RUNS,
             keep_outputs: bool = False) -> Timing:
    fn(*input_sets[0])
    samples, outputs = [], {}
    for i in range(reps):
        k = i % len(input_sets)
        t0 = time.perf_counter()
        out = fn(*input_sets[k])
        samples.append((time.perf_counter() - t0) * 1e6)
        if keep_outputs:
            outputs[k] = out
    return Timing(statistics.median(samples), samples, outputs)


def time_fn(fn: Callable, input_sets: Sequence[tuple], device: str, keep_outputs: bool = False) -> Timing:
    if device == "cuda":
        return time_gpu(fn, input_sets, keep_outputs=keep_outputs)
    return time_cpu(fn, input_sets, keep_outputs=keep_outputs)


def cuda_graphed(fn: Callable, example: tuple, warmup: int = 3) -> Callable:
    """fn captured once in a CUDA graph: the returned callable copies its tensor arguments into the
    captured input buffers and replays the graph, so no Python or launch overhead is left in the loop.

    What a deployment that serves fixed shapes does (vLLM, TensorRT-LLM): timing both the original
    and the optimized model this way separates GPU time from host overhead. The output tensor is
    the graph's own buffer, overwritten by the next replay.
    """
    static = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in example)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph requires
        for _ in range(warmup):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)

    def replay(*args):
        for dst, src in zip(static, args):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        graph.replay()
        return out

    return replay
