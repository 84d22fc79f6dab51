"""The warm launcher (autokernel.harness.zygote) behind run_bench, on the CPU through Triton's interpreter.

A bench forked from the zygote must be the bench a fresh `python -m autokernel.harness.harness` gives: the same
result, a hang killed at the time limit, a crash reported as one, nothing of one experiment seen by the
next, and when the zygote is gone or started with another environment, still a correct bench. That the loop
benches through it: tests/test_orchestrate_harness.py.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import copy_project, started_in

from autokernel.harness import runner

ROOT = Path(__file__).resolve().parent.parent
RMSNORM = ROOT / "kernels" / "rmsnorm.py"
# A kernel file of a type no registry knows: the harness imports it (running what it does at import),
# then stops with "unknown kernel type". Enough for what happens at import, in a fraction of a second.
PROBE = '''
KERNEL_TYPE = "zygote_probe"
import os, sys, time, subprocess, ctypes
import torch

{body}

def kernel_fn(x):
    return x
'''
LEAK_CHECK = '''
if getattr(torch, "_autokernel_probe", False):
    raise RuntimeError("torch._autokernel_probe is set: state leaked from an earlier experiment")
torch._autokernel_probe = True
print("probe: clean torch module", flush=True)
'''

# The probes do at import what the static check refuses (subprocesses, ctypes, patching torch): the launcher
# must survive such code wherever it comes from, so these benches run with the check off.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("unguarded")]


def probe(tmp_path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(PROBE.format(body=body))
    return path


@pytest.fixture
def warm(warm_launcher):
    """A running zygote for CPU benches: the test run's own (tests/conftest.py), started again for the next
    test if this one kills or replaces it."""
    return warm_launcher


@pytest.fixture
def no_warm_launcher():
    """No zygote running, as in a process that never started one (bench.py)."""
    runner.stop_warm()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.slow(10)
def test_a_correct_kernel_passes_warm_as_it_does_fresh(warm):
    fresh = runner.run_bench(RMSNORM, device="cpu", quick=True, seed=7, warm=False)
    forked = runner.run_bench(RMSNORM, device="cpu", quick=True, seed=7)
    assert (fresh["launcher"], forked["launcher"]) == ("fresh", "warm")
    for r in (fresh, forked):
        assert r["status"] == "pass" and r["correctness"] == "PASS", r["log"] + r["stderr_tail"]
        assert r["latency_us"] > 0 and r["eager_us"] > 0
    assert [(s["name"], s["passed"], s["checks"]) for s in forked["stages"]] == \
        [(s["name"], s["passed"], s["checks"]) for s in fresh["stages"]]
    assert set(forked) == set(fresh) and forked["gpu"] == fresh["gpu"] == "cpu (Triton interpreter)"
    assert "note: warm launcher" not in forked["log"]
    # torch, triton and the harness were imported before the request: the child starts at once
    assert started_in(forked["log"]) < 1.0 < started_in(fresh["log"])


def test_a_hang_times_out_and_the_zygote_serves_the_next_bench(warm, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    hang = probe(tmp_path, "hang", f'''
sleeper = subprocess.Popen(["sleep", "600"])
open({str(pid_file)!r}, "w").write(str(sleeper.pid))
print("probe: hanging", flush=True)
time.sleep(600)''')
    start = time.perf_counter()
    result = runner.run_bench(hang, device="cpu", timeout=3)
    assert result["status"] == "timeout" and result["launcher"] == "warm"
    assert "3 s time limit" in result["reason"] and "probe: hanging" in result["log"]
    assert time.perf_counter() - start < 15
    grandchild = int(pid_file.read_text())
    deadline = time.time() + 5
    while _running(grandchild) and time.time() < deadline:
        time.sleep(0.1)
    assert not _running(grandchild), "the child's process group outlived the time limit"
    after = runner.run_bench(probe(tmp_path, "clean", LEAK_CHECK), device="cpu")
    assert after["launcher"] == "warm" and "unknown kernel type 'zygote_probe'" in after["reason"]
    assert warm.alive() and runner.warm_launcher() is warm


@pytest.mark.parametrize("how, says", [("ctypes.string_at(0)", "died: killed by SIGSEGV (a segfault"),
                                       ("os._exit(3)", "died: exit code 3")])
def test_a_crash_is_a_crash_and_the_zygote_survives(warm, tmp_path, how, says):
    result = runner.run_bench(probe(tmp_path, "crash", f'print("probe: about to die", flush=True)\n{how}'),
                              device="cpu", timeout=60)
    assert result["status"] == "crash" and result["launcher"] == "warm"
    assert says in result["reason"] and "probe: about to die" in result["log"]
    after = runner.run_bench(probe(tmp_path, "clean", LEAK_CHECK), device="cpu")
    assert after["launcher"] == "warm" and warm.alive()


def test_experiments_do_not_share_module_state(warm, tmp_path):
    kernel = probe(tmp_path, "leak", LEAK_CHECK)
    for _ in range(2):  # the second import would raise if the first one's torch attribute survived
        result = runner.run_bench(kernel, device="cpu")
        assert result["launcher"] == "warm"
        assert "probe: clean torch module" in result["log"], result["reason"]
        assert "unknown kernel type 'zygote_probe'" in result["reason"]


def test_a_dead_zygote_falls_back_to_a_fresh_process(warm, tmp_path):
    kernel = probe(tmp_path, "clean", LEAK_CHECK)
    assert runner.run_bench(kernel, device="cpu")["launcher"] == "warm"
    os.kill(warm.proc.pid, signal.SIGKILL)
    warm.proc.wait()
    result = runner.run_bench(kernel, device="cpu")
    assert result["launcher"] == "fresh" and "unknown kernel type 'zygote_probe'" in result["reason"]
    notes = [line for line in result["log"].splitlines() if "warm launcher" in line]
    assert len(notes) == 1 and "fresh process" in notes[0], result["log"]
    # the next bench goes warm again, through a zygote started in its place
    assert runner.run_bench(kernel, device="cpu")["launcher"] == "warm"
    assert runner.warm_launcher() is not warm and runner.warm_launcher().alive()


def test_a_zygote_of_another_environment_is_not_used(warm, tmp_path, monkeypatch):
    """PYTHONHASHSEED is read when the interpreter starts: a child forked from a zygote started
    without it would hash with the zygote's random key."""
    kernel = probe(tmp_path, "hash", 'print("probe: hash", hash("autokernel"), flush=True)')
    monkeypatch.setenv("PYTHONHASHSEED", "123")
    want = subprocess.run([sys.executable, "-c", 'print(hash("autokernel"))'], capture_output=True, text=True,
                          env=os.environ).stdout.strip()
    result = runner.run_bench(kernel, device="cpu")
    assert result["launcher"] == "warm" and f"probe: hash {want}" in result["log"]
    assert runner.warm_launcher() is not warm and not warm.alive()


