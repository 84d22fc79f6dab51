"""Run the harness on one kernel file in a child process with a time limit.

The parent never imports the candidate. A hang becomes TIMEOUT (the child's whole process group is
killed), a segfault, an illegal memory access or an exception at import becomes CRASH, its reason's first
line naming the cause (the signal, or the exception with its sizes: autokernel/harness/crash.py) above the
tail of its error output, and the caller (bench.py, the loop) carries on either way.

The child is a fresh `python -m autokernel.harness.harness` process, or, while a warm launcher runs (the loop
starts one: start_warm), a fork of a process that has already imported torch, triton and the harness
(autokernel.harness.zygote): the same run without seconds of imports. If the launcher is unusable, the bench
runs in a fresh process and its log says why in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from autokernel.harness import channel, crash, gpu, zygote
from autokernel.harness.processes import kill_group, pump

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = {"cuda": 300, "cpu": 600}  # the interpreter is ~1000x slower than a GPU
ERROR_TAIL_LINES = 25
HARNESS_COMMAND = zygote.HARNESS_MODULE_COMMAND  # what a child runs (tests put an unguarded harness here)
MAX_WARM_RESTARTS = 3  # a warm launcher that keeps dying is given up on; benches go on in fresh processes


def child_env(device: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"  # must be set before triton is imported in the child
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def _keep(sink: list, echo: bool):
    """pump's put: each line into `sink`, and onto this process's stdout too when echoing."""
    def put(line: str | None) -> None:
        if line is not None:
            sink.append(line)
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
    return put


def _stop(proc) -> None:
    """SIGKILL to the child's group: a forked one through its zygote, a fresh one from here."""
    proc.kill_group() if isinstance(proc, zygote.Child) else kill_group(proc)


@dataclass
class _Run:
    returncode: int | None
    timed_out: bool
    out_lines: list
    err_lines: list
    launcher: str  # "warm" (forked from the zygote) or "fresh"


def _watch(proc, timeout: float, echo: bool, launcher: str, out_lines: list) -> _Run:
    """Collect a started child's output until it exits; kill its process group at the time limit."""
    err_lines = []
    pumps = [threading.Thread(target=pump, args=(proc.stdout, _keep(out_lines, echo)), daemon=True),
             threading.Thread(target=pump, args=(proc.stderr, _keep(err_lines, False)), daemon=True)]
    for t in pumps:
        t.start()
    try:
        proc.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        _stop(proc)
        timed_out = True
    except BaseException:  # Ctrl-C (or a zygote that died under it): never leave a child running on the GPU
        _stop(proc)
        raise
    finally:
        for t in pumps:
            t.join(timeout=5)
    return _Run(proc.returncode, timed_out, out_lines, err_lines, launcher)


