"""A Ray cluster: the keep-or-reset loop of each kernel as a Ray task, with work moving only as data.

`orchestrate.py run --ray ADDRESS` (or `--ray local`, which starts Ray here) runs a driver in the
user's repository. Each kernel of the plan becomes one Ray task asking for one GPU (CPU mode, when
the cluster has no GPU or with --device cpu: one CPU). Its arguments are data: the repository at
the queue's base commit as a `git archive` tarball (put in Ray's object store once), the kernel
file's source, the plan entry, the loop settings, and when resuming, the kernel's best source and
loop state. The task unpacks into a temporary directory on its node, makes a git repository there
and runs the ordinary single-kernel loop (autokernel.loop.workers.worker_main, as a --gpus worker does)
in a child process, so the harness is the bundle's own code (autokernel/loop/raynode.py). No shared file
system, no repository and no AutoKernel install on the node, only Python with AutoKernel's
dependencies: the task function itself travels by value, and the openai agent's key variable, if
set, in the task's runtime_env (a command agent's CLI must be installed on the nodes).

The task is a streaming generator: it yields the experiments its loop has settled, each with its
kernel source and commit message, and the loop's output lines. The driver prints the lines and
replays the experiments on branch autokernel/<tag>/<kernel> of the user's repository without
touching its work tree (a commit per experiment on top of the best one, made with git plumbing, so
that `git log` and `git show <sha>` read as after a local run), appends the rows to results.tsv
(worker column `ray:<node ip>[/gpuN]`) and writes workspace/kernels/<kernel>_optimized.py.

Resume. workspace/ray.<tag>.json (written only by the driver, atomically) holds the queue, the
base commit and, per kernel, its last settled loop state and best source. A task lost with its
node (or its worker process killed, or raising) is submitted again by the driver, up to
MAX_RESUBMITS times, with that state: the new task commits the best source onto the branch of a
fresh repository, writes the loop state and the kernel's past rows, and the loop goes on at the
next experiment. This is why the driver resubmits rather than setting Ray's max_retries: a Ray
retry would run the task again with its first arguments, from the baseline. An experiment a loss
interrupted is done again. Applying an experiment is itself resumable: the rows and the new branch
tip are written into the record first ("pending"), then to results.tsv and the branch, so a driver
killed in between finishes the job at its next start. `run --ray ... --tag <tag>` resumes a tag.
"""

from __future__ import annotations

import io
import os
import signal
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

from autokernel import results
from autokernel.loop import LoopConfig, budget
from autokernel.loop.gitlog import KERNEL_PATH, GitLog
from autokernel.loop.raynode import kernel_task
from autokernel.loop.runs import ParallelRun, kernel_rows, queue_entries, read_json, resumed, say_summary, write_record
from autokernel.loop.state import LoopError, StateFile, repo_lock
from autokernel.loop.workers import branch_name, read_queue, run_threads, say

RECORD_FILE = "workspace/ray.{tag}.json"
RAY_HINT = "pip install 'autokernel[ray]' (or pip install 'ray[default]>=2.9')"
MAX_RESUBMITS = 2  # per kernel and run: a task lost with its node is submitted again this often
CONNECT_TIMEOUT_S = 5.0  # seconds to wait for the cluster's address to answer at all
STOP_JOIN_S = 15.0  # seconds Ctrl-C waits for each cancelled task to report before the driver exits


# ------------------------------------------------------------------------------ Ray itself
def import_ray():
    try:
        import ray
    except ImportError:
        raise LoopError(f"--ray needs Ray, which is not installed: {RAY_HINT}") from None
    return ray


