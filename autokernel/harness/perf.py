"""Timing a correct kernel against PyTorch eager and torch.compile, and placing it on the roofline.

All three run on the same shape and dtype, in the same process, through autokernel.harness.timing. Every timed
run of the kernel sees inputs it has never seen (a cache gains nothing), a random sample of those runs is
checked against the oracle, the kernel runs once more on refilled buffers, and on a GPU the event median
must agree with the host clock's GPU time per call over a synchronized batch.
A time under the physical floor (datasheet bandwidth and FLOP rate) is a FAIL, not a record.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from autokernel.harness import checking, gpu, guards, timing
from autokernel.registry import KernelSpec, shape_label

INPUT_SETS = 3  # rotated while timing the baselines (the kernel sees a fresh set every run)
CHECKED_RUNS = 3  # timed runs of the kernel, drawn at random, whose outputs are checked against the oracle
# The host-clock cross-check: a batch of about HOST_CLOCK_BATCH_US of GPU work, HOST_CLOCK_MIN_CALLS to
# HOST_CLOCK_MAX_CALLS calls. Honest kernels time at or above the host clock's figure (the events pay an
# L2 flush and fresh inputs; the batch runs back to back on warm data), so 15% under it, less 2 us of
# event resolution, is work the events did not see.
HOST_CLOCK_BATCH_US = 20_000
HOST_CLOCK_MIN_CALLS = 3
HOST_CLOCK_MAX_CALLS = 200
HOST_CLOCK_AGREEMENT = 0.85
HOST_CLOCK_SLACK_US = 2.0
ROOFLINE_SLACK = 0.8  # a time below 80% of the physical floor cannot be real
# torch.compile's baseline is the faster of these modes at each shape: max-autotune's GEMM templates can lose to the
# default's cuBLAS (TinyLlama's MLP on an H100: 259 us against 224), and a user runs whichever is faster.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
BASELINE_CACHE = Path(__file__).resolve().parents[2] / "workspace" / "baseline_cache.json"


@dataclass
class PerfResult:
    shape: dict
    dtype: str
    latency_us: float
    noise_pct: float
    eager_us: float | None
    compile_us: float | None
    compile_note: str
    throughput_tflops: float
    bandwidth_gb_s: float
    pct_peak: float | None
    peak_vram_mb: float | None  # what one call of the kernel allocates beyond its inputs (call_peak_mb)
    ceilings: dict | None
    host_clock_us: float | None = None  # GPU time per call by the host clock (the events' cross-check)
    eager_peak_vram_mb: float | None = None  # the same for PyTorch eager (the reference) on the same inputs

    @property
    def speedup_vs_pytorch(self):
        return self.eager_us / self.latency_us if self.eager_us else None

    @property
    def speedup_vs_compile(self):
        return self.compile_us / self.latency_us if self.compile_us else None


def gpu_input_sets(spec: KernelSpec, shape: dict, dtype: torch.dtype, seed: int = 0) -> list[tuple]:
    """INPUT_SETS input sets of `shape` on the GPU from one seeded generator: what the GPU tools time over."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [spec.make_inputs(shape, dtype, "cuda", gen) for _ in range(INPUT_SETS)]


def compiled_reference(spec: KernelSpec, mode: str = COMPILE_MODES[-1]):
    """torch.compile of the reference in one of COMPILE_MODES (fastest_compiled times them all)."""
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = 64
    return torch.compile(spec.reference, mode=mode, dynamic=False)


def fastest_compiled(spec: KernelSpec, time_us) -> tuple[float, str]:
    """(us, mode) of the fastest of COMPILE_MODES' compilations of the reference, time_us(fn) timing each; a mode
    that fails to compile or run is passed over, and where every mode fails the last failure is raised."""
    times, failure = {}, None
    for mode in COMPILE_MODES:
        try:
            times[mode] = time_us(compiled_reference(spec, mode))
        except Exception as e:  # noqa: BLE001  (a compiler failure is the baseline's problem, not the kernel's)
            failure = e
    if not times:
        raise failure
    mode = min(times, key=times.get)
    return times[mode], mode


