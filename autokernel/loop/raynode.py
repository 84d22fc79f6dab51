"""What a Ray task of orchestrate.py run --ray does on its node (the driver is autokernel/loop/raycluster.py).

kernel_task is the task. It runs before any AutoKernel code is on the node: the driver sends it by
value (cloudpickle), and it and its helpers use the standard library only. It unpacks the bundle (the
repository at the queue's base commit, a tarball) into a fresh directory under the node's temporary
directory, and starts `python -m autokernel.loop.raynode SPEC_FILE` there, so that what runs from then on
is the bundle's own code. That process (node_main) makes a git repository of the bundle, writes the
kernel file and, when resuming, commits the best source so far onto the kernel's branch with the
loop's state and past rows, then runs the ordinary single-kernel loop (autokernel.loop.workers.worker_main,
as a --gpus worker does) while a thread reads the loop's results.tsv and state every POLL_S and prints
each settled experiment (its row, kernel source and commit message, and the loop state after it) as
one JSON line on stdout. The task yields those events and the loop's output lines to the driver, then
the loop's exit code. A task cancelled by the driver stops its loop with SIGTERM (the loop undoes its
experiment in flight); a task whose worker process dies takes its loop with it (PR_SET_PDEATHSIG), and
the directory it leaves is removed by the next task on that node.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from autokernel import results
from autokernel.harness.processes import pump
from autokernel.loop.gitlog import KERNEL_PATH, GitLog
from autokernel.loop.state import StateFile

POLL_S = 1.0  # seconds between two looks at the loop's results and state
STOP_LIMIT_S = 60.0  # seconds a cancelled task's loop gets to undo its experiment
LOG_TAIL_LINES = 25  # of the loop's output, sent with its exit code
WORKDIRS = "autokernel-ray"  # under the node's temporary directory: <tag>--<kernel>.<pid>.<random>


# ------------------------------------------------------------------------------ the task: standard library only
def kernel_task(bundle: bytes, spec: dict):
    """Unpack the bundle, run node_main in it, yield its events and log lines, then the exit code."""
    import json
    import queue
    import tarfile

    work = _workdir(spec["config"]["tag"])
    repo, proc = work / "repo", None
    try:
        with tarfile.open(fileobj=io.BytesIO(bundle)) as tar:
            tar.extractall(repo, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        node = _node_label()
        (work / "spec.json").write_text(json.dumps({**spec, "parent": os.getpid(), "node": node}))
        # `-m` from the unpacked repository puts it first on sys.path: the node runs the bundle's code
        proc = subprocess.Popen([sys.executable, "-m", "autokernel.loop.raynode", str(work / "spec.json")], cwd=repo,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        lines: queue.Queue = queue.Queue()
        for kind, stream in (("event", proc.stdout), ("log", proc.stderr)):
            put = lambda line, kind=kind: lines.put((kind, line and line.rstrip("\n")))  # noqa: E731
            threading.Thread(target=pump, args=(stream, put), daemon=True).start()
        tail, streams = [], 2
        while streams:
            kind, line = lines.get()
            if line is None:
                streams -= 1
            elif kind == "event":
                yield {**json.loads(line), "node": node}
            else:
                tail = (tail + [line])[-LOG_TAIL_LINES:]
                yield {"log": [line], "node": node}
        yield {"final": True, "rc": proc.wait(), "tail": tail, "node": node}
    finally:
        if proc is not None and proc.poll() is None:  # cancelled: the loop undoes its experiment first
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_LIMIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def _node_label() -> str:
    import ray

    gpus = ray.get_gpu_ids()
    return f"ray:{ray.util.get_node_ip_address()}" + (f"/gpu{','.join(map(str, gpus))}" if gpus else "")


def _workdir(tag: str) -> Path:
    """A fresh directory for this task; those left by tasks whose worker process died are removed."""
    base = Path(tempfile.gettempdir()) / WORKDIRS
    base.mkdir(exist_ok=True)
    for old in base.glob("*.*.*"):
        pid = old.name.split(".")[-2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{tag.replace('/', '--').replace('.', '-')}.{os.getpid()}.", dir=base))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


# ------------------------------------------------------------------------------ the bundle's code
def node_main(argv: list[str]) -> int:
    """`python -m autokernel.loop.raynode SPEC_FILE` in the unpacked repository: the kernel's loop
    (autokernel.loop.workers.worker_main) with a thread that prints each settled experiment as a JSON line
    on stdout; everything else the loop prints goes to stderr."""
    import json

    from autokernel.loop.workers import _die_with_parent, worker_main

    spec = json.loads(Path(argv[0]).read_text())
    _die_with_parent(spec["parent"])  # the task's worker process died (its node too, perhaps): stop
    root, tag = Path.cwd(), spec["config"]["tag"]
    _prepare(root, spec)
    events = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the loop's own output (rich, print) to stderr: stdout carries events only
    sent = [len(spec["resume"]["rows"]) if spec["resume"] else 0]
    stop = threading.Event()

    def report() -> dict:
        event = _settled(root, tag, sent[0])
        if event["rows"]:
            events.write(json.dumps(event) + "\n")
            sent[0] += len(event["rows"])
        return event

    def watch() -> None:
        while not stop.wait(POLL_S):
            _test_kill(spec, root, report())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    hours = max(0.0, (spec["deadline"] - time.time()) / 3600)
    child = {"config": {**spec["config"], "hours": hours, "worker": spec["node"]}, "agent": spec["agent"],
             "source": spec["source"], "parent": spec["parent"], "entry": spec["entry"]}
    try:
        return worker_main([json.dumps(child)])
    finally:
        stop.set()
        watcher.join()
        event = report()  # what the loop settled last, and its final state (a kernel done, say)
        if not event["rows"] and event["job"] is not None:
            events.write(json.dumps(event) + "\n")


def _prepare(root: Path, spec: dict) -> None:
    """A git repository of the unpacked bundle with the kernel file, and the loop's state when resuming."""
    import git

    kernel = root / spec["source"]
    kernel.parent.mkdir(parents=True, exist_ok=True)
    kernel.write_text(spec["kernel"])
    git.Repo.init(root)
    log = GitLog(root)
    log.repo.git.add("-A")
    log.repo.git.commit("-qm", "AutoKernel: the repository as the Ray driver sent it", "--no-verify",
                        env=log.identity_env())
    resume = spec["resume"]
    if resume:
        tag = spec["config"]["tag"]
        log.checkout_branch(f"autokernel/{tag}")
        (root / KERNEL_PATH).write_text(resume["source"])
        sha = log.commit_kernel(f"resume {tag} at experiment {resume['next_experiment']}: the best kept so far")
        state = StateFile(root, tag)
        job = {**resume["job"], "source": spec["source"], "baseline_sha": sha, "best_sha": sha}
        state.create(f"autokernel/{tag}", [job], sha)
        state.data.update(next_experiment=resume["next_experiment"], last_log=resume["last_log"])
        state.save()
        for row in resume["rows"]:  # the agent's history in its prompt
            results.append_row(row, root / "results.tsv")


