"""orchestrate.py run --ray: each kernel as a task on a real local Ray instance, on the CPU.

One Ray instance (2 CPUs) serves the module. The driver runs in this process against a copy of the
project (as tests/test_workers.py sets it up) with the builtin agent and the real harness through
Triton's interpreter: two kernels as two tasks, the worker process of one killed while it benches
(the driver submits it again and it goes on from its last kept experiment), then a second run of the
same tag after a driver killed between its record and results.tsv. About a minute. Without Ray
installed only the error test runs (CI installs the `ray` extra).
"""

import ast
import re
import subprocess
import sys

import pytest
from helpers import PROJECT, copy_project

import orchestrate
from autokernel import results
from autokernel.loop import LoopConfig, raycluster
from autokernel.loop.agents.builtin import describe_move
from autokernel.loop.gitlog import GitLog

KERNELS = ["kernels/rmsnorm.py", "kernels/softmax.py"]
KILLED = "rmsnorm"  # its first task's worker process dies while experiment KILL_AFTER + 1 is benching
KILL_AFTER = 1
RUN_LIMIT_S = 300  # one orchestrate.py run


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray")
    # "local": always a fresh instance of this process, never a cluster that another test process (a
    # pytest-xdist worker, another checkout's run) started on this machine and may stop under it
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def project(tmp_path):
    return copy_project(tmp_path, PROJECT + KERNELS)


class Lines:
    """A ui for the driver that keeps what it prints."""

    def __init__(self):
        self.lines = []

    def print(self, text):
        self.lines.append(text)


def drive(repo, max_experiments: int, tag: str = "t", device: str | None = "cpu", **hooks) -> tuple[str, Lines]:
    ui = Lines()
    # no kernel may finish early: CPU timings swing enough for a 2x "win"
    config = LoopConfig(tag=tag, device=device, quick=True, max_experiments=max_experiments, target_speedup=100)
    why = raycluster.RayDriver(repo, config, {"name": "builtin", "options": {}}, ui=ui, **hooks).run(None, KERNELS)
    return why, ui


def tunables(source: str) -> dict:
    tree = ast.parse(source)
    return {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
            and isinstance(n.targets[0], ast.Name) and n.targets[0].id.isupper() and
            isinstance(n.value, ast.Constant)}


def check_kernel(repo, name: str, rows: list[dict], tag: str = "t") -> list[dict]:
    """The kernel's rows number 1..n with one baseline; each experiment is the builtin agent's one
    move from the last kept version before it, which is its commit's parent; the kept ones are the
    branch; no move is tried twice (the agent's memory went along with the task)."""
    git = GitLog(repo)
    mine = [r for r in rows if r["tag"] == f"{tag}/{name}"]
    assert [r["experiment"] for r in mine] == [str(i) for i in range(1, len(mine) + 1)]
    assert [r["status"] for r in mine].count("baseline") == 1 and mine[0]["status"] == "baseline"
    assert all(r["kernel_file"] == f"kernels/{name}.py" and r["worker"].startswith("ray:") for r in mine)
    kept, moves = git.head(), []
    for row in mine:
        commit = git.repo.commit(row["commit"])
        assert [p.hexsha for p in commit.parents] == [kept]
        if row["status"] != "baseline":
            move = describe_move(tunables(git.file_at(kept, "kernel.py")), tunables(git.file_at(row["commit"],
                                                                                                "kernel.py")))
            assert move and row["description"].startswith(move), (move, row["description"])
            moves.append(move)
        if row["status"] in ("baseline", "keep"):
            kept = row["commit"]
    assert len(set(moves)) == len(moves)
    assert git.branch_head(f"autokernel/{tag}/{name}") == kept
    assert (repo / f"workspace/kernels/{name}_optimized.py").read_text() == git.file_at(kept, "kernel.py") + "\n"
    return mine


def whole_rows(repo) -> list[dict]:
    rows = results.read_rows(repo / "results.tsv")
    lines = (repo / "results.tsv").read_text().splitlines()
    assert lines[0].split("\t") == results.COLUMNS and len(lines) == len(rows) + 1
    return rows


