"""KernelBench mode: problems, starters, the harness on ModelNew files, the loop on a problem, fast_p.

The problems are our own tiny ones in KernelBench's exact format (tests/fixtures/kernelbench/level1,
level2), with Triton solutions beside them (solutions/); everything runs on the CPU through Triton's
interpreter. The harness runs in-process for the guard checks (fast) and in child processes for the
command line, the loop and the scorer, as a user runs them.
"""

import ast
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import IDENTITY, PROJECT, copy_project

from autokernel import kernelfile, results
from autokernel.cuda import cuda_build
from autokernel.harness import harness, sourcecheck
from autokernel.harness.checking import CheckFailed
from kernelbench import problems, skeleton, spec
from kernelbench.score import fast_p

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "kernelbench"
SOLUTIONS = FIXTURES / "solutions"
LINEAR = "kb/level2/1_Linear_ReLU"
RUN_LIMIT_S = 300


@pytest.fixture
def fixtures_root(monkeypatch):
    """The harness resolves kb/ types from the fixtures (as from a KernelBench checkout)."""
    monkeypatch.setenv(problems.ENV_ROOT, str(FIXTURES))
    monkeypatch.delenv(spec.ENV_WORKSPACE, raising=False)
    return FIXTURES


def candidate(tmp_path, solution: str, kernel_type: str, edit=None) -> Path:
    """A solution from the fixtures, declaring its type, with an optional (old, new) edit planted."""
    text = (SOLUTIONS / solution).read_text()
    if edit:
        assert edit[0] in text, f"the solution no longer contains {edit[0]!r}"
        text = text.replace(*edit)
    path = tmp_path / f"candidate_{abs(hash((solution, edit)))}.py"
    path.write_text(text + f'\nKERNEL_TYPE = "{kernel_type}"\n')
    return path


# ---------------------------------------------------------------------------------------- problems
def test_problems_are_listed_by_level_and_selected_by_name_or_id(tmp_path):
    found = problems.from_checkout(FIXTURES)
    assert [p.key for p in found if p.level == "level2"] == ["level2/1_Linear_ReLU"]
    assert [p.problem_id for p in found if p.level == "level1"] == [1, 2, 3, 4, 5]
    assert [p.key for p in problems.select(found, ["level1/3"])] == ["level1/3_Sum_reduction_over_a_dimension"]
    assert len(problems.select(found, ["level1", "level1/2_Softmax"])) == 5
    with pytest.raises(problems.ProblemError, match="no problem matches 'level3'"):
        problems.select(found, ["level3"])
    # a cached dataset (as saved from the published one) gives the same problems, nothing fetched
    records = [{"level": int(p.level[-1]), "problem_id": p.problem_id, "name": p.name.split("_", 1)[1] + ".py",
                "code": p.code} for p in found]
    (tmp_path / "kb.json").write_text(json.dumps(records))
    (tmp_path / "kb.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    for name in ("kb.json", "kb.jsonl"):
        assert [(p.key, p.code) for p in problems.from_dataset(tmp_path / name)] == [(p.key, p.code) for p in found]
    with pytest.raises(problems.ProblemError, match="not a KernelBench checkout"):
        problems.from_checkout(tmp_path)


def test_starters_keep_the_constructor_and_say_what_to_write():
    (linear,) = problems.select(problems.from_checkout(FIXTURES), ["level2/1"])
    for backend in skeleton.BACKENDS:
        text = skeleton.render(linear, backend, LINEAR, "workspace/kernelbench/level2/1_Linear_ReLU.py")
        decl = kernelfile.declarations(text)
        assert decl["KERNEL_TYPE"] == LINEAR and set(decl["TUNABLES"]) <= set(decl)
        tree = ast.parse(text)
        assert [n.name for n in tree.body if isinstance(n, ast.ClassDef)] == ["ModelNew"]
        assert sourcecheck.violations(text) == [], backend  # a starter the harness's static check refuses helps no one
    namespace = {}
    exec(compile(skeleton.render(linear, "triton", LINEAR, "p.py"), "starter.py", "exec"), namespace)
    model_new = namespace["ModelNew"](40, 24)
    reference = problems.load_module(FIXTURES / "level2" / "1_Linear_ReLU.py").Model(40, 24)
    assert {k: v.shape for k, v in model_new.state_dict().items()} == \
        {k: v.shape for k, v in reference.state_dict().items()}
    with pytest.raises(NotImplementedError, match="skeleton"):
        model_new(torch.randn(2, 40))


# ---------------------------------------------------------------------------------------- the spec
def test_inputs_come_fresh_from_the_problem_and_weights_are_models(fixtures_root):
    kb = spec.resolve(LINEAR)
    draw = lambda seed: kb.make_inputs(kb.bench_shape, torch.float32, "cpu", torch.Generator().manual_seed(seed))
    first, second, again = draw(1), draw(2), draw(1)
    assert first[0].shape == (8, 40) and not torch.equal(first[0], second[0]) and torch.equal(first[0], again[0])
    module = kernelfile.import_kernel(SOLUTIONS / "level2" / "1_Linear_ReLU.py")
    bound = kb.bind(module, "cpu")
    reference = spec.resolve(LINEAR).bind(module, "cpu")  # a second build: the same seed, the same weights
    assert torch.equal(bound.model.linear.weight, reference.model.linear.weight)
    assert torch.allclose(bound(*first), kb.reference(*first), atol=1e-5)
    assert kb.flops(kb.bench_shape) == 2 * 8 * 40 * 24  # counted on the meta device, nothing allocated


def test_gpu_sized_problems_are_refused_in_cpu_mode(tmp_path, monkeypatch):
    text = (FIXTURES / "level1" / "2_Softmax.py").read_text().replace("batch_size = 8", "batch_size = 4096")
    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "2_Softmax.py").write_text(text.replace("dim = 200", "dim = 393216"))
    monkeypatch.setenv(spec.ENV_WORKSPACE, str(tmp_path))
    kb = spec.resolve("kb/level1/2_Softmax")
    assert kb.bench_shape["inputs"] == "4096x393216"
    with pytest.raises(CheckFailed, match="too large for CPU mode"):
        kb.bind(kernelfile.import_kernel(SOLUTIONS / "level1" / "2_Softmax.py"), "cpu")


