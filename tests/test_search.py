"""The builtin agent's wide search (issue 35): configurations drawn from the whole space, screened at the model's
shapes by successive halving, the fastest proposed as experiments, and a per-shape table the kernel dispatches.

The screen itself (autokernel/harness/screen.py) runs for real here on a small Triton kernel in the interpreter;
the loop's tests use a stand-in screen and bench that time a configuration by its BLOCK (tests/test_model_loop.py).
"""

import json
from pathlib import Path

import pytest
import torch
from helpers import git_env, make_repo, repo_files, rows
from test_model_loop import ARGS, MODEL_KERNEL, SHAPES, TIMES, commit_all, model_bench

from autokernel.harness import screen
from autokernel.kernelfile import import_kernel, tunable_space
from autokernel.loop import Loop, LoopConfig
from autokernel.loop.agents import Proposal, Task, make_agent, search, standing
from autokernel.loop.agents.builtin import TABLE_MARK, apply_table, next_move, position
from autokernel.loop.state import load_jobs
from autokernel.profile.extraction import set_model_shapes

ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------------------ drawing from the whole space


def test_a_screen_draws_combinations_from_the_whole_space_and_never_what_was_seen():
    space, best = tunable_space((ROOT / "kernels" / "fused_mlp.py").read_text())
    seen = {search.key({**best, "BLOCK_M": 64}), search.key({**best, "VARIANT": "tma"})}
    drawn = search.draw(space, best, seed=0, seen=seen, elite=[{**best, "VARIANT": "grouped", "BLOCK_N": 256}])
    keys = [search.key(c) for c in drawn]
    assert drawn[0] == best and len(drawn) == search.SCREEN_SIZE and len(set(keys)) == len(keys)
    assert not set(keys) & seen
    changed = [sum(c[n] != best[n] for n in best) for c in drawn[1:]]
    assert sum(k >= 2 for k in changed) >= len(drawn) // 2  # most change several tunables at once
    variants = {c["VARIANT"] for c in drawn if sum(c[n] != best[n] for n in best) >= 2}
    assert len(variants) == len(space["VARIANT"])  # every variant, each with other tiles
    assert search.draw(space, best, seed=0, seen=seen) == search.draw(space, best, seed=0, seen=seen)


# ------------------------------------------------------------------------------ the agent on a screen
KERNEL = '''"""A stand-in kernel: only VARIANT "b" with BLOCK 128 is fast, and neither move is, alone."""
KERNEL_TYPE = "rmsnorm"
MODEL_SHAPES = [{"M": 64, "N": 128}, {"M": 8, "N": 96}]
MODEL_CALLS = [3, 1]
VARIANT = "a"
BLOCK = 64
WARPS = 4
TUNABLES = {"VARIANT": ["a", "b"], "BLOCK": [32, 64, 128], "WARPS": [4, 8]}


def kernel_fn(x, weight, eps=1e-6):
    return x
'''


def combination_time(config: dict) -> float:
    if config["VARIANT"] == "b":
        return 60.0 if config["BLOCK"] == 128 else 130.0
    return 100.0 + (config["BLOCK"] != 64) * 5 + (config["WARPS"] != 4) * 5


def fake_screen(time_of, calls=(3, 1), seen=None, reached=None):
    """A screen that times each configuration by time_of(config) -> us per call (or a (us, us) per shape); with
    `reached`, the configurations past the first `reached` are left unreached, as a screen out of time leaves them."""
    def run(configs):
        if seen is not None:
            seen.append(configs)
        results = []
        for c in configs:
            us = time_of(c)
            us = list(us) if isinstance(us, tuple) else [us, us]
            results.append({"config": c, "status": "timed", "us": us, "rung": 0, "reason": "",
                            "model_us": sum(k * t for k, t in zip(calls, us))})
        for r in results[reached:] if reached is not None else []:
            r.update(status="unreached", us=[], model_us=None)
        return {"shapes": [{"key": a, "calls": k} for a, k in zip(ARGS, calls)], "results": results}
    return run


