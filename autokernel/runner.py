"""Run the harness on one kernel file in a child process with a time limit.

The parent never imports the candidate. A hang becomes TIMEOUT (the child's whole process group is
killed), a segfault, an illegal memory access or an exception at import becomes CRASH with the tail of
its error output, and the caller (bench.py, the loop) carries on either way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from autokernel import gpu

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT_S = {"cuda": 300, "cpu": 600}  # the interpreter is ~1000x slower than a GPU
ERROR_TAIL_LINES = 25


def child_env(device: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"  # must be set before triton is imported in the child
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def _pump(stream, sink: list, echo: bool):
    for line in iter(stream.readline, ""):
        sink.append(line)
        if echo:
            sys.stdout.write(line)
            sys.stdout.flush()
    stream.close()


def _kill_group(proc: subprocess.Popen):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_bench(kernel_path, device: str | None = None, quick: bool = False, timeout: float | None = None,
              dtype: str = "fp16", seed: int | None = None, echo: bool = False, timed: bool = True,
              reuse_baselines: bool = False) -> dict:
    """Correctness stages and timing of kernel_path, isolated. Returns the result dict (see module doc)."""
    device = gpu.pick_device(device)
    timeout = timeout or DEFAULT_TIMEOUT_S[device]
    kernel_path = str(Path(kernel_path).resolve())
    with tempfile.TemporaryDirectory(prefix="autokernel-") as tmp:
        out_json = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "autokernel.harness", kernel_path, "--device", device, "--out", out_json,
               "--dtype", dtype]
        cmd += ["--quick"] * quick + ["--no-timing"] * (not timed) + ["--reuse-baselines"] * reuse_baselines
        cmd += ["--seed", str(seed)] if seed is not None else []
        start = time.perf_counter()
        env = {**child_env(device), "AUTOKERNEL_LAUNCHED_AT": repr(time.time())}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                                env=env, start_new_session=True)
        out_lines, err_lines = [], []
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, out_lines, echo), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, err_lines, False), daemon=True)]
        for t in pumps:
            t.start()
        try:
            proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            timed_out = True
        except BaseException:  # Ctrl-C: never leave a child running on the GPU
            _kill_group(proc)
            raise
        for t in pumps:
            t.join(timeout=5)
        result = _read_result(out_json, proc.returncode, timed_out, timeout, err_lines)
    # The child names the GPU it ran on (the parent never initializes CUDA just for a label); a child
    # that died before saying so leaves the device kind.
    result.setdefault("gpu", gpu.device_name("cpu") if device == "cpu" else device)
    result.update(kernel_file=str(kernel_path), device=device, cpu_mode=device == "cpu",
                  wall_s=round(time.perf_counter() - start, 2),
                  log="".join(out_lines), stderr_tail="".join(err_lines[-ERROR_TAIL_LINES:]))
    return result


def _read_result(out_json, returncode, timed_out, timeout, err_lines) -> dict:
    base = {"correctness": "FAIL", "stages": [], "failed_stage": None}
    if timed_out:
        return {**base, "status": "timeout", "reason": f"no result within the {timeout:.0f} s time limit (a hang?)"}
    if os.path.exists(out_json) and returncode == 0:
        with open(out_json) as f:
            return json.load(f)
    tail = "".join(err_lines[-ERROR_TAIL_LINES:]).strip() or "(no error output)"
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
    return {**base, "status": "crash", "reason": f"the harness process died ({how}):\n{tail}"}