# ---------------------------------------------------------------------------------------- the harness
def run_harness(path) -> dict:
    return harness.run(str(path), "cpu", quick=True, seed=3, dtype="fp32", timed=False)


def test_correct_modelnew_passes_with_models_weights(fixtures_root, tmp_path):
    result = run_harness(candidate(tmp_path, "level2/1_Linear_ReLU.py", LINEAR))
    assert result["status"] == "pass", result["reason"]
    checks = {s["name"]: s["checks"] for s in result["stages"]}
    assert checks["shape_sweep"] == 3 and checks["determinism"] == 3  # fresh inputs per trial, fp32 only


CHEATS = {
    "renamed parameters": (("self.linear = nn.Linear", "self.fc = nn.Linear"), "missing linear.weight"),
    "PyTorch does the matmul": (("        x = x.contiguous()\n        M, K",
                                 "        return torch.relu(nn.functional.linear(x, self.linear.weight, "
                                 "self.linear.bias))\n        M, K"), "aten.addmm"),
}


@pytest.mark.parametrize("cheat", CHEATS)
def test_a_cheating_modelnew_fails_with_the_reason(fixtures_root, tmp_path, cheat):
    edit, reason = CHEATS[cheat]
    result = run_harness(candidate(tmp_path, "level2/1_Linear_ReLU.py", LINEAR, edit))
    assert result["status"] == "fail" and result["failed_stage"] == "smoke"
    assert reason in result["reason"]


def test_the_candidates_own_get_inputs_is_never_called(fixtures_root, tmp_path):
    planted = ("class ModelNew", "def get_inputs():\n    raise RuntimeError('the candidate chose the inputs')\n\n\n"
               "class ModelNew")
    result = run_harness(candidate(tmp_path, "level2/1_Linear_ReLU.py", LINEAR, planted))
    assert result["status"] == "pass", result["reason"]