def test_the_agent_proposes_the_combination_the_screen_ranks_first_where_no_single_move_gains(tmp_path):
    (tmp_path / "kernel.py").write_text(KERNEL)
    seen = []
    task = Task(root=tmp_path, kernel_name="k", kernel_type="rmsnorm", experiment=1, memory={},
                screen=fake_screen(combination_time, seen=seen))
    agent = make_agent("builtin")
    agent.observe(task, None, "baseline")
    proposal = agent.propose(task)
    config = tunable_space((tmp_path / "kernel.py").read_text())[1]
    assert config == {"VARIANT": "b", "BLOCK": 128, "WARPS": 4}
    assert "from screen 1" in proposal.description and "40.0% faster there" in proposal.description
    assert len(seen) == 1 and len(seen[0]) == 12  # the whole space of this file: 2 x 3 x 2
    log = json.loads((tmp_path / "workspace" / "agent_logs" / "k_screen_1.json").read_text())
    assert len(log["results"]) == 12
    # reverted: the next the screen ranked above the file's own (b, 128 with 8 warps), from the same screen
    (tmp_path / "kernel.py").write_text(KERNEL)
    agent.observe(task, proposal, "revert")
    proposal = agent.propose(task)
    assert len(seen) == 1 and "from screen 1" in proposal.description
    assert tunable_space((tmp_path / "kernel.py").read_text())[1] == {"VARIANT": "b", "BLOCK": 128, "WARPS": 8}


def test_once_the_screens_best_is_kept_its_slower_configurations_are_not_benched(tmp_path):
    """A Qwen3 night on an H200 kept the screen's best (rope_attention folded, 23.8% faster there), then benched the
    two next, which the same screen had timed 1% faster than the old configuration and 30% slower than the new: 90 s
    for two reverts. Kept, the screen's best leaves the rest of its queue but the per-shape table."""
    (tmp_path / "kernel.py").write_text(KERNEL)
    task = Task(root=tmp_path, kernel_name="k", kernel_type="rmsnorm", experiment=1, memory={},
                screen=fake_screen(combination_time))
    agent = make_agent("builtin")
    agent.observe(task, None, "baseline")
    proposal = agent.propose(task)
    assert tunable_space((tmp_path / "kernel.py").read_text())[1] == {"VARIANT": "b", "BLOCK": 128, "WARPS": 4}
    assert [i["kind"] for i in task.memory["queue"]] == ["config", "table"]  # b, 128 with 8 warps: 60 us there too
    agent.observe(task, proposal, "keep")
    assert [i["kind"] for i in task.memory["queue"]] == ["table"]
    assert search.key({"VARIANT": "b", "BLOCK": 128, "WARPS": 8}) in task.memory["passed_over"]
    assert search.key({"VARIANT": "b", "BLOCK": 128, "WARPS": 4}) not in task.memory["passed_over"]
    # the table has nothing to dispatch (one best at both shapes), and the screen timed the whole space of this file:
    # nothing is left worth a bench, where the 8 warps the screen timed no faster came next before
    assert agent.propose(task) is None


