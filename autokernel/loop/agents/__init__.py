"""Pluggable agents: whatever proposes the next change to kernel.py.

An agent gets a `Task` (the kernel, its history, the last bench output, a memory the loop persists
for it) and edits kernel.py in place, returning a `Proposal` that describes the edit, or None when it
has nothing left to try. The loop does everything else: committing, benching, keeping or resetting,
and putting back any other file the agent touched.

- builtin: an offline search over the kernel's declared TUNABLES (no LLM, no network);
- command: any coding CLI (claude, codex, aider, ...) run in the repository;
- openai: any OpenAI-compatible chat-completions endpoint (hosted, vLLM, Ollama).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

RECENT_ROWS = 12  # results rows shown to an LLM agent
LOG_TAIL_CHARS = 6000  # of the last bench output shown to an LLM agent
AGENT_NAMES = ("builtin", "command", "openai")


class AgentError(Exception):
    """This one proposal failed (a malformed reply, a CLI that crashed): the experiment is reverted."""


class AgentUnavailable(Exception):
    """The agent cannot work at all (endpoint unreachable, no key, CLI missing): the loop stops."""


@dataclass
class Task:
    root: Path  # repository root; the agent runs here
    kernel_name: str  # e.g. "01_rmsnorm"
    kernel_type: str  # e.g. "rmsnorm"
    experiment: int
    memory: dict  # the agent's own JSON-serialisable state for this kernel, persisted by the loop
    history: list[dict] = field(default_factory=list)  # results.tsv rows of this kernel, oldest first
    last_log: str = ""  # what the harness printed for the last experiment
    seed: int = 0
    model_shapes: list = field(default_factory=list)  # observe(): per-shape times of the experiment observed
    # screen(configs) -> the harness's screen of those configurations of kernel.py (autokernel/harness/screen.py);
    # None where the loop offers none (a stand-in bench)
    screen: Callable[[list[dict]], dict] | None = None
    standing: str = ""  # where the kernel stands (standing()): the LLM agents' prompt carries it
    dtype: str = "fp16"  # the dtype the model runs in: its shapes are timed, and a per-shape table holds, in it

    @property
    def kernel_file(self) -> Path:
        return self.root / "kernel.py"

    @property
    def log_dir(self) -> Path:
        return self.root / "workspace" / "agent_logs"


@dataclass
class Proposal:
    description: str  # one line for the commit message and results.tsv
    meta: dict = field(default_factory=dict)  # handed back to the agent's observe()


class Agent:
    name = "agent"

    def propose(self, task: Task) -> Proposal | None:
        raise NotImplementedError

    def observe(self, task: Task, proposal: Proposal | None, status: str) -> None:
        """Learn the outcome (baseline/keep/revert/crash/timeout) of a proposal; None for the baseline.
        "unchanged": reverted untimed, because the candidate launches exactly what the best launches at every
        timed shape (the harness's launch record): what it changed does not act at these shapes."""

    def finish(self, task: Task) -> Proposal | None:
        """One last change when the loop ends the kernel (kept only if it beats the best), or None."""
        return None


def make_agent(name: str, **options) -> Agent:
    """The agent called `name`; options are its constructor's keyword arguments."""
    if name == "builtin":
        from autokernel.loop.agents.builtin import BuiltinAgent
        return BuiltinAgent()
    if name == "command":
        from autokernel.loop.agents.command import CommandAgent
        return CommandAgent(**options)
    if name == "openai":
        from autokernel.loop.agents.chat import ChatAgent
        return ChatAgent(**options)
    raise ValueError(f"unknown agent {name!r}; use one of {', '.join(AGENT_NAMES)}")


# ------------------------------------------------------------------------------ prompts
def reference_source(root: Path, kernel_type: str) -> str:
    """The `<type>_ref` function from its type's module (autokernel/types/<type>.py), else from the checkout's
    reference.py, read without importing torch."""
    from autokernel import types

    for path in (types.module_path(kernel_type), root / "reference.py"):
        if path is None or not path.is_file():
            continue
        text = path.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name == f"{kernel_type}_ref":
                return ast.get_source_segment(text, node) or ""
    return ""


def _history_table(rows: list[dict]) -> str:
    if not rows:
        return "(no experiments yet)"
    lines = ["exp | status | correctness | latency_us | speedup_vs_pytorch | description", "-|-|-|-|-|-"]
    for r in rows[-RECENT_ROWS:]:
        lines.append(" | ".join(str(r.get(k, "")) for k in (
            "experiment", "status", "correctness", "latency_us", "speedup_vs_pytorch", "description")))
    return "\n".join(lines)


EDIT_INSTRUCTIONS = """Edit kernel.py in place: make ONE focused change that you expect to make it faster while
staying correct. Change no other file. Do not run git; the loop commits, benchmarks and keeps or resets.
End your output with one line `DESCRIPTION: <what you changed and why>`."""

REPLY_INSTRUCTIONS = """Reply with the complete new kernel.py in ONE ```python code block: make ONE focused change
that you expect to make it faster while staying correct. After the block, write one line
`DESCRIPTION: <what you changed and why>`."""


def standing(job: dict, source: str) -> str:
    """Where a kernel stands, for a prompt: its share of the model, its best against the baseline, and per model
    shape its calls, time and distance to the roofline (as the last kept bench measured them), then the tunables
    and variants its file declares with their values now."""
    lines = []
    if job.get("f"):
        lines.append(f"- share of the model's time (the profile): {job['f']:.1%}" + (
            f"; the plan expects {job['gain']:.2f}x end to end from its starter" if job.get("gain") else ""))
    if job.get("best_us") and job.get("baseline_us"):
        peak = f", {job['best_pct_peak']:.0f}% of its roofline" if job.get("best_pct_peak") else ""
        lines.append(f"- best so far: {job['best_us']:.1f} us per forward of the model, "
                     f"{job['baseline_us'] / job['best_us']:.2f}x its baseline{peak}")
    shapes = job.get("best_shapes") or []
    if shapes:
        lines += ["", "| model shape | calls per forward | us per call | % of roofline | eager us | compile us |",
                  "|-|-|-|-|-|-|"]
        lines += [f"| {s.get('shape')} | {s.get('calls')} | {_figure(s.get('us'))} | {_figure(s.get('pct_peak'))} | "
                  f"{_figure(s.get('eager_us'))} | {_figure(s.get('compile_us'))} |" for s in shapes]
    from autokernel.kernelfile import KernelFileError, tunable_space

    try:
        space, now = tunable_space(source)
    except KernelFileError:  # a file that does not parse: the harness's log says so
        space, now = {}, {}
    if space:
        lines += ["", "Tunables and variants the file declares (TUNABLES), with their values now:"]
        lines += [f"- {name} = {now[name]!r} of {values!r}" for name, values in space.items()]
    from autokernel.loop.agents.builtin import TABLE_MARK

    if TABLE_MARK in source:
        lines.append("The file ends with a per-shape table (SHAPE_CONFIGS): at those shapes, in SHAPE_TABLE_DTYPE, its "
                     "values replace the constants above; edit the table to change what the model's shapes run.")
    return "\n".join(lines)


def _figure(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def build_prompt(task: Task, program: str, edit_in_place: bool) -> str:
    """program.md, the current kernel, its reference, the recent results and the last bench output."""
    kernel = task.kernel_file.read_text() if task.kernel_file.is_file() else ""
    log = task.last_log[-LOG_TAIL_CHARS:] if task.last_log else "(none yet)"
    parts = [
        program.strip(),
        f"# Experiment {task.experiment}: kernel {task.kernel_name} (type {task.kernel_type})",
        f"## Where it stands\n{task.standing}" if task.standing else "",
        f"## kernel.py (the best version so far)\n```python\n{kernel.rstrip()}\n```",
        "## The reference it must match\n```python\n"
        f"{reference_source(task.root, task.kernel_type).rstrip()}\n```",
        f"## Recent results of this kernel\n{_history_table(task.history)}",
        f"## Output of the last benchmark\n```\n{log.rstrip()}\n```",
        "## Your task\n" + (EDIT_INSTRUCTIONS if edit_in_place else REPLY_INSTRUCTIONS),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def read_program(root: Path) -> str:
    path = root / "program.md"
    return path.read_text() if path.is_file() else "You optimize one Triton kernel in kernel.py."


_DESCRIPTION = re.compile(r"^\W*DESCRIPTION\W*:\s*(.+?)\s*$", re.M | re.I)


def find_description(text: str, fallback: str) -> str:
    found = _DESCRIPTION.findall(text or "")
    return (found[-1] if found else fallback)[:200]
