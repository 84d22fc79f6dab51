"""`orchestrate.py demo`: the README's first command, on the CPU, end to end; and what it refuses to overwrite."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import orchestrate
from autokernel import results
from autokernel.loop import demo
from autokernel.loop.gitlog import GitLog

ROOT = Path(__file__).resolve().parent.parent
DEMO_LIMIT_S = 400  # one CPU demo with a single experiment takes about a minute on 2 cores
IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def clone_of_this_tree(tmp_path) -> tuple[Path, dict]:
    """(repo, env): this repository's files as they are now (not its last commit) in a fresh git repository,
    and an environment with no git identity, as on a newcomer's machine."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".git", "workspace", "results.tsv", "progress.png",
                                                               "__pycache__", "*.egg-info", ".venv", ".*_cache"))
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", *cmd], cwd=repo, env={**env, **IDENTITY}, check=True)
    return repo, env


def run_demo(repo, env, *args):
    return subprocess.run([sys.executable, "orchestrate.py", "demo", "--device", "cpu", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=DEMO_LIMIT_S)


@pytest.mark.slow(61)
def test_the_demo_runs_the_pipeline_and_ends_with_the_speedup_and_where_the_kernels_are(tmp_path):
    repo, env = clone_of_this_tree(tmp_path)
    done = run_demo(repo, env, "--max-experiments", "1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    steps = [line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("[demo ")]
    assert [s.split()[1] for s in steps] == ["profile.py", "extract.py", "orchestrate.py"]  # the pipeline itself
    summary = done.stdout.split("\ndemo done in ", 1)[1].splitlines()[1:]
    verified = json.loads((repo / "workspace" / "verify.json").read_text())
    speedup = verified["timing"]["optimized"]["speedup_vs_eager"]
    assert summary[0].strip().startswith("the model, LlamaModel") and f"{speedup:.3g}x over eager" in summary[0]
    assert "measured by verify.py (CPU mode: Triton interpreter timings, not performance figures)" in summary[0]
    optimized = sorted(p.name for p in (repo / "workspace" / "kernels").glob("*_optimized.py"))
    assert optimized and summary[1].strip().startswith(f"kernels: workspace/kernels/ (the loop's best: {optimized[0]}")
    assert "branch autokernel/demo" in summary[2] and summary[-1].strip() == "back to your branch: git checkout main"
    rows = results.read_rows(repo / "results.tsv")
    assert [r["tag"] for r in rows] == ["demo"] and rows[0]["status"] == "baseline"
    assert GitLog(repo).branch_exists("autokernel/demo") and (repo / "progress.png").is_file()
    # again: the demo would write over this run, so it refuses, in one line, before anything runs
    again = run_demo(repo, env, "--max-experiments", "1")
    assert again.returncode == 2 and again.stdout == "" and len(again.stderr.splitlines()) == 1
    assert again.stderr.startswith("orchestrate.py: error: an earlier run's files are here (workspace/plan.json")
    assert len(results.read_rows(repo / "results.tsv")) == 1
    # moved aside, the next demo takes a fresh tag: the first one's branch and rows stay as they are
    (repo / "before-demo").mkdir()
    for name in ("workspace", "progress.png"):
        shutil.move(repo / name, repo / "before-demo" / name)
    assert demo.earlier_run(repo) == [] and demo.fresh_tag(repo, None) == "demo-2"


@pytest.fixture
def repo(tmp_path, monkeypatch):
    for key, value in IDENTITY.items():
        monkeypatch.setenv(key, value)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".gitignore").write_text((ROOT / ".gitignore").read_text())
    (repo / "kernel.py").write_text("# the kernel under optimization\n")
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    return repo


@pytest.mark.parametrize("earlier", ["workspace/plan.json", "workspace/kernels/01_rmsnorm.py", "progress.png"])
def test_the_demo_refuses_to_write_over_an_earlier_run(repo, capsys, earlier):
    (repo / earlier).parent.mkdir(parents=True, exist_ok=True)
    (repo / earlier).write_text("{}")
    assert orchestrate.main(["--repo", str(repo), "demo", "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    shown = earlier if earlier.count("/") < 2 else "workspace/kernels"
    assert out == "" and err.startswith(f"orchestrate.py: error: an earlier run's files are here ({shown})")
    assert "move them aside first" in err and len(err.splitlines()) == 1
    assert not (repo / "results.tsv").exists() and not GitLog(repo).branch_exists("autokernel/demo")


def test_the_demo_takes_a_fresh_tag_and_refuses_a_taken_one(repo, capsys):
    assert demo.fresh_tag(repo, None) == "demo"
    for tag in ("demo", "demo-2"):
        subprocess.run(["git", "branch", f"autokernel/{tag}"], cwd=repo, check=True)
    assert demo.fresh_tag(repo, None) == "demo-3" and demo.fresh_tag(repo, "mine") == "mine"
    assert orchestrate.main(["--repo", str(repo), "demo", "--device", "cpu", "--tag", "demo-2"]) == 2
    assert "tag demo-2 is taken" in capsys.readouterr().err


def test_ctrl_c_in_a_step_says_what_finishes_the_pipeline(repo, capsys, monkeypatch):
    ran = []

    def step(step, root, number, total):  # the profile and extract steps run; Ctrl-C comes in the loop's
        ran.append(step.argv[0])
        if step.argv[0] == "orchestrate.py":
            raise KeyboardInterrupt
        return 0
    monkeypatch.setattr(demo, "run_step", step)
    assert orchestrate.main(["--repo", str(repo), "demo", "--device", "cpu"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert ran == ["profile.py", "extract.py", "orchestrate.py"] and len(err) == 1
    assert err[0].startswith("demo interrupted at loop, verify and report; what is done stays. To finish from here: "
                             "python orchestrate.py run --tag demo --device cpu")
    assert err[0].endswith("--verify")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_the_demo_on_cuda_without_a_gpu_is_one_line_before_anything_runs(repo, capsys):
    assert orchestrate.main(["--repo", str(repo), "demo", "--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "orchestrate.py: error: --device cuda was asked for, but no CUDA GPU is visible " \
                                "to PyTorch\n"
    assert not (repo / "workspace").exists()
