"""Whether a model runs faster without a kernel than with it, from latencies timed in turns: a verdict only where
the difference is outside the comparison's own noise.

Two models timed in turns (one run of each per turn, timing.time_turns) give paired samples: a host that slows
down slows both runs of a turn alike, so the per-turn ratio without / with is what carries the difference, and
its spread is the comparison's noise. The verdict is the median of those ratios with a distribution-free
confidence interval (the order statistics that a binomial(n, 1/2) count puts around the median, as a sign test
does): "faster" (the model is faster without the kernel) when the whole interval lies below 1 - margin, "slower"
when it lies above 1 + margin, and "within noise" otherwise, which decides nothing: a difference smaller than the
margin, or one the turns cannot tell from the noise, gives the same verdict run after run. A close call (the
interval reaching past the margin on either side) earns more turns before it is left undecided (endtoend's
Trials.compare). docs/deploy-and-prune.md says why.

One run's interval holds that run's noise only. Another run (another process, another machine: Inductor picks its
kernels' configurations by timing them, the GPU's clocks differ) reads the same comparison a few tenths of a
percent away, outside the first run's interval; so the interval is widened by BETWEEN_RUNS on each side before it
is held against the margin, and a ratio that close to the margin reads "within noise" in every run.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

CONFIDENCE = 0.99  # of the interval around the median ratio: a prune takes many verdicts, each must hold
FASTER, SLOWER, WITHIN_NOISE = "faster", "slower", "within noise"
# how far one comparison's median moves between runs, beyond the interval of each: TinyLlama's compiled rmsnorm read
# 0.994x, 0.994x, 0.992x (interval 0.990-0.995), 0.987x and 0.987x (0.983-0.990) in five runs on three H200s
BETWEEN_RUNS = 0.004
GPU_TIMED = ("graph", "compile_graph")  # modes replayed from a CUDA graph: their time is the GPU's (deciding_mode)
# BETWEEN_RUNS in a mode timed without CUDA graphs, where the launches bound the forward and the host's speed moves
# what a kernel saves or costs: Qwen3-0.6B's eager add_rmsnorm read 0.999x, 0.971x, 0.986x in three runs on one H100
# (intervals 0.988-1.016, 0.956-0.983, 0.977-1.005), graphed 1.006x (1.004-1.007) in each
HOST_BETWEEN_RUNS = 0.015
# BETWEEN_RUNS in a compiled mode, where each run's Inductor picks its kernels' configurations by timing them anew:
# TinyLlama's compiled, graphed rmsnorm read 0.984x, 0.986x, 0.986x, 0.987x, 0.989x, 0.996x and fused_mlp
# 0.967x-0.977x in six runs on one H100 (intervals +-0.2%): held to BETWEEN_RUNS, rmsnorm left in one run of three.
COMPILED_BETWEEN_RUNS = 0.006
PAIRED_P = 0.05  # a side is faster when it won this improbably many rounds for a coin (two-sided sign test)


@dataclass(frozen=True)
class Verdict:
    """One mode's comparison of a model without a kernel (or kernels) against the model with it."""
    without_ms: float  # medians of each side's samples
    with_ms: float
    ratio: float  # median over the turns of without / with: below 1 when the model is faster without
    low: float  # the ratio's confidence interval
    high: float
    turns: int
    outcome: str  # FASTER (without is faster), SLOWER, or WITHIN_NOISE
    earlier: float | None = None  # the ratio of an earlier run whose outcome this one holds (recall.py)

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        """'9.100 ms without, 9.000 with (1.011x, 95% interval 0.998-1.024 over 120 turns, within noise)'."""
        if math.isinf(self.without_ms) or math.isinf(self.with_ms):
            return f"{self.without_ms:.3f} ms without, {self.with_ms:.3f} with"
        return (f"{self.without_ms:.3f} ms without, {self.with_ms:.3f} with ({self.ratio:.3f}x, "
                f"{CONFIDENCE:.0%} interval {self.low:.3f}-{self.high:.3f} over {self.turns} turns, {self.outcome}"
                f"{held_from(self.earlier)})")


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free confidence interval for the median of values: the k-th smallest and the k-th largest,
    k the largest count with P(binomial(n, 1/2) < k) <= (1 - confidence) / 2. Fewer than six values: their range."""
    ordered = sorted(values)
    n = len(ordered)
    tail, k, below = (1 - confidence) / 2, 0, 0.0
    while k < n // 2:
        below += math.comb(n, k) / 2**n  # P(count <= k)
        if below > tail:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def compare(without_us: list[float], with_us: list[float], margin: float) -> Verdict:
    """The verdict on samples timed in turns (the i-th of each from the same turn)."""
    ratios = [a / b for a, b in zip(without_us, with_us) if b > 0]
    without_ms, with_ms = statistics.median(without_us) / 1e3, statistics.median(with_us) / 1e3
    if not ratios:
        return Verdict(without_ms, with_ms, 1.0, 0.0, math.inf, 0, WITHIN_NOISE)
    ratio = statistics.median(ratios)
    low, high = median_interval(ratios)
    reach = margin + BETWEEN_RUNS
    outcome = FASTER if high < 1 - reach else SLOWER if low > 1 + reach else WITHIN_NOISE
    return Verdict(without_ms, with_ms, ratio, low, high, len(ratios), outcome)


def agree(verdict: Verdict, earlier: dict, spread: float) -> bool:
    """Whether a verdict's reading and an earlier run's (a Verdict's dict) are one measurement read twice: their
    intervals no further apart than `spread`, what a comparison moves between runs (between_runs). A failed run
    agrees with nothing."""
    if not (verdict.turns and earlier.get("turns")):
        return False
    return verdict.low - earlier["high"] <= spread and earlier["low"] - verdict.high <= spread


def held_from(earlier: float | None) -> str:
    """', held from an earlier run (0.983x)' for a verdict that kept an earlier run's outcome, else ''."""
    return "" if earlier is None else f", held from an earlier run ({earlier:.3f}x)"


def deciding_mode(verdicts: dict) -> str | None:
    """The mode that leaves a type out ({mode: Verdict, or its dict}): the one where the model runs the most faster
    without it, outside the noise; None where there is none. Where another mode runs it slower without, outside the
    noise too, a graphed mode decides (GPU_TIMED): modes of one side run the same kernels, and a CUDA graph's
    replay times the GPU's work, the same run after run, where a forward without graphs is bound by its launches
    and the host's speed moves what a kernel saves or costs there. Following the larger effect flipped: Qwen3-0.6B's
    rope_attention read 0.918x, 0.890x and 0.854x eagerly in three runs on one H100, 1.085x graphed in each, and was
    kept once and left out twice. A model that fails with the kernel leaves it out wherever it fails."""
    found = {m: v if isinstance(v, dict) else v.to_dict() for m, v in verdicts.items()}
    faster = [m for m, v in found.items() if v["outcome"] == FASTER]
    if not faster:
        return None
    mode = max(faster, key=lambda m: _speedup(1.0, found[m]["high"]))
    slower = [m for m, v in found.items() if v["outcome"] == SLOWER]
    if not slower or math.isinf(_speedup(1.0, found[mode]["high"])):
        return mode
    graphed = [m for m in (*faster, *slower) if m in GPU_TIMED]
    if graphed:
        return graphed[0] if graphed[0] in faster else None
    outweighed = any(_speedup(found[m]["low"], 1.0) > _speedup(1.0, found[mode]["high"]) for m in slower)
    return None if outweighed else mode


def between_runs(mode: str, modes) -> float:
    """How far a comparison in `mode` moves between runs, beyond each run's interval, among the modes of one side
    that decide together: HOST_BETWEEN_RUNS in a mode the host bounds beside a GPU_TIMED one (a mode that decides
    alone is the one the user runs), COMPILED_BETWEEN_RUNS in a compiled one, else BETWEEN_RUNS."""
    if mode not in GPU_TIMED and any(m in GPU_TIMED for m in modes):
        return HOST_BETWEEN_RUNS
    return COMPILED_BETWEEN_RUNS if mode.startswith("compile") else BETWEEN_RUNS


def margin_for(mode: str, margin: float, modes) -> float:
    """The margin a verdict in `mode` is taken against, widened by what its comparisons move between runs beyond
    BETWEEN_RUNS (which compare() adds): so the host's drift never flips what the graphed mode leaves undecided, nor
    Inductor's autotuning what a compiled mode does."""
    return margin + between_runs(mode, modes) - BETWEEN_RUNS


def _speedup(without: float, with_: float) -> float:
    """How much faster one side runs, from a bound on without / with (0: the model failed with the kernel)."""
    return math.inf if with_ == 0 else without / with_


def close_call(verdict: Verdict, margin: float) -> bool:
    """Within noise, but more turns could still decide it: the interval reaches past the margin on a side."""
    reach = margin + BETWEEN_RUNS
    return verdict.outcome == WITHIN_NOISE and (verdict.low < 1 - reach or verdict.high > 1 + reach)


def failed(without_ms: float, with_ms: float) -> Verdict:
    """The verdict where a side failed to run (counted as infinitely slow): no noise to weigh."""
    if without_ms == with_ms:
        return Verdict(without_ms, with_ms, 1.0, 1.0, 1.0, 0, WITHIN_NOISE)
    bound = 0.0 if without_ms < with_ms else math.inf
    return Verdict(without_ms, with_ms, bound, bound, bound, 0, FASTER if without_ms < with_ms else SLOWER)


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
