"""Parallel experiments on one host: one keep-or-reset loop per GPU, each on its own kernel.

`orchestrate.py run --gpus 0,1` starts a driver here. The driver never touches the main work tree
(only workspace/ and results.tsv); each kernel of the plan gets a git worktree
workspace/worktrees/<tag>/<kernel>, where the ordinary single-kernel loop runs in a child process
(`python -m autokernel.loop.workers`) with CUDA_VISIBLE_DEVICES set to its GPU. That loop's tag is
<tag>/<kernel>, so its branch is autokernel/<tag>/<kernel>, its state and lock live in the worktree,
and its rows (tagged <tag>/<kernel>, worker gpu<N>) go to the main repository's results.tsv, which
results.append_row writes whole under a file lock. Free workers take the pending kernel with the
most end-to-end gain left (the plan's Amdahl order); a worker whose loop stops takes the next one.

Resume. The queue is workspace/workers.<tag>.json (written only by the driver, atomically); each
kernel's progress is its worktree's loop state. Killed at any moment, `run --gpus ... --tag <tag>`
starts the unfinished kernels again first and each loop reconciles the experiment a kill interrupted.
A worker that dies on its own (a signal, an OOM kill) is started again on its kernel, up to
MAX_RESPAWNS times; a worker outlives no driver (PR_SET_PDEATHSIG), so no orphan holds a worktree.

Budgets: --hours bounds the whole run; each kernel gets --per-kernel-minutes (default: its Amdahl share,
autokernel/loop/budget.py, of hours x workers, at most the hours; a type with nothing to gain, or whose rival
side the model runs faster, runs last, until the end); --max-experiments counts benches per kernel in this run.

CPU mode: with no GPU, `--gpus 0,1` still starts two workers; the ids are only labels (the
harness children run on the CPU cores through Triton's interpreter) and timings are not figures.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path

from autokernel.loop import Loop, LoopConfig, budget
from autokernel.loop.gitlog import KERNEL_PATH, GitLog, is_artifact
from autokernel.loop.runs import ParallelRun, queue_entries, read_json, resumed, say_summary, write_record
from autokernel.loop.state import LoopError, StateFile, lock_holder, new_job, repo_lock

QUEUE_FILE = "workspace/workers.{tag}.json"
WORKTREES = "workspace/worktrees"  # one worktree per kernel, under <tag>/
WORKER_LOGS = "workspace/workers"  # each worker's full output, <tag>/<kernel>.log
MAX_RESPAWNS = 2  # per kernel and run: a worker killed from outside is started again this often
STOP_GRACE_S = 5.0  # seconds a worker gets to stop on Ctrl-C before it is sent SIGTERM
STOP_LIMIT_S = 120.0  # seconds after SIGTERM before SIGKILL (the loop undoes its experiment first)
PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)


def say(ui, text: str, prefix: str | None = None) -> None:
    """A driver's line on the live display (none in tests), with the worker's name in colour."""
    if ui is None:
        return
    from rich.markup import escape

    ui.print(f"[cyan]{escape(f'[{prefix}]')}[/cyan] {escape(text)}" if prefix else text)


def run_threads(threads: list, stop) -> None:
    """Start the threads and wait for them all; on Ctrl-C, stop(threads) and re-raise."""
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # short waits: Ctrl-C reaches the main thread only between them
    except KeyboardInterrupt:
        stop(threads)
        raise


# ------------------------------------------------------------------------------ names and places
def parse_gpus(text: str, env: dict | None = None) -> list[str]:
    """`0,1,3` or `all` -> the worker ids. `all` counts the visible GPUs; without one, name the ids."""
    env = os.environ if env is None else env
    if text.strip() == "all":
        visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        count = len(visible) if visible else _cuda_count()
        if not count:
            raise LoopError("--gpus all: no GPU is visible; in CPU mode name the workers, e.g. --gpus 0,1")
        return [str(i) for i in range(count)]
    ids = [g.strip() for g in text.split(",") if g.strip()]
    if not ids or len(set(ids)) != len(ids):
        raise LoopError(f"--gpus {text!r}: give distinct GPU ids, e.g. 0,1,2,3, or all")
    return ids


def _cuda_count() -> int:
    from autokernel.harness.gpu import has_cuda

    if not has_cuda():
        return 0
    import torch

    return torch.cuda.device_count()


def device_for(gpu: str, env: dict) -> str:
    """What CUDA_VISIBLE_DEVICES the worker gets: id N of the GPUs this process sees, not of the host."""
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[int(gpu)] if gpu.isdigit() and int(gpu) < len(visible) else gpu


def queue_path(root: Path, tag: str) -> Path:
    return root / QUEUE_FILE.format(tag=tag)


def worktree_path(root: Path, tag: str, name: str) -> Path:
    return root / WORKTREES / tag / name


def branch_name(tag: str, name: str) -> str:
    return f"autokernel/{tag}/{name}"


def kernel_state(root: Path, tag: str, name: str) -> dict | None:
    """The worker loop's saved state of one kernel, or None before its loop started."""
    return StateFile(worktree_path(root, tag, name), f"{tag}/{name}").read()


