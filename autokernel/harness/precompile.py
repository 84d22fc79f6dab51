"""Compiling ahead of the stages: the calls the five stages will make, made by several processes at once.

A bench that meets a cold cache spends most of its time in Triton's compiler, one specialization after another (on
an H100, the rope_attention file extracted for TinyLlama: the shape sweep 55.8 s and the edge cases 43.3 s cold,
0.6 s and 0.3 s once Triton's on-disk cache held its kernels). A night's first bench of each kernel is such a bench,
and so is every experiment that changes a compile-time constant (a night's GROUP_M move on fused_mlp: stages 37 s).
As the stages start, WORKERS processes each make every WORKERS-th of the calls the stages make (on inputs of the same
shapes, other values), unchecked, so the compiles run side by side and the stages find most of them in the cache;
when the stages end, the workers still going are stopped, before anything is timed. A bench whose kernels the cache
holds already loses nothing to them. Nothing a worker does is a verdict: the stages run as always, in the harness's
process, every call checked. The screen (autokernel/harness/screen.py) does the
same with its configurations: each worker loads every WORKERS-th of them and calls it at the model's shapes, so the
screen finds them compiled (each configuration is a compile of its own: an H100 screen of 48 took 49-61 s).

    python -m autokernel.harness.precompile kernel.py --worker 2 --of 8 --seed S [--quick] [--device cuda]
    python -m autokernel.harness.precompile kernel.py --worker 2 --of 8 --configs configs.json [--dtype fp16]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TIMEOUT_S = 240  # the screen's workers still compiling after this long are stopped; the screen compiles the rest
MAX_WORKERS = 8


def workers() -> int:
    """Processes to compile with: half the cores (the other half for the harness and the host), at most
    MAX_WORKERS; below 2 there is nothing to gain."""
    return min(MAX_WORKERS, (os.cpu_count() or 2) // 2)


class Alongside:
    """Workers making the stages' calls while the harness runs the stages (start); stop() ends them."""

    def __init__(self, procs: list, started: float):
        self.procs, self.started, self.stopped = procs, started, False

    def stop(self, when: str = "when the stages ended") -> str:
        """Each worker still going stopped (the stages are over: what it would compile now serves nothing); a line,
        "" when they were stopped before."""
        if self.stopped:
            return ""
        self.stopped = True
        done = sum(proc.poll() is not None for proc in self.procs)
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        took = time.monotonic() - self.started
        return (f"compiling ahead: {len(self.procs)} processes made the stages' calls alongside them, {done} finished, "
                f"{len(self.procs) - done} stopped {when} ({took:.1f} s)")


def start(path: str, device: str, seed: int, quick: bool, count: int | None = None) -> Alongside | None:
    """Workers started on the stages' calls, for the stages to run meanwhile (None: too few cores). Started
    alongside rather than waited for: a bench whose kernels are all in the cache (most of a night's experiments)
    loses nothing to them, one that meets a cold cache finds most of its compiles done by the time it gets there."""
    count = workers() if count is None else count
    if count < 2:
        return None
    flags = ["--seed", str(seed + 1), "--device", device] + (["--quick"] if quick else [])
    return Alongside(_started(path, flags, count), time.monotonic())


def warm_configs(path: str, configs_file: str, device: str, dtype: str, count: int | None = None,
                 timeout: float = TIMEOUT_S) -> str:
    """The configurations in configs_file (a JSON list) called at the model's shapes by the workers; a line."""
    flags = ["--configs", configs_file, "--device", device, "--dtype", dtype]
    return _run(path, flags, "the configurations' calls", count, timeout)


def _run(path: str, flags: list[str], what: str, count: int | None, timeout: float) -> str:
    count = workers() if count is None else count
    if count < 2:
        return "compiling ahead: off (fewer than 4 cores)"
    start = time.monotonic()
    procs = _started(path, flags, count)
    stopped = 0
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            stopped += 1
    late = f", {stopped} stopped at the {timeout:.0f} s limit" if stopped else ""
    return f"compiling ahead: {count} processes made {what} in {time.monotonic() - start:.1f} s{late}"


def _started(path: str, flags: list[str], count: int) -> list:
    command = [sys.executable, "-m", "autokernel.harness.precompile", path, "--of", str(count), *flags]
    # close_fds: the pipe that holds the key the harness signs its result with stays in the harness (channel.py)
    return [subprocess.Popen(command + ["--worker", str(i)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             close_fds=True) for i in range(count)]


def make_calls(path: str, device: str, seed: int, quick: bool, worker: int, of: int) -> int:
    """This worker's share of the stages' calls (the harness's own stages, each call the i-th of all with
    i % of == worker), unchecked; returns how many it made."""
    from autokernel.harness import harness

    module, spec, _ = harness._load(path, device)

    class Share(harness.Harness):
        made = seen = 0

        def call(self, inputs, what: str, tol_scale: float = 1.0):
            self.seen += 1
            if self.seen % of == worker:
                self.made += 1
                self.fn(*inputs)
                self.sync()

    share = Share(module, spec, device, quick, seed)
    for stage in harness.STAGES:
        try:
            getattr(share, stage)()
        except Exception:  # noqa: BLE001, S112  (a failure is the stages' to report, in the harness's process)
            continue
    return share.made


def make_config_calls(path: str, configs: list[dict], device: str, dtype: str, worker: int, of: int) -> int:
    """This worker's share of the configurations (the i-th with i % of == worker), each loaded as the screen loads
    it and called once at every model shape, unchecked; returns how many it called."""
    import shutil

    import torch

    from autokernel.harness import screen
    from autokernel.registry import parse_dtype

    box = screen._Screen(path, device, parse_dtype(dtype))
    made = 0
    try:
        for index, config in enumerate(configs):
            if index % of != worker:
                continue
            try:
                fn = box.load(index, config)
                for sets in box.inputs:
                    fn(*sets[0])
                if device == "cuda":
                    torch.cuda.synchronize()
                made += 1
            except Exception:  # noqa: BLE001, S112  (the screen gives this configuration its verdict)
                continue
    finally:
        shutil.rmtree(box.dir, ignore_errors=True)
    return made


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="One worker compiling a kernel's stage calls ahead (the harness's child)")
    p.add_argument("kernel")
    p.add_argument("--worker", type=int, required=True)
    p.add_argument("--of", type=int, required=True)
    p.add_argument("--seed", type=int, default=0, help="the stages' seed")
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--configs", help="a JSON list of configurations: call those, not the stages' calls")
    p.add_argument("--dtype", default="fp16", help="with --configs: the inputs' dtype")
    args = p.parse_args(argv)
    from autokernel import compat

    if compat.interpreting():
        compat.prepare_interpreter()
    if args.configs:
        configs = json.loads(Path(args.configs).read_text())
        made = make_config_calls(args.kernel, configs, args.device, args.dtype, args.worker, args.of)
        print(f"worker {args.worker} of {args.of}: {made} configurations")
    else:
        made = make_calls(args.kernel, args.device, args.seed, args.quick, args.worker, args.of)
        print(f"worker {args.worker} of {args.of}: {made} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