def test_the_coordinate_search_makes_no_move_a_screen_timed_far_behind_from_the_same_configuration(tmp_path):
    """A Qwen3 night's rope_attention, between screens, moved to BLOCK_M 32, NUM_STAGES 1 and the "fused" variant
    (1.3-3x slower; seven experiments, 4.4 of 18 minutes) after a screen had timed each of those single moves from the
    same configuration: such a move, 10% slower or more there, is not made again, alone or with another."""
    best = {"VARIANT": "b", "BLOCK": 128, "WARPS": 4}
    timed = [{"config": {**best, **move}, "status": "timed", "model_us": us, "us": [us]}
             for move, us in (({}, 240.0), ({"BLOCK": 64}, 400.0), ({"WARPS": 8}, 250.0), ({"VARIANT": "a"}, 280.0),
                              ({"VARIANT": "a", "BLOCK": 32}, 500.0))]
    assert search.hopeless(timed, best) == {("BLOCK", "64"), ("VARIANT", '"a"')}  # WARPS 8: 4% slower, kept open
    assert search.hopeless(timed[1:], best) == set()  # the screen did not time the configuration itself
    memory = {}
    search.remember(memory, {"shapes": [], "results": timed}, best)
    search.remember(memory, {"shapes": [], "results": [timed[0], {**timed[2], "model_us": 300.0}]}, best)
    memory = json.loads(json.dumps(memory))  # as the state file holds it
    assert memory["hopeless"] == {"of": search.key(best), "pairs": [["BLOCK", "64"], ["VARIANT", '"a"'],
                                                                   ["WARPS", "8"]]}  # screens of one configuration
    pos = position(KERNEL.replace('VARIANT = "a"', 'VARIANT = "b"').replace("BLOCK = 64", "BLOCK = 128"), [])
    assert pos.best == best
    memory["tried"] = [{**best, "BLOCK": 32}]
    assert next_move(pos, memory, seed=0) is None  # every move left holds one of the three
    memory["hopeless"]["of"] = search.key({**best, "WARPS": 8})  # measured from another configuration: not here
    assert next_move(pos, memory, seed=0) is not None


def test_the_coordinate_search_does_not_bench_what_the_screen_passed_over(tmp_path):
    """A move the screen timed no faster than the file's configuration, or saw fail, is no experiment's worth: the
    coordinate search goes on with the moves it did not reach; with the whole space screened and nothing faster,
    the agent has nothing left to try."""
    (tmp_path / "kernel.py").write_text(KERNEL)
    def reached_four(configs):  # the file's own, one timed 0.5% faster, one that fails, one slower; rest unreached
        times = {0: 100.0, 1: 99.5, 3: 125.0}
        out = fake_screen(lambda c: times.get(configs.index(c), 0.0), reached=4)(configs)
        out["results"][2].update(status="failed", us=[], model_us=None)
        return out
    task = Task(root=tmp_path, kernel_name="k", kernel_type="rmsnorm", experiment=1, memory={}, screen=reached_four)
    agent = make_agent("builtin")
    agent.observe(task, None, "baseline")
    proposal = agent.propose(task)
    drawn = [json.loads(k) for k in task.memory["screened"]]
    assert len(drawn) == 4 and set(task.memory["passed_over"]) == {search.key(c) for c in drawn}
    assert proposal is not None and "screen" not in proposal.description  # nothing queued: a coordinate move
    assert search.key(tunable_space((tmp_path / "kernel.py").read_text())[1]) not in task.memory["passed_over"]
    # the whole space screened, nothing 1% faster: nothing is benched again
    (tmp_path / "kernel.py").write_text(KERNEL)
    task = Task(root=tmp_path, kernel_name="k", kernel_type="rmsnorm", experiment=1, memory={},
                screen=fake_screen(lambda c: 100.0 - (c["BLOCK"] == 128) * 0.5))
    agent.observe(task, None, "baseline")
    assert agent.propose(task) is None and len(task.memory["passed_over"]) == 12


def test_a_screen_that_fails_leaves_the_coordinate_search_to_go_on(tmp_path):
    (tmp_path / "kernel.py").write_text(KERNEL)

    def broken(configs):
        raise RuntimeError("the screen failed (exit code 1): boom")
    task = Task(root=tmp_path, kernel_name="k", kernel_type="rmsnorm", experiment=1, memory={}, screen=broken)
    agent = make_agent("builtin")
    agent.observe(task, None, "baseline")
    proposal = agent.propose(task)
    assert proposal is not None and "screen" not in proposal.description
    assert "boom" in task.memory["screen_error"] and not search.wants_screen(task.memory, {})


# ------------------------------------------------------------------------------ the night: screen, keep, table
TABLE_KERNEL = KERNEL.replace('KERNEL_TYPE = "rmsnorm"', 'import torch\n\nKERNEL_TYPE = "rmsnorm"').replace(
    "    return x\n", "    return torch.full((1,), BLOCK)  # which BLOCK ran\n")
