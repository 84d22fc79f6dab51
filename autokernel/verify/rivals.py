"""Rivals in a prune: a kept type whose sites another loaded type would take without it.

Types take a model's sites in turn: rope_attention replaces Qwen3's attention modules, and the SDPA call inside them,
which flash_attention's patch takes, never runs while it is in. The greedy prune times each kept type against the
model without it, and without rope_attention that model runs SDPA, not flash_attention: flash_attention never ran,
so it was never timed, and deploy installs only the types a site ran. On an H100 the same Qwen3-0.6B compiled and
graphed ran 1.14x torch.compile with rope_attention and 1.38x with flash_attention in its place (BENCHMARKS.md).

So a prune also tries each kept type's rivals: the loaded types that run once it is out (one eager forward of the
model without it says which). The model with the rivals in its place is timed in turns with the kept set; where it
is faster outside the noise the type leaves, the rivals join the kept set, and each then gets the trial every kept
type gets (the model without it), so that no rival stays that the model is faster without.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from autokernel.ops import swap
from autokernel.verify import noise
from autokernel.verify.pruneclock import Clock


def try_rivals(trials, optimized: swap.Optimized, keep: list[str], standby: list[str], dropped: dict,
               progress: Callable[[str], None] | None, decided: dict, try_without: Callable) -> swap.Optimized:
    """Each type of `keep` against its rivals among `standby` (the loaded types no site ran); `keep`, `standby` and
    `dropped` updated in place, decided given each trial under "<type>-><rival>+...", each rival taken then tried
    out by try_without (pruning._try_without). The model that goes on."""
    if not standby:
        return optimized
    running = _running(trials, keep + standby, standby)  # those that run beside every kept type are no one's rival
    for kernel_type in list(keep):
        rivals = [t for t in _running(trials, [t for t in keep if t != kernel_type] + standby, standby)
                  if t not in running]
        if not rivals:
            continue
        if isinstance(progress, Clock):  # its heartbeat names the trial under way
            progress.begin(f"prune ({', '.join(trials.modes)}): {kernel_type} against {', '.join(rivals)}")
        trial = swap.build(trials.model, [t for t in keep if t != kernel_type] + rivals)
        verdicts = trials.compare(trial.module(), against=optimized.module())
        decided[f"{kernel_type}->{'+'.join(rivals)}"] = {m: v.to_dict() for m, v in verdicts.items()}
        mode = noise.deciding_mode(verdicts)
        instead = f"{', '.join(rivals)} in its place"
        if mode:
            keep.remove(kernel_type)
            keep.extend(rivals)
            standby[:] = [t for t in standby if t not in rivals]
            dropped[kernel_type] = f"{instead}: the model is faster in {mode} mode ({verdicts[mode].text()})"
            optimized = trial
        trials.forget_all_but(optimized.module())
        if progress:
            progress(f"prune ({', '.join(trials.modes)}): {kernel_type} " + (
                f"left out, {dropped[kernel_type]}" if mode else f"kept against {instead}: " + "; ".join(
                    f"{m} {v.text()}" for m, v in verdicts.items())))
        if mode:
            for rival in rivals:
                optimized = try_without(trials, optimized, [rival], keep, dropped, progress, decided)
    return optimized


def _running(trials, types: list[str], standby: list[str]) -> list[str]:
    """The standby types a site runs in one eager forward of the model with `types`."""
    probe = swap.build(trials.model, types)
    try:
        with torch.no_grad():
            probe.module()(*trials.sets[0])
    except Exception:  # noqa: BLE001  (a set that does not run has no rival to offer: the trials time what runs)
        return []
    return [t for t in probe.swapped_types() if t in standby]