def _settled(root: Path, tag: str, sent: int) -> dict:
    """The loop's rows after the first `sent` that its state has moved past, each with its kernel
    source and commit message, and that state (read first: it is saved after the row is written)."""
    state = StateFile(root, tag).read()
    if state is None:
        return {"rows": [], "job": None}
    done = [r for r in results.read_rows(root / "results.tsv")
            if r["tag"] == tag and int(r["experiment"]) < state["next_experiment"]][sent:]
    repo = GitLog(root).repo if done else None
    rows = []
    for row in done:
        commit = repo.commit(row["commit"]) if row["commit"] else None
        source = commit.tree[KERNEL_PATH].data_stream.read().decode() if commit else ""
        rows.append(dict(row, source=source, message=commit.message if commit else ""))
    return {"rows": rows, "job": state["jobs"][0], "next_experiment": state["next_experiment"],
            "last_log": state.get("last_log", "")}


def _test_kill(spec: dict, root: Path, event: dict) -> None:
    """Test hook: once experiment `kill_after` is sent and the next one is benching, the task's worker
    process is killed (SIGKILL), as with its node; this loop follows it (PR_SET_PDEATHSIG)."""
    after = spec.get("kill_after")
    if not after or (event.get("next_experiment") or 0) <= after:
        return
    inflight = (StateFile(root, spec["config"]["tag"]).read() or {}).get("inflight") or {}
    if inflight.get("phase") == "bench":
        time.sleep(POLL_S)  # the last event reaches the driver first
        os.kill(spec["parent"], signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(node_main(sys.argv[1:]))
