"""The command agent: any coding CLI (claude, codex, aider, a script of your own) run in the repository.

The prompt (program.md, the kernel, its reference, the recent results, the last bench output) goes
to the command on stdin, or, when the command contains `{prompt_file}`, in a file whose quoted path
replaces the placeholder. The command edits kernel.py in place; the last `DESCRIPTION: ...` line it
prints names the change. It runs in its own process group under a time limit, and everything it
prints is kept in workspace/agent_logs/. A command that exits non-zero or overruns its limit fails
this experiment only; a command the shell cannot find stops the loop.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from autokernel.harness.processes import kill_group, signal_group
from autokernel.loop.agents import (
    Agent,
    AgentError,
    AgentUnavailable,
    Proposal,
    Task,
    build_prompt,
    find_description,
    read_program,
)

AGENT_TIMEOUT_S = 1800  # one edit by a coding CLI; an hour-long edit is a stuck agent
KILL_GRACE_S = 10  # between SIGTERM and SIGKILL when the limit is reached
NOT_FOUND_EXIT = 127  # the shell's code for "command not found"


class CommandAgent(Agent):
    name = "command"

    def __init__(self, command: str, timeout_s: float = AGENT_TIMEOUT_S):
        if not command or not command.strip():
            raise AgentUnavailable("the command agent needs --agent-cmd, e.g. --agent-cmd \"claude -p\"")
        self.command = command
        self.timeout_s = timeout_s

    def propose(self, task: Task) -> Proposal:
        task.log_dir.mkdir(parents=True, exist_ok=True)
        stem = task.log_dir / f"exp{task.experiment:04d}_{task.kernel_name}"
        prompt_file = stem.with_suffix(".prompt.md")
        prompt_file.write_text(build_prompt(task, read_program(task.root), edit_in_place=True))
        log_file = stem.with_suffix(".log")
        uses_file = "{prompt_file}" in self.command
        command = self.command.replace("{prompt_file}", shlex.quote(str(prompt_file)))
        env = {**os.environ, "AUTOKERNEL_PROMPT_FILE": str(prompt_file),
               "AUTOKERNEL_EXPERIMENT": str(task.experiment), "AUTOKERNEL_KERNEL": task.kernel_name}
        with open(log_file, "w") as log:
            log.write(f"$ {command}\n")
            log.flush()
            rc = self._run(command, None if uses_file else prompt_file, log, task.root, env)
        output = log_file.read_text()
        rel = log_file.relative_to(task.root)
        if rc == NOT_FOUND_EXIT:
            raise AgentUnavailable(f"the agent command was not found: {self.command!r} (see {rel})")
        if rc != 0:
            raise AgentError(f"the agent command exited with {rc} (see {rel})")
        return Proposal(find_description(output, "edit by the command agent"), {"log": str(rel)})

    def _run(self, command: str, stdin_file: Path | None, log, cwd: Path, env: dict) -> int:
        stdin = open(stdin_file) if stdin_file else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(command, shell=True, cwd=cwd, env=env, stdin=stdin, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if stdin_file:
                stdin.close()
        try:
            code = proc.wait(timeout=self.timeout_s)
            signal_group(proc.pid)  # what the CLI left running in the background must not edit behind the bench
            return code
        except subprocess.TimeoutExpired:
            kill_group(proc, KILL_GRACE_S)
            raise AgentError(f"the agent command ran past its limit of {self.timeout_s:g} s") from None
        except BaseException:  # Ctrl-C: never leave the CLI editing files behind the loop's back
            kill_group(proc, KILL_GRACE_S)
            raise