def _run_fresh(args: list, env: dict, timeout: float, echo: bool, out_lines: list, key: bytes) -> _Run:
    key_fd = channel.key_pipe(key)
    try:
        proc = subprocess.Popen([sys.executable, *HARNESS_COMMAND, *args, "--key-fd", str(key_fd)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env,
                                start_new_session=True, pass_fds=(key_fd,))
    finally:
        os.close(key_fd)
    return _watch(proc, timeout, echo, "fresh", out_lines)


def _run_warm(args: list, env: dict, timeout: float, echo: bool, warm: bool | None,
              key: bytes) -> tuple[_Run | None, str]:
    """The harness forked from the zygote: (the run, "") or, when it cannot be used, (None, why)."""
    if warm is False:
        return None, ""
    try:
        launcher = _warm_for(env, REPO_ROOT, start_if_missing=bool(warm))
    except (zygote.ZygoteError, OSError) as e:
        return None, str(e)
    if launcher is None:
        return None, ""
    if not launcher.lock.acquire(blocking=False):
        return None, "busy with another bench"
    key_fd = channel.key_pipe(key)
    try:
        child = launcher.launch(args, env, REPO_ROOT, key_fd, HARNESS_COMMAND)
        _counts["warm"] += 1
        return _watch(child, timeout, echo, "warm", []), ""
    except (zygote.ZygoteError, OSError, KeyError) as e:  # a misbehaving zygote costs one bench its warmth
        return None, f"{type(e).__name__}: {e}" if not isinstance(e, zygote.ZygoteError) else str(e)
    finally:
        os.close(key_fd)  # the zygote's child holds its own copy
        launcher.lock.release()


def _harness_args(kernel_path: str, device: str, out_json: str, quick: bool, dtype: str, seed: int | None,
                 timed: bool, reuse_baselines: bool, same_as: str | None = None) -> list:
    """The command line of `python -m autokernel.harness.harness` (and of a zygote's request). A GPU bench compiles
    ahead (autokernel/harness/precompile.py: workers make the stages' calls alongside them): a night's first bench of
    a kernel, and an experiment that changes a compile-time constant, meet a cold compile cache."""
    args = [kernel_path, "--device", device, "--out", out_json, "--dtype", dtype]
    args += ["--quick"] * quick + ["--no-timing"] * (not timed) + ["--reuse-baselines"] * reuse_baselines
    args += ["--compile-ahead"] * (device == "cuda")
    args += ["--same-as", same_as] if same_as else []
    return args + (["--seed", str(seed)] if seed is not None else [])


def run_bench(kernel_path, device: str | None = None, quick: bool = False, timeout: float | None = None,
              dtype: str = "fp16", seed: int | None = None, echo: bool = False, timed: bool = True,
              reuse_baselines: bool = False, warm: bool | None = None, same_as: str | None = None) -> dict:
    """Correctness stages and timing of kernel_path, isolated. Returns the result dict (see module doc).

    warm: None forks the child from the warm launcher if one is running (start_warm), True starts one
    if none is, False always starts a fresh process. same_as: a launch digest (autokernel/harness/launch_record.py);
    a kernel that launches exactly that passes untimed, with "unchanged": True."""
    device = gpu.pick_device(device)
    timeout = timeout or DEFAULT_TIMEOUT_S[device]
    kernel_path = str(Path(kernel_path).resolve())
    with tempfile.TemporaryDirectory(prefix="autokernel-") as tmp:
        out_json = os.path.join(tmp, "result.json")
        args = _harness_args(kernel_path, device, out_json, quick, dtype, seed, timed, reuse_baselines, same_as)
        start = time.perf_counter()
        key = channel.new_key()  # one per bench: only this child can sign this result
        run, why_not = _run_warm(args, _launch_env(device), timeout, echo, warm, key)
        if run is None:
            out_lines = []
            if why_not:  # a zygote was wanted: say once why this bench did not use it
                _counts["fresh"] += 1
                _note(out_lines, f"note: warm launcher not used ({why_not}); starting a fresh process", echo)
                if os.path.exists(out_json):
                    os.remove(out_json)  # from a child the zygote's death interrupted
            run = _run_fresh(args, _launch_env(device), timeout, echo, out_lines, key)
        result = _read_result(out_json, run.returncode, run.timed_out, timeout, run.err_lines, key)
    # The child names the GPU it ran on (the parent never initializes CUDA just for a label); a child
    # that died before saying so leaves the device kind.
    result.setdefault("gpu", gpu.device_name("cpu") if device == "cpu" else device)
    result.update(kernel_file=str(kernel_path), device=device, cpu_mode=device == "cpu", launcher=run.launcher,
                  wall_s=round(time.perf_counter() - start, 2),
                  log="".join(run.out_lines), stderr_tail="".join(run.err_lines[-ERROR_TAIL_LINES:]))
    return result


def _launch_env(device: str) -> dict:
    return {**child_env(device), "AUTOKERNEL_LAUNCHED_AT": repr(time.time())}


def _note(out_lines: list, line: str, echo: bool) -> None:
    out_lines.append(line + "\n")
    if echo:
        print(line, flush=True)


def _read_result(out_json, returncode, timed_out, timeout, err_lines, key: bytes) -> dict:
    base = {"correctness": "FAIL", "stages": [], "failed_stage": None}
    if timed_out:
        return {**base, "status": "timeout", "reason": f"no result within the {timeout:.0f} s time limit (a hang?)"}
    if os.path.exists(out_json) and returncode == 0:
        try:
            return channel.read(out_json, key)
        except channel.ForgedResult as e:
            return {**base, "status": "fail", "failed_stage": "guard",
                    "reason": f"forged result: {e}; the kernel's code wrote or changed it"}
    tail = "".join(err_lines[-ERROR_TAIL_LINES:]).strip() or "(no error output)"
    # the first line names the cause (a signal, an exception with its sizes), the verdict shows only that line
    return {**base, "status": "crash",
            "reason": f"the harness process died: {crash.death_cause(returncode, ''.join(err_lines))}\n{tail}"}


# ------------------------------------------------------------------------- the warm launcher, one per process
_warm: zygote.Zygote | None = None
_restarts = 0
_guard = threading.Lock()
_counts = {"warm": 0, "fresh": 0}  # benches since start_warm: forked warm, or run fresh instead of warm


def start_warm(device: str | None = None) -> bool:
    """Start the warm launcher for this device's harness children (the loop does, once per run). It
    imports in the background; benches fall back to fresh processes if it never gets ready.
    False where it cannot start (no fork on this platform, no such device)."""
    try:
        if not zygote.supported():
            return False
        _replace_warm(child_env(gpu.pick_device(device)), REPO_ROOT)
        return True
    except (zygote.ZygoteError, OSError, RuntimeError, ValueError):
        return False


def stop_warm() -> str:
    """Stop the warm launcher, if any. Returns what it did, for the log."""
    global _warm, _restarts
    with _guard:
        gone, _warm, _restarts = _warm, None, 0
    if gone is not None:
        gone.stop()
    summary = f"{_counts['warm']} bench(es) forked warm, {_counts['fresh']} run in a fresh process instead"
    _counts.update(warm=0, fresh=0)
    return summary


def warm_launcher() -> zygote.Zygote | None:
    """The zygote benches fork from now, if any."""
    return _warm


def _replace_warm(env: dict, cwd) -> zygote.Zygote:
    global _warm
    with _guard:
        if _warm is not None:
            _warm.stop()
        _warm = zygote.Zygote(env, cwd)
        return _warm


def _warm_for(env: dict, cwd, start_if_missing: bool) -> zygote.Zygote | None:
    """The zygote to fork this bench from, started or replaced as needed; None when none is wanted
    (none running, and start_if_missing is False). ZygoteError when one is wanted but unusable."""
    global _restarts
    launcher = _warm
    if launcher is None and not start_if_missing:
        return None
    if not zygote.supported():
        raise zygote.ZygoteError("this platform cannot fork")
    if launcher is None or not launcher.matches(env, cwd):
        launcher = _replace_warm(env, cwd)  # another environment: a zygote importing with it
    elif not launcher.alive():
        if _restarts >= MAX_WARM_RESTARTS:
            raise zygote.ZygoteError(f"it stopped ({launcher.dead or 'exited'}) and was restarted {_restarts} times")
        _restarts += 1
        _replace_warm(env, cwd)  # for the next bench; this one runs fresh
        raise zygote.ZygoteError(f"it stopped ({launcher.dead or 'exited'}); restarting it")
    try:
        launcher.ready()
    except zygote.StaleZygote:
        launcher = _replace_warm(env, cwd)  # the harness changed on disk: import it again
        launcher.ready()
    return launcher
