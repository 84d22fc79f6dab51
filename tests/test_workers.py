"""orchestrate.py run --gpus: one worker per GPU, on the CPU through Triton's interpreter.

On a CPU-only machine `--gpus 0,1` starts two workers whose ids are only labels. Each test copies the
project into a temporary git repository (as tests/test_orchestrate_harness.py does) and runs the
real harness: two workers on three kernels (rows in one results.tsv tagged by worker, one branch
per kernel, the worker done first takes the third kernel); then a kill -9 of one worker, which the
driver starts again, and a kill -9 of everything, which a restart resumes. About a minute or two.
"""

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from helpers import PROJECT, copy_project, descendants, harness_children, wait_for

from autokernel import results
from autokernel.loop.gitlog import GitLog
from autokernel.loop.state import LoopError, lock_holder
from autokernel.loop.workers import branch_name, device_for, parse_gpus, worker_rates, worktree_path

KERNELS = ["kernels/rmsnorm.py", "kernels/softmax.py"]
THIRD = "kernels/rmsnorm_2.py"  # a third kernel: the worker done first takes it
RUN_LIMIT_S = 240  # one orchestrate.py run of two workers in these tests


@pytest.fixture
def project(tmp_path):
    return copy_project(tmp_path, PROJECT + KERNELS, extra={THIRD: "kernels/rmsnorm.py"})


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


@pytest.mark.slow(47)
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
    assert any(line.startswith("all: 6 experiments") for line in lines)  # and the rate per worker below it
    report = orchestrate(repo, env, command="report")
    assert report.returncode == 0 and all(n in report.stdout for n in names)


def _a_bench(repo, proc, names, printed) -> str:
    """The first kernel of `names` whose loop (holding its lock) is benching its first experiment."""

    def benching():
        for name in names:
            tree = worktree_path(repo, "t", name)
            try:
                inflight = json.loads((tree / "workspace/loop_state.json").read_text()).get("inflight") or {}
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            if inflight.get("experiment") == 1 and inflight.get("phase") == "bench" and lock_holder(tree):
                return name
        return None

    try:
        return wait_for(benching, 200, "a first experiment to reach the bench", alive=proc)
    except AssertionError:
        out = printed.text() if proc.poll() is not None else "".join(printed.lines)  # all of it once it ended
        raise AssertionError(f"no first experiment reached the bench: {out!r}") from None


def _kill_tree(pid: int) -> list[int]:
    """SIGKILL to pid and its descendants, all stopped first, as a host that dies stops them at once: killed one
    after the other, a worker can see its driver die first and stop the way SIGTERM asks (PR_SET_PDEATHSIG), with
    an "interrupted" row (CI, loaded, saw that row once)."""
    victims = [pid] + descendants(pid)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in victims:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
    return victims


class _Printed:
    """What a background process prints, read as it comes: a barrier can wait for a line."""

    def __init__(self, proc):
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
        self._reader.start()

    def has(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def text(self) -> str:
        self._reader.join(timeout=10)
        return "".join(self.lines)


@pytest.mark.slow(31)
def test_kill_9_of_a_worker_then_of_everything(project):
    repo, env = project
    proc = orchestrate(repo, env, *[a for k in KERNELS for a in ("--kernel", k)], "--max-experiments", "1",
                       background=True)
    printed = _Printed(proc)
    try:
        name = _a_bench(repo, proc, ("rmsnorm", "softmax"), printed)
        worker = int(lock_holder(worktree_path(repo, "t", name)))
        wait_for(lambda: harness_children(worker), 60, f"the harness child of the worker on {name}", alive=proc)
        assert len(_kill_tree(worker)) >= 2  # the worker's loop and its harness child; the driver lives
        restarted = f"the worker on {name} died (signal 9); starting it again"
        wait_for(lambda: printed.has(restarted), 60, "the driver to start the worker again", alive=proc)
    finally:
        # Then the host dies (the driver, the workers, the harnesses) as soon as the driver said so: seconds
        # before the new worker, a fresh Python, can have finished the experiment it resumes.
        victims = _kill_tree(proc.pid)
        proc.wait()
        out = printed.text()
    assert len(victims) >= 2 and restarted in out, out
    tree = GitLog(worktree_path(repo, "t", name))
    # The kill may land before or after the in-flight commit is made; either way the commit left behind
    # must not survive the restart on the kernel's branch.
    left_behind = tree.head()

    done = orchestrate(repo, env, "--max-experiments", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    # Killed before the bench finished, the experiment is done again; killed between its outcome and its row,
    # the row is written from the saved outcome. Either way the restart says which.
    resumes = [line for line in done.stdout.splitlines() if f" {name}] resume: " in line]
    assert any("experiment 1 was interrupted" in line or "recorded experiment 1 that a kill interrupted" in line
               for line in resumes), done.stdout
    rows = check_results_file(repo)
    for kernel in ("rmsnorm", "softmax"):
        mine = check_kernel_branch(repo, kernel, rows)
        assert [r["status"] for r in mine] == ["baseline"] and mine[0]["correctness"] == "PASS"
    if not tree.is_ancestor(left_behind, "main"):  # a commit the loop made, not the project's own
        assert not tree.is_ancestor(left_behind, branch_name("t", name))


def test_gpu_ids():
    assert parse_gpus("0, 1,3") == ["0", "1", "3"]
    assert parse_gpus("all", {"CUDA_VISIBLE_DEVICES": "4,5"}) == ["0", "1"]
    with pytest.raises(LoopError):
        parse_gpus("0,0")
    assert device_for("1", {"CUDA_VISIBLE_DEVICES": "4,5"}) == "5"  # id 1 of what the driver sees
    assert device_for("1", {}) == "1"



def test_experiments_per_hour_per_worker():
    rows = [{"worker": w, "timestamp": f"2026-01-01T00:{m:02d}:00+00:00"}
            for w, m in (("gpu0", 0), ("gpu1", 1), ("gpu0", 30), ("gpu1", 31), ("gpu0", 60 - 1))]
    rates = worker_rates(rows)
    assert rates["gpu1"] == (2, 2.0)  # one interval of 30 min
    assert rates["gpu0"][0] == 3 and abs(rates["gpu0"][1] - 2 * 60 / 59) < 1e-9
    assert rates["all"][0] == 5 and abs(rates["all"][1] - 4 * 60 / 59) < 1e-9
    assert worker_rates(rows[:1])["gpu0"] == (1, None)  # no interval yet: no rate
