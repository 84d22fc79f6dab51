"""The prune's progress: its lines prefixed by the trials done, the time spent and what is left, and a heartbeat
while one step (a compile of minutes) runs on."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from autokernel.verify.verification import duration

HEARTBEAT_S = 30.0  # a progress line at least this often while a prune runs (Clock)


class Clock:
    """progress() with each line prefixed by the trials done, the time spent and an estimate of what is left; while
    it runs (a context), a line every HEARTBEAT_S that passes without one, naming the step under way (begin()): one
    compile can take minutes (Gemma-2 2B's first compiled trial at 1x8192, 107 s; Qwen3's last check, minutes in
    ptxas), and a silent prompt reads as a hang."""

    def __init__(self, progress: Callable[[str], None] | None, trials: int):
        self.progress, self.trials, self.done, self.started = progress, max(trials, 1), 0, time.monotonic()
        self.step, self.step_at, self.said, self._stop = "", self.started, self.started, threading.Event()

    def __call__(self, line: str) -> None:
        self.done += 1
        self.trials = max(self.trials, self.done)  # a joint trial (_try_together) is one more than counted
        if self.progress is None:
            return
        spent = time.monotonic() - self.started
        left = spent / self.done * max(self.trials - self.done, 0)
        self._say(f"[{self.done}/{self.trials}, {duration(spent)} spent, ~{duration(left)} left] {line}")

    def note(self, line: str) -> None:
        """A line about the step under way (a long compile), counted as no trial."""
        self.begin(line)
        if self.progress is not None:
            self._say(f"[{self.done}/{self.trials}, {duration(time.monotonic() - self.started)} spent] {line}")

    def begin(self, step: str) -> None:
        """The step now under way, for the heartbeat's line (no line of its own)."""
        self.step, self.step_at = step, time.monotonic()

    def _say(self, line: str) -> None:
        self.said = time.monotonic()
        self.progress(line)

    def __enter__(self):
        if self.progress is not None:
            threading.Thread(target=self._beat, daemon=True, name="prune-heartbeat").start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S / 4):
            now = time.monotonic()
            if now - self.said >= HEARTBEAT_S and self.step:
                self._say(f"[{self.done}/{self.trials}, {duration(now - self.started)} spent] {self.step}: "
                          f"still under way ({duration(now - self.step_at)})")