OUT_OF_SHARED_MEMORY = ("B=1 Hq=32 Hkv=8 D=128 S=2048 causal=True fp32: kernel_fn ran out of memory on the GPU "
                        "(triton.OutOfResources): 246,016 bytes of shared memory asked, 232,448 the limit")


def test_a_screened_configuration_that_crashed_at_another_shape_comes_back_for_the_models_shapes_alone(tmp_path):
    """The screen times a configuration at the model's shapes in the model's dtype; the stages run it at every shape
    and dtype and it asked more shared memory than the GPU has at one of them (an H100 night lost rope_attention's
    11.9% so). The agent's next proposal is that configuration as a table of the model's shapes, in the model's
    dtype: the file runs it there and its constants everywhere else. Any other crash is not retried."""
    kernel = tmp_path / "kernel.py"
    agent = make_agent("builtin")
    illegal = "RuntimeError: CUDA error: an illegal memory access"
    for reason, retried in ((OUT_OF_SHARED_MEMORY, True), (illegal, False)):
        kernel.write_text(TABLE_KERNEL)
        task = Task(root=tmp_path, kernel_name="k", kernel_type="rmsnorm", experiment=1, memory={}, dtype="fp16",
                    screen=fake_screen(combination_time))
        agent.observe(task, None, "baseline")
        proposal = agent.propose(task)
        assert proposal.meta["config"] == {"VARIANT": "b", "BLOCK": 128, "WARPS": 4}
        kernel.write_text(TABLE_KERNEL)  # the loop's reset
        task.history = [{"status": "crash", "description": f"{proposal.description} ({reason})"}]
        agent.observe(task, proposal, "crash")
        proposal = agent.propose(task)
        assert ("the model's shapes alone" in proposal.description) == retried, proposal.description
    task.history = [{"status": "crash", "description": f"x ({OUT_OF_SHARED_MEMORY})"}]
    agent.observe(task, Proposal("x", {"config": {"VARIANT": "a", "BLOCK": 32, "WARPS": 8}}), "crash")
    assert all(item["kind"] != "model_shapes" for item in task.memory.get("queue", []))  # not from a screen
    kernel.write_text(TABLE_KERNEL)
    task = Task(root=tmp_path, kernel_name="k", kernel_type="rmsnorm", experiment=1, memory={}, dtype="fp16",
                screen=fake_screen(combination_time))
    agent.observe(task, None, "baseline")
    task.history = [{"status": "crash", "description": f"{agent.propose(task).description} ({OUT_OF_SHARED_MEMORY})"}]
    kernel.write_text(TABLE_KERNEL)
    agent.observe(task, Proposal("", {"config": {"VARIANT": "b", "BLOCK": 128, "WARPS": 4}, "screened": True}), "crash")
    proposal = agent.propose(task)
    assert "246,016 bytes of shared memory asked" in proposal.description
    module = import_kernel(kernel)
    for (x, weight), dtype, block in ((ARGS[0], torch.float16, 128), (ARGS[1], torch.float16, 128),
                                      (ARGS[0], torch.float32, 64), ([64, 96], torch.float16, 64)):
        assert module.kernel_fn(torch.zeros(x, dtype=dtype), torch.zeros(weight, dtype=dtype)).item() == block


def test_a_screened_configuration_past_the_time_limit_comes_back_for_the_models_shapes_alone(tmp_path):
    """The stages compile a configuration for every shape and dtype they check; the screen ran it at the model's
    shapes. Past the time limit there (an H100 night lost flash_attention's 7.5% so), it comes back at once as a
    table of the model's shapes, in the model's dtype."""
    kernel = tmp_path / "kernel.py"
    kernel.write_text(TABLE_KERNEL)
    task = Task(root=tmp_path, kernel_name="k", kernel_type="flash_attention", experiment=1, memory={},
                dtype="fp16", screen=fake_screen(combination_time))
    agent = make_agent("builtin")
    agent.observe(task, None, "baseline")
    proposal = agent.propose(task)
    kernel.write_text(TABLE_KERNEL)
    task.history = [{"status": "timeout", "description": f"{proposal.description} (no result within the 120 s time "
                     "limit (a hang?))"}]
    agent.observe(task, proposal, "timeout")
    proposal = agent.propose(task)
    assert "the model's shapes alone (no result within the time limit" in proposal.description
    module, (x, weight) = import_kernel(kernel), ARGS[0]
    assert module.kernel_fn(torch.zeros(x, dtype=torch.float16), torch.zeros(weight)).item() == 128
    assert module.kernel_fn(torch.zeros(x), torch.zeros(weight)).item() == 64  # fp32: the constants


