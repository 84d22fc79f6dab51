"""The loop on the model's own kernels: plan -> extracted file -> loop, the time in the model as the
objective, the night shared by Amdahl, the per-shape table, and the report beside verify.py's figure.

A stand-in harness (`model_bench`) reports per-shape times from the kernel file's BLOCK (and its
per-shape table, when it has one), so these run in seconds; tests/test_modeltime.py runs the real one.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FAKE_KERNEL, FakeBench, Lines, git_env, make_repo, repo_files, rows

from autokernel.harness import sourcecheck
from autokernel.kernelfile import declarations, import_kernel
from autokernel.loop import Loop, LoopConfig, budget, decide, report
from autokernel.loop.agents import make_agent
from autokernel.loop.agents.builtin import apply_table, launch_key, record_shape_times, shape_table, tunable_space
from autokernel.loop.state import load_jobs
from autokernel.profile.extraction import set_model_shapes

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [{"M": 64, "N": 128}, {"M": 8, "N": 96}]
ARGS = [[[64, 128], [128]], [[8, 96], [96]]]  # the tensor arguments' shapes at each model shape
TIMES = {32: (100.0, 20.0), 64: (80.0, 30.0), 128: (60.0, 50.0)}  # us per call at each shape, by BLOCK
MODEL_KERNEL = '''"""A stand-in kernel the model calls at two shapes; the fake bench times it by BLOCK."""
import torch

KERNEL_TYPE = "rmsnorm"
BLOCK = 64
TUNABLES = {"BLOCK": [32, 64, 128]}


def kernel_fn(x, weight, eps=1e-6):
    return x
'''


def model_kernel(calls) -> str:
    return set_model_shapes(MODEL_KERNEL, SHAPES, "shapes of a test model", calls)


def model_bench(path, **options) -> dict:
    """What the harness reports for a kernel with model shapes, from BLOCK and any SHAPE_CONFIGS."""
    decl = declarations(Path(path).read_text())
    table = {key: dict(zip(decl["SHAPE_TABLE_NAMES"], values)) for key, values in decl.get("SHAPE_CONFIGS", {}).items()}
    shapes = []
    for i, (shape, calls, args) in enumerate(zip(decl["MODEL_SHAPES"], decl["MODEL_CALLS"], ARGS)):
        block = table.get(launch_key(args), {}).get("BLOCK", decl["BLOCK"])
        shapes.append({"shape": shape, "calls": calls, "arg_shapes": args, "us": TIMES[block][i], "noise_pct": 0.5,
                       "eager_us": 100.0, "compile_us": None, "host_us": 5.0, "graphed": True})
    model_us = sum(s["calls"] * s["us"] for s in shapes)
    eager = sum(s["calls"] * 100.0 for s in shapes)
    return {"status": "pass", "correctness": "PASS", "latency_us": shapes[0]["us"], "noise_pct": 0.5,
            "speedup_vs_pytorch": 100.0 / shapes[0]["us"], "pct_peak": None, "gpu": "fake", "device": "cuda",
            "model_us": model_us, "model_noise_pct": 0.5, "model_vs_pytorch": eager / model_us, "host_us": 5.0,
            "model_host_us": 5.0 * sum(decl["MODEL_CALLS"]), "model_timing": "cuda_graph", "model_shapes": shapes,
            "log": f"---\nmodel_us: {model_us}\n"}


@pytest.fixture
def repo(tmp_path, monkeypatch):
    git_env(monkeypatch)
    return make_repo(tmp_path / "repo", repo_files())


def commit_all(repo) -> None:
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "kernels"], cwd=repo,
                   check=True)


def write_plan(repo, entries) -> Path:
    path = repo / "workspace" / "plan.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"model": "TestModel", "source": "models/llama.py", "class_name": "LlamaModel",
                                "config": "tiny", "input_shape": [2, 64], "dtype": "float32", "cpu_mode": True,
                                "entries": entries}))
    return path


def entry(type_, rank, f, s, shapes=()):
    return {"type": type_, "rank": rank, "f": f, "s": s, "gain": 1 / ((1 - f) + f / s),
            "shapes": [{"shape": sh, "calls": 3, "time_us": 1.0} for sh in shapes]}


# ------------------------------------------------------------------------------ plan -> extract -> loop
def test_the_loop_takes_the_extracted_kernels_and_says_which(repo):
    kernels = repo / "workspace" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "01_rmsnorm.py").write_text(set_model_shapes(FAKE_KERNEL, SHAPES[:1], "shapes", [3]))
    (repo / "kernels" / "softmax.py").write_text(FAKE_KERNEL.replace('"rmsnorm"', '"softmax"'))
    plan = write_plan(repo, [entry("rmsnorm", 1, 0.3, 2.0, SHAPES[:1]), entry("softmax", 2, 0.2, 2.0, SHAPES[1:]),
                             entry("layernorm", 3, 0.1, 2.0)])
    said = []
    jobs = load_jobs(repo, plan, warn=said.append)
    # softmax has a starter, but extract.py left it out: timed at its own shapes, its time would go where the model
    # is not (an H100 night gave the starters of matmul and rmsnorm 8% of its time so)
    assert [(j["type"], j["source"]) for j in jobs] == [("rmsnorm", "workspace/kernels/01_rmsnorm.py")]
    assert said[0] == "rmsnorm: workspace/kernels/01_rmsnorm.py (1 model shape(s))"
    assert said[1].startswith("skipped softmax: not extracted") and "--kernel kernels/softmax.py" in said[1]
    assert said[2].startswith("skipped layernorm")
    # a plan with nothing extracted (extract.py never ran) falls back to the starters, saying so
    (kernels / "01_rmsnorm.py").rename(kernels / "elsewhere.py")
    said.clear()
    assert [j["source"] for j in load_jobs(repo, plan, warn=said.append)] == ["kernels/softmax.py"]
    assert said[1].startswith("warning: softmax: no extracted kernel") and "falling back" in said[1]
    (kernels / "elsewhere.py").rename(kernels / "01_rmsnorm.py")
    # a kernel_file recorded by extract.py wins over the NN_<type>.py name; other shapes are warned about
    (kernels / "mine.py").write_text(set_model_shapes(FAKE_KERNEL, SHAPES[1:], "shapes", [3]))
    data = json.loads(plan.read_text())
    data["entries"][0]["kernel_file"] = "workspace/kernels/mine.py"
    plan.write_text(json.dumps(data))
    said.clear()
    assert load_jobs(repo, plan, warn=said.append)[0]["source"] == "workspace/kernels/mine.py"
    assert "does not carry this plan's shapes" in said[0]


def test_extract_records_the_kernel_files_and_call_counts(repo_root, tmp_path):
    plan = tmp_path / "in.plan.json"
    plan.write_text(json.dumps({"model": "m", "entries": [
        {"type": "rmsnorm", "rank": 1, "f": 0.3, "s": 2.0, "gain": 1.2,
         "shapes": [{"shape": SHAPES[0], "calls": 33, "time_us": 5.0},
                    {"shape": SHAPES[1], "calls": 2, "time_us": 1.0}]}]}))
    out = tmp_path / "kernels"
    proc = subprocess.run([sys.executable, "extract.py", "--plan", str(plan), "--top", "1", "--output-dir", str(out)],
                          cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    decl = declarations((out / "01_rmsnorm.py").read_text())
    assert decl["MODEL_SHAPES"] == SHAPES and decl["MODEL_CALLS"] == [33, 2]
    recorded = json.loads((out / "plan.json").read_text())
    assert recorded["entries"][0]["kernel_file"] == str((out / "01_rmsnorm.py").resolve())


# ------------------------------------------------------------------------------ the weighted objective
def test_decide_on_the_time_in_the_model_and_the_host_cost():
    best = {"model_us": 100.0, "model_host_us": 50.0}
    faster_alone = {"status": "pass", "correctness": "PASS", "latency_us": 10.0, "model_us": 120.0,
                    "model_host_us": 50.0, "model_timing": "cuda_graph"}
    assert decide(faster_alone, best["model_us"], 1.0, best["model_host_us"])[0] == "revert"
    gains_20 = {**faster_alone, "model_us": 80.0}
    assert decide(gains_20, 100.0, 1.0, 50.0)[0] == "keep"
    host_eats_it = {**gains_20, "model_host_us": 75.0}  # 20 us saved on the GPU, 25 us more on the host
    assert decide({**gains_20, "model_host_us": 72.0}, 100.0, 1.0, 50.0)[0] == "keep"  # 2 us over: host noise
    status, why = decide(host_eats_it, 100.0, 1.0, 50.0)
    assert status == "revert" and "host's cost per forward grew" in why
    assert decide({**host_eats_it, "model_timing": "cpu_host_clock"}, 100.0, 1.0, 50.0)[0] == "keep"


def run_model_loop(repo, calls, **config):
    (repo / "kernels" / "model.py").write_text(model_kernel(calls))
    commit_all(repo)
    loop = Loop(repo, LoopConfig(tag="t", max_reverts=3, **config), make_agent("builtin"),
                load_jobs(repo, kernels=["kernels/model.py"]), bench=model_bench)
    return loop, loop.run()


def test_the_loop_keeps_on_the_time_in_the_model_not_the_primary_shape(repo):
    loop, why = run_model_loop(repo, [1, 10])  # the second shape is called ten times as often
    log = rows(repo)
    kept = [r for r in log if r["status"] in ("baseline", "keep")]
    assert [float(r["model_us"]) for r in kept][:2] == [380.0, 300.0]  # BLOCK 64, then 32 (100 + 10 x 20)
    block_128 = next(r for r in log if r["description"].startswith("BLOCK 64 -> 128") or
                     r["description"].startswith("BLOCK 32 -> 128"))
    assert block_128["status"] == "revert" and float(block_128["latency_us"]) == 60.0  # fastest alone, slower here
    assert all(r["host_us"] == "5" for r in kept)
    assert float(kept[0]["model_vs_pytorch"]) == pytest.approx(1100 / 380, rel=1e-3)  # written to 4 digits
    job = loop.state.jobs[0]
    assert job["objective"] == "model_us" and job["best_us"] == float(kept[-1]["model_us"])


@pytest.mark.parametrize("deploy, kept", [(None, False), ("compile", False), ("compile_graph", True), ("graph", True)])
def test_the_hosts_cost_counts_only_where_the_deployed_model_runs_the_launcher(repo, deploy, kept):
    """A change 80 us faster on the GPU whose launcher costs 1 ms more a forward: reverted where the model the
    kernel was extracted for calls it from the host (the plan's deploy mode; a --kernel file is judged as eager),
    kept where the model is a CUDA graph's replay, which never runs the launcher after the capture."""
    def costly_small_blocks(path, **options):
        result = model_bench(path, **options)
        if declarations(Path(path).read_text())["BLOCK"] == 32:
            result["model_host_us"] += 1000.0
        return result

    (repo / "kernels" / "model.py").write_text(model_kernel([1, 10]))
    commit_all(repo)
    jobs = load_jobs(repo, kernels=["kernels/model.py"])
    if deploy:
        jobs[0]["deploy"] = deploy
    Loop(repo, LoopConfig(tag="t", max_reverts=3), make_agent("builtin"), jobs, bench=costly_small_blocks).run()
    block_32 = next(r for r in rows(repo) if r["description"].startswith("BLOCK 64 -> 32"))
    assert (block_32["status"] == "keep") == kept
    assert kept or "host's cost per forward grew" in block_32["description"]


def test_the_builtin_agent_ends_with_a_per_shape_table_kept_only_when_faster(repo):
    loop, why = run_model_loop(repo, [10, 1])  # 32: 1020, 64: 830, 128: 650; shape 2 alone is fastest at 32
    log = rows(repo)
    last = log[-1]
    assert last["description"].startswith("per-shape table") and last["status"] == "keep"
    assert float(last["model_us"]) == 620.0  # 10 x 60 at BLOCK 128 + 1 x 20 at BLOCK 32
    optimized = (repo / "workspace/kernels/model_optimized.py").read_text()
    assert declarations(optimized)["SHAPE_CONFIGS"] == {((768, 96), (96, 96)): (32,)}
    assert loop.state.jobs[0]["finale_done"] and why == "every kernel is done"


def test_a_run_that_ends_with_its_kernel_parked_still_ends_with_the_per_shape_table(repo):
    loop, why = run_model_loop(repo, [10, 1], max_experiments=3)  # the last bench left goes to the finale
    log = rows(repo)
    assert why == "3 experiments run (--max-experiments)" and len(log) == 3
    assert log[-1]["description"].startswith("per-shape table")
    job = loop.state.jobs[0]
    assert job["finale_done"] and job["status"] != "done"  # not done for good: a later run goes on with it


def test_the_per_shape_table_dispatches_by_the_arguments_sizes(tmp_path):
    source = MODEL_KERNEL.replace("return x", "return BLOCK")
    best = tunable_space(source)[1]
    memory = {}
    record_shape_times(memory, best, [{"arg_shapes": a, "calls": 1, "us": 10.0} for a in ARGS])
    record_shape_times(memory, {"BLOCK": 32}, [{"arg_shapes": ARGS[0], "calls": 1, "us": 12.0},
                                               {"arg_shapes": ARGS[1], "calls": 1, "us": 5.0}])
    assert shape_table({**memory, "shapes": memory["shapes"][:1]}, best) is None  # one shape: no table
    path = tmp_path / "k.py"
    path.write_text(apply_table(source, shape_table(memory, best), best))
    import torch

    module = import_kernel(path)
    assert module.kernel_fn(torch.empty(8, 96), torch.empty(96)) == 32
    assert module.kernel_fn(torch.empty(1, 8, 96), torch.empty(96)) == 32  # the model's 3-D view of it
    assert module.kernel_fn(torch.empty(64, 128), torch.empty(128)) == 64
    assert module.BLOCK == 64  # put back after the call


@pytest.mark.parametrize("starter", sorted(p.name for p in (ROOT / "kernels").glob("*.py")))
def test_a_starter_with_a_per_shape_table_passes_the_static_check(starter):
    """The file the builtin agent writes at the end (its SHAPE_CONFIGS table and dispatching kernel_fn)
    must still pass the harness's static check, or the loop's last step fails as a guard."""
    source = set_model_shapes((ROOT / "kernels" / starter).read_text(), SHAPES, "shapes of a test", [2, 1])
    best = tunable_space(source)[1]
    moved = next(n for n, v in best.items() if type(v) is int)
    memory = {}
    record_shape_times(memory, best, [{"arg_shapes": a, "calls": 1, "us": 10.0} for a in ARGS])
    record_shape_times(memory, {**best, moved: best[moved] * 2 or 64}, [{"arg_shapes": ARGS[0], "calls": 1, "us": 12.0},
                                                                  {"arg_shapes": ARGS[1], "calls": 1, "us": 5.0}])
    table = apply_table(source, shape_table(memory, best), best, "bf16")
    assert table is not None and "SHAPE_CONFIGS" in table and "SHAPE_TABLE_DTYPE = torch.bfloat16" in table
    assert sourcecheck.violations(table, starter) == []


@pytest.mark.parametrize("edit", [lambda text: text.replace("MODEL_CALLS = [10, 1]", "MODEL_CALLS = [1, 1]"),
                                  lambda text: text + '\nMODEL_SOURCE = {"model": "models/other.py:Other"}\n'],
                         ids=["calls", "source"])
def test_the_agent_may_not_edit_the_model_shapes(repo, edit):
    class ShrinkShapes:
        name = "shrink"

        def propose(self, task):
            task.kernel_file.write_text(edit(task.kernel_file.read_text()))
            from autokernel.loop.agents import Proposal

            return Proposal("fewer calls")

        def observe(self, *args):
            pass

        def finish(self, task):
            return None

    (repo / "kernels" / "model.py").write_text(model_kernel([10, 1]))
    commit_all(repo)
    Loop(repo, LoopConfig(tag="t", max_reverts=1), ShrinkShapes(), load_jobs(repo, kernels=["kernels/model.py"]),
         bench=model_bench).run()
    last = rows(repo)[-1]
    assert last["status"] == "revert" and "changed MODEL_SHAPES, MODEL_CALLS or MODEL_SOURCE" in last["description"]


# ------------------------------------------------------------------------------ the night by Amdahl
def test_budget_follows_the_gain_left_and_no_gain_types_go_last():
    jobs = [{"name": n, "status": "pending", "f": f, "s": s, "gain": 1 / ((1 - f) + f / s)}
            for n, f, s in (("norm", 0.4, 10.0), ("mlp", 0.4, 1.1), ("matmul", 0.2, 1.0))]
    assert budget.potential(jobs[0]) == pytest.approx(0.04) and budget.potential(jobs[2]) == 0.0
    split = budget.shares(jobs)
    assert split["mlp"] == pytest.approx(0.4 / 1.1 / (0.4 / 1.1 + 0.04)) and split["matmul"] == 0.0
    assert [j["name"] for j in sorted(jobs, key=budget.order(jobs))] == ["mlp", "norm", "matmul"]
    jobs[0]["status"] = jobs[1]["status"] = "done"
    assert budget.shares(jobs) == {"matmul": 1.0}  # the others done: what is left is its
    measured = {**jobs[1], "status": "pending", "measured_on": "cuda", "best_vs_pytorch": 2.0, "best_pct_peak": 50}
    assert budget.potential(measured) == pytest.approx(0.4 / 2.0 * 0.5)  # measured speedup, room to the roof
    assert budget.shares([{"name": "a", "status": "pending"}, {"name": "b", "status": "pending"}]) == \
        {"a": 0.5, "b": 0.5}  # --kernel files: no plan share, even split
    fused_away = {"name": "softmax", "status": "pending", "f": 0.0, "s": 1.8, "gain": 1.0}  # --deploy compile_graph
    assert budget.shares([{**jobs[1], "status": "pending"}, fused_away]) == {"mlp": 1.0, "softmax": 0.0}


def test_a_type_the_prune_would_leave_out_is_ranked_by_what_it_would_save_at_the_roofline():
    """Issue 35: with the plan's roofline (floor_us, profile.py on a GPU) a type slower than what the model runs
    there (the prune would leave it out) is not queued blindly: it may save what lies between the model's own time
    and the roofline's, and a type the model already runs near its roofline gets little."""
    mlp = {"name": "mlp", "status": "pending", "f": 0.4, "s": 1.1, "gain": 1.04, "time_us": 4000.0,
           "floor_us": 2600.0}
    attention = {"name": "attention", "status": "pending", "f": 0.2, "s": 0.87, "gain": 0.97, "time_us": 2000.0,
                 "floor_us": 400.0}
    at_roof = {"name": "gemm", "status": "pending", "f": 0.3, "s": 0.95, "gain": 0.98, "time_us": 1000.0,
               "floor_us": 990.0}
    assert budget.potential(attention) == pytest.approx(0.2 * (1 - 0.2))  # the model's own time, down to the roof
    assert budget.potential(mlp) == pytest.approx(0.4 * (1 / 1.1 - 0.65))  # its starter's time, down to the roof
    assert budget.potential(at_roof) == pytest.approx(0.3 * 0.05)  # beyond 95% of the roof: noise, a sliver
    queue = [mlp, at_roof, attention]
    assert [j["name"] for j in sorted(queue, key=budget.order(queue))] == ["attention", "mlp", "gemm"]
    assert budget.shares([mlp, attention, at_roof])["attention"] > 0.5
    # once its baseline ran in the model: 2500 us there (the model's 2000 stays), at 16% of its roofline
    timed = {**attention, "measured_on": "cuda", "objective": "model_us", "best_us": 2500.0, "best_pct_peak": 16.0}
    assert budget.potential(timed) == pytest.approx(0.2 * (1 - 2500 / 2000 * 0.16))
    # a plan made on the CPU has no roofline: the type waits for the time the others leave, as before
    assert budget.potential({**attention, "floor_us": None}) == 0.0


def test_the_loop_shares_its_hours_by_amdahl_and_says_so(repo):
    for name in ("norm", "mlp", "matmul"):
        (repo / "kernels" / f"{name}.py").write_text(FAKE_KERNEL)
    plan = write_plan(repo, [{**entry("rmsnorm", 1, 0.4, 10.0), "kernel_file": "kernels/norm.py"},
                             {**entry("rmsnorm", 2, 0.4, 1.1), "kernel_file": "kernels/mlp.py"},
                             {**entry("rmsnorm", 3, 0.2, 1.0), "kernel_file": "kernels/matmul.py"}])
    commit_all(repo)
    ui = Lines()
    loop = Loop(repo, LoopConfig(tag="t", hours=1.0, max_reverts=1), make_agent("builtin"),
                load_jobs(repo, plan, warn=ui.print), bench=FakeBench(), ui=ui)
    loop.run()
    order = list(dict.fromkeys(r["kernel_file"] for r in rows(repo)))
    assert order == ["kernels/mlp.py", "kernels/norm.py", "kernels/matmul.py"]
    jobs = {j["name"]: j for j in loop.state.jobs}
    assert jobs["mlp"]["budget_s"] / 3600 == pytest.approx(0.4 / 1.1 / (0.4 / 1.1 + 0.04), rel=0.01)
    assert any(line.startswith("  matmul: plan gain 1.000x") and "queued last" in line for line in ui.lines)
    # while the others can gain it waits, parked, without even a baseline; once they are done it gets the time
    assert any(line.startswith("matmul parked (nothing to gain over PyTorch while others can") for line in ui.lines)
    matmul_from = next(i for i, r in enumerate(rows(repo)) if r["kernel_file"] == "kernels/matmul.py")
    assert {r["kernel_file"] for r in rows(repo)[matmul_from:]} == {"kernels/matmul.py"}
    assert [j["status"] for j in loop.state.jobs] == ["done"] * 3



def test_a_share_smaller_than_a_baseline_waits_for_the_time_the_others_leave(repo):
    """A type with a sliver of the model's time (a 20-minute H100 night gave rotary_embedding, 0.03% of the compiled
    forward, its baseline and a screen: 58 s) starts no baseline in the first round when its share of the time is
    less than a baseline has taken; it gets the time the others leave, in the next round."""
    import time

    for name in ("mlp", "sliver"):
        (repo / "kernels" / f"{name}.py").write_text(FAKE_KERNEL)
    plan = write_plan(repo, [{**entry("rmsnorm", 1, 0.4, 1.1), "kernel_file": "kernels/mlp.py"},
                             {**entry("rmsnorm", 2, 0.001, 1.05), "kernel_file": "kernels/sliver.py"}])
    commit_all(repo)

    class SlowBaselines(FakeBench):  # a baseline takes 0.5 s, an experiment no time
        def __call__(self, path, **options):
            if not options.get("reuse_baselines"):
                time.sleep(0.5)
            return super().__call__(path, **options)

    ui = Lines()
    loop = Loop(repo, LoopConfig(tag="t", hours=0.01, max_reverts=1), make_agent("builtin"),
                load_jobs(repo, plan, warn=ui.print), bench=SlowBaselines(), ui=ui)
    loop.run()
    waited = [line for line in ui.lines if line.startswith("sliver parked (its 0.0 min share is less than a baseline")]
    assert waited and "(~1 s): waits for the time the others leave)" in waited[0]
    log = rows(repo)
    first = next(i for i, r in enumerate(log) if r["kernel_file"] == "kernels/sliver.py")
    assert log[first]["status"] == "baseline" and any("round 2" in line for line in ui.lines)
    assert all(r["kernel_file"] == "kernels/mlp.py" for r in log[:first])

# ------------------------------------------------------------------------------ the morning report
def test_report_puts_the_estimate_beside_verify_and_builds_its_command(repo):
    plan = json.loads(write_plan(repo, []).read_text())
    cmd = report.verify_command(plan)
    assert cmd[1:] == ["verify.py", "--model", "models/llama.py", "--class-name", "LlamaModel", "--config", "tiny",
                       "--input-shape", "2,64", "--dtype", "float32", "--device", "cpu", "--report",
                       "workspace/verify.json"]
    assert "--cuda-graph" in report.verify_command({**plan, "cpu_mode": False})
    compiled = report.verify_command({**plan, "cpu_mode": False, "deploy": "compile_graph"})  # profile.py --deploy
    assert compiled[compiled.index("--cuda-graph") + 1:][:3] == ["--compile", "--deploy", "compile_graph"]
    assert report.read_verify(repo) is None
    assert "no end-to-end measurement yet" in report.estimate_lines(1.3, None, None)[-1]
    (repo / "workspace" / "verify.json").write_text(json.dumps({
        "model": "TestModel", "input_shape": [1, 2048], "gpu": "NVIDIA H200", "cpu_mode": False,
        "timing": {"eager": {"ms": 10.0, "speedup_vs_eager": 1.0},
                   "optimized": {"ms": 9.0, "speedup_vs_eager": 1.111},
                   "optimized_graph": {"ms": 8.0, "speedup_vs_eager": 1.25}}}))
    verify = report.read_verify(repo)
    lines = report.estimate_lines(1.3, verify, None)
    assert any("1.250x over eager with CUDA graphs" in line and "off by +4.0%" in line for line in lines)
    assert any(line.strip() == "1.111x over eager in eager mode (launch costs included)" for line in lines)
    assert "older than the last kept experiment" in report.estimate_lines(1.3, verify, "9999-01-01T00:00:00")[1]
    # with extracted files the loop began from, verify.py times the kept kernels against them, and the report says
    extracted = {**plan, "entries": [{"type": "rmsnorm", "kernel_file": "workspace/kernels/01_rmsnorm.py"}]}
    assert report.verify_command(extracted)[-4:-2] == ["--against", "extracted"]
    against = {"against": "extracted", "differs": ["rmsnorm"], "speedup": 1.0036, "verdict": "faster",
               "won_rounds": 27, "rounds": 30, "p_value": 1e-5}
    lines = report.estimate_lines(1.3, {**verify, "against": against}, None)
    assert lines[-1].strip().startswith("the kept kernels against the extracted ones (rmsnorm differ)")
    assert "1.0036x, faster (this run's faster in 27 of 30 turns" in lines[-1]


def test_a_plan_ranked_under_torch_compile_has_its_estimate_over_torch_compile(repo):
    """profile.py --deploy compile_graph: the shares are of the compiled forward, so the estimate is over
    torch.compile and is compared with verify.py's compiled + graphed row, not the graphed row over eager (an H100
    night on TinyLlama: estimate 1.273x, compiled + graphed 1.282x, graphed over eager 1.627x)."""
    kernels = repo / "workspace" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "01_rmsnorm.py").write_text(set_model_shapes(FAKE_KERNEL, SHAPES[:1], "shapes", [3]))
    plan = write_plan(repo, [entry("rmsnorm", 1, 0.3, 2.0, SHAPES[:1])])
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "deploy": "compile_graph"}))
    assert [j["deploy"] for j in load_jobs(repo, plan, warn=lambda _: None)] == ["compile_graph"]
    timing = {"optimized_graph": {"speedup_vs_eager": 1.627},
              "optimized_compile": {"speedup_vs_compile": 1.273},
              "optimized_compile_graph": {"speedup_vs_compile": 1.282}}
    verify = {"model": "TestModel", "input_shape": [1, 2048], "gpu": "NVIDIA H100", "cpu_mode": False,
              "written": "2026-11-27T07:55:55+00:00", "timing": timing, "prune": {"mode": "compile_graph"}}
    lines = report.estimate_lines(1.273, verify, None, deploy="compile_graph")
    assert lines[0] == "end-to-end estimate (Amdahl over the plan's shares): 1.273x over torch.compile"
    assert any("1.282x over torch.compile, both with CUDA graphs" in line and "off by -0.7%" in line for line in lines)
    assert any(line.strip() == "1.627x over eager with CUDA graphs" for line in lines)  # shown, not compared
    assert report.measured_speedup(verify) == (1.282, "over torch.compile, both with CUDA graphs")
    # verify.py run in every mode: the eager side's graphed figure, as before
    every = {**verify, "prune": {"mode": "eager,graph,compile,compile_graph"}}
    assert report.measured_speedup(every) == (1.627, "over eager with CUDA graphs")
    assert "over eager with CUDA graphs" in report.estimate_lines(1.6, every, None)[2]


