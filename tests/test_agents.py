"""The three agents on their own: the builtin search, the command agent, the openai agent over HTTP.

The openai agent talks to a real HTTP server on 127.0.0.1 that speaks the chat-completions protocol.
"""

import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from helpers import ChatServer

from autokernel.agents import AgentError, AgentUnavailable, Task, build_prompt
from autokernel.agents.builtin import BuiltinAgent, apply_config, candidates, config_key, tunable_space
from autokernel.agents.chat import ChatAgent, extract_kernel
from autokernel.agents.command import CommandAgent

ROOT = Path(__file__).resolve().parent.parent
DETUNED = {"NUM_WARPS": 1, "CHUNK": 512, "VARIANT": "looped", "ROWS_PER_PROGRAM": 8}


@pytest.fixture
def workdir(tmp_path):
    for name in ("reference.py", "program.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    source = (ROOT / "kernels" / "rmsnorm.py").read_text()
    (tmp_path / "kernel.py").write_text(apply_config(source, DETUNED))
    return tmp_path


def make_task(root, experiment=2, memory=None):
    return Task(root=root, kernel_name="rmsnorm", kernel_type="rmsnorm", experiment=experiment,
                memory={} if memory is None else memory, last_log="latency_us: 812.0\n")


# ------------------------------------------------------------------------------ builtin
def test_apply_config_rewrites_only_the_literals(workdir):
    source = (workdir / "kernel.py").read_text()
    new = apply_config(source, {"VARIANT": "single_pass", "NUM_WARPS": 8})
    changed = [(a, b) for a, b in zip(source.splitlines(), new.splitlines()) if a != b]
    assert len(source.splitlines()) == len(new.splitlines()) and len(changed) == 2
    for (old, line), start in zip(changed, ('VARIANT = "single_pass"  #', "NUM_WARPS = 8  #")):
        assert line.startswith(start) and line.split("#", 1)[1] == old.split("#", 1)[1]  # comment kept
    assert tunable_space(new)[1] == {**tunable_space(source)[1], "VARIANT": "single_pass", "NUM_WARPS": 8}


def test_candidates_move_one_tunable_at_a_time_nearest_first():
    space = {"A": [1, 2, 4, 8], "B": ["x", "y", "z"]}
    order = list(candidates(space, {"A": 2, "B": "y"}, seed=0))
    assert len(order) == len({config_key(c) for c in order}) == 4 * 3 - 1  # all, each once
    first = order[:4]  # the four single moves one step away come before anything else
    assert {config_key(c) for c in first} == {config_key(c) for c in (
        {"A": 1, "B": "y"}, {"A": 4, "B": "y"}, {"A": 2, "B": "x"}, {"A": 2, "B": "z"})}
    assert order[4] == {"A": 8, "B": "y"}  # then two steps away, then pairs
    assert order == list(candidates(space, {"A": 2, "B": "y"}, seed=0))  # seeded
    assert any(list(candidates(space, {"A": 2, "B": "y"}, seed=s))[:4] != first for s in range(1, 20))


def test_candidates_push_a_kept_move_further():
    space = {"A": [1, 2, 4, 8], "B": ["x", "y", "z"]}
    for seed in range(10):  # whatever the shuffle, the kept direction goes first
        assert next(candidates(space, {"A": 4, "B": "y"}, seed, momentum={"A": 1})) == {"A": 8, "B": "y"}


def test_builtin_never_repeats_and_ends_when_exhausted(workdir):
    kernel = workdir / "kernel.py"
    source = re.sub(r"^TUNABLES = \{.*?^\}", 'TUNABLES = {"ROWS_PER_PROGRAM": [8, 4], "NUM_WARPS": [1, 2]}',
                    kernel.read_text(), flags=re.S | re.M)
    kernel.write_text(source)
    agent, task = BuiltinAgent(), make_task(workdir)
    agent.observe(task, None, "baseline")
    seen = [config_key(tunable_space(source)[1])]
    while (proposal := agent.propose(task)) is not None:
        config = tunable_space(kernel.read_text())[1]
        assert config == proposal.meta["config"] and config_key(config) not in seen
        seen.append(config_key(config))
        agent.observe(task, proposal, "revert")
        kernel.write_text(source)  # the loop resets to the best after a revert
    assert len(seen) == 4  # 2 x 2 configurations, then nothing left


def test_builtin_memory_survives_json(workdir):
    agent, task = BuiltinAgent(), make_task(workdir)
    agent.observe(task, None, "baseline")
    proposal = agent.propose(task)
    agent.observe(task, proposal, "keep")
    memory = json.loads(json.dumps(task.memory))  # what the loop's state file holds
    again = BuiltinAgent().propose(make_task(workdir, memory=memory))
    assert again.meta["config"] != proposal.meta["config"]


# ------------------------------------------------------------------------------ prompt and command agent
def test_prompt_has_program_kernel_reference_history_and_log(workdir):
    task = make_task(workdir)
    task.history = [{"experiment": "1", "status": "baseline", "correctness": "PASS", "latency_us": "812",
                     "speedup_vs_pytorch": "1.1", "description": "baseline from kernels/rmsnorm.py"}]
    prompt = build_prompt(task, (workdir / "program.md").read_text(), edit_in_place=True)
    assert "six tiers" in prompt and 'VARIANT = "looped"' in prompt
    assert "def rmsnorm_ref" in prompt and "baseline from kernels/rmsnorm.py" in prompt
    assert "latency_us: 812.0" in prompt and "DESCRIPTION:" in prompt


def test_command_agent_prompt_on_stdin_and_in_a_file(workdir):
    script = "import sys; data = sys.stdin.read(); print('got', len(data)); print('DESCRIPTION: via stdin')"
    agent = CommandAgent(f"{sys.executable} -c \"{script}\"", timeout_s=30)
    proposal = agent.propose(make_task(workdir))
    assert proposal.description == "via stdin"
    log = (workdir / proposal.meta["log"]).read_text()
    assert "got" in log and int(log.split("got ")[1].split()[0]) > 1000
    agent = CommandAgent(f"{sys.executable} -c \"import sys; print('DESCRIPTION:', "
                         f"open(sys.argv[1]).read().count('kernel.py') > 0)\" {{prompt_file}}")
    assert agent.propose(make_task(workdir, experiment=3)).description == "True"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie waits for a reaper, it runs nothing


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_the_command_agent_leaves_nothing_running(workdir):
    pid_file = workdir / "bg.pid"
    agent = CommandAgent(f"sleep 300 & echo $! > {pid_file}; echo DESCRIPTION: left a job behind", timeout_s=30)
    assert agent.propose(make_task(workdir)).description == "left a job behind"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:  # the SIGKILL is sent; its delivery takes a moment
        time.sleep(0.05)
    alive = _alive(pid)
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the agent's background job was still running when the bench would start"


def test_a_group_that_ignores_sigterm_is_killed_after_its_grace():
    """processes.kill_group, as the command agent stops its CLI at the limit: SIGTERM, then SIGKILL."""
    import subprocess

    from autokernel.processes import kill_group, pump

    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline() == "ready\n"  # its SIGTERM handler is in place
    started = time.monotonic()
    kill_group(proc, grace_s=0.5)
    assert proc.returncode == -signal.SIGKILL and time.monotonic() - started < 10
    lines = []
    pump(proc.stdout, lines.append)
    assert lines == [None]  # what is left of the pipe, then its end


def test_command_agent_failures(workdir):
    with pytest.raises(AgentError, match="exited with 3"):
        CommandAgent(f"{sys.executable} -c 'raise SystemExit(3)'").propose(make_task(workdir))
    with pytest.raises(AgentError, match="past its limit"):
        CommandAgent("sleep 30", timeout_s=0.5).propose(make_task(workdir))
    with pytest.raises(AgentUnavailable, match="not found"):
        CommandAgent("no-such-coding-cli-xyz --flag").propose(make_task(workdir))


# ------------------------------------------------------------------------------ openai agent over HTTP
def good_reply(workdir, warps=4):
    code = (workdir / "kernel.py").read_text().replace("NUM_WARPS = 1 ", f"NUM_WARPS = {warps} ")
    return f"More warps hide latency.\n\n```python\n{code}```\n\nDESCRIPTION: NUM_WARPS 1 -> {warps}\n"


@pytest.fixture
def chat(monkeypatch):
    monkeypatch.setenv("AK_TEST_KEY", "sk-test")
    servers = []

    def start(replies):
        servers.append(ChatServer(replies))
        agent = ChatAgent(model="coder", base_url=servers[-1].url, api_key_env="AK_TEST_KEY",
                          backoff_s=0.01, transport="urllib")
        return servers[-1], agent

    yield start
    for s in servers:
        s.close()


def test_openai_good_reply_becomes_kernel_py(workdir, chat):
    server, agent = chat([(200, good_reply(workdir))])
    proposal = agent.propose(make_task(workdir))
    assert proposal.description == "NUM_WARPS 1 -> 4"
    assert tunable_space((workdir / "kernel.py").read_text())[1]["NUM_WARPS"] == 4
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sk-test"
    messages = request["body"]["messages"]
    assert request["body"]["model"] == "coder" and "six tiers" in messages[0]["content"]
    assert 'VARIANT = "looped"' in messages[1]["content"]


def test_openai_malformed_reply_is_an_agent_error(workdir, chat):
    before = (workdir / "kernel.py").read_text()
    server, agent = chat([(200, "I would increase the block size."),
                          (200, "```python\nprint('not a kernel')\n```")])
    for _ in range(2):
        with pytest.raises(AgentError, match="malformed reply"):
            agent.propose(make_task(workdir))
    assert (workdir / "kernel.py").read_text() == before


def test_openai_retries_a_500_then_succeeds(workdir, chat):
    server, agent = chat([(500, "overloaded"), (503, "warming up"), (200, good_reply(workdir, 8))])
    assert agent.propose(make_task(workdir)).description == "NUM_WARPS 1 -> 8"
    assert len(server.requests) == 3


def test_openai_unreachable_or_refused_is_a_clear_error(workdir, chat):
    server, agent = chat([(401, "invalid api key")])
    with pytest.raises(AgentUnavailable, match="HTTP 401.*invalid api key"):
        agent.propose(make_task(workdir))
    assert len(server.requests) == 1  # a refusal is not retried
    url = server.url
    server.close()
    dead = ChatAgent(model="coder", base_url=url, retries=2, backoff_s=0.01, transport="urllib")
    with pytest.raises(AgentUnavailable, match=f"{url} failed 3 times.*cannot reach"):
        dead.propose(make_task(workdir))


def test_openai_package_transport(workdir, chat):
    pytest.importorskip("openai")
    server, agent = chat([(500, "boom"), (200, good_reply(workdir))])
    agent.transport = "openai"
    assert agent.propose(make_task(workdir)).description == "NUM_WARPS 1 -> 4"
    assert len(server.requests) == 2


def test_extract_kernel_picks_the_whole_file():
    kernel = 'KERNEL_TYPE = "rmsnorm"\n\ndef kernel_fn(x, weight, eps=1e-6):\n    return x\n'
    reply = f"```python\nNUM_WARPS = 4\n```\nThe file:\n```python\n{kernel}```"
    assert extract_kernel(reply, "rmsnorm") == kernel
    with pytest.raises(AgentError):
        extract_kernel(reply, "softmax")


def test_builtin_agent_hands_hard_coded_values_back_to_the_kernels_heuristic_first():
    from autokernel.agents.builtin import candidates

    space = {"NUM_WARPS": [0, 1, 2, 4, 8], "CHUNK": [512, 1024, 2048], "VARIANT": ["auto", "looped"]}
    detuned = {"NUM_WARPS": 1, "CHUNK": 512, "VARIANT": "looped"}
    first_three = [c for c, _ in zip(candidates(space, detuned, seed=0), range(3))]
    # all heuristics back together first (each alone may be slower), then one at a time
    assert first_three[0] == {**detuned, "NUM_WARPS": 0, "VARIANT": "auto"}
    assert sorted(first_three[1:], key=str) == sorted([{**detuned, "NUM_WARPS": 0}, {**detuned, "VARIANT": "auto"}],
                                                      key=str)


def test_builtin_agent_moves_tunables_that_changed_nothing_last():
    from autokernel.agents.builtin import candidates

    space = {"PROGRAMS_PER_SM": [1, 2, 3], "CHUNK": [512, 1024, 2048]}
    current = {"PROGRAMS_PER_SM": 2, "CHUNK": 512}
    singles = [c for c, _ in zip(candidates(space, current, seed=0, flat=["PROGRAMS_PER_SM"]), range(4))]
    assert [c["CHUNK"] != 512 for c in singles] == [True, True, False, False]


def test_builtin_agent_learns_which_tunables_made_no_difference(tmp_path):
    from autokernel.agents import Proposal, Task
    from autokernel.agents.builtin import BuiltinAgent

    kernel = tmp_path / "kernel.py"
    kernel.write_text('KERNEL_TYPE = "rmsnorm"\nA = 1\nB = 1\nTUNABLES = {"A": [1, 2], "B": [1, 2]}\n')
    rows = [{"status": "baseline", "latency_us": "100.0"}, {"status": "revert", "latency_us": "100.4"}]
    task = Task(root=tmp_path, kernel_name="k", kernel_type="rmsnorm", experiment=2, memory={}, history=rows)
    agent = BuiltinAgent()
    agent.observe(task, Proposal("A 1 -> 2", {"config": {"A": 2, "B": 1}, "directions": {"A": 1}}), "revert")
    assert task.memory["flat"] == ["A"]
    rows.append({"status": "revert", "latency_us": "150.0"})  # B mattered (it made things worse)
    agent.observe(task, Proposal("B 1 -> 2", {"config": {"A": 1, "B": 2}, "directions": {"B": 1}}), "revert")
    assert task.memory["flat"] == ["A"]
    rows.append({"status": "keep", "latency_us": "80.0"})
    agent.observe(task, Proposal("A, B", {"config": {"A": 2, "B": 2}, "directions": {"A": 1, "B": 1}}), "keep")
    assert task.memory["flat"] == []


def test_builtin_agent_moves_a_tunable_that_launched_nothing_new_no_more_until_a_keep(tmp_path):
    from autokernel.agents import Proposal

    kernel = tmp_path / "kernel.py"
    kernel.write_text('KERNEL_TYPE = "rmsnorm"\nA = 1\nB = 1\nC = 1\n'
                      'TUNABLES = {"A": [1, 2, 3], "B": [1, 2], "C": [1, 2]}\n')
    task = Task(root=tmp_path, kernel_name="k", kernel_type="rmsnorm", experiment=2, memory={})
    agent = BuiltinAgent()
    agent.observe(task, None, "baseline")
    moved = []
    while (proposal := agent.propose(task)) is not None:
        config = proposal.meta["config"]
        moved.append({n for n, v in config.items() if v != 1})
        # A launches nothing new at these shapes: the harness reverts it untimed, the loop says "unchanged"
        agent.observe(task, proposal, "unchanged" if moved[-1] == {"A"} else "revert")
        kernel.write_text(apply_config(kernel.read_text(), {"A": 1, "B": 1, "C": 1}))
    assert moved.count({"A"}) == 1 and not any("A" in m for m in moved if m != {"A"})  # never again, not in pairs
    assert {"B", "C"} in moved  # the others are still searched, together too
    # a keep changes the configuration: A may act there, and is moved again
    agent.observe(task, Proposal("B 1 -> 2", {"config": {"A": 1, "B": 2, "C": 1}, "directions": {"B": 1}}), "keep")
    kernel.write_text(apply_config(kernel.read_text(), {"B": 2}))
    assert task.memory["inert"] == [] and "A" in agent.propose(task).description
