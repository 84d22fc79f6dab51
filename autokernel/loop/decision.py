"""Keep or revert: the verdict on a benched candidate against the best kept version.

A change stays when it is correct and faster than the best by more than max(MIN_GAIN_PCT, the noise measured
at the baseline), and, timed in a CUDA graph, when the host's cost per forward did not grow by more than the
GPU time it saves (Loop._confirm judges the same rule again on two benches of each). The host's cost counts only
where the model the kernel was extracted from runs it from the host (the plan's deploy mode, host_counts): replayed
from a CUDA graph (graph, compile_graph), a launcher's Python never runs after the capture, and a region night
under compile_graph once reverted a 2.9% faster row kernel for 111 us of host time the model would never spend.
"""

from __future__ import annotations

from autokernel import results
from autokernel.loop.report import format_us
from autokernel.verify.noise import GPU_TIMED  # the deploy modes whose forward is a CUDA graph's replay

# One bench's host clock can be tens of percent off (the same launcher read up to 3x apart between benches); the
# least of two benches differs by a few percent, while a launcher that really costs more (another launch, a
# torch op, a sync) costs tens of percent. On a GPU the rule is judged on the least of two benches of each
# (Loop._confirm); within this margin the GPU decides.
HOST_NOISE_PCT = 5.0
MIN_GAIN_PCT = 1.0  # a change must beat the best by more than this (or the baseline noise, if larger)


def decide(result: dict, best_us: float | None, threshold_pct: float,
           best_host_us: float | None = None) -> tuple[str, str]:
    """(status, why) of a benched candidate: keep, revert, crash or timeout.

    Times are the objective (results.objective_us: the time in the model when the kernel has model
    shapes). A change faster on the GPU is still reverted when the host's cost per forward pass
    (model_host_us, measured on a GPU only) grew by more than the GPU time it saves (beyond the host
    clock's noise, HOST_NOISE_PCT): in an eager model the host would eat the gain."""
    status = result.get("status")
    if status in ("crash", "timeout"):
        return status, first_line(result.get("reason")) or status
    if status != "pass" or result.get("correctness") != "PASS":
        return "revert", f"FAIL at {result.get('failed_stage') or 'harness'}: {first_line(result.get('reason'))}"
    value = results.objective_us(result)
    if best_us is None:
        return "keep", "first correct version"
    gain = 100.0 * (best_us - value) / best_us
    if gain <= threshold_pct:
        return "revert", f"{gain:+.1f}% vs {format_us(best_us)}, needs > {threshold_pct:.1f}%"
    if result.get("model_timing") == "cuda_graph":
        costlier = host_grew(result.get("model_host_us"), best_host_us, best_us - value)
        if costlier:
            return "revert", f"{gain:.1f}% faster on the GPU, but {costlier}"
    return "keep", f"{gain:.1f}% faster than {format_us(best_us)}"


def host_counts(job: dict) -> bool:
    """Whether the host's cost of the kernel's calls reaches the model: not where every mode of the plan's deploy
    (profile.py --deploy, in the job) replays CUDA graphs; a kernel given by hand (no plan) is judged as eager."""
    modes = [m for m in str(job.get("deploy") or "eager").split(",") if m]
    return not all(m in GPU_TIMED for m in modes)


def host_grew(host_us: float | None, best_host_us: float | None, saved_us: float) -> str | None:
    """Why a change that saves saved_us of GPU time per forward costs more on the host than it saves, or
    None when it does not (or either host figure is missing)."""
    if host_us is None or best_host_us is None:
        return None
    grew = host_us - best_host_us
    if grew <= saved_us + best_host_us * HOST_NOISE_PCT / 100:
        return None
    return f"the host's cost per forward grew by {format_us(grew)}, more than the {format_us(saved_us)} saved"


def least(*values: float | None) -> float | None:
    """The least of the values given, None ones left out (None when all are)."""
    present = [v for v in values if v is not None]
    return min(present) if present else None


def first_line(text) -> str:
    """The first line of a reason or log, cut at 300 characters."""
    lines = (text or "").strip().splitlines()
    return lines[0][:300] if lines else ""