def read_queue(root: Path, tag: str) -> dict | None:
    return read_json(queue_path(root, tag))


# ------------------------------------------------------------------------------ what status/report read
def worker_jobs(root: Path, tag: str) -> list[dict]:
    """Every kernel of the queue as its loop sees it, plus worker, branch and whether it runs now."""
    queue = read_queue(root, tag) or {"jobs": [], "assigned": {}}
    out = []
    for entry in queue["jobs"]:
        state = kernel_state(root, tag, entry["name"])
        job = dict(state["jobs"][0], seed=state.get("seed", 0)) if state else dict(entry, status="pending", reason="")
        job["worker"] = queue["assigned"].get(entry["name"], "")
        job["branch"] = branch_name(tag, entry["name"])
        wt = worktree_path(root, tag, entry["name"])
        job["pid"] = lock_holder(wt) if wt.is_dir() else None
        job.setdefault("reason", "")
        if job["pid"]:
            job["status"], job["reason"] = "running", f"on {job['worker']} (pid {job['pid']})"
        out.append(job)
    return out


def worker_rates(rows: list[dict]) -> dict[str, tuple[int, float | None]]:
    """Per worker (and "all"): experiments logged and experiments per hour between its first and last
    row (n - 1 intervals: the first row lands one experiment after the worker started)."""
    from datetime import datetime

    groups = {"all": rows} | {w: [r for r in rows if r["worker"] == w] for w in sorted({r["worker"] for r in rows})}
    out = {}
    for worker, mine in groups.items():
        stamps = sorted(datetime.fromisoformat(r["timestamp"]).timestamp() for r in mine if r["timestamp"])
        span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
        out[worker] = (len(mine), 3600.0 * (len(stamps) - 1) / span if span > 0 else None)
    return out


