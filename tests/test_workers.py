"""orchestrate.py run --gpus: one worker per GPU, on the CPU through Triton's interpreter.

On a CPU-only machine `--gpus 0,1` starts two workers whose ids are only labels. Each test copies the
project into a temporary git repository (as tests/test_orchestrate_harness.py does) and runs two
workers on two kernels with the real harness: their rows share one results.tsv, tagged by worker,
and each kernel ends on its own branch; then a kill -9 of everything mid-experiment and a restart.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from test_orchestrate_harness import IDENTITY, PROJECT, ROOT, _descendants

from autokernel import results
from autokernel.gitlog import GitLog
from autokernel.loop.state import LoopError
from autokernel.workers import branch_name, device_for, parse_gpus, worktree_path

KERNELS = ["kernels/rmsnorm.py", "kernels/softmax.py"]
THIRD = "kernels/rmsnorm_2.py"  # a third kernel: the worker done first takes it
RUN_LIMIT_S = 240  # one orchestrate.py run of two workers in these tests


@pytest.fixture
def project(tmp_path):
    repo = tmp_path / "repo"
    for name in dict.fromkeys(PROJECT + KERNELS):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, repo / name)
    shutil.copy(ROOT / "kernels/rmsnorm.py", repo / THIRD)
    shutil.copytree(ROOT / "autokernel", repo / "autokernel", ignore=shutil.ignore_patterns("__pycache__"))
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}
    env.pop("TRITON_INTERPRET", None)
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", *cmd], cwd=repo, env={**env, **IDENTITY}, check=True)
    return repo, env


def orchestrate(repo, env, *args, command="run", background=False):
    cmd = [sys.executable, "orchestrate.py", command, "--tag", "t", *args]
    if command == "run":
        cmd[3:3] = ["--device", "cpu", "--quick", "--gpus", "0,1"]
    if background:
        return subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S)


def check_kernel_branch(repo, name: str, rows: list[dict]) -> list[dict]:
    """One kernel's rows are its branch: kept ones are the commits after init, the others are off it."""
    mine = [r for r in rows if r["tag"] == f"t/{name}"]
    assert [r["experiment"] for r in mine] == [str(i) for i in range(1, len(mine) + 1)]
    git = GitLog(repo)
    branch = branch_name("t", name)
    kept = [r["commit"] for r in mine if r["status"] in ("baseline", "keep")]
    assert [sha for sha, _ in git.log(f"main..{branch}")] == kept[::-1]
    assert all(not git.is_ancestor(r["commit"], branch) for r in mine if r["status"] not in ("baseline", "keep")
               and r["commit"])
    tree = GitLog(worktree_path(repo, "t", name))
    assert tree.changes() == {} and tree.branch() == branch
    return mine


def check_results_file(repo) -> list[dict]:
    rows = results.read_rows(repo / "results.tsv")
    lines = (repo / "results.tsv").read_text().splitlines()
    assert lines[0].split("\t") == results.COLUMNS and len(lines) == len(rows) + 1  # whole rows only
    return rows


@pytest.mark.slow
def test_two_workers_three_kernels(project):
    repo, env = project
    done = orchestrate(repo, env, *[a for k in KERNELS + [THIRD] for a in ("--kernel", k)], "--max-experiments", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = check_results_file(repo)
    names = ("rmsnorm", "softmax", "rmsnorm_2")
    by_kernel = {name: check_kernel_branch(repo, name, rows) for name in names}
    for name, mine in by_kernel.items():
        assert len(mine) == 2 and mine[0]["status"] == "baseline" and mine[0]["correctness"] == "PASS"
        assert mine[0]["kernel_file"] == f"kernels/{name}.py"
        assert len({r["worker"] for r in mine}) == 1  # a kernel stays with the worker that took it
        assert "KERNEL_TYPE" in (repo / f"workspace/kernels/{name}_optimized.py").read_text()
    first = {by_kernel[n][0]["worker"]: n for n in ("rmsnorm", "softmax")}
    assert sorted(first) == ["gpu0", "gpu1"]  # the two first kernels in parallel, one per worker
    third = by_kernel["rmsnorm_2"]
    before = by_kernel[first[third[0]["worker"]]]  # its worker finished its first kernel, then took it
    assert rows.index(before[-1]) < rows.index(third[0])
    main = GitLog(repo)
    assert main.branch() == "main" and main.changes() == {}  # the main work tree is never touched
    assert all(f"autokernel/t/{n}:" in done.stdout for n in names)

    status = orchestrate(repo, env, command="status")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    for name in names:
        assert any(line.startswith(f"{name} ") and " gpu" in line and "2 exp" in line for line in lines)
    report = orchestrate(repo, env, command="report")
    assert report.returncode == 0 and all(n in report.stdout for n in names)


def _wait_for_a_bench(repo, proc, experiment: int, limit_s: float = 200) -> tuple[str, dict]:
    deadline = time.time() + limit_s
    while time.time() < deadline and proc.poll() is None:
        for name in ("rmsnorm", "softmax"):
            state_file = worktree_path(repo, "t", name) / "workspace" / "loop_state.json"
            try:
                inflight = json.loads(state_file.read_text()).get("inflight") or {}
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            if inflight.get("experiment") == experiment and inflight.get("phase") == "bench":
                return name, inflight
        time.sleep(0.2)
    raise AssertionError(f"no experiment {experiment} reached the bench: {proc.communicate()[0]!r}")


@pytest.mark.slow
def test_kill_9_mid_run_then_restart_resumes(project):
    repo, env = project
    proc = orchestrate(repo, env, *[a for k in KERNELS for a in ("--kernel", k)], "--max-experiments", "3",
                       "--seed", "1", background=True)
    try:
        name, inflight = _wait_for_a_bench(repo, proc, experiment=2)
        time.sleep(2.0)  # well into the harness run
        victims = [proc.pid] + _descendants(proc.pid)
    finally:
        for pid in [proc.pid] + _descendants(proc.pid):  # the host dies: the workers and harnesses too
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    assert len(victims) >= 4  # the driver, two workers, a harness child
    assert GitLog(worktree_path(repo, "t", name)).head() == inflight["candidate"]  # left unrecorded

    done = orchestrate(repo, env, "--max-experiments", "1", "--seed", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "experiment 2 was interrupted" in done.stdout
    rows = check_results_file(repo)
    mine = check_kernel_branch(repo, name, rows)
    assert mine[1]["description"].startswith(inflight["proposal"]["description"])  # the same move, redone
    assert not GitLog(repo).is_ancestor(inflight["candidate"], branch_name("t", name))
    check_kernel_branch(repo, "softmax" if name == "rmsnorm" else "rmsnorm", rows)


def test_gpu_ids():
    assert parse_gpus("0, 1,3") == ["0", "1", "3"]
    assert parse_gpus("all", {"CUDA_VISIBLE_DEVICES": "4,5"}) == ["0", "1"]
    with pytest.raises(LoopError):
        parse_gpus("0,0")
    assert device_for("1", {"CUDA_VISIBLE_DEVICES": "4,5"}) == "5"  # id 1 of what the driver sees
    assert device_for("1", {}) == "1"

