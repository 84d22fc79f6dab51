"""What the loop remembers between runs: the kernel queue, each kernel's best, the experiment in flight.

workspace/loop_state.json holds the state of the tag being worked on; switching to another tag moves
the old one aside to workspace/loop_state.<tag>.json. Every write is atomic (a temporary file,
fsync, rename), so a kill leaves either the old state or the new one, never half of each. A lock
file held with flock keeps two loops off one repository; the kernel drops it when the process dies,
so a kill -9 leaves no stale lock behind.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path

from autokernel import results
from autokernel.kernelfile import KernelFileError, declarations, kernel_type, read_source
from autokernel.loop import budget

STATE_FILE = "workspace/loop_state.json"
LOCK_FILE = "workspace/orchestrate.lock"
STATE_VERSION = 1


class LoopError(Exception):
    """The loop cannot start or go on; the message says why and what to do."""


@contextmanager
def repo_lock(root: Path):
    path = root / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the bench or agent children
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise LoopError(f"another loop (pid {owner}) is running on {root}; "
                            "one loop per repository (stop it first, or use another clone)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def lock_holder(root: Path) -> str | None:
    """The pid of the loop running on `root`, or None when none is."""
    path = root / LOCK_FILE
    if not path.exists():
        return None
    with open(path, "r+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read().strip() or "?"
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class StateFile:
    def __init__(self, root: Path, tag: str):
        self.root, self.tag = root, tag
        self.path = root / STATE_FILE
        self.data: dict = {}

    def _archived(self, tag: str) -> Path:
        return self.path.with_name(f"loop_state.{tag.replace('/', '--')}.json")  # --gpus tags are <tag>/<kernel>

    def read(self) -> dict | None:
        """The saved state of this tag, without taking it over."""
        for path in (self.path, self._archived(self.tag)):
            if path.is_file():
                data = json.loads(path.read_text())
                if data.get("tag") == self.tag:
                    return data
        return None

    def load(self) -> bool:
        data = self.read()
        if data is None:
            return False
        if data.get("version") != STATE_VERSION:
            raise LoopError(f"{self.path} was written by another version of the loop; start a new --tag")
        self.data = data
        return True

    def create(self, branch: str, jobs: list[dict], head: str) -> None:
        self.data = {"version": STATE_VERSION, "tag": self.tag, "branch": branch, "head": head,
                     "next_experiment": 1, "jobs": jobs, "inflight": None, "last_log": ""}
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():  # another tag's state is moved aside, not overwritten
            other = json.loads(self.path.read_text()).get("tag")
            if other and other != self.tag:
                os.replace(self.path, self._archived(other))
        write_json_atomic(self.path, self.data)
        archived = self._archived(self.tag)
        if archived.exists():
            archived.unlink()

    @property
    def jobs(self) -> list[dict]:
        return self.data["jobs"]

    def job(self, name: str) -> dict:
        return next(j for j in self.jobs if j["name"] == name)

    def next_job(self) -> dict | None:
        return next_job(self.jobs)


def next_job(jobs: list[dict]) -> dict | None:
    """The kernel being worked on, else the pending one with the most end-to-end gain left (budget.py)."""
    active = [j for j in jobs if j["status"] == "active"]
    pending = [j for j in jobs if j["status"] == "pending"]
    return (active or sorted(pending, key=budget.order(jobs)) or [None])[0]


def unpark(jobs: list[dict]) -> list[dict]:
    """The parked kernels back in the queue for another round: reverts in a row reset, and each gets its
    time share anew when it starts. Returns them."""
    parked = [j for j in jobs if j["status"] == "parked"]
    for job in parked:
        job.update(status="pending", reason="", reverts_in_row=0, budget_s=None)
    return parked


# ------------------------------------------------------------------------------ the queue
def new_job(root: Path, source: str, entry: dict | None = None) -> dict:
    entry = entry or {}
    path = Path(source) if Path(source).is_absolute() else root / source
    try:
        found_type = kernel_type(read_source(path), path.name)
    except KernelFileError as e:
        raise LoopError(str(e)) from None
    rel = str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)
    return {"name": path.stem, "type": found_type, "source": rel, "f": entry.get("f"), "s": entry.get("s"),
            "rival_of": entry.get("rival_of") or [],
            "gain": entry.get("gain"), "time_us": entry.get("time_us"), "floor_us": entry.get("floor_us"),
            "status": "pending", "reason": "",
            "baseline_sha": None, "baseline_us": None, "noise_pct": None, "best_sha": None, "best_us": None,
            "best_pct_peak": None, "best_vs_pytorch": None, "experiments": 0, "kept": 0, "reverts_in_row": 0,
            "seconds": 0.0, "memory": {}}


def load_jobs(root: Path, plan: str | Path | None = None, kernels: list[str] | None = None,
              warn=print) -> list[dict]:
    """The queue from --kernel files, or from the plan (its extracted kernel files, ranked by gain). Where extract.py
    wrote some of the plan's kernels, the others are left out: a starter is timed at its own shapes, not the model's,
    so its share of the night would go where the model is not; only a plan with none extracted falls back to them."""
    if kernels:
        return [new_job(root, k) for k in kernels]
    plan_path = Path(plan) if plan else root / "workspace" / "plan.json"
    if not plan_path.is_absolute():
        plan_path = root / plan_path
    if not plan_path.is_file():
        raise LoopError(f"no plan at {plan_path}: run profile.py (and extract.py) first, or pass --kernel FILE")
    plan = json.loads(plan_path.read_text())
    jobs = []
    entries = plan.get("entries", [])
    starters = not any(_extracted(root, entry) for entry in entries)
    for entry in sorted(entries, key=lambda e: -(e.get("gain") or 0.0)):
        source = plan_kernel_file(root, entry, warn, starters)
        if source is None:
            continue
        # the mode the plan's shares were measured in (profile.py --deploy): the report's estimate is over it
        jobs.append({**new_job(root, source, entry), "deploy": plan.get("deploy", "eager")})
    if not jobs:
        raise LoopError(f"no kernel of {plan_path} has a kernel file: run extract.py first")
    return jobs


def plan_kernel_file(root: Path, entry: dict, warn=print, starters: bool = True) -> str | None:
    """The file the loop optimizes for a plan entry, saying which: the one extract.py recorded, else
    workspace/kernels/NN_<type>.py, else, where `starters`, (with a warning) the starter kernels/<type>.py, which
    times its own shapes instead of the model's. None when there is no file to take."""
    type_ = entry["type"]
    found = _extracted(root, entry)
    if found:
        source = found[0]
        shapes = _declared(root, source).get("MODEL_SHAPES") or []
        planned = [s["shape"] for s in entry.get("shapes", []) if isinstance(s, dict) and s.get("shape")]
        if planned and shapes != planned:
            warn(f"{type_}: {source} does not carry this plan's shapes (extracted from another plan? "
                 "run extract.py again); taken anyway")
        else:
            warn(f"{type_}: {source} ({len(shapes)} model shape(s))")
        return source
    starter = f"kernels/{type_}.py"
    if not starters:
        warn(f"skipped {type_}: not extracted (extract.py --top left it out); extract it, or pass --kernel "
             f"{starter}, to take it")
        return None
    if not _exists(root, starter):
        warn(f"skipped {type_}: no kernel file (run extract.py)")
        return None
    warn(f"warning: {type_}: no extracted kernel in the plan or workspace/kernels (run extract.py); falling back "
         f"to the starter {starter}, which is timed at its own shapes, not the model's")
    return starter


EXTRACTED_DIR = "workspace/kernels"


def _extracted(root: Path, entry: dict) -> list[str]:
    """The files extract.py wrote for a plan entry that exist: the one it recorded, its NN_<type>.py name."""
    return [f for f in (entry.get("kernel_file"), _extracted_name(entry)) if f and _exists(root, f)]


def _extracted_name(entry: dict) -> str | None:
    return f"{EXTRACTED_DIR}/{int(entry['rank']):02d}_{entry['type']}.py" if entry.get("rank") else None


def _path(root: Path, source: str) -> Path:
    return Path(source) if Path(source).is_absolute() else root / source  # never the current directory's


def _exists(root: Path, source: str) -> bool:
    return _path(root, source).is_file()


def _declared(root: Path, source: str) -> dict:
    path = _path(root, source)
    try:
        return declarations(read_source(path), path.name)
    except KernelFileError:
        return {}


def job_row_history(results_path: Path, tag: str, source: str) -> list[dict]:
    return [r for r in results.read_rows(results_path) if r["tag"] == tag and r["kernel_file"] == source]
