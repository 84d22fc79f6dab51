"""The three ways of running the loop behind one interface, so that orchestrate.py's commands read
the same whichever ran: one process (SingleRun, here), one worker per GPU (autokernel/loop/workers.py,
WorkersRun) and a Ray cluster (autokernel/loop/raycluster.py, RayRun).

A Run starts the loop and reads back what it recorded: the status lines, every kernel as its loop
sees it (the fields of a loop job, status and reason included), the results.tsv rows of the tag, and
the kernels `next` speaks of. The parallel kinds run one single-kernel loop per kernel under the tag
<tag>/<kernel>; what they share (their rows, the newest tag on disk, one line per kernel, the closing
summary) is written once below.
"""

from __future__ import annotations

import json
from pathlib import Path

from autokernel import results
from autokernel.loop import Loop, LoopConfig
from autokernel.loop.report import format_us, state_text
from autokernel.loop.state import STATE_FILE, LoopError, StateFile, load_jobs, lock_holder, next_job, write_json_atomic


class Run:
    """One tag's run of the loop, whichever way it runs."""

    stopped = "loop stopped"  # what the run's last line calls its end

    def __init__(self, root: Path, tag: str, agent=None):
        self.root, self.tag, self.agent = Path(root), tag, agent

    def start(self, config: LoopConfig, plan: str | None, kernels: list[str] | None, ui) -> str:
        """Run (or resume) the loop on the plan or kernel files; returns why it stopped."""
        raise NotImplementedError

    def started(self) -> bool:
        """Whether the tag has a record of this kind (status shows the table only then)."""
        return True

    def status_lines(self) -> list[str]:
        raise NotImplementedError

    def jobs(self) -> list[dict]:
        """Every kernel as its loop sees it (the loop's job fields), in queue order."""
        raise NotImplementedError

    def rows(self) -> list[dict]:
        """The tag's rows of results.tsv."""
        raise NotImplementedError

    def next_jobs(self) -> list[dict]:
        """The kernels `next` speaks of, each with the seed of its agent's search order ("seed")."""
        raise NotImplementedError

    def verify_device(self, device: str | None) -> str | None:
        """The device `run --verify` measures the model on, here: the one the loop ran on."""
        return device


class SingleRun(Run):
    """The loop in this process, on branch autokernel/<tag> of this checkout."""

    def __init__(self, root: Path, tag: str, plan: str | None = None, agent=None):
        super().__init__(root, tag, agent)
        self.plan = plan
        self.state = StateFile(self.root, tag).read()

    def start(self, config, plan, kernels, ui) -> str:
        fresh = resumed(self.state, plan, kernels, ui.print) is None
        jobs = load_jobs(self.root, plan, kernels, warn=ui.print) if fresh else None
        return Loop(self.root, config, self.agent, jobs, ui=ui).run()

    def started(self) -> bool:
        return self.state is not None

    def status_lines(self) -> list[str]:
        holder = lock_holder(self.root)
        lines = [f"tag {self.tag}: " + (f"a loop is running (pid {holder})" if holder else "no loop running")]
        state = self.state
        if state is None:
            return lines + ["no loop has run with this tag yet: start one with `python orchestrate.py run`"]
        lines.append(f"branch {state['branch']} at {state['head'][:10]}; next experiment {state['next_experiment']}")
        if state.get("inflight"):
            f = state["inflight"]
            lines.append(f"in flight: experiment {f['experiment']} on {f['kernel']} ({f['phase']})")
        return lines

    def jobs(self) -> list[dict]:
        if self.state:
            return self.state["jobs"]
        return load_jobs(self.root, self.plan, None) if self.plan else []

    def rows(self) -> list[dict]:
        return [r for r in results.read_rows(self.root / "results.tsv") if r["tag"] == self.tag]

    def next_jobs(self) -> list[dict]:
        """One kernel: the one the loop works on next, else the first parked one of the next round."""
        jobs = self.state["jobs"] if self.state else load_jobs(self.root, self.plan, None)
        job = next_job(jobs) or next_job([dict(j, status="pending") for j in jobs if j["status"] == "parked"])
        return [dict(job, seed=self.state.get("seed", 0) if self.state else 0)] if job else []


def single_loop_tag(root: Path) -> str | None:
    """The tag of the single loop's state on disk (so that a bare `run` resumes it), or None."""
    path = Path(root) / STATE_FILE
    return json.loads(path.read_text()).get("tag") if path.is_file() else None


