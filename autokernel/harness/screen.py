"""Screening: many configurations of one kernel file timed at its model shapes in one process, by successive halving.

The builtin agent's search (autokernel/loop/agents/search.py) asks which of tens of configurations (each a set of
values for the file's TUNABLES: variants, tiles, warps, stages) are worth a full experiment. One harness run per
configuration would cost tens of seconds each; here one process imports the file's text with each configuration
written in (a file of its own, so that Triton reads the source it runs), checks its output against the oracle at
every model shape, and times it there. Successive halving spends the timing where it pays: every configuration
is timed briefly, the best third (by the time in the model: calls x time per call, summed over the shapes), the
fastest at each shape and the configuration the file has now go on to be timed again with ETA times the runs, and
so on. A screen decides nothing: what it ranks first still goes through the five stages, the timing and the
confirmation of a loop experiment, so a configuration that is fast but wrong here is only a wasted experiment.

    python -m autokernel.harness.screen kernel.py --configs configs.json --out screen.json [--device cuda]

On a GPU each configuration at each shape is a CUDA graph replayed (timing.time_gpu); on the CPU (Triton's
interpreter) the host clock, which shows that the path works, not which configuration is faster.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HANG_S = 180  # a screen still going this long after its first rung's deadline is stopped
ETA = 3  # each rung keeps a third of the configurations and times them with three times the runs
REPS = {"cuda": (10, 30, 90), "cpu": (1, 2, 3)}  # timed runs per configuration and shape, rung by rung
TIMED, WRONG, FAILED, UNREACHED = "timed", "wrong", "failed", "unreached"


def rung_survivors(results: list[dict], among: list[int], eta: int = ETA) -> list[int]:
    """Indices (of those `among`, the configurations a rung timed) that the rung sends on: the best 1/eta by time
    in the model, the fastest at each shape (a per-shape table's candidates), and the first configuration (the
    file's own: what the others must beat)."""
    timed = [i for i in among if results[i]["status"] == TIMED]
    if not timed:
        return []
    ranked = sorted(timed, key=lambda i: results[i]["model_us"])
    keep = set(ranked[:max(1, math.ceil(len(timed) / eta))])
    shapes = len(results[timed[0]]["us"])
    keep |= {min(timed, key=lambda i: results[i]["us"][k]) for k in range(shapes)}
    keep |= {0} if 0 in timed else set()
    return sorted(keep)


class _Screen:
    """The kernel file's text, its type's spec, the model shapes with their calls and one fixed set of inputs per
    shape (every configuration sees the same inputs) in one process."""

    def __init__(self, path: str, device: str, dtype):
        from autokernel.harness import harness, modeltime

        self.source = Path(path).read_text()
        module, self.spec, _ = harness._load(path, device)
        runner = harness.Harness(module, self.spec, device, quick=False, seed=0)
        self.shapes = modeltime.weighted_shapes(module, runner.model_shapes)
        self.inputs = [[runner.model_inputs(s, dtype) for _ in range(2)] for s, _ in self.shapes]
        self.device, self.dir = device, tempfile.mkdtemp(prefix="autokernel-screen-")
        self.stem = Path(path).stem

    def load(self, index: int, config: dict):
        """kernel_fn of the file with `config` written in, imported from a file of its own."""
        from autokernel.kernelfile import apply_config, import_kernel

        variant = Path(self.dir) / f"{self.stem}_screen_{index}.py"
        variant.write_text(apply_config(self.source, config))
        module = import_kernel(variant)
        return self.spec.bind(module, self.device) if self.spec.bind else module.kernel_fn

    def check(self, fn) -> None:
        """fn's output at every model shape against the oracle (checking.CheckFailed when it is off)."""
        from autokernel.harness import checking

        for (shape, _), sets in zip(self.shapes, self.inputs):
            checking.checked_call(fn, self.spec, sets[0], f"screen {checking.describe(shape, sets[0][0].dtype)}")

    def time(self, fn, reps: int) -> list[float]:
        """fn's median us per call at each model shape, over `reps` runs rotating the shape's input sets."""
        import torch

        from autokernel.harness import modeltime, timing

        us = []
        for sets in self.inputs:
            if self.device == "cuda":
                timed, graphs = modeltime.graph_time(fn, sets, reps)
                del graphs  # each configuration's graph pools go before the next one captures
                torch.cuda.synchronize()
            else:
                timed = timing.time_cpu(fn, sets, reps=reps)
            us.append(timed.median_us)
        return us

    def model_us(self, us: list[float]) -> float:
        return sum(calls * t for (_, calls), t in zip(self.shapes, us))


def screen(path: str, configs: list[dict], device: str, dtype: str = "fp16", seconds: float = 120.0,
           eta: int = ETA, progress=None, update=None, compile_ahead: bool | None = None) -> dict:
    """{"shapes": [{"key": the tensor arguments' shapes, "calls": per forward}], "results": one per configuration,
    in the order given: {"config", "status" (timed, wrong, failed or unreached), "us" (per shape, at the last rung
    it reached), "model_us", "rung", "reason"}}. The first rung stops starting configurations after `seconds` (the
    rest: unreached); the later ones time the few it sends on. update, if given, gets the figures so far (with
    "on": the index of the configuration about to run) before each configuration. compile_ahead (default: on a
    GPU) has workers call the configurations first, side by side (autokernel/harness/precompile.py)."""
    from autokernel.registry import parse_dtype

    box = _Screen(path, device, parse_dtype(dtype))
    results = [{"config": c, "status": UNREACHED, "us": [], "model_us": None, "rung": -1, "reason": ""}
               for c in configs]
    shapes = [{"key": [list(a.shape) for a in sets[0] if hasattr(a, "shape")], "calls": calls}
              for (_, calls), sets in zip(box.shapes, box.inputs)]
    if not box.shapes:
        return {"shapes": [], "results": results}
    if compile_ahead or (compile_ahead is None and device == "cuda"):
        _compile_ahead(path, configs, device, dtype, seconds, progress)
    deadline, fns = time.monotonic() + seconds, {}
    todo = list(range(len(configs)))
    try:
        for rung, reps in enumerate(REPS["cuda" if device == "cuda" else "cpu"]):
            for i in todo:
                if rung == 0 and time.monotonic() > deadline and i != 0:
                    break
                if update:
                    update({"shapes": shapes, "results": results, "on": i})
                _measure(box, results[i], i, fns, rung, reps)
            if progress:
                progress(f"screen rung {rung + 1}: {len(todo)} configuration(s), {reps} run(s) each")
            todo = rung_survivors(results, todo, eta)
            if len(todo) <= 1:
                break
    finally:
        shutil.rmtree(box.dir, ignore_errors=True)  # the configurations' files
    return {"shapes": shapes, "results": results}


def _compile_ahead(path: str, configs: list[dict], device: str, dtype: str, seconds: float, progress) -> None:
    from autokernel.harness import precompile

    with tempfile.TemporaryDirectory(prefix="autokernel-ahead-") as tmp:
        given = Path(tmp) / "configs.json"
        given.write_text(json.dumps(configs))
        line = precompile.warm_configs(str(path), str(given), device, dtype, timeout=seconds)
    if progress:
        progress(line)


def _measure(box: _Screen, result: dict, index: int, fns: dict, rung: int, reps: int) -> None:
    """One configuration at one rung: loaded and checked the first time, then timed at every shape."""
    from autokernel.harness import crash

    try:
        if index not in fns:
            fns[index] = box.load(index, result["config"])
            box.check(fns[index])
        us = box.time(fns[index], reps)
    except Exception as e:  # noqa: BLE001  (whatever a configuration does wrong is its own verdict)
        wrong = type(e).__name__ in ("CheckFailed", "GuardFailed")
        result.update(status=WRONG if wrong else FAILED, reason=str(e).splitlines()[0][:300] if wrong else
                      crash.exception_cause(e)[:300])
        fns.pop(index, None)
        return
    result.update(status=TIMED, us=us, model_us=box.model_us(us), rung=rung)


# ------------------------------------------------------------------------------ from the loop's process
def run_screen(path: str | Path, configs: list[dict], device: str | None = None, dtype: str = "fp16",
               seconds: float = 120.0, timeout: float | None = None) -> dict:
    """screen() in a child process (the loop's own process never imports a kernel), stopped after `timeout`
    seconds (default: `seconds` and HANG_S more, on a GPU `seconds` more for compiling ahead). The child writes its
    figures after every configuration, so a child stopped by the timeout (a configuration that compiles for minutes)
    still gives what it measured, the configuration it was on marked failed; a child that dies before any figure is
    a RuntimeError."""
    from autokernel.harness.gpu import pick_device
    from autokernel.harness.processes import kill_group
    from autokernel.harness.runner import REPO_ROOT, child_env

    device = pick_device(device)
    with tempfile.TemporaryDirectory(prefix="autokernel-screen-") as tmp:
        given, out = Path(tmp) / "configs.json", Path(tmp) / "screen.json"
        given.write_text(json.dumps(configs))
        args = [sys.executable, "-m", "autokernel.harness.screen", str(path), "--configs", str(given), "--out",
                str(out), "--device", device, "--dtype", dtype, "--seconds", str(seconds)]
        with open(Path(tmp) / "log.txt", "w+") as log:
            proc = subprocess.Popen(args, env=child_env(device), cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                # on a GPU compiling ahead may take up to `seconds` before the first rung's `seconds` start
                limit = timeout or (2 * seconds if device == "cuda" else seconds) + HANG_S
                returncode, hung = proc.wait(timeout=limit), False
            except subprocess.TimeoutExpired:
                kill_group(proc)
                returncode, hung = proc.returncode, True
            log.seek(0)
            tail = log.read().strip().splitlines()[-1:] or ["no output"]
        if not out.is_file():
            raise RuntimeError(f"the screen {'did not end in time' if hung else 'failed'} (exit code {returncode}): "
                               f"{tail[0][:300]}")
        result = json.loads(out.read_text())
        if hung or returncode != 0:
            _mark_stopped(result, "did not end in time" if hung else f"the screen died: {tail[0][:200]}")
        return result


def _mark_stopped(result: dict, why: str) -> None:
    """The configuration a stopped screen was on is failed (with why); those after it were never reached."""
    if result.get("on") is not None:
        result["results"][result["on"]].update(status=FAILED, reason=why)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Time many configurations of one kernel file at its model shapes, "
                                            "by successive halving (the builtin agent's screen)")
    p.add_argument("kernel", help="the kernel file (with MODEL_SHAPES and TUNABLES)")
    p.add_argument("--configs", required=True, help="a JSON list of configurations ({TUNABLE: value})")
    p.add_argument("--out", required=True, help="where the JSON result goes")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--seconds", type=float, default=120.0, help="when the first rung stops starting configurations")
    args = p.parse_args(argv)
    configs = json.loads(Path(args.configs).read_text())

    def write(figures: dict) -> None:
        tmp = Path(f"{args.out}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(figures))
        tmp.replace(args.out)  # atomic: a parent that stops the screen reads a whole file
    write(screen(args.kernel, configs, args.device, args.dtype, args.seconds,
                 progress=lambda line: print(line, flush=True), update=write))
    return 0


if __name__ == "__main__":
    sys.exit(main())