# ------------------------------------------------------------------------------ the driver
class Driver:
    """Runs one worker per GPU over the queue; see the module docstring."""

    def __init__(self, root: Path, config: LoopConfig, agent: dict, gpus: list[str], ui=None):
        self.root, self.cfg, self.agent, self.gpus, self.ui = Path(root).resolve(), config, agent, gpus, ui
        self.tag = config.tag
        self.lock = threading.Lock()  # the queue file, git worktree commands, the todo list
        self.children: dict[str, subprocess.Popen] = {}
        self.stopping = False
        self.started = time.time()

    def run(self, plan: str | None = None, kernels: list[str] | None = None) -> str:
        with repo_lock(self.root):  # no single loop and no second driver on this repository meanwhile
            self.git = GitLog(self.root)
            self.queue = self._load_queue(plan, kernels)
            todo = [j for j in self.queue["jobs"] if not _is_done(kernel_state(self.root, self.tag, j["name"]))]
            if not todo:
                return "every kernel is done"
            started = [j for j in todo if kernel_state(self.root, self.tag, j["name"])]
            fresh = sorted((j for j in todo if j not in started), key=budget.order(todo))
            self.todo = deque(started + fresh)  # resume first, then by the gain left (loop/budget.py)
            self.respawns = {j["name"]: 0 for j in todo}
            self.minutes = budget.parallel_minutes(todo, self.cfg.hours, len(self.gpus), self.cfg.per_kernel_minutes)
            self._say(f"{len(self.gpus)} worker(s) on {len(todo)} kernel(s) of tag {self.tag}, minutes per kernel: "
                      + ", ".join(f"{n} {m:.0f}" for n, m in self.minutes.items())
                      + f"; logs in {WORKER_LOGS}/{self.tag}/")
            self._run_workers()
            return self._summary()

    def _run_workers(self) -> None:
        run_threads([threading.Thread(target=self._worker, args=(g,), daemon=True) for g in self.gpus], self._stop)

    # -------------------------------------------------------------------- the queue
    def _load_queue(self, plan, kernels) -> dict:
        queue = resumed(read_queue(self.root, self.tag), plan, kernels, self._say)
        if queue is not None:
            return queue
        if StateFile(self.root, self.tag).read() is not None or self.git.branch_exists(f"autokernel/{self.tag}"):
            raise LoopError(f"tag {self.tag} belongs to a single loop (branch autokernel/{self.tag}); "
                            "choose another --tag for --gpus")
        self.git.require_clean()  # the worktrees start from HEAD: uncommitted edits would not be in them
        queue = {"version": 1, "tag": self.tag, "base": self.git.head(), "gpus": self.gpus,
                 "jobs": queue_entries(self.root, plan, kernels, self._say), "assigned": {}}
        self._save_queue(queue)
        return queue

    def _save_queue(self, queue: dict) -> None:
        write_record(queue_path(self.root, self.tag), queue)

    def _take(self, gpu: str) -> dict | None:
        with self.lock:
            if self.stopping or not self.todo or self._hours_left() <= 0:
                return None
            job = self.todo.popleft()
            self.queue["assigned"][job["name"]] = f"gpu{gpu}"
            self._save_queue(self.queue)
            return job

    def _hours_left(self) -> float:
        return self.cfg.hours - (time.time() - self.started) / 3600

    # -------------------------------------------------------------------- one worker
    def _worker(self, gpu: str) -> None:
        while (job := self._take(gpu)) is not None:
            try:
                rc = self._run_kernel(gpu, job)
            except Exception as e:  # noqa: BLE001  (one kernel's broken worktree must not stop the others)
                self._say(f"gpu{gpu}: could not run {job['name']}: {e}")
                continue
            state = kernel_state(self.root, self.tag, job["name"])
            self._save_best(job, state)
            if self.stopping or _is_done(state):
                continue
            if rc < 0 and self.respawns[job["name"]] < MAX_RESPAWNS:  # killed from outside: start it again
                self.respawns[job["name"]] += 1
                self._say(f"gpu{gpu}: the worker on {job['name']} died (signal {-rc}); starting it again")
                with self.lock:
                    self.todo.appendleft(job)
            elif rc not in (0, 130):
                self._say(f"gpu{gpu}: the worker on {job['name']} stopped with exit code {rc}; see "
                          f"{self._log_path(job).relative_to(self.root)}")

    def _run_kernel(self, gpu: str, job: dict) -> int:
        with self.lock:
            wt = self._worktree(job)
            source = self._source_in(wt, job["source"])
        config = LoopConfig(**{**asdict(self.cfg), "tag": f"{self.tag}/{job['name']}", "hours": self._hours_left(),
                               "per_kernel_minutes": self.minutes[job["name"]], "worker": f"gpu{gpu}",
                               "results_path": str(self.root / "results.tsv")})
        spec = {"config": asdict(config), "agent": self.agent, "source": source, "parent": os.getpid(),
                "entry": {k: job.get(k) for k in ("f", "s", "gain", "time_us")}}
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": device_for(gpu, os.environ), "PYTHONUNBUFFERED": "1"}
        log = self._log_path(job)
        log.parent.mkdir(parents=True, exist_ok=True)
        with self.lock:
            if self.stopping:
                return 130
            # `-m` from the worktree puts it first on sys.path: the worker runs the worktree's own code
            proc = subprocess.Popen([sys.executable, "-m", "autokernel.loop.workers", json.dumps(spec)], cwd=wt,
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.children[gpu] = proc
        self._say(f"gpu{gpu}: {job['name']} on {branch_name(self.tag, job['name'])} (pid {proc.pid})")
        with open(log, "a", encoding="utf-8") as sink:
            for line in proc.stdout:
                sink.write(line)
                sink.flush()
                self._say(line.rstrip(), prefix=f"gpu{gpu} {job['name']}")
        return proc.wait()

    def _worktree(self, job: dict) -> Path:
        """The kernel's worktree; made detached at the queue's base (its loop creates the branch)."""
        wt = worktree_path(self.root, self.tag, job["name"])
        if not (wt / ".git").exists():
            self.git.repo.git.worktree("prune")
            if wt.exists():
                shutil.rmtree(wt)
            self.git.repo.git.worktree("add", "--detach", str(wt), self.queue["base"])
        return wt

    def _source_in(self, wt: Path, source: str) -> str:
        """The kernel file as the worker's loop names it: tracked files are in the worktree already;
        an artifact (workspace/kernels/ from extract.py) is copied there; anything else by full path."""
        path = Path(source) if Path(source).is_absolute() else self.root / source
        if Path(source).is_absolute() or (wt / source).is_file():
            return source
        if is_artifact(source):
            (wt / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, wt / source)
            return source
        return str(path)

    def _save_best(self, job: dict, state: dict | None) -> None:
        best = state and state["jobs"][0].get("best_sha")
        if best:
            path = self.root / "workspace" / "kernels" / f"{job['name']}_optimized.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.git.file_at(best, KERNEL_PATH) + "\n")

    def _log_path(self, job: dict) -> Path:
        return self.root / WORKER_LOGS / self.tag / f"{job['name']}.log"

    # -------------------------------------------------------------------- stopping and the end
    def _stop(self, threads: list[threading.Thread]) -> None:
        """Ctrl-C reached the workers too (one process group); SIGTERM the ones a `kill` did not."""
        with self.lock:
            self.stopping = True
        self._say("stopping: each worker undoes its experiment in flight")
        deadline = time.time() + STOP_GRACE_S
        for sig, limit in ((signal.SIGTERM, STOP_LIMIT_S), (signal.SIGKILL, 10.0)):
            while time.time() < deadline and any(p.poll() is None for p in self.children.values()):
                time.sleep(0.1)
            for p in self.children.values():
                if p.poll() is None:
                    p.send_signal(sig)
            deadline = time.time() + limit
        for t in threads:
            t.join(10.0)

    def _summary(self) -> str:
        done, total = say_summary(worker_jobs(self.root, self.tag), self._say)
        self._say(f"the branches: git branch --list 'autokernel/{self.tag}/*'; one kernel's notebook: "
                  f"git log main..autokernel/{self.tag}/<kernel>")
        if done == total:
            return f"every kernel is done; best versions in workspace/kernels/, branches autokernel/{self.tag}/*"
        return f"{done} of {total} kernels done (budget of this run used); run again to go on"

    def _say(self, text: str, prefix: str | None = None) -> None:
        say(self.ui, text, prefix)


def _is_done(state: dict | None) -> bool:
    return bool(state) and all(j["status"] == "done" for j in state["jobs"])


# ------------------------------------------------------------------------------ what orchestrate.py reads
class WorkersRun(ParallelRun):
    """A --gpus run (where: the GPU ids): the Driver above, its queue and each worktree's loop."""

    stopped = "workers stopped"
    record_file = QUEUE_FILE
    driver = Driver

    def heading(self, holder: str | None) -> str:
        return f"tag {self.tag}: " + (f"workers running (driver pid {holder})" if holder else "no workers running")

    def status_lines(self) -> list[str]:
        lines = super().status_lines()
        for worker, (n, rate) in worker_rates(self.rows()).items():
            lines.append(f"{worker}: {n} experiments" + (f", {rate:.1f} per hour" if rate else ""))
        return lines

    def jobs(self) -> list[dict]:
        return worker_jobs(self.root, self.tag)


# ------------------------------------------------------------------------------ one worker's process
def _die_with_parent(parent: int) -> None:
    """SIGTERM when the driver dies (Linux), so that a killed driver leaves no worker behind."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the driver died before prctl
        sys.exit(130)


def _sigterm(signum, frame):
    raise KeyboardInterrupt  # as orchestrate.py does: the experiment in flight is undone and logged


def worker_main(argv: list[str]) -> int:
    """`python -m autokernel.loop.workers SPEC`: the single-kernel loop in the current worktree."""
    from autokernel.loop.agents import AgentUnavailable, make_agent
    from autokernel.loop.gitlog import GitError
    from autokernel.loop.report import LiveLine

    spec = json.loads(argv[0])
    signal.signal(signal.SIGTERM, _sigterm)
    _die_with_parent(spec["parent"])
    root = Path.cwd()
    config = LoopConfig(**spec["config"])
    try:
        agent = make_agent(spec["agent"]["name"], **spec["agent"]["options"])
        jobs = None if StateFile(root, config.tag).read() else [new_job(root, spec["source"], spec["entry"])]
        with LiveLine() as ui:
            why = Loop(root, config, agent, jobs, ui=ui).run()
            ui.print(f"loop stopped: {why}")
    except (LoopError, GitError, AgentUnavailable) as e:
        print(f"error: {e}", flush=True)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the experiment in flight was undone and logged", flush=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