def test_integer_outputs_are_compared_exactly(fixtures_root, tmp_path):
    kind = "kb/level1/4_Argmax_over_a_dimension"
    assert spec.resolve(kind).tolerance(torch.float32) == spec.INT_TOLERANCE
    assert run_harness(candidate(tmp_path, "level1/4_Argmax_over_a_dimension.py", kind))["status"] == "pass"
    # indices from 100 up off by one: within KernelBench's 1e-2 relative, so only an exact check fails them
    off = ("tl.argmax(x, axis=0).to(tl.int64)", "(tl.argmax(x, axis=0) - (tl.argmax(x, axis=0) >= 100)).to(tl.int64)")
    result = run_harness(candidate(tmp_path, "level1/4_Argmax_over_a_dimension.py", kind, off))
    assert result["status"] == "fail" and "elements off" in result["reason"]


# ---------------------------------------------------------------------------------------- fast_p
def test_fast_p_counts_correct_and_faster_over_the_whole_set():
    records = [{"correct": True, "speedup_vs_pytorch": 3.5, "speedup_vs_compile": 1.2},
               {"correct": True, "speedup_vs_pytorch": 1.6, "speedup_vs_compile": 0.9},
               {"correct": True, "speedup_vs_pytorch": 0.7, "speedup_vs_compile": 0.5},
               {"correct": False, "speedup_vs_pytorch": None}, {"correct": False}]  # a fail, a missing one
    assert fast_p(records, "eager") == {"0": 0.6, "1": 0.4, "1.5": 0.4, "2": 0.2, "3": 0.2}
    assert fast_p(records, "compile") == {"0": 0.6, "1": 0.2, "1.5": 0.0, "2": 0.0, "3": 0.0}
    cpu = [{"correct": True, "speedup_vs_pytorch": 0.1, "speedup_vs_compile": None}]
    assert set(fast_p(cpu, "compile").values()) == {None}  # never timed: n/a, not zero


# ---------------------------------------------------------------------------------------- end to end
def project(tmp_path) -> tuple[Path, dict]:
    repo, env = copy_project(tmp_path, PROJECT)  # kernelbench/ included
    for var in (problems.ENV_ROOT, problems.ENV_DATASET, spec.ENV_WORKSPACE):
        env.pop(var, None)
    return repo, env


def git(repo, env, *args):
    subprocess.run(["git", *args], cwd=repo, env={**env, **IDENTITY}, check=True)