def test_after_a_table_of_the_models_shapes_is_kept_the_search_goes_on_at_those_shapes(tmp_path):
    """Kept, a table of the model's shapes is what the model runs: the file's constants act only at the shapes the
    stages check. An H100 night's search went on moving the constants and got 10 experiments that launched what the
    best launched. Now the screen times each configuration at the model's shapes on the file without the table, and
    each proposal is such a table, its moves named from the table's configuration."""
    kernel = tmp_path / "kernel.py"
    constants, at_model = {"VARIANT": "a", "BLOCK": 64, "WARPS": 4}, {"VARIANT": "b", "BLOCK": 128, "WARPS": 4}
    keys = [json.dumps(a) for a in ARGS]
    kernel.write_text(apply_table(TABLE_KERNEL, {k: at_model for k in keys}, constants, "fp16"))
    assert position(kernel.read_text(), keys).best == at_model
    assert position(kernel.read_text(), keys[:1]).best == constants  # a table of other shapes: the constants
    assert apply_table(TABLE_KERNEL, {k: constants for k in keys}, constants, "fp16") == TABLE_KERNEL  # no entry
    seen_files = []

    def screen_of(configs):
        seen_files.append(kernel.read_text())
        return fake_screen(lambda c: 50.0 if c == {**at_model, "WARPS": 8} else combination_time(c))(configs)
    memory = {"shapes": [{"key": a, "calls": k} for a, k in zip(ARGS, (3, 1))], "tried": [constants, at_model],
              "screens": 1, "screened_at": search.key(constants)}
    task = Task(root=tmp_path, kernel_name="k", kernel_type="rmsnorm", experiment=3, memory=memory, dtype="fp16",
                screen=screen_of)
    proposal = make_agent("builtin").propose(task)
    assert len(seen_files) == 1 and TABLE_MARK not in seen_files[0]
    assert proposal.description.startswith("WARPS 4 -> 8 (from screen 2")
    pos = position(kernel.read_text(), keys)
    assert pos.best == {**at_model, "WARPS": 8} and pos.constants == constants
    module, (x, weight) = import_kernel(kernel), ARGS[1]
    assert module.kernel_fn(torch.zeros(x, dtype=torch.float16), torch.zeros(weight)).item() == 128
    assert module.kernel_fn(torch.zeros(x), torch.zeros(weight)).item() == 64 and module.WARPS == 4


def test_a_screen_that_found_nothing_is_followed_by_another_not_by_twelve_single_moves(tmp_path):
    """A screen that ranks nothing 1% above the file's configuration leaves one coordinate move, then the next
    proposal screens again, drawing what the first did not reach."""
    (tmp_path / "kernel.py").write_text(KERNEL)
    calls = []
    reached_three = fake_screen(lambda c: 100.0, seen=calls, reached=3)
    task = Task(root=tmp_path, kernel_name="k", kernel_type="rmsnorm", experiment=1, memory={}, screen=reached_three)
    agent = make_agent("builtin")
    agent.observe(task, None, "baseline")
    proposal = agent.propose(task)
    assert len(calls) == 1 and "screen" not in proposal.description
    (tmp_path / "kernel.py").write_text(KERNEL)
    task.history = [{"status": "revert", "description": proposal.description}]
    agent.observe(task, proposal, "revert")
    agent.propose(task)
    assert len(calls) == 2 and task.memory["screens"] == 2
    reached = {search.key(c) for c in calls[0][1:3]}
    assert not reached & {search.key(c) for c in calls[1]}


