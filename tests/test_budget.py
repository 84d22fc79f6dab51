"""The night's budget with rivals (autokernel/loop/budget.py): an opt-in type (rope_attention) and the types it
takes the time of (flash_attention, rotary_embedding: rival_of ["rope_attention"]) cover the same share of the
model, so only the side the model would deploy now gets time; the other waits, queued last. Which side that is, each
side's baseline at the model's shapes says: those come first. The jobs are the plan of an H100 night under
compile_graph, where the budget gave each side its own share and ~8.5 of 19 minutes went to kernels the model never
ran; an H200 Qwen3 night then gave 13 of 18 minutes to the side the plan guessed and the model did not run."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import FAKE_KERNEL, FakeBench, Lines, git_env, make_repo, repo_files, rows

from autokernel.loop import Loop, LoopConfig, budget
from autokernel.loop.agents import make_agent
from autokernel.loop.state import load_jobs, next_job

RIVALS = ["rope_attention"]
NIGHT = [  # name (= type), f, s, time_us, floor_us, rival_of
    ("fused_mlp", 0.418, 1.064, 4643.8, 3152.8, []),
    ("rope_attention", 0.363, 1.043, 4034.3, 382.2, []),
    ("linear_cross_entropy", 0.041, 1.104, 457.7, 271.7, []),
    ("add_rmsnorm", 0.026, 1.012, 291.1, 220.4, []),
    ("rotary_embedding", 0.080, 1.050, 892.3, 127.4, RIVALS),
    ("flash_attention", 0.283, 0.869, 3144.9, 382.2, RIVALS),
]
RIVAL_SIDE = ("rotary_embedding", "flash_attention")


def night() -> list[dict]:
    return [{"name": n, "type": n, "status": "pending", "f": f, "s": s, "gain": 1 / ((1 - f) + f / s),
             "time_us": t, "floor_us": floor, "rival_of": list(rival_of), "measured_on": None, "best_us": None,
             "best_vs_pytorch": None, "best_pct_peak": None} for n, f, s, t, floor, rival_of in NIGHT]


def by_name(jobs: list[dict]) -> dict[str, dict]:
    return {j["name"]: j for j in jobs}


def timed(jobs: list[dict]) -> list[dict]:
    """Every kernel's baseline tried (on the CPU: the plan's s still decide)."""
    for job in jobs:
        job.update(baseline_sha="b", experiments=1)
    return jobs


def rivals_faster(jobs: list[dict]) -> list[dict]:
    """The baselines ran in the model on a GPU: the rival pair leaves far less of the time than rope_attention."""
    best = {"rope_attention": 3800.0, "flash_attention": 1500.0, "rotary_embedding": 400.0}
    for job in timed(jobs):
        if job["name"] in best:
            job.update(measured_on="cuda", objective="model_us", best_us=best[job["name"]], best_vs_pytorch=1.0)
    return jobs


def test_the_plan_before_baselines_deploys_rope_attention_and_its_rivals_get_no_share():
    jobs = night()
    rope = by_name(jobs)["rope_attention"]
    # report.amdahl's choice: own 0.363 / 1.043 = 0.348 <= instead 0.283 * 1 + 0.080 / 1.05 = 0.359
    assert budget.left_of(rope) == pytest.approx(1 / 1.043)
    assert budget.outrun(jobs) == {"rotary_embedding": ["rope_attention"], "flash_attention": ["rope_attention"]}
    split = budget.shares(jobs)
    assert split["flash_attention"] == 0.0 and split["rotary_embedding"] == 0.0
    own = {j["name"]: budget.potential(j) for j in jobs}
    assert own["flash_attention"] > 0.2 and own["rotary_embedding"] > 0.05  # on their own they would have had time
    counted = sum(p for n, p in own.items() if n not in RIVAL_SIDE)
    assert split["rope_attention"] == pytest.approx(own["rope_attention"] / counted)
    assert split["rope_attention"] == pytest.approx(0.7104, abs=1e-3)  # the group's time, not 42% of the night
    assert sum(split.values()) == pytest.approx(1.0)
    assert budget.potentials(jobs)["flash_attention"] == 0.0
    assert budget.potentials(jobs)["rope_attention"] == own["rope_attention"]


def test_rivals_faster_in_the_model_take_the_share_and_the_opt_in_type_waits():
    jobs = rivals_faster(night())
    assert budget.outrun(jobs) == {"rope_attention": ["rotary_embedding", "flash_attention"]}
    split = budget.shares(jobs)
    assert split["rope_attention"] == 0.0
    own = {j["name"]: budget.potential(j) for j in jobs}
    counted = sum(p for n, p in own.items() if n != "rope_attention")
    for name in RIVAL_SIDE:
        assert split[name] == pytest.approx(own[name] / counted) and split[name] > 0.0
    assert sum(split.values()) == pytest.approx(1.0)


def test_a_rival_whose_opt_in_type_is_not_queued_keeps_its_own_potential():
    jobs = [j for j in night() if j["name"] != "rope_attention"]
    assert budget.outrun(jobs) == {}
    own = {j["name"]: budget.potential(j) for j in jobs}
    split = budget.shares(jobs)
    for name in RIVAL_SIDE:
        assert split[name] == pytest.approx(own[name] / sum(own.values())) and split[name] > 0.0


def test_a_done_opt_in_type_still_decides_and_its_rivals_wait_for_the_time_left():
    jobs = night()
    by_name(jobs)["rope_attention"]["status"] = "done"
    split = budget.shares(jobs)
    assert "rope_attention" not in split
    assert split["flash_attention"] == 0.0 and split["rotary_embedding"] == 0.0
    assert split["fused_mlp"] > 0.8
    for job in jobs:  # everything else done: the waiting side gets the time left, evenly
        if job["name"] not in RIVAL_SIDE:
            job["status"] = "done"
    assert budget.shares(jobs) == {"rotary_embedding": 0.5, "flash_attention": 0.5}


def test_describe_says_which_side_the_model_runs():
    lines = budget.describe(timed(night()), seconds_left=19 * 60)
    assert "  flash_attention: a rival of rope_attention, which the model runs faster now: queued last, on the " \
           "time the others leave" in lines
    assert "  rotary_embedding: a rival of rope_attention, which the model runs faster now: queued last, on the " \
           "time the others leave" in lines
    assert lines[0].startswith("  rope_attention: 71% of the time left (~13 min;")
    assert not any("nothing to gain" in line for line in lines)
    lines = budget.describe(rivals_faster(night()), seconds_left=19 * 60)
    assert "  rope_attention: its rivals rotary_embedding and flash_attention run faster in the model now: " \
           "queued last, on the time the others leave" in lines
    assert budget.waiting_reason(by_name(night())["flash_attention"], night()) == \
        "a rival of rope_attention, which the model runs faster now"


def test_the_untimed_sides_of_a_rivalry_come_first_and_a_timed_side_waits_for_them():
    jobs = night()
    assert budget.time_first(jobs) == {"rope_attention", "flash_attention", "rotary_embedding"}
    names = [j["name"] for j in sorted(jobs, key=budget.order(jobs))]
    assert names[:3] == ["rope_attention", "rotary_embedding", "flash_attention"] and names[3] == "fused_mlp"
    assert budget.describe(jobs, seconds_left=60)[0].startswith(
        "  first the baselines of flash_attention, rope_attention, rotary_embedding: their times at the model's shapes")
    rope, flash = by_name(jobs)["rope_attention"], by_name(jobs)["flash_attention"]
    rope.update(baseline_sha="b", experiments=1, status="active")
    assert budget.undecided(rope, jobs) and not budget.undecided(by_name(jobs)["fused_mlp"], jobs)
    assert next_job([{**rope, "status": "pending"}, *jobs[2:]])["name"] == "rotary_embedding"
    flash["status"] = "parked"  # a side parked untimed (an earlier run's) holds nothing up until it is back
    by_name(jobs)["rotary_embedding"].update(baseline_sha="b", experiments=1)
    assert not budget.undecided(rope, jobs) and budget.time_first(jobs) == set()
    flash["status"] = "pending"
    assert budget.undecided(rope, jobs)
    flash["status"] = "active"  # its baseline failed: tried, and the split goes on from the plan's guess for it
    flash.update(experiments=1)
    assert not budget.undecided(rope, jobs)
    assert all(not budget.undecided(j, jobs) for j in night() if j["name"] in ("fused_mlp", "add_rmsnorm"))


def test_the_queue_puts_the_waiting_side_last():
    jobs = timed(night())
    names = [j["name"] for j in sorted(jobs, key=budget.order(jobs))]
    assert names == ["rope_attention", "fused_mlp", "linear_cross_entropy", "add_rmsnorm",
                     "rotary_embedding", "flash_attention"]  # the waiting side by plan gain, last
    subset = [j for j in jobs if j["name"] in ("flash_attention", "add_rmsnorm")]
    assert [j["name"] for j in sorted(subset, key=budget.order(jobs))] == ["add_rmsnorm", "flash_attention"]
    assert budget.order(jobs)(by_name(jobs)["flash_attention"])[0] is True
    by_name(jobs)["rope_attention"]["status"] = "done"
    by_name(jobs)["fused_mlp"]["status"] = "done"
    assert next_job(jobs)["name"] == "linear_cross_entropy"  # not flash_attention, the largest potential alone
    jobs = rivals_faster(night())
    assert [j["name"] for j in sorted(jobs, key=budget.order(jobs))][-1] == "rope_attention"


def test_parallel_minutes_run_the_waiting_side_last_until_the_end():
    minutes = budget.parallel_minutes(night(), hours=1.0, slots=2)
    assert minutes["flash_attention"] == 60.0 and minutes["rotary_embedding"] == 60.0  # a no-gain type's lot
    assert minutes["rope_attention"] == pytest.approx(min(60.0, budget.shares(night())["rope_attention"] * 120))
    assert minutes["fused_mlp"] == pytest.approx(budget.shares(night())["fused_mlp"] * 120)


class ModelBench(FakeBench):
    """A GPU's bench at the model's shapes: each type's time in the model (MODEL_US, scaled by the file's LATENCY)."""
    MODEL_US = {"rope_attention": 3800.0, "flash_attention": 1500.0, "rotary_embedding": 400.0}

    def __call__(self, path, **options):
        out = super().__call__(path, **options)
        kind = re.search(r'^KERNEL_TYPE = "(\w+)"', Path(path).read_text(), re.M).group(1)
        return {**out, "device": "cuda", "cpu_mode": True, "model_us": self.MODEL_US[kind] * out["latency_us"] / 100}


def rivalry_night(tmp_path, monkeypatch, bench) -> tuple[Loop, Lines, list[str]]:
    """A night of rope_attention and its rivals, as the plan of NIGHT ranks them: the loop, its lines, the kernel
    file of each row of results.tsv."""
    git_env(monkeypatch)
    repo = make_repo(tmp_path / "repo", repo_files())
    entries = []
    for rank, (name, f, s, time_us, floor_us, rival_of) in enumerate(NIGHT[1:2] + NIGHT[4:], start=1):
        (repo / "kernels" / f"{name}.py").write_text(FAKE_KERNEL.replace('"rmsnorm"', f'"{name}"'))
        entries.append({"type": name, "rank": rank, "f": f, "s": s, "gain": 1 / ((1 - f) + f / s), "shapes": [],
                        "time_us": time_us, "floor_us": floor_us, "rival_of": rival_of,
                        "kernel_file": f"kernels/{name}.py"})
    plan = repo / "workspace" / "plan.json"
    plan.parent.mkdir(exist_ok=True)
    plan.write_text(json.dumps({"model": "TestModel", "source": "models/llama.py", "class_name": "LlamaModel",
                                "config": "tiny", "input_shape": [2, 64], "dtype": "float32", "cpu_mode": True,
                                "entries": entries}))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["add", "-A"], ["commit", "-qm", "kernels"]):
        subprocess.run(["git", *cmd], cwd=repo, env=env, check=True)
    ui = Lines()
    loop = Loop(repo, LoopConfig(tag="t", hours=1.0, max_reverts=1), make_agent("builtin"),
                load_jobs(repo, plan, warn=ui.print), bench=bench, ui=ui)
    loop.run()
    return loop, ui, [r["kernel_file"] for r in rows(repo)]


def test_the_loop_times_every_side_then_works_on_the_one_the_model_runs(tmp_path, monkeypatch):
    loop, ui, files = rivalry_night(tmp_path, monkeypatch, FakeBench())
    # every side's baseline first, then the side the model runs (the plan's s decide on the CPU), its rivals after it
    assert files[:3] == ["kernels/rope_attention.py", "kernels/rotary_embedding.py", "kernels/flash_attention.py"]
    rope_rows = files.count("kernels/rope_attention.py")
    assert rope_rows > 2 and files[3:rope_rows + 2] == ["kernels/rope_attention.py"] * (rope_rows - 1)
    assert "rope_attention waits for its rivals' baselines: the model's shapes decide which side gets the time" \
        in ui.lines
    decided = ui.lines.index("every side of the rivalries timed at the model's shapes; time by Amdahl now:")
    assert ui.lines[decided + 1].startswith("  rope_attention: 100% of the time left")
    assert any(line.startswith("  flash_attention: a rival of rope_attention, which the model runs faster now: "
                               "queued last") for line in ui.lines[decided:])
    assert any(line.startswith("flash_attention parked (a rival of rope_attention, which the model runs faster now: "
                               "waits for the time the others leave") for line in ui.lines)
    rope = next(j for j in loop.state.jobs if j["name"] == "rope_attention")
    assert rope["budget_s"] / 3600 == pytest.approx(1.0, rel=0.01)  # the group's time is all its own


def test_rivals_faster_at_the_model_s_shapes_get_the_night_where_the_plan_guessed_the_other_side(tmp_path,
                                                                                                  monkeypatch):
    """The plan's s put rope_attention ahead (the H200 Qwen3 night's mistake); the baselines in the model say the
    rival pair leaves less of the time, and the night goes to them."""
    loop, ui, files = rivalry_night(tmp_path, monkeypatch, ModelBench())
    assert files[:3] == ["kernels/rope_attention.py", "kernels/rotary_embedding.py", "kernels/flash_attention.py"]
    again = files.index("kernels/rope_attention.py", 1)  # rope_attention again only once its rivals are done
    assert again > 5 and set(files[3:again]) == {"kernels/flash_attention.py", "kernels/rotary_embedding.py"}
    done = {j["name"]: j["status"] for j in loop.state.jobs}
    assert done["flash_attention"] == done["rotary_embedding"] == "done"
    decided = ui.lines.index("every side of the rivalries timed at the model's shapes; time by Amdahl now:")
    assert ui.lines[decided + 1].startswith("  rotary_embedding: ") or ui.lines[decided + 1].startswith(
        "  flash_attention: ")
    assert any(line.startswith("  rope_attention: its rivals") and "run faster in the model now: queued last" in line
               for line in ui.lines[decided:])