def test_workers_share_their_gpu_hours_by_amdahl():
    jobs = [{"name": n, "f": f, "s": s, "gain": 1 / ((1 - f) + f / s)}
            for n, f, s in (("norm", 0.4, 10.0), ("mlp", 0.4, 1.1), ("matmul", 0.2, 1.0))]
    minutes = budget.parallel_minutes(jobs, hours=1.0, slots=2)
    share = 0.04 / (0.4 / 1.1 + 0.04)
    assert minutes == {"norm": pytest.approx(share * 120), "mlp": 60.0, "matmul": 60.0}  # capped at the run


def test_report_shows_each_model_shape_before_and_after(repo):
    loop, _ = run_model_loop(repo, [1, 10])
    job = loop.state.jobs[0]
    assert [s["us"] for s in job["baseline_shapes"]] == [80.0, 30.0]  # BLOCK 64
    assert [s["calls"] for s in job["best_shapes"]] == [1, 10]
    lines = report.shape_lines(loop.state.jobs)
    assert lines[0] == "model at the model's shapes (us per call; calls per forward):"
    assert lines[2].split()[:6] == ["M=8", "N=96", "x10", "30.0", "us", "->"]


def test_the_estimate_uses_the_time_in_the_model_against_the_profiled_time():
    norm = {"f": 0.4, "time_us": 1000.0, "best_us": 250.0, "in_model": True, "best_vs_pytorch": 10.0}
    mlp = {"f": 0.2, "time_us": 500.0, "best_us": 600.0, "in_model": True, "best_vs_pytorch": 0.8}
    by_hand = {"f": 0.1, "best_us": 5.0, "in_model": False, "best_vs_pytorch": 2.0}
    assert report.remaining_fraction(norm) == 0.25  # not 1 / 10: the model's own ops took 1000 us
    assert report.remaining_fraction(mlp) == 1.0  # slower than the model's own: left out by verify.py
    assert report.amdahl([norm, mlp, by_hand]) == pytest.approx(1 / (0.3 + 0.4 * 0.25 + 0.2 + 0.1 / 2))