@pytest.mark.slow(60)
def test_two_kernels_as_tasks_a_lost_worker_and_a_second_run(ray_instance, project):
    repo, _ = project
    why, ui = drive(repo, 2, kill_after={KILLED: KILL_AFTER})
    assert why.startswith("0 of 2 kernels done")  # each stopped at its 2 experiments
    rows = whole_rows(repo)
    for name in ("rmsnorm", "softmax"):
        assert len(check_kernel(repo, name, rows)) == 2
    record = raycluster.read_record(repo, "t")
    assert record["kernels"][KILLED]["attempts"] == 2 and record["kernels"]["softmax"]["attempts"] == 1
    lost = [line for line in ui.lines if f"{KILLED}: its task was lost (WorkerCrashedError" in line]
    assert len(lost) == 1 and lost[0].endswith(f"from experiment {KILL_AFTER + 1}")
    assert any(f"resumed autokernel/t/{KILLED} at experiment {KILL_AFTER + 1}" in line for line in ui.lines)
    main = GitLog(repo)
    assert main.branch() == "main" and main.changes() == {}  # the user's work tree is never touched

    # The driver killed after recording softmax's last experiment as pending, before its row, branch and
    # optimized file: a second run writes them once, then each kernel goes one experiment on.
    last = [r for r in rows if r["tag"] == "t/softmax"][-1]
    record["pending"]["softmax"] = {"rows": [last], "entry": record["kernels"]["softmax"]}
    raycluster.write_record(raycluster.record_path(repo, "t"), record)
    kept_lines = [line for line in (repo / "results.tsv").read_text().splitlines()
                  if not line.startswith(f"{last['experiment']}\t") or "\tt/softmax\t" not in line]
    (repo / "results.tsv").write_text("\n".join(kept_lines) + "\n")
    main.repo.git.update_ref("refs/heads/autokernel/t/softmax", main.head())
    (repo / "workspace/kernels/softmax_optimized.py").unlink()
    why, ui = drive(repo, 1)
    rows = whole_rows(repo)
    for name in ("rmsnorm", "softmax"):
        mine = check_kernel(repo, name, rows)
        assert len(mine) == 3 and mine[-1]["status"] != "baseline"
    assert raycluster.read_record(repo, "t")["pending"] == {}


def test_without_ray_or_with_gpus_a_clear_error(project, monkeypatch, capsys):
    repo, _ = project
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    args = ["--repo", str(repo), "run", "--tag", "t", "--kernel", "kernels/rmsnorm.py", "--ray", "local"]
    assert orchestrate.main(args) == 2
    assert "pip install 'autokernel[ray]'" in capsys.readouterr().err
    assert raycluster.read_record(repo, "t") is None  # nothing was started
    assert orchestrate.main(args + ["--gpus", "0,1"]) == 2
    assert "--ray and --gpus: choose one" in capsys.readouterr().err


@pytest.mark.slow(20)
def test_orchestrate_run_ray_local(project):
    """The command line as a user types it: its own local Ray instance, one kernel, the report."""
    pytest.importorskip("ray")
    repo, env = project
    cmd = [sys.executable, "orchestrate.py", "run", "--ray", "local", "--device", "cpu", "--quick", "--tag", "c",
           "--max-experiments", "1", "--kernel", "kernels/softmax.py"]
    done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = whole_rows(repo)
    assert row["tag"] == "c/softmax" and row["status"] == "baseline" and row["worker"].startswith("ray:")
    assert GitLog(repo).branch_head("autokernel/c/softmax") == row["commit"]
    assert "Ray tasks stopped: 0 of 1 kernels done" in done.stdout and "AutoKernel report: tag c" in done.stdout


def test_an_unreachable_cluster_a_clear_error(project, capsys):
    pytest.importorskip("ray")
    repo, _ = project
    args = ["--repo", str(repo), "run", "--tag", "t", "--kernel", "kernels/rmsnorm.py", "--ray", "127.0.0.1:1"]
    assert orchestrate.main(args) == 2  # at once: Ray itself would retry for minutes
    assert "cannot reach the Ray cluster at '127.0.0.1:1'" in capsys.readouterr().err
    assert raycluster.read_record(repo, "t") is None


def test_the_task_travels_without_autokernel(tmp_path):
    """What a node unpickles needs no AutoKernel: a Python that cannot import it loads the task."""
    ray = pytest.importorskip("ray")  # its pickler only: no instance is started
    raycluster.ship_by_value(ray)
    payload = tmp_path / "task.pkl"
    payload.write_bytes(ray.cloudpickle.dumps(raycluster.kernel_task))
    code = f"""
import sys
class NoAutoKernel:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "autokernel":
            raise ImportError("not on this node: " + name)
sys.meta_path.insert(0, NoAutoKernel())
import ray.cloudpickle
task = ray.cloudpickle.loads(open({str(payload)!r}, "rb").read())
assert task.__name__ == "kernel_task" and "autokernel" not in sys.modules
"""
    done = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.gpu
@pytest.mark.slow
def test_on_a_gpu_cluster_each_task_gets_a_gpu(ray_instance, project):
    """On the GPU machine: the tasks ask for one GPU each and bench on it (real timings, the GPU's name)."""
    repo, _ = project
    gpus = int(ray_instance.cluster_resources().get("GPU", 0))
    assert gpus, "Ray sees no GPU on a machine where torch does"
    why, ui = drive(repo, 2, tag="g", device=None)
    assert any(f"Ray cluster: {gpus} GPU(s)" in line for line in ui.lines), ui.lines
    rows = whole_rows(repo)
    for name in ("rmsnorm", "softmax"):
        mine = check_kernel(repo, name, rows, tag="g")
        assert len(mine) == 2 and mine[0]["correctness"] == "PASS" and float(mine[0]["latency_us"]) > 0
        assert re.fullmatch(r"ray:[0-9.]+/gpu\d+", mine[0]["worker"]), mine[0]["worker"]
        assert "interpreter" not in mine[0]["device"] and mine[0]["device"], mine[0]["device"]
