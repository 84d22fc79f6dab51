"""What earlier runs of verify.py decided on the same model, input, GPU and kernel files: a prune's comparison that
reads now as it read then, within what one comparison moves between runs, keeps the verdict it had.

A verdict is a line drawn on a ratio measured with noise (noise.py), and some type's ratio sits on the line: over three
runs on one H100, TinyLlama's compiled rmsnorm read 0.983x (interval 0.982-0.984), 0.981x (0.977-0.984) and 0.983x
(0.981-0.986) against a line at 0.984 (the 1% margin and Inductor's 0.6% between runs), and was left out, left out and
kept. Moving the line moves the type that sits on it; no line makes a decision on such a reading repeatable. What does
is remembering: the readings of two runs that agree within noise.between_runs are one measurement read twice, and the
second run takes the first one's verdict (the report says "held from an earlier run" with both figures). Only a
reading that moved further than that (another kernel file, another machine, a real change) is decided afresh, and
stored for the next run. A verdict that held keeps the reading that decided it as the one later runs are held to, so
readings cannot walk across the line a few tenths at a time. The one other line a prune draws on a reading, whether
the eager forward is device-bound (pruning.DEVICE_BOUND), is held alike (side_of).

The verdicts are kept per model, input, deploy modes, GPU and versions of torch and Triton in one JSON file each under
~/.cache/autokernel/verdicts ($AUTOKERNEL_CACHE moves it), each trial under the types it left out and the kernels it
was timed against, with a digest of every kernel file it ran: a trial of other kernels is a new trial. verify.py's
--fresh forgets them for a run (and stores what that run decides). Torch-free.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from dataclasses import replace
from pathlib import Path

from autokernel.verify import noise

TOGETHER = "kept together"  # pruning's name for the kept set against the original
LARGE = 1 << 20  # bytes: a file of a config folder this large (weights) counts by its size (path_digest)


def cache_dir() -> Path:
    """$AUTOKERNEL_CACHE, else $XDG_CACHE_HOME/autokernel, else ~/.cache/autokernel."""
    if os.environ.get("AUTOKERNEL_CACHE"):
        return Path(os.environ["AUTOKERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autokernel"


def digest(value) -> str:
    """A short digest of bytes, or of anything JSON writes (keys sorted)."""
    data = value if isinstance(value, bytes) else json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def path_digest(path: Path) -> str:
    """A digest of a config file or folder: each file's name and its contents, a large one's size (a pretrained
    folder's weights are not read)."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return digest([(p.name, digest(p.read_bytes()) if p.stat().st_size < LARGE else p.stat().st_size) for p in files])


class Recall:
    """The verdicts of earlier runs on one model (identity: what makes two runs the same comparison) and this run's,
    to be stored by save(). kernels: {type: digest of the kernel file it runs}; fresh: hold nothing from earlier
    runs."""

    def __init__(self, identity: dict, kernels: dict[str, str], fresh: bool = False, root: Path | None = None):
        self.path = (root or cache_dir()) / "verdicts" / f"{digest(identity)}.json"
        self.identity, self.kernels = identity, kernels
        self.earlier = {} if fresh else _read(self.path)
        self.now: dict[str, dict] = {}

    def hold(self, left_out: list[str], against: list[str], verdicts: dict, modes: list[str]) -> dict:
        """verdicts ({mode: noise.Verdict}) of the trial without `left_out` (TOGETHER: the original) against the
        model with `against`, each one whose reading agrees with an earlier run's (noise.agree) given that run's
        outcome; this run's readings are stored for the next, but where a verdict held, the one it held to."""
        key = f"{'+'.join(sorted(left_out))} against {'+'.join(sorted(against))}"
        kernels = {t: self.kernels.get(t, "") for t in sorted({*left_out, *against} - {TOGETHER})}
        entry = self.earlier.get(key)
        earlier = entry["verdicts"] if entry and entry.get("kernels") == kernels else {}
        held, stored = {}, {}
        for mode, verdict in verdicts.items():
            before = earlier.get(mode)
            if before and before["outcome"] != verdict.outcome and noise.agree(
                    verdict, before, noise.between_runs(mode, modes)):
                held[mode], stored[mode] = replace(verdict, outcome=before["outcome"], earlier=before["ratio"]), before
            else:
                held[mode], stored[mode] = verdict, verdict.to_dict()
        now = self.now.get(key)  # the same trial timed again in other modes (pruning._eager_alone): both kept
        if now and now["kernels"] == kernels:
            stored = {**now["verdicts"], **stored}
        self.now[key] = {"kernels": kernels, "verdicts": stored}
        return held

    def side_of(self, name: str, readings: list[float], line: float) -> bool:
        """Whether the median of `readings` (one figure read a few times) is at `line` or above it, held to an
        earlier run's answer where the two runs' readings overlap (their ranges); the answer and the readings it
        rests on are stored for the next run, where it held the earlier ones. A figure that sits on a line
        (Gemma-2 2B's device share at 1x8192, against pruning.DEVICE_BOUND) gives one answer run after run."""
        low, high = min(readings), max(readings)
        before = self.earlier.get(name)
        if before and before.get("low", math.inf) <= high and low <= before.get("high", -math.inf):
            self.now[name] = before
            return bool(before["above"])
        median = statistics.median(readings)
        self.now[name] = {"median": median, "low": low, "high": high, "above": median >= line}
        return median >= line

    def save(self) -> str | None:
        """Write the earlier runs' verdicts with this run's over them; whole or not at all (a file written beside
        it, then renamed). Why it could not (a cache folder that cannot be written), or None: a run's report does
        not depend on it."""
        if not self.now:
            return None
        part = self.path.with_suffix(f".{os.getpid()}.part")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            part.write_text(json.dumps({"identity": self.identity, "trials": {**self.earlier, **self.now}},
                                       indent=1, default=str))
            part.replace(self.path)
        except OSError as e:
            return f"the prune's verdicts were not stored for the next run ({e})"
        return None


def _read(path: Path) -> dict:
    """The trials a verdict file holds; none where it is missing or unreadable (a run that decides afresh)."""
    try:
        return json.loads(path.read_text())["trials"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