@pytest.fixture
def repo(tmp_path, monkeypatch):
    git_env(monkeypatch)
    return make_repo(tmp_path / "repo", repo_files())


def test_the_night_keeps_the_screens_best_then_a_per_shape_table_each_shape_dispatches(repo):
    # BLOCK 32: 10 x 100 + 20 = 1020 us, 64: 830, 128: 650 per forward; the small shape alone is fastest at 32
    source = set_model_shapes(MODEL_KERNEL.replace("return x", "return BLOCK"), SHAPES, "a test model", [10, 1])
    (repo / "kernels" / "model.py").write_text(source)
    commit_all(repo)
    screens = []
    loop = Loop(repo, LoopConfig(tag="t", max_reverts=3), make_agent("builtin"),
                load_jobs(repo, kernels=["kernels/model.py"]), bench=model_bench,
                screen=fake_screen(lambda c: TIMES[c["BLOCK"]], calls=(10, 1), seen=screens))
    loop.run()
    log = rows(repo)
    assert [r["status"] for r in log[:3]] == ["baseline", "keep", "keep"]
    assert log[1]["description"].startswith("BLOCK 64 -> 128 (from screen 1") and float(log[1]["model_us"]) == 650
    assert log[2]["description"].startswith("per-shape table from screen 1") and float(log[2]["model_us"]) == 620
    assert len(screens) == 1  # not again after the keep: every configuration of the space was screened
    module = import_kernel(repo / "workspace" / "kernels" / "model_optimized.py")
    half = {"dtype": torch.float16}  # the loop's dtype, which the table holds for
    x64, x8 = torch.empty(64, 128, **half), torch.empty(8, 96, **half)
    assert module.kernel_fn(x64, torch.empty(128, **half)) == 128
    assert module.kernel_fn(x8, torch.empty(96, **half)) == 32
    assert module.kernel_fn(x8.float(), torch.empty(96)) == 128  # other dtypes: the constants


def test_the_prompt_says_where_the_kernel_stands_at_each_model_shape():
    job = {"f": 0.42, "gain": 1.31, "best_us": 400.0, "baseline_us": 500.0, "best_pct_peak": 57.4,
           "best_shapes": [{"shape": {"M": 2048, "N": 5632}, "calls": 22, "us": 18.2, "pct_peak": 57.4,
                            "eager_us": 40.0, "compile_us": 21.0}]}
    text = standing(job, (ROOT / "kernels" / "rmsnorm.py").read_text())
    assert "42.0%" in text and "1.25x its baseline" in text and "57% of its roofline" in text
    assert "| {'M': 2048, 'N': 5632} | 22 | 18.2 | 57.4 | 40.0 | 21.0 |" in text
    assert "- VARIANT = 'auto' of ['auto', 'single_pass', 'looped', 'persistent']" in text
    assert "per-shape table" not in text
    tabled = apply_table(TABLE_KERNEL, {json.dumps(ARGS[0]): {"VARIANT": "b", "BLOCK": 128, "WARPS": 4}},
                         {"VARIANT": "a", "BLOCK": 64, "WARPS": 4}, "fp16")
    assert "per-shape table (SHAPE_CONFIGS)" in standing(job, tabled)


# ------------------------------------------------------------------------------ the screen, for real
SCREENED = '''"""A small RMSNorm for the screen's tests: BLOCK 100 does not compile, SCALE 2.0 is wrong."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rmsnorm"
MODEL_SHAPES = [{"M": 8, "N": 96}, {"M": 4, "N": 256}]
MODEL_CALLS = [3, 1]
BLOCK = 256
SCALE = 1.0
TUNABLES = {"BLOCK": [100, 256, 512], "SCALE": [1.0, 2.0]}


@triton.jit
def _rms(x_ptr, w_ptr, y_ptr, N, eps, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(y_ptr + row * N + cols, (x * r * w * scale).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x, weight, eps=1e-6):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)
    _rms[(x2.shape[0],)](x2, weight, y, x2.shape[1], eps, SCALE, BLOCK=BLOCK)
    return y.reshape(x.shape)
'''


