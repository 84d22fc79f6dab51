"""Child processes started in a session of their own: stop the whole group, read a pipe line by line.

The harness children (autokernel/harness/runner.py, forked by autokernel/harness/zygote.py), the command agent's CLI
and a Ray task's loop (autokernel/loop/raynode.py) all run this way, so that what a child leaves running in
the background goes with it. Standard library only: a Ray task carries this module by value.
"""

from __future__ import annotations

import os
import signal
import subprocess


def signal_group(pid: int, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to the process group `pid` leads; False when nothing is left in it."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return False
    return True


def kill_group(proc: subprocess.Popen, grace_s: float | None = None) -> None:
    """Stop the group `proc` leads and reap `proc`: SIGKILL, or first SIGTERM and `grace_s` seconds
    to finish (a CLI that cleans up after itself)."""
    if grace_s is not None and signal_group(proc.pid, signal.SIGTERM):
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            pass
    signal_group(proc.pid)
    proc.wait()


def pump(stream, put) -> None:
    """put(line) for each line of `stream` as it comes (a reader thread's body), put(None) at its end."""
    for line in iter(stream.readline, ""):
        put(line)
    stream.close()
    put(None)