def kb(repo, env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelbench", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=RUN_LIMIT_S)


@pytest.mark.slow(39)
def test_setup_then_the_loop_unchanged_then_score_the_kept_kernel(tmp_path):
    repo, env = project(tmp_path)
    done = kb(repo, env, "setup", "level1/1_Swish", "--root", str(FIXTURES))
    assert done.returncode == 0, done.stderr
    reference = repo / "workspace/kernelbench/level1/1_Swish.py"
    assert not reference.stat().st_mode & stat.S_IWUSR  # read-only: agents edit kernel.py only
    assert 'KERNEL_TYPE = "kb/level1/1_Swish"' in (repo / "kernel.py").read_text()
    skeleton_run = kb(repo, env, "eval", "--device", "cpu", "--quick", "--no-log")
    assert skeleton_run.returncode == 1 and "ModelNew.forward is a skeleton" in skeleton_run.stdout

    shutil.copy(FIXTURES / "loop" / "swish_detuned.py", repo / "kernel.py")  # what a user writes
    git(repo, env, "commit", "-qam", "swish")
    loop = subprocess.run([sys.executable, "orchestrate.py", "run", "--kernel", "kernel.py", "--device", "cpu",
                           "--quick", "--tag", "t", "--max-experiments", "3", "--min-gain", "50",
                           "--target-speedup", "100"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=RUN_LIMIT_S)
    assert loop.returncode == 0, loop.stdout + loop.stderr
    rows = results.read_rows(repo / "results.tsv")
    assert {r["kernel_type"] for r in rows} == {"kb/level1/1_Swish"}
    assert all(r["correctness"] == "PASS" for r in rows), [(r["status"], r["description"]) for r in rows]
    assert sorted(r["status"] for r in rows) == ["baseline", "keep", "revert"]
    (keep,) = [r for r in rows if r["status"] == "keep"]
    assert keep["description"].startswith("BLOCK_SIZE 32 -> 4096")

    kernel_py = hashlib.sha256((repo / "kernel.py").read_bytes()).hexdigest()
    score = kb(repo, env, "score", "--problems", "level1/1_Swish", "--device", "cpu", "--quick",
               "--json", "score.json")
    assert score.returncode == 0, score.stderr
    record = json.loads((repo / "score.json").read_text())["problems"]["level1/1_Swish"]
    assert record["correct"] and record["solution"].endswith("workspace/kernels/kernel_optimized.py")
    assert hashlib.sha256((repo / "kernel.py").read_bytes()).hexdigest() == kernel_py


@pytest.mark.slow(20)
def test_score_a_set_of_solutions_resumes_and_reports_fast_p(tmp_path):
    repo, env = project(tmp_path)
    args = ["score", "--root", str(FIXTURES), "--problems", "level1/1", "level1/3", "level1/5", "level2",
            "--solutions", str(SOLUTIONS), "--device", "cpu", "--quick", "--json", "out.json"]
    first = kb(repo, env, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    data = json.loads((repo / "out.json").read_text())
    status = {k: r["status"] for k, r in data["problems"].items()}
    assert status == {"level1/1_Swish": "pass", "level1/3_Sum_reduction_over_a_dimension": "fail",
                      "level1/5_Matrix_multiplication": "missing", "level2/1_Linear_ReLU": "pass"}
    assert "aten.sum" in data["problems"]["level1/3_Sum_reduction_over_a_dimension"]["reason"]
    assert data["last"]["fast_p"]["eager"]["0"] == 0.5  # 2 correct of 4, the missing one included
    assert set(data["last"]["fast_p"]["compile"].values()) == {None}  # torch.compile is timed on a GPU
    # the fast_p table: a row per p, a column per baseline (its printed header, "vs compile", rich may wrap)
    assert "fast_1.5" in first.stdout and list(data["last"]["fast_p"]) == ["eager", "compile"]
    assert len(results.read_rows(repo / "results.tsv")) == 3  # one row per bench

    again = kb(repo, env, *args)  # resumed: nothing benched again
    assert again.returncode == 0 and again.stdout.count("scored before, same solution") == 3
    assert json.loads((repo / "out.json").read_text())["problems"] == data["problems"]
    assert len(results.read_rows(repo / "results.tsv")) == 3


# ---------------------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
def test_on_a_gpu_modelnew_is_timed_against_eager_and_compile(fixtures_root, tmp_path):
    from autokernel.harness.runner import run_bench

    result = run_bench(candidate(tmp_path, "level2/1_Linear_ReLU.py", LINEAR), device="cuda", dtype="fp32",
                       quick=True)
    assert result["status"] == "pass", result["reason"]
    assert result["eager_us"] > 0 and result["compile_us"] > 0 and result["pct_peak"] is not None


@pytest.mark.gpu
def test_on_a_gpu_the_cuda_starter_builds_and_runs(fixtures_root, tmp_path):
    from autokernel.harness.runner import run_bench

    (swish,) = problems.select(problems.from_checkout(FIXTURES), ["level1/1"])
    text = skeleton.render(swish, "cuda", "kb/level1/1_Swish", "p.py")
    text = text.replace("out[i] = x[i];", "out[i] = x[i] / (1.0f + expf(-x[i]));")
    text = text.replace('raise NotImplementedError("ModelNew.forward is a skeleton', 'return _elementwise(x)  # ("')
    (tmp_path / "cuda_swish.py").write_text(text)
    result = run_bench(tmp_path / "cuda_swish.py", device="cuda", dtype="fp32", quick=True,
                       timeout=float(os.environ.get("KB_CUDA_BUILD_TIMEOUT", 600)))
    assert result["status"] == "pass", result["reason"] + result.get("stderr_tail", "")


@pytest.mark.skipif(cuda_build.nvcc_path() is None, reason="nvcc not found: device code not compiled")
def test_the_cuda_starter_compiles(fixtures_root):
    (swish,) = problems.select(problems.from_checkout(FIXTURES), ["level1/1"])
    namespace = {}
    exec(compile(skeleton.render(swish, "cuda", "kb/level1/1_Swish", "p.py"), "starter.py", "exec"), namespace)
    cuda_build.compile_only("kb_swish", cuda_build.PRELUDE + namespace["CUDA_SRC"], "sm_90a")