@pytest.mark.slow(13)
def test_changed_harness_code_is_not_run_stale(tmp_path, no_warm_launcher):
    """The zygote imported the harness: once a file it imported changes on disk, a new zygote runs the
    new code (in a copy of the project, whose harness this test edits)."""
    repo, _ = copy_project(tmp_path)
    env = {**runner.child_env("cpu"), "PYTHONPATH": str(repo)}
    kernel = probe(tmp_path, "clean", LEAK_CHECK)

    def bench() -> tuple:
        launcher = runner._warm_for(env, repo, start_if_missing=True)
        child = launcher.launch([str(kernel), "--device", "cpu", "--out", str(tmp_path / "r.json")], env, repo,
                                command=runner.HARNESS_COMMAND)
        out = child.stdout.read()
        child.stderr.read()
        assert child.wait(60) == 0
        return launcher, out

    try:
        first, out = bench()
        assert "probe: clean torch module" in out and "edited" not in out
        harness = repo / "autokernel" / "harness" / "harness.py"
        marker = '    result = {"status": "crash"'
        harness.write_text(harness.read_text().replace(marker, '    print("harness: edited")\n' + marker, 1))
        second, out = bench()
        assert "harness: edited" in out and second is not first and not first.alive()
    finally:
        runner.stop_warm()


def test_bench_py_alone_runs_fresh(tmp_path, no_warm_launcher):
    """bench.py benches once: no zygote is started for it."""
    assert runner.warm_launcher() is None
    result = runner.run_bench(probe(tmp_path, "clean", LEAK_CHECK), device="cpu")
    assert result["launcher"] == "fresh" and "warm launcher" not in result["log"]
    assert runner.warm_launcher() is None


@pytest.mark.gpu
def test_a_warm_bench_on_the_gpu_is_the_fresh_one():
    """The zygote never initializes CUDA, so its forked children can: same stages, same checks."""
    assert runner.start_warm("cuda")
    try:
        fresh = runner.run_bench(RMSNORM, device="cuda", quick=True, seed=3, timed=False, warm=False)
        forked = runner.run_bench(RMSNORM, device="cuda", quick=True, seed=3, timed=False)
    finally:
        runner.stop_warm()
    assert forked["launcher"] == "warm" and fresh["status"] == forked["status"] == "pass", forked["log"]
    assert [(s["name"], s["checks"]) for s in forked["stages"]] == [(s["name"], s["checks"]) for s in fresh["stages"]]
    assert forked["gpu"] == fresh["gpu"] != "cuda"  # the child named the GPU it ran on
