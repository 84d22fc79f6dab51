"""The loop's logic on temporary git repositories, with a stand-in for the harness.

`FakeBench` reads the LATENCY constant of kernel.py and reports a file that does not parse as a
crash, so that these tests check keep/revert, git, results.tsv, resuming and the safety rules in
seconds. The real harness runs in tests/test_orchestrate_harness.py.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FAKE_KERNEL, ChatServer, FakeBench, Lines, git_env, make_repo, repo_files, rows

import orchestrate
from autokernel import results
from autokernel.loop import Loop, LoopConfig, LoopError, decide
from autokernel.loop.agents import make_agent
from autokernel.loop.gitlog import GitLog
from autokernel.loop.state import load_jobs, repo_lock

ROOT = Path(__file__).resolve().parent.parent
@pytest.fixture
def repo(tmp_path, monkeypatch):
    git_env(monkeypatch)
    return make_repo(tmp_path / "repo", repo_files())


def run_loop(repo, agent="builtin", bench=None, **config):
    config.setdefault("max_reverts", 3)
    jobs = load_jobs(repo, kernels=["kernels/fake.py"])
    loop = Loop(repo, LoopConfig(tag="t", **config), make_agent(agent) if isinstance(agent, str) else agent,
                jobs, bench=bench or FakeBench())
    return loop, loop.run()


def branch_shas(repo):
    return [sha for sha, _ in GitLog(repo).log("autokernel/t")]


def test_decide():
    ok = {"status": "pass", "correctness": "PASS", "latency_us": 98.0}
    assert decide(ok, 100.0, 1.0)[0] == "keep"
    assert decide(ok, 100.0, 3.0)[0] == "revert"  # within the noise
    assert decide(ok, None, 1.0) == ("keep", "first correct version")
    assert decide({"status": "fail", "correctness": "FAIL", "failed_stage": "smoke", "reason": "NaN"},
                  100.0, 1.0) == ("revert", "FAIL at smoke: NaN")
    assert decide({"status": "timeout", "reason": "hang"}, 100.0, 1.0) == ("timeout", "hang")


def test_builtin_loop_keeps_improvements_and_git_agrees_with_results(repo):
    loop, why = run_loop(repo)
    assert why == "every kernel is done"
    log = rows(repo)
    assert [r["status"] for r in log][:1] == ["baseline"]
    kept = [r for r in log if r["status"] in ("baseline", "keep")]
    assert [float(r["latency_us"]) for r in kept] == [100, 90, 80]  # each keep beats the last
    assert all(r["status"] == "revert" for r in log if r not in kept)
    shas = branch_shas(repo)
    assert [r["commit"] for r in reversed(kept)] == shas[:len(kept)]  # kept commits are the branch
    assert not {r["commit"] for r in log if r not in kept} & set(shas)  # reverted ones are off it
    subjects = [s for _, s in GitLog(repo).log("autokernel/t")]
    assert subjects[0].startswith(f"exp {kept[-1]['experiment']} fake: LATENCY 90 -> 80 | keep 80.0 us 1.25x")
    assert GitLog(repo).repo.head.commit.author.name == "AutoKernel"  # no identity configured
    assert "LATENCY = 80" in (repo / "workspace/kernels/fake_optimized.py").read_text()
    assert loop.state.jobs[0]["status"] == "done" and loop.state.data["inflight"] is None
    assert GitLog(repo).changes() == {}


def test_the_loop_numbers_on_after_manual_bench_rows(repo):
    bench_row = {"status": "pass", "correctness": "PASS", "kernel_type": "rmsnorm", "description": "by hand"}
    for _ in range(2):  # bench.py run by hand before the night: experiments 1 and 2
        results.append_row(bench_row, repo / "results.tsv")
    run_loop(repo, max_experiments=2)
    numbers = [int(r["experiment"]) for r in rows(repo)]
    assert numbers == [1, 2, 3, 4]
    assert [s for _, s in GitLog(repo).log("autokernel/t")][0].startswith("exp 3 fake: baseline")
    assert results.append_row(bench_row, repo / "results.tsv")["experiment"] == 5  # and bench.py after it
    loop, _ = run_loop(repo, max_experiments=1)  # the resumed loop goes on past the bench row
    assert int(rows(repo)[-1]["experiment"]) == 6 and loop.state.data["next_experiment"] == 7


@pytest.mark.parametrize("ending", ["budget", "ctrl-c", "error"])
def test_run_says_how_to_get_back_from_the_experiment_branch(repo, monkeypatch, capsys, ending):
    from autokernel.harness import runner

    def hook(call):
        if call == 2 and ending == "ctrl-c":
            raise KeyboardInterrupt
        if call == 2 and ending == "error":
            (repo / "reference.py").write_text("# edited while the loop ran\n")
    monkeypatch.setattr(runner, "start_warm", lambda device: False)
    monkeypatch.setattr(runner, "run_bench", FakeBench(hook))
    argv = ["--repo", str(repo), "run", "--kernel", "kernels/fake.py", "--tag", "t", "--max-experiments", "3"]
    assert orchestrate.main(argv) == {"budget": 0, "ctrl-c": 130, "error": 2}[ending]
    assert GitLog(repo).branch() == "autokernel/t"
    lines = [line for line in capsys.readouterr().out.splitlines() if "git checkout main" in line]
    assert len(lines) == 1 and "left on branch autokernel/t" in lines[0] and "_optimized.py" in lines[0]
    if ending == "budget":  # a run started on the branch leaves the checkout where it found it: no line
        assert orchestrate.main(argv) == 0
        assert "git checkout" not in capsys.readouterr().out


def test_max_reverts_and_experiment_budget(repo):
    loop, why = run_loop(repo, max_experiments=2)
    assert why == "2 experiments run (--max-experiments)" and len(rows(repo)) == 2
    loop, why = run_loop(repo, max_reverts=1)  # resumes the tag; reverts park it, only the agent ends it
    assert (loop.state.jobs[0]["status"], loop.state.jobs[0]["reason"]) == ("done", "the agent has nothing left to try")
    assert why == "every kernel is done"
    assert [r["experiment"] for r in rows(repo)] == [str(i) for i in range(1, len(rows(repo)) + 1)]


def two_kernel_repo(repo):
    """A second fake kernel, slower and with its own latencies, so a row benched on the wrong file shows."""
    slow = FAKE_KERNEL.replace("LATENCY = 100", "LATENCY = 300").replace("[120, 100, 90, 80]", "[320, 300, 290, 280]")
    (repo / "kernels" / "slow.py").write_text(slow)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "slow"], cwd=repo, check=True)
    return load_jobs(repo, kernels=["kernels/fake.py", "kernels/slow.py"])


def test_reverts_in_a_row_park_a_kernel_and_time_left_resumes_it(repo):
    said = Lines()
    loop = Loop(repo, LoopConfig(tag="t", max_reverts=1), make_agent("builtin"), two_kernel_repo(repo),
                bench=FakeBench(), ui=said)
    assert loop.run() == "every kernel is done"
    order = [r["kernel_file"] for r in rows(repo)]
    runs = [k for i, k in enumerate(order) if i == 0 or order[i - 1] != k]
    assert runs[:3] == ["kernels/fake.py", "kernels/slow.py", "kernels/fake.py"]  # parked, then resumed
    assert any(line.startswith("fake parked (1 reverts in a row)") for line in said.lines)
    assert any(line.startswith("round 2: ") for line in said.lines)
    latencies = {k: {float(r["latency_us"]) for r in rows(repo) if r["kernel_file"] == k} for k in set(order)}
    assert max(latencies["kernels/fake.py"]) <= 120 and min(latencies["kernels/slow.py"]) >= 280  # each its own file
    assert sorted(min(v) for v in latencies.values()) == [80, 280]  # both searched to the end
    assert [(j["status"], j["reason"]) for j in loop.state.jobs] == [("done", "the agent has nothing left to try")] * 2
    assert "LATENCY = 80" in (repo / "workspace/kernels/fake_optimized.py").read_text()
    assert "LATENCY = 280" in (repo / "workspace/kernels/slow_optimized.py").read_text()
    assert any(s.startswith("fake: back to its best") for _, s in GitLog(repo).log("autokernel/t"))


class OneSidedAgent:
    """Nothing to try on `fake`; on `slow` an endless supply of changes that are never faster."""
    name = "one-sided"

    def propose(self, task):
        from autokernel.loop.agents import Proposal

        if task.kernel_name == "fake":
            return None
        text = task.kernel_file.read_text()
        task.kernel_file.write_text(text + f"# try {task.experiment}\n")
        return Proposal(f"try {task.experiment}")

    def observe(self, *args):
        pass

    def finish(self, task):
        return None


class ScriptedAgent:
    """Proposes the given edits of kernel.py in order (text -> text), then nothing."""
    name = "scripted"

    def __init__(self, *edits):
        self.edits = list(edits)

    def propose(self, task):
        from autokernel.loop.agents import Proposal

        if not self.edits:
            return None
        description, edit = self.edits.pop(0)
        task.kernel_file.write_text(edit(task.kernel_file.read_text()))
        return Proposal(description)

    def observe(self, *args):
        pass

    def finish(self, task):
        return None


def test_a_keep_on_the_gpu_is_confirmed_against_the_best_benched_again(repo):
    class GpuBench(FakeBench):  # the baseline's first bench is one slow measurement, 10% over what it is
        def __call__(self, path, **options):
            result = super().__call__(path, **options)
            slow = 10.0 if self.calls == 1 else 0.0
            return {**result, "cpu_mode": False, "latency_us": result["latency_us"] + slow}

    agent = ScriptedAgent(("a comment, nothing else", lambda text: text + "# nothing\n"),
                          ("LATENCY 100 -> 80", lambda text: text.replace("LATENCY = 100", "LATENCY = 80")))
    bench = GpuBench()
    loop, _ = run_loop(repo, agent=agent, bench=bench)
    log = rows(repo)
    assert [r["status"] for r in log] == ["baseline", "revert", "keep"]
    # the change that does nothing beat the slow baseline by 9%, and lost it when both were benched again
    assert "not confirmed: benched again 100.0 us against the best's 100.0 us" in log[1]["description"]
    assert "confirmed: 20.0% benched again against the best benched again" in log[2]["description"]
    assert bench.calls == 1 + 3 + 3  # each candidate that cleared the bar: the best and itself once more
    assert "LATENCY = 80" in (repo / "workspace/kernels/fake_optimized.py").read_text()
    assert [r["commit"] for r in (log[2], log[0])] == branch_shas(repo)[:2]
    assert GitLog(repo).changes() == {}


def test_on_the_gpu_the_host_cost_is_judged_on_two_benches_of_each(repo):
    class HostBench(FakeBench):  # host 50 us per forward; "# host 90" in the file costs 90; bench 2 spikes +40
        def __call__(self, path, **options):
            result = super().__call__(path, **options)
            host = 90.0 if "# host 90" in Path(path).read_text() else 50.0
            host += 40.0 if self.calls == 2 else 0.0
            return {**result, "cpu_mode": False, "model_host_us": host, "model_timing": "cuda_graph"}

    agent = ScriptedAgent(("LATENCY 100 -> 80", lambda text: text.replace("LATENCY = 100", "LATENCY = 80")),
                          ("LATENCY 80 -> 70, host 90", lambda text: text.replace("LATENCY = 80", "LATENCY = 70")
                           + "# host 90\n"))
    loop, _ = run_loop(repo, agent=agent, bench=HostBench())
    log = rows(repo)
    assert [r["status"] for r in log] == ["baseline", "keep", "revert"]
    # the first bench of the 20 us win said its host cost 40 us more: benched again, it costs what the best does
    assert "confirmed: 20.0% benched again" in log[1]["description"]
    # 10 us saved on the GPU, 40 us more on the host in both of its benches: reverted
    assert "the host's cost per forward grew by 40.0 us, more than the 10.0 us saved (both benched twice)" in \
        log[2]["description"]
    assert "LATENCY = 80" in (repo / "workspace/kernels/fake_optimized.py").read_text()


def test_a_change_that_launches_what_the_best_launches_is_reverted_untimed(repo):
    class FingerprintBench(FakeBench):  # BLOCK "does nothing": the launches depend on LATENCY alone
        def __call__(self, path, same_as=None, **options):
            result = super().__call__(path, **options)
            launched = f"launches at {result['latency_us']:g} us"
            self.asked.append(same_as)
            if same_as == launched:
                return {"status": "unchanged", "correctness": "-", "unchanged": True, "launch_digest": launched,
                        "log": "timing skipped"}
            return {**result, "launch_digest": launched}

    bench = FingerprintBench()
    bench.asked = []
    run_loop(repo, bench=bench, max_experiments=12)
    log = rows(repo)
    untimed = [r for r in log if "not timed" in r["description"]]
    assert untimed and all(r["status"] == "revert" and r["description"].startswith("BLOCK") for r in untimed)
    assert all(r["latency_us"] in ("", None) for r in untimed)
    assert bench.asked[0] is None and "launches at 100 us" in bench.asked[1:]  # the baseline is always timed
    assert [float(r["latency_us"]) for r in log if r["status"] in ("baseline", "keep")] == [100, 90, 80]


def test_a_kernel_whose_agent_is_exhausted_is_not_resumed(repo):
    said = Lines()
    loop = Loop(repo, LoopConfig(tag="t", max_reverts=2, max_experiments=9), OneSidedAgent(), two_kernel_repo(repo),
                bench=FakeBench(), ui=said)
    assert loop.run() == "9 experiments run (--max-experiments)"
    log = rows(repo)
    assert [r["status"] for r in log if r["kernel_file"] == "kernels/fake.py"] == ["baseline"]
    assert [r["kernel_file"] for r in log[1:]] == ["kernels/slow.py"] * 8  # baseline and 7 tries, over 4 rounds
    fake, slow = loop.state.jobs
    assert (fake["status"], fake["reason"]) == ("done", "the agent has nothing left to try")
    assert sum(line.startswith("slow parked (2 reverts in a row)") for line in said.lines) == 3
    assert slow["status"] != "done"


def agent_script(repo):
    """A command agent: a good edit, then a broken one, then an edit that also touches other files."""
    script = repo / "workspace" / "agent.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(r'''
import os, pathlib, sys
prompt = sys.stdin.read()
pathlib.Path("workspace/last_prompt.md").write_text(prompt)
n = int(os.environ["AUTOKERNEL_EXPERIMENT"])
kernel = pathlib.Path("kernel.py")
text = kernel.read_text()
if n == 2:
    kernel.write_text(text.replace("LATENCY = 100", "LATENCY = 60"))
    print("DESCRIPTION: cut the latency")
elif n == 3:
    kernel.write_text(text.replace("def kernel_fn(", "def kernel_fn(("))
    print("DESCRIPTION: a broken edit")
else:
    kernel.write_text(text.replace("LATENCY = 60", "LATENCY = 10"))
    pathlib.Path("reference.py").write_text("def rmsnorm_ref(x, weight, eps=1e-6):\n    return x\n")
    pathlib.Path("notes.txt").write_text("sneaky")
    print("DESCRIPTION: faster by changing the reference")
''')
    return f"{sys.executable} {script}"


def test_command_agent_good_kept_broken_reverted_other_files_put_back(repo):
    reference = (repo / "reference.py").read_text()
    agent = make_agent("command", command=agent_script(repo), timeout_s=60)
    loop, why = run_loop(repo, agent=agent, max_experiments=4)
    statuses = [(r["status"], r["description"]) for r in rows(repo)]
    assert statuses[1] == ("keep", "cut the latency (40.0% faster than 100.0 us)")
    assert statuses[2][0] == "crash" and statuses[2][1].startswith("a broken edit (SyntaxError")
    assert statuses[3] == ("revert", "faster by changing the reference (touched other files: notes.txt, "
                                     "reference.py)")
    assert rows(repo)[3]["commit"] == ""  # never committed
    assert (repo / "reference.py").read_text() == reference and not (repo / "notes.txt").exists()
    assert "LATENCY = 60" in (repo / "kernel.py").read_text()
    assert len(branch_shas(repo)) == 3  # init, baseline, exp 2
    prompt = (repo / "workspace/last_prompt.md").read_text()
    assert "six tiers" in prompt and "LATENCY = 60" in prompt and "cut the latency" in prompt
    assert (repo / "workspace/agent_logs/exp0004_fake.log").is_file()
    # the same edit again and again, never benched: parking it would only spin, so the kernel is done
    assert why == "every kernel is done" and loop.state.jobs[0]["reason"] == \
        "failed: the agent's last 3 changes never reached the harness"


def test_agent_that_commits_by_itself_is_undone(repo):
    script = repo / "workspace" / "commit.sh"
    script.parent.mkdir(exist_ok=True)
    script.write_text("sed -i 's/LATENCY = 100/LATENCY = 70/' kernel.py\n"
                      "git -c user.name=a -c user.email=a@a commit -qam 'agent commit'\necho 'DESCRIPTION: d'\n")
    loop, _ = run_loop(repo, agent=make_agent("command", command=f"sh {script}"), max_experiments=2)
    assert [r["status"] for r in rows(repo)] == ["baseline", "keep"]
    assert [s for _, s in GitLog(repo).log("autokernel/t")][0].startswith("exp 2 fake: d | keep 70.0 us")
    assert "agent commit" not in [s for _, s in GitLog(repo).log("autokernel/t")]


def test_openai_agent_in_the_loop(repo, monkeypatch):
    code = FAKE_KERNEL.replace("LATENCY = 100", "LATENCY = 60")
    server = ChatServer([(200, f"```python\n{code}```\nDESCRIPTION: sixty"), (200, "no code, sorry"),
                         (500, "busy"), (200, f"```python\n{code.replace('= 60', '= 30')}```")])
    try:
        agent = make_agent("openai", model="m", base_url=server.url)
        agent.backoff_s, agent.transport = 0.01, "urllib"
        run_loop(repo, agent=agent, max_experiments=4)
    finally:
        server.close()
    log = rows(repo)
    assert [r["status"] for r in log] == ["baseline", "keep", "revert", "keep"]
    assert log[2]["description"].startswith("(agent failed) (malformed reply")
    assert log[3]["latency_us"] == "30" and "LATENCY = 30" in (repo / "kernel.py").read_text()


def test_ctrl_c_writes_a_last_row_and_resumes(repo):
    def interrupt(call):
        if call == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_loop(repo, bench=FakeBench(interrupt))
    log = rows(repo)
    assert log[-1]["status"] == "revert" and log[-1]["description"].endswith("(interrupted: Ctrl-C)")
    state = json.loads((repo / "workspace/loop_state.json").read_text())
    assert GitLog(repo).changes() == {} and GitLog(repo).head() == state["jobs"][0]["best_sha"]
    assert state["inflight"] is None and state["next_experiment"] == len(log) + 1
    loop, why = run_loop(repo)
    assert why == "every kernel is done"
    assert len({r["experiment"] for r in rows(repo)}) == len(rows(repo))


def test_kill_between_outcome_and_row_loses_nothing(repo, monkeypatch):
    real_append = results.append_row

    def killed(row, path):  # the process dies right after the outcome reached the state file
        if row["status"] == "keep":
            raise SystemExit("kill -9")
        return real_append(row, path)
    monkeypatch.setattr(results, "append_row", killed)
    with pytest.raises(SystemExit):
        run_loop(repo)
    monkeypatch.setattr(results, "append_row", real_append)
    loop, _ = run_loop(repo, max_experiments=0)  # resuming records the keep and stops
    log = rows(repo)
    assert log[-1]["status"] == "keep" and sum(r["status"] == "keep" for r in log) == 1
    assert GitLog(repo).head() == log[-1]["commit"] == loop.state.jobs[0]["best_sha"]


def test_harness_change_stops_the_loop(repo):
    def tamper(call):
        if call == 2:
            with open(repo / "reference.py", "a") as f:
                f.write("# edited while the loop ran\n")
    with pytest.raises(LoopError, match="harness files changed.*reference.py"):
        run_loop(repo, bench=FakeBench(tamper))
    assert GitLog(repo).changes() == {"reference.py": "M"}  # the tree minus the experiment


def test_refuses_a_dirty_tree_and_a_second_loop(repo, capsys):
    (repo / "reference.py").write_text("# local edit\n")
    assert orchestrate.main(["--repo", str(repo), "run", "--kernel", "kernels/fake.py"]) == 2
    assert "uncommitted changes (M reference.py)" in capsys.readouterr().err
    subprocess.run(["git", "checkout", "reference.py"], cwd=repo, check=True)
    with repo_lock(repo):
        assert orchestrate.main(["--repo", str(repo), "run", "--kernel", "kernels/fake.py"]) == 2
    assert f"another loop (pid {os.getpid()}) is running" in capsys.readouterr().err
    assert not (repo / "results.tsv").exists()


def test_status_next_report(repo, capsys):
    plan = {"entries": [{"type": "rmsnorm", "f": 0.4, "s": 2.0, "gain": 1.25, "kernel_file": "kernels/fake.py"}]}
    (repo / "workspace").mkdir(exist_ok=True)
    (repo / "workspace/plan.json").write_text(json.dumps(plan))
    assert orchestrate.main(["--repo", str(repo), "next", "--tag", "t"]) == 0
    assert "next kernel: fake (rmsnorm, kernels/fake.py, 40.0% of the model's time" in capsys.readouterr().out
    loop = Loop(repo, LoopConfig(tag="t", max_experiments=3), make_agent("builtin"),
                load_jobs(repo, repo / "workspace/plan.json"), bench=FakeBench())
    loop.run()
    assert orchestrate.main(["--repo", str(repo), "status"]) == 0
    out = capsys.readouterr().out
    assert "tag t: no loop running" in out and "next experiment 4" in out
    assert orchestrate.main(["--repo", str(repo), "next"]) == 0
    assert "builtin agent's next move: " in capsys.readouterr().out
    assert orchestrate.main(["--repo", str(repo), "report"]) == 0
    out = capsys.readouterr().out
    speedup = 100 / min(float(r["latency_us"]) for r in rows(repo))
    assert f"{1 / (0.6 + 0.4 / speedup):.3f}x over PyTorch" in out  # Amdahl
    assert (repo / "progress.png").read_bytes()[:4] == b"\x89PNG"


def recorded_parallel_runs(repo) -> dict:
    """A single loop's tag s made for real, then its kernel's state and rows recorded again as a --gpus
    run (tag w: fake done, other parked, third pending) and as a --ray run (tag r: fake parked by its loop
    and stopped, other done), as their drivers write them."""
    from autokernel.loop.state import write_json_atomic

    Loop(repo, LoopConfig(tag="s", max_experiments=3), make_agent("builtin"),
         load_jobs(repo, kernels=["kernels/fake.py"]), bench=FakeBench()).run()
    state = json.loads((repo / "workspace/loop_state.json").read_text())
    job, made = state["jobs"][0], rows(repo)
    entries = [{"name": n, "type": "rmsnorm", "source": f"kernels/{n}.py", "f": 0.2, "s": 2.0, "gain": 1.1,
                "time_us": None} for n in ("fake", "other", "third")]
    write_json_atomic(repo / "workspace/workers.w.json", {"version": 1, "tag": "w", "base": state["head"],
                      "gpus": ["0", "1"], "jobs": entries, "assigned": {"fake": "gpu0", "other": "gpu1"}})
    record = {"version": 1, "tag": "r", "base": state["head"], "pending": {}, "seed": 0, "jobs": [], "kernels": {}}
    for name, status, reason in (("fake", "done", "the agent has nothing left to try"),
                                 ("other", "parked", "5 reverts in a row")):
        mine = dict(job, name=name, source=f"kernels/{name}.py", status=status, reason=reason)
        tree = repo / "workspace/worktrees/w" / name / "workspace"
        tree.mkdir(parents=True)
        write_json_atomic(tree / "loop_state.json", dict(state, tag=f"w/{name}", jobs=[mine]))
        ray_mine = dict(mine, status="parked" if name == "fake" else "done", reason="3 reverts in a row"
                        if name == "fake" else "2x over the baseline")
        record["jobs"].append({**entries[name != "fake"], "kernel": FAKE_KERNEL})
        record["kernels"][name] = {"status": "stopped" if name == "fake" else "done", "node": "ray:10.0.0.1/gpu0",
                                   "reason": "" if name == "fake" else "2x over the baseline", "attempts": 1,
                                   "tip": job["best_sha"], "baseline": job["baseline_sha"], "job": ray_mine,
                                   "best_source": FAKE_KERNEL, "next_experiment": 4, "last_log": ""}
        for tag, worker in ((f"w/{name}", f"gpu{name != 'fake':d}"), (f"r/{name}", "ray:10.0.0.1/gpu0")):
            for row in made:
                results.append_row(dict(row, tag=tag, worker=worker, kernel_file=f"kernels/{name}.py"),
                                   repo / "results.tsv")
    write_json_atomic(repo / "workspace/ray.r.json", record)
    return state


def test_status_next_report_read_every_kind_of_run_alike(repo, capsys):
    recorded_parallel_runs(repo)
    assert [type(orchestrate.recorded_run(repo, t)).__name__ for t in "swr"] == ["SingleRun", "WorkersRun", "RayRun"]

    def lines(*args):
        assert orchestrate.main(["--repo", str(repo), *args]) == 0
        return capsys.readouterr().out.splitlines()

    workers = lines("status", "--tag", "w")
    assert workers[0] == "tag w: no workers running"
    assert re.match(r"other +gpu1 +parked \(5 reverts in a row\) +autokernel/w/other +3 exp", workers[2])
    assert re.match(r"third +- +pending +autokernel/w/third +0 exp, 0 kept, no best yet", workers[3])
    assert workers[4].startswith("all: 6 experiments") and workers[5].startswith("gpu0: 3 experiments")
    ray = lines("status", "--tag", "r")
    assert ray[0] == "tag r on Ray: no driver running"
    assert re.match(r"fake +ray:10\.0\.0\.1/gpu0 +parked \(3 reverts in a row\) +autokernel/r/fake", ray[1])
    assert re.match(r"other +ray:10\.0\.0\.1/gpu0 +done +autokernel/r/other .*  2x over the baseline$", ray[2])
    # next: every kernel not done of a parallel run, the one the loop takes next of a single loop
    def next_kernels(tag):
        return [x.split(" (")[0] for x in lines("next", "--tag", tag) if x.startswith("next kernel")]

    assert next_kernels("w") == ["next kernel: other", "next kernel: third"]
    assert next_kernels("r") == ["next kernel: fake"]
    assert lines("next", "--tag", "s")[0].startswith("next kernel: fake (rmsnorm, kernels/fake.py)")
    for tag, runs in (("s", 3), ("w", 6), ("r", 6)):
        report = orchestrate.recorded_run(repo, tag)
        assert len(report.rows()) == runs and lines("report", "--tag", tag)[-1].startswith("progress plot: ")
    assert lines("status")[0] == "tag s: no loop running"  # the single loop's state on disk comes first


def test_kernel_takes_several_files_as_a_shell_glob_gives_them():
    """`--kernel workspace/kernels/R*.py` (the shell hands over every match) and repeated --kernel: all the files."""
    args = orchestrate.parse_args(["run", "--kernel", "R01_a.py", "R04_b.py", "--kernel", "01_rmsnorm.py", "--hours",
                                   "0.1"])
    assert args.kernel == ["R01_a.py", "R04_b.py", "01_rmsnorm.py"] and args.hours == 0.1