def test_the_screen_checks_and_times_each_configuration_at_the_model_shapes(tmp_path):
    path = tmp_path / "kernel.py"
    path.write_text(SCREENED)
    configs = [{"BLOCK": 256, "SCALE": 1.0}, {"BLOCK": 512, "SCALE": 1.0}, {"BLOCK": 256, "SCALE": 2.0},
               {"BLOCK": 100, "SCALE": 1.0}]
    out = screen.run_screen(path, configs, device="cpu", dtype="fp16", seconds=60)
    assert [s["calls"] for s in out["shapes"]] == [3, 1] and out["shapes"][0]["key"] == [[8, 96], [96]]
    got = {json.dumps(r["config"]): r for r in out["results"]}
    assert [r["config"] for r in out["results"]] == configs  # in the order given
    assert got[json.dumps(configs[2])]["status"] == "wrong" and "elements off" in got[json.dumps(configs[2])]["reason"]
    assert got[json.dumps(configs[3])]["status"] == "failed"
    for timed in configs[:2]:
        r = got[json.dumps(timed)]
        assert r["status"] == "timed" and len(r["us"]) == 2 and r["model_us"] == pytest.approx(3 * r["us"][0] +
                                                                                               r["us"][1])
    # the file's own configuration goes on as far as any (when it alone is left, the screen ends)
    assert got[json.dumps(configs[0])]["rung"] == max(r["rung"] for r in out["results"])
    assert path.read_text() == SCREENED  # the file itself is never edited


def test_a_rung_sends_on_the_best_third_the_fastest_at_each_shape_and_the_files_own():
    def r(us):
        return {"status": "timed", "us": us, "model_us": sum(us)}
    results = [r([50, 50]), r([10, 80]), r([40, 40]), r([45, 41]), r([90, 5]), {"status": "wrong", "us": []},
               r([60, 60]), r([1, 1])]
    among = list(range(7))  # the last was timed at an earlier rung and left behind there
    assert screen.rung_survivors(results, among, eta=3) == [0, 1, 2, 3, 4]  # 2, 3 by the model; 1, 4 by a shape; 0


@pytest.mark.slow(25)
def test_a_screen_stopped_on_a_configuration_that_hangs_keeps_what_it_measured(tmp_path):
    path = tmp_path / "kernel.py"
    path.write_text(SCREENED.replace("SCALE = 1.0\n", "SCALE = 1.0\nHANG = False\n").replace(
        '"SCALE": [1.0, 2.0]}', '"SCALE": [1.0, 2.0], "HANG": [False, True]}').replace(
        "    x2 = x.reshape", "    while HANG:\n        pass\n    x2 = x.reshape"))
    configs = [{"BLOCK": 256, "SCALE": 1.0, "HANG": False}, {"BLOCK": 256, "SCALE": 1.0, "HANG": True},
               {"BLOCK": 512, "SCALE": 1.0, "HANG": False}]
    out = screen.run_screen(path, configs, device="cpu", dtype="fp16", seconds=60, timeout=25)
    assert [r["status"] for r in out["results"]] == ["timed", "failed", "unreached"]
    assert out["results"][1]["reason"] == "did not end in time"


def test_orchestrate_next_says_the_agent_screens_then_what_the_screen_queued(tmp_path):
    from autokernel.loop.agents.builtin import describe_next

    (tmp_path / "kernel.py").write_text(KERNEL)
    assert describe_next(KERNEL, {}, 0).startswith("screen up to")
    task = Task(root=tmp_path, kernel_name="k", kernel_type="rmsnorm", experiment=1, memory={},
                screen=fake_screen(combination_time))
    make_agent("builtin")._screen(task, position(KERNEL, []))
    assert describe_next(KERNEL, task.memory, 0).startswith("BLOCK 64 -> 128, VARIANT 'a' -> 'b' (from screen 1")