def _baseline_key(spec, shape, dtype) -> str:
    source = hashlib.sha1(inspect.getsource(spec.reference).encode()).hexdigest()[:12]
    return (f"{gpu.device_name()}|torch {torch.__version__}|{spec.name}|{shape_label(shape)}|{dtype}|{source}"
            f"|timing {timing.PROTOCOL}|{compiled_as()}")


def compiled_as() -> str:
    """The compile modes in a baseline cache's key: an entry measured under other modes is not read."""
    return f"compile {'+'.join(COMPILE_MODES)}"


def cached_baselines(path: Path) -> dict:
    """A baseline cache (JSON: key -> {"us", "mode", "date"}), {} where there is none yet."""
    return json.loads(path.read_text()) if path.is_file() else {}


def cache_baseline(path: Path, key: str, us: float, mode: str) -> None:
    """One baseline into the cache at path, written atomically: a reader never sees half a file."""
    cache = cached_baselines(path)
    cache[key] = {"us": us, "mode": mode, "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache, indent=1))
    tmp.replace(path)


def _time_compile(spec, input_sets, device, shape, dtype, reuse: bool) -> tuple[float | None, str]:
    """torch.compile's time on this shape; with reuse, the one measured earlier on this GPU and torch."""
    if device != "cuda":
        return None, "not timed in CPU mode"
    key = _baseline_key(spec, shape, dtype)
    cache = cached_baselines(BASELINE_CACHE)
    if reuse and key in cache:
        return cache[key]["us"], f"{cache[key].get('mode', 'torch.compile')}, reused from {cache[key]['date']}"
    try:
        us, mode = fastest_compiled(spec, lambda fn: timing.time_fn(fn, input_sets, device).median_us)
    except Exception as e:  # a compiler failure is the baseline's problem, not the kernel's
        return None, f"torch.compile failed: {type(e).__name__}: {str(e)[:200]}"
    cache_baseline(BASELINE_CACHE, key, us, mode)
    return us, f"{mode}, the faster of {', '.join(COMPILE_MODES)}"


def _check_timed_outputs(fn, spec, input_sets, timed):
    for inputs, pristine, out in timed.checked:
        checking.verify_output(out, spec, inputs, "output of a timed run, drawn at random", pristine=pristine)
    for old, new in zip(input_sets[0], input_sets[1]):
        if isinstance(old, torch.Tensor):
            old.copy_(new.flip(0) if new.dim() else new)
    checking.checked_call(fn, spec, input_sets[0], "after timing, input buffers refilled with new values")


def _host_clock_guard(fn, input_sets, event_us: float) -> float | None:
    """The CUDA-event median against the host clock's GPU time per call (timing.host_clock_us). Events
    that see less than the host clock does miss work: moved to a side stream or a thread, left lazy, or
    timers patched. GuardFailed with both numbers."""
    calls = int(min(HOST_CLOCK_MAX_CALLS, max(HOST_CLOCK_MIN_CALLS, HOST_CLOCK_BATCH_US / max(event_us, 1.0))))
    wall_us = timing.host_clock_us(fn, input_sets, calls)
    if wall_us is not None and event_us < HOST_CLOCK_AGREEMENT * wall_us - HOST_CLOCK_SLACK_US:
        raise guards.GuardFailed(
            f"timed at {event_us:.1f} us by CUDA events but {wall_us:.1f} us per call by the host clock over "
            f"{calls} synchronized calls (more than {100 * (1 - HOST_CLOCK_AGREEMENT):.0f}% apart): the events "
            "miss work (a side stream, a thread, a lazy output or a patched timer)")
    return wall_us


def measure(fn, spec: KernelSpec, make_inputs, shape, dtype, device, reuse_baselines=False,
            after_kernel=None) -> PerfResult:
    """Time fn on `shape`; make_inputs() gives a fresh input set each call.

    Every timed run of fn sees a fresh input set, a few of them drawn at random are checked against the
    oracle, and on a GPU the event median is cross-checked with the host clock. after_kernel() runs once
    the kernel is timed and checked, before the baselines (the harness checks its fingerprints there).
    With reuse_baselines, torch.compile's time comes from an earlier run on the same GPU, torch, shape
    and reference (the loop benches one shape hundreds of times; compiling it each time costs seconds).
    """
    input_sets = [make_inputs() for _ in range(INPUT_SETS)]
    timed = timing.time_fn(fn, None, device, fresh=make_inputs, check_runs=CHECKED_RUNS)
    peak_mb = call_peak_mb(fn, input_sets[0]) if device == "cuda" else None
    _check_timed_outputs(fn, spec, input_sets, timed)
    host_clock = _host_clock_guard(fn, input_sets, timed.median_us) if device == "cuda" else None
    if after_kernel is not None:
        after_kernel()
    eager_us = timing.time_fn(spec.reference, input_sets, device).median_us
    eager_peak_mb = call_peak_mb(spec.reference, input_sets[0]) if device == "cuda" else None
    compile_us, compile_note = _time_compile(spec, input_sets, device, shape, dtype, reuse_baselines)

    nbytes, nflops = spec.bytes_moved(shape, dtype), spec.flops(shape)
    seconds = timed.median_us * 1e-6
    pct, ceil = None, None
    if device == "cuda":
        ceil = gpu.ceilings()
        _roofline_guard(seconds, nbytes, nflops)
        pct = 100.0 * roofline_s(nbytes, nflops, dtype, ceil) / seconds
    return PerfResult(
        shape=shape, dtype=str(dtype).replace("torch.", ""), latency_us=timed.median_us,
        noise_pct=timed.spread_pct, eager_us=eager_us, compile_us=compile_us, compile_note=compile_note,
        throughput_tflops=nflops / seconds / 1e12, bandwidth_gb_s=nbytes / seconds / 1e9,
        pct_peak=pct, peak_vram_mb=peak_mb, ceilings=ceil.__dict__ if ceil else None, host_clock_us=host_clock,
        eager_peak_vram_mb=eager_peak_mb,
    )


def call_peak_mb(fn, inputs) -> float:
    """MiB that one call of fn allocates at its peak beyond what was allocated before it: its workspace and
    output, with its inputs already resident (as in a model). Measured on a call of its own: over the timed
    runs the peak would be the fresh input sets, the oracle's copies and the L2 flush buffer instead (a
    linear + cross-entropy's 470 MB weight made every time, against a fused kernel's few MB of workspace)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn(*inputs)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def roofline_s(nbytes: float, nflops: float, dtype, ceil: gpu.Ceilings | None = None) -> float:
    """The least time this GPU's ceilings allow for moving nbytes and computing nflops in dtype (the roofline)."""
    ceil = ceil or gpu.ceilings()
    return max(nbytes / (ceil.bandwidth_gb_s * 1e9), nflops / (_flops_ceiling(ceil, dtype) * 1e12))


def _flops_ceiling(ceil: gpu.Ceilings, dtype) -> float:
    return ceil.fp32_tflops if dtype == torch.float32 else ceil.fp16_tflops


def _roofline_guard(seconds, nbytes, nflops):
    # The tensor-core rate bounds every dtype: an fp32 kernel may legitimately use split-TF32 tricks.
    limit = gpu.physical_limit(gpu.device_name())
    floor = max(nbytes / (limit.bandwidth_gb_s * 1e9), nflops / (limit.fp16_tflops * 1e12))
    if seconds < ROOFLINE_SLACK * floor:
        raise checking.CheckFailed(
            f"timed at {seconds * 1e6:.1f} us, under the physical floor of {floor * 1e6:.1f} us for "
            f"{nbytes / 1e6:.1f} MB and {nflops / 1e9:.1f} GFLOP on {limit.name}: "
            "faster than the roofline allows, so the kernel is not doing the work")