def connect(address: str) -> bool:
    """Join the cluster at `address` (`local`: start one here). True when this call started Ray."""
    ray = import_ray()
    if ray.is_initialized():  # a caller (a test, a notebook) has connected already
        return False
    previous = signal.getsignal(signal.SIGTERM)
    try:
        if address == "local":
            ray.init(log_to_driver=False, include_dashboard=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise LoopError(f"cannot reach the Ray cluster at {address!r}: {e}") from None
    finally:
        signal.signal(signal.SIGTERM, previous)  # Ray's exits at once; `kill` stops the tasks as Ctrl-C does
    return True


def check_address(address: str) -> None:
    """A HOST:PORT that nothing answers fails here at once: Ray itself would retry for minutes."""
    import socket

    host, _, port = address.rpartition(":")
    if address in ("local", "auto") or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise LoopError(f"cannot reach the Ray cluster at {address!r} ({e}): is `ray start --head` running "
                        "there, and is this its address (host:port, as `ray status` shows)?") from None


def ship_by_value(ray) -> None:
    """kernel_task and its helpers travel in the task itself, not as modules the node must import."""
    import sys

    from autokernel.harness import processes

    ray.cloudpickle.register_pickle_by_value(sys.modules[kernel_task.__module__])
    ray.cloudpickle.register_pickle_by_value(processes)


def record_path(root: Path, tag: str) -> Path:
    return root / RECORD_FILE.format(tag=tag)


def read_record(root: Path, tag: str) -> dict | None:
    return read_json(record_path(root, tag))


def ray_jobs(root: Path, tag: str) -> list[dict]:
    """Every kernel of a --ray tag as status/report read it (the loop's job fields, local names)."""
    record = read_record(root, tag) or {"jobs": [], "kernels": {}}
    out = []
    for entry in record["jobs"]:
        mine = record["kernels"][entry["name"]]
        job = {**(mine["job"] or {}), **{k: v for k, v in entry.items() if k != "kernel"}}
        job.update(status=mine["status"], reason=mine["reason"], worker=mine["node"], seed=record.get("seed", 0),
                   branch=branch_name(tag, entry["name"]), best_sha=mine["tip"], baseline_sha=mine["baseline"])
        if mine["status"] == "stopped" and (mine["job"] or {}).get("status") == "parked":  # as its loop says it
            job.update(status="parked", reason=mine["job"]["reason"])
        out.append(job)
    return out


def remote_source(source: str) -> str:
    """Where the kernel file lies in the task's repository: its own path, or workspace/kernels/."""
    return f"workspace/kernels/{Path(source).name}" if Path(source).is_absolute() else source


# ------------------------------------------------------------------------------ the driver
class RayDriver:
    """Runs every kernel of the queue as a Ray task and records what they send; see the module docstring."""

    def __init__(self, root: Path, config: LoopConfig, agent: dict, address: str = "local", ui=None,
                 kill_after: dict[str, int] | None = None):
        self.root, self.cfg, self.agent, self.address, self.ui = Path(root).resolve(), config, agent, address, ui
        self.tag = config.tag
        self.kill_after = kill_after or {}  # test hook: kernel -> experiment after which its first task dies
        self.lock = threading.Lock()  # the record, the branches, results.tsv
        self.live: dict[str, object] = {}  # kernel -> its task's generator
        self.stopping = False

    def run(self, plan: str | None = None, kernels: list[str] | None = None) -> str:
        ray = import_ray()  # before anything is written: without Ray, nothing happens
        check_address(self.address)
        with repo_lock(self.root):  # no loop, no --gpus driver and no second --ray driver meanwhile
            self.git = GitLog(self.root)
            self.record = self._load_record(plan, kernels)
            self.record["seed"] = self.cfg.seed  # `orchestrate.py next` shows the same search order
            for name in list(self.record["pending"]):  # a kill between an experiment's record and its row
                self._settle(name)
            todo = [j for j in self.record["jobs"] if self.record["kernels"][j["name"]]["status"] != "done"]
            if not todo:
                return "every kernel is done"
            started = connect(self.address)
            try:
                self._start(ray, todo)
                self._run_tasks(todo)
            finally:
                if started:
                    ray.shutdown()
            return self._summary()

    def _start(self, ray, todo: list[dict]) -> None:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        if self.cfg.device == "cuda" and not gpus:
            raise LoopError("--device cuda, but the Ray cluster has no GPU")
        self.device = "cuda" if gpus and self.cfg.device != "cpu" else "cpu"
        slots = gpus if self.device == "cuda" else int(ray.cluster_resources().get("CPU", 1))
        self.minutes = budget.parallel_minutes(todo, self.cfg.hours, slots, self.cfg.per_kernel_minutes)
        self.deadline = time.time() + self.cfg.hours * 3600
        self.benched = {j["name"]: 0 for j in todo}
        tarball = io.BytesIO()
        self.git.repo.archive(tarball, self.record["base"], format="tar")
        self.bundle = ray.put(tarball.getvalue())
        env = {k: os.environ[k] for k in [self.agent["options"].get("api_key_env")] if k and k in os.environ}
        ship_by_value(ray)
        self.task = ray.remote(kernel_task).options(
            num_gpus=1 if self.device == "cuda" else 0, num_cpus=1, max_retries=0, num_returns="streaming",
            runtime_env={"env_vars": env} if env else None)
        mode = f"{gpus} GPU(s)" if self.device == "cuda" else "CPU mode (no GPU: timings are not figures)"
        self._say(f"Ray cluster: {mode}; {len(todo)} kernel(s) of tag {self.tag} as tasks, minutes per kernel: "
                  + ", ".join(f"{n} {m:.0f}" for n, m in self.minutes.items()))

    def _run_tasks(self, todo: list[dict]) -> None:
        run_threads([threading.Thread(target=self._kernel, args=(j,), daemon=True) for j in todo], self._stop)

    # -------------------------------------------------------------------- the record
    def _load_record(self, plan, kernels) -> dict:
        record = read_record(self.root, self.tag)
        if record is not None and record.get("version") != 1:
            raise LoopError(f"{record_path(self.root, self.tag)} was written by another version; start a new --tag")
        if resumed(record, plan, kernels, self._say) is not None:
            return record
        if read_queue(self.root, self.tag) is not None or StateFile(self.root, self.tag).read() is not None \
                or self.git.branch_exists(f"autokernel/{self.tag}"):
            raise LoopError(f"tag {self.tag} belongs to another loop (--gpus or a single loop); choose another --tag")
        self.git.require_clean()  # the tasks get HEAD: uncommitted edits would not be in it
        jobs = queue_entries(self.root, plan, kernels, self._say)
        names = [j["name"] for j in jobs]
        taken = [branch_name(self.tag, n) for n in names if self.git.branch_exists(branch_name(self.tag, n))]
        if taken:
            raise LoopError(f"branch {taken[0]} exists but no record of tag {self.tag}: choose another --tag")
        record = {"version": 1, "tag": self.tag, "base": self.git.head(), "pending": {},
                  "jobs": [{**j, "kernel": self._read_kernel(j["source"])} for j in jobs],
                  "kernels": {n: {"status": "pending", "reason": "", "node": "", "attempts": 0, "tip": None,
                                  "baseline": None, "best_source": None, "job": None, "next_experiment": 1,
                                  "last_log": ""} for n in names}}
        self._save(record)
        return record

    def _read_kernel(self, source: str) -> str:
        return (Path(source) if Path(source).is_absolute() else self.root / source).read_text()

    def _save(self, record: dict | None = None) -> None:
        write_record(record_path(self.root, self.tag), record or self.record)

    # -------------------------------------------------------------------- one kernel's tasks
    def _kernel(self, job: dict) -> None:
        try:
            self._kernel_tasks(job)
        except Exception as e:  # noqa: BLE001  (one kernel's broken record must not stop the others)
            self._set(job["name"], "failed", f"{type(e).__name__}: {e}")
            _cancel(self.live.get(job["name"]))

    def _kernel_tasks(self, job: dict) -> None:
        """Submit the kernel's task, record what it sends, submit it again when it is lost."""
        import ray

        name, lost = job["name"], 0
        while (why := self._cannot_go(name)) is None:
            with self.lock:
                mine = self.record["kernels"][name]
                mine.update(status="running", attempts=mine["attempts"] + 1)
                self._save()
                self.live[name] = gen = self.task.remote(self.bundle, self._spec(job, first=lost == 0))
            final = None
            try:
                for ref in gen:
                    event = ray.get(ref)
                    self._apply_event(job, event)
                    final = event if event.get("final") else final
            except ray.exceptions.TaskCancelledError:
                return
            except ray.exceptions.RayError as e:
                if self.stopping:
                    return
                lost += 1
                first = (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
                if lost > MAX_RESUBMITS:
                    return self._set(name, "failed", f"task lost {lost} times, last: {first}")
                self._say(f"{name}: its task was lost ({type(e).__name__}: {first}); submitting it again "
                          f"from experiment {self.record['kernels'][name]['next_experiment']}")
                continue
            return self._finish(name, final)
        if self.record["kernels"][name]["status"] != "done":
            self._set(name, "stopped", why)

    def _cannot_go(self, name: str) -> str | None:
        if self.stopping:
            return "interrupted"
        if self.record["kernels"][name]["status"] == "done":
            return "done"
        if time.time() >= self.deadline:
            return f"the {self.cfg.hours:g} h budget is used"
        if self.cfg.max_experiments is not None and self.benched[name] >= self.cfg.max_experiments:
            return f"{self.benched[name]} experiments run (--max-experiments)"
        return None

    def _spec(self, job: dict, first: bool) -> dict:
        name, mine = job["name"], self.record["kernels"][job["name"]]
        left = None if self.cfg.max_experiments is None else self.cfg.max_experiments - self.benched[name]
        config = {**asdict(self.cfg), "tag": f"{self.tag}/{name}", "max_experiments": left, "device": self.device,
                  "per_kernel_minutes": self.minutes[name], "results_path": None, "worker": None}
        resume = None
        if mine["tip"]:
            rows = [dict(r, kernel_file=remote_source(job["source"])) for r in kernel_rows(self.root, self.tag)
                    if r["tag"] == config["tag"]]
            resume = {k: mine[k] for k in ("job", "next_experiment", "last_log")}
            resume.update(source=mine["best_source"], rows=rows)
        return {"config": config, "agent": self.agent, "source": remote_source(job["source"]),
                "kernel": job["kernel"], "entry": {k: job.get(k) for k in ("f", "s", "gain")},
                "deadline": self.deadline, "resume": resume,
                "kill_after": self.kill_after.get(name) if first else None}

    def _set(self, name: str, status: str, reason: str) -> None:
        with self.lock:
            self.record["kernels"][name].update(status=status, reason=reason)
            self._save()
        if status == "failed":
            self._say(f"{name}: {reason}")

    def _finish(self, name: str, final: dict | None) -> None:
        mine = self.record["kernels"][name]
        if (mine["job"] or {}).get("status") == "done":
            return self._set(name, "done", mine["job"].get("reason", ""))
        if final and final["rc"] not in (0, 130):
            self._say("\n".join(final["tail"]), prefix=f"{final['node']} {name}")
            last = (final["tail"] or ["(no output)"])[-1]
            return self._set(name, "failed", f"its loop stopped with exit code {final['rc']}: {last}")
        why = next((x for x in reversed(final["tail"] if final else []) if x.startswith("loop stopped: ")), "")
        self._set(name, "stopped", self._cannot_go(name) or why[len("loop stopped: "):])

    # -------------------------------------------------------------------- recording what a task sends
    def _apply_event(self, job: dict, event: dict) -> None:
        name = job["name"]
        for line in event.get("log", []):
            self._say(line, prefix=f"{event['node']} {name}")
        if event.get("final") or event.get("job") is None:
            return
        with self.lock:
            mine = dict(self.record["kernels"][name], node=event["node"], job=event["job"],
                        next_experiment=event["next_experiment"], last_log=event["last_log"])
            rows = []
            for row in event["rows"]:
                row = dict(row)
                source, message = row.pop("source"), row.pop("message")
                if row["commit"]:
                    self.benched[name] += 1
                    sha = self._commit(mine["tip"] or self.record["base"], source,
                                       f"{message.rstrip()}\n\nnode: {event['node']}\n")
                    if row["status"] in ("keep", "baseline"):
                        mine.update(tip=sha, best_source=source)
                        mine["baseline"] = mine["baseline"] or sha
                    row["commit"] = sha
                rows.append(dict(row, kernel_file=job["source"]))
            self.record["pending"][name] = {"rows": rows, "entry": mine}
            self._save()
            self._settle(name)

    def _settle(self, name: str) -> None:
        """Rows not yet in results.tsv, the branch, the optimized file; then the record moves on."""
        pending = self.record["pending"][name]
        done = {(r["tag"], r["experiment"]) for r in results.read_rows(self.root / "results.tsv")}
        for row in pending["rows"]:
            if (row["tag"], str(row["experiment"])) not in done:
                results.append_row(row, self.root / "results.tsv")
        mine = pending["entry"]
        if mine["tip"]:
            self.git.repo.git.update_ref(f"refs/heads/{branch_name(self.tag, name)}", mine["tip"])
            best = self.root / "workspace" / "kernels" / f"{name}_optimized.py"
            best.parent.mkdir(parents=True, exist_ok=True)
            best.write_text(mine["best_source"])
        self.record["kernels"][name] = mine
        del self.record["pending"][name]
        self._save()

    def _commit(self, parent: str, source: str, message: str) -> str:
        """A commit of the base tree with kernel.py = `source` on top of `parent`; the work tree,
        the index and HEAD of the user's repository are left alone (a temporary index)."""
        git = self.git.repo.git
        with tempfile.TemporaryDirectory(prefix="autokernel-ray-") as tmp:
            blob_file, msg_file = Path(tmp, "kernel.py"), Path(tmp, "message")
            blob_file.write_text(source)
            msg_file.write_text(message)
            env = {"GIT_INDEX_FILE": str(Path(tmp, "index"))}
            blob = git.hash_object("-w", str(blob_file))
            git.read_tree(self.record["base"], env=env)
            git.update_index("--add", "--cacheinfo", f"100644,{blob},{KERNEL_PATH}", env=env)
            tree = git.write_tree(env=env)
            return git.commit_tree(tree, "-p", parent, "-F", str(msg_file), env=self.git.identity_env())

    # -------------------------------------------------------------------- stopping and the end
    def _stop(self, threads: list[threading.Thread]) -> None:
        """Ctrl-C: cancel the tasks; each undoes the experiment it was running (resumed next time)."""
        self.stopping = True
        self._say("stopping: cancelling the tasks (a resume does their experiments in flight again)")
        for gen in list(self.live.values()):
            _cancel(gen)
        for t in threads:
            t.join(STOP_JOIN_S)

    def _summary(self) -> str:
        done, total = say_summary(ray_jobs(self.root, self.tag), self._say)
        if done == total:
            return f"every kernel is done; best versions in workspace/kernels/, branches autokernel/{self.tag}/*"
        return f"{done} of {total} kernels done; run again with --tag {self.tag} to go on"

    def _say(self, text: str, prefix: str | None = None) -> None:
        say(self.ui, text, prefix)


def _cancel(gen) -> None:
    import ray

    try:
        ray.cancel(gen)
    except Exception:  # noqa: BLE001  (a finished task cannot be cancelled, and need not be)
        pass


# ------------------------------------------------------------------------------ what orchestrate.py reads
class RayRun(ParallelRun):
    """A --ray run (where: the cluster's address): the RayDriver above and its record."""

    stopped = "Ray tasks stopped"
    record_file = RECORD_FILE
    worker_width = 22  # ray:<node ip>/gpuN
    driver = RayDriver

    def heading(self, holder: str | None) -> str:
        return f"tag {self.tag} on Ray: " + (f"the driver is running (pid {holder})" if holder else "no driver running")

    def jobs(self) -> list[dict]:
        return ray_jobs(self.root, self.tag)

    def verify_device(self, device: str | None) -> str | None:
        return None  # the cluster's device is not this machine's: verify.py picks its own