# ------------------------------------------------------------------------------ what the parallel kinds share
class ParallelRun(Run):
    """One single-kernel loop per kernel side by side, under the tag <tag>/<kernel>, from a driver that
    alone writes the run's record (record_file): --gpus workers and Ray tasks."""

    record_file = ""  # the driver's record, "workspace/<kind>.{tag}.json"
    driver = None  # its class: driver(root, config, agent, where, ui=ui).run(plan, kernels) -> why it stopped
    worker_width = 6  # of the worker column of the status lines

    def __init__(self, root: Path, tag: str, agent: dict | None = None, where=None):
        super().__init__(root, tag, agent)
        self.where = where  # the driver's: the GPU ids, the cluster's address

    @classmethod
    def recorded(cls, root: Path, tag: str) -> bool:
        return (Path(root) / cls.record_file.format(tag=tag)).is_file()

    @classmethod
    def latest_tag(cls, root: Path) -> str | None:
        """The tag of the most recently written record of this kind (what a bare `status` shows)."""
        found = sorted(Path(root).glob(cls.record_file.format(tag="*")), key=lambda p: p.stat().st_mtime)
        return json.loads(found[-1].read_text()).get("tag") if found else None

    def start(self, config, plan, kernels, ui) -> str:
        return self.driver(self.root, config, self.agent, self.where, ui=ui).run(plan, kernels)

    def heading(self, holder: str | None) -> str:
        """The first status line: whether the driver runs (its pid: holder)."""
        raise NotImplementedError

    def status_lines(self) -> list[str]:
        return [self.heading(lock_holder(self.root))] + [kernel_line(job, self.worker_width) for job in self.jobs()]

    def rows(self) -> list[dict]:
        return kernel_rows(self.root, self.tag)

    def next_jobs(self) -> list[dict]:
        """Every kernel not done: they run side by side."""
        return [j for j in self.jobs() if j["status"] != "done"]


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def write_record(path: Path, record: dict) -> None:
    """A driver's record, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record)


def resumed(record: dict | None, plan, kernels, say) -> dict | None:
    """The record (or loop state) of a tag being resumed, saying that --plan/--kernel do not change it."""
    if record is not None and (plan or kernels):
        say(f"tag {record['tag']} exists: resuming its queue (--plan/--kernel apply to a new --tag)")
    return record


def queue_entries(root: Path, plan, kernels, say) -> list[dict]:
    """A new parallel run's kernels, each as the plan names it (one loop per kernel: unique names)."""
    jobs = load_jobs(root, plan, kernels, warn=say)
    names = [j["name"] for j in jobs]
    if len(set(names)) != len(names):
        raise LoopError(f"two kernel files share a name ({', '.join(names)}): rename one")
    return [{k: j[k] for k in ("name", "type", "source", "f", "s", "gain", "time_us", "floor_us",
                                  "rival_of")} for j in jobs]


def kernel_rows(root: Path, tag: str) -> list[dict]:
    """The rows of every kernel's loop of a parallel run: tagged <tag>/<kernel>."""
    return [r for r in results.read_rows(Path(root) / "results.tsv") if r["tag"].startswith(f"{tag}/")]


def kernel_line(job: dict, worker_width: int) -> str:
    """One kernel of a parallel run: worker, state ("parked (why)" as the report says it), branch, progress."""
    best = f"best {format_us(job['best_us'])}" if job.get("best_us") else "no best yet"
    state, why = (state_text("parked", job["reason"]), "") if job["status"] == "parked" else \
        (job["status"], job["reason"])
    return (f"{job['name']:<24} {job['worker'] or '-':<{worker_width}} {state:<8} {job['branch']:<40} "
            f"{job.get('experiments', 0)} exp, {job.get('kept', 0)} kept, {best}  {why}")


def say_summary(jobs: list[dict], say) -> tuple[int, int]:
    """Each kernel's branch, state and experiments to `say`; returns (kernels done, kernels)."""
    for job in jobs:
        where = f", best in workspace/kernels/{job['name']}_optimized.py" if job.get("best_sha") else ""
        say(f"{job['branch']}: {job['status']} {job['reason']}".rstrip() +
            f" ({job.get('experiments', 0)} experiments, {job.get('kept', 0)} kept{where})")
    return sum(j["status"] == "done" for j in jobs), len(jobs)