def test_the_estimate_counts_an_opt_in_type_or_its_rivals_whichever_leaves_less():
    """extract.py writes flash_attention and rotary_embedding beside rope_attention, whose time they share; verify's
    prune deploys the faster: the estimate takes the better of the two, never both."""
    rope = {"type": "rope_attention", "f": 0.3, "time_us": 300.0, "best_us": 270.0, "in_model": True,
            "best_vs_pytorch": 1.1}
    flash = {"type": "flash_attention", "f": 0.2, "time_us": 200.0, "best_us": 100.0, "in_model": True,
             "best_vs_pytorch": 2.0, "rival_of": ["rope_attention"]}
    rotary = {"type": "rotary_embedding", "f": 0.05, "time_us": 50.0, "best_us": 40.0, "in_model": True,
              "best_vs_pytorch": 1.2, "rival_of": ["rope_attention"]}
    # the rivals leave 0.05 (what rope_attention takes beyond them) + 0.1 + 0.04 of its 0.3; rope_attention 0.27
    assert report.amdahl([rope, flash, rotary]) == pytest.approx(1 / (0.7 + 0.05 + 0.1 + 0.04))
    slow = {**flash, "best_us": 200.0}  # no faster than the model's own: rope_attention's 0.27 stands
    assert report.amdahl([rope, slow, rotary]) == pytest.approx(1 / (0.7 + 0.27))
