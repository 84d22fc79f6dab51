"""The keep-or-reset loop behind orchestrate.py.

For the kernel with the most end-to-end gain left: copy it into kernel.py, commit and bench it (the
baseline); then again and again ask the agent for one change, commit it ("exp N <kernel>: ..."),
bench it in a child process, keep the commit if it is correct and faster than the best kept version
by more than max(1%, the noise measured at the baseline), else reset the branch to the best. On a GPU a
keep is confirmed first: the best kept version and the candidate are benched once more, and the change
stays only if the candidate's slower time still beats the best's faster one by that margin (one slow
measurement of the best would otherwise let a change that does nothing through). A candidate that
launches exactly what the best launches (autokernel/harness/launch_record.py) is reverted untimed. Every
experiment is one results.tsv row carrying its commit (reverted commits stay reachable by sha for
`git show` until git's garbage collection). Only kernel.py may change: whatever else the agent
touched is put back and the experiment counts as reverted.

Parked and done. After --max-reverts in a row, or at the end of its time share, a kernel is parked and
the next one in Amdahl order goes on; when every kernel is parked or done and time is left, the parked
ones go round again (reverts in a row reset, the time left shared anew: budget.py), each starting from
its best (a "back to its best" commit). A kernel is done for good at the target speedup or fraction of
peak, when the agent has nothing left to try, when it never had a correct version or its last changes
never reached the harness, or after --per-kernel-minutes. The agent's one last move (Agent.finish)
comes when a kernel is done, or, for the others, once the time or benches left only cover those moves.

Crash safety. workspace/loop_state.json (written atomically) holds the queue, each kernel's best
commit, and the experiment in flight. An experiment's outcome is written there before its row goes
to results.tsv and before the state moves on, so a restart after kill -9 at any moment either finds
the outcome and finishes recording it, or finds none and resets the branch to the best commit and
does the experiment again: no kept experiment is lost, no unrecorded commit stays on the branch.
"""

from __future__ import annotations

import hashlib
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from autokernel import results
from autokernel.kernelfile import KernelFileError, declarations
from autokernel.loop import budget
from autokernel.loop.agents import Agent, AgentError, Proposal, Task
from autokernel.loop.gitlog import KERNEL_PATH, GitError, GitLog
from autokernel.loop.report import CPU_CAVEAT, format_duration, format_us, progress_line
from autokernel.loop.state import LoopError, StateFile, job_row_history, repo_lock, unpark

# A full harness run takes 10-30 s on a GPU; a candidate still going after this long is a hang (seen on
# an H200: a one-warp, 8192-wide single-pass rmsnorm compiled for minutes), and the night moves on.
LOOP_BENCH_TIMEOUT_S = {"cuda": 120, "cpu": 600}
# The baseline also compiles torch.compile's reference (max-autotune) at every model shape: minutes for a GEMM
# type with several shapes, where an experiment reuses those times.
BASELINE_TIMEOUT_FACTOR = 4
# what an experiment's outcome keeps of the harness result (the loop state and the agent read them)
OUTCOME_KEYS = ("latency_us", "noise_pct", "pct_peak", "speedup_vs_pytorch", "model_us", "model_noise_pct",
                "model_vs_pytorch", "model_host_us", "model_timing", "model_shapes", "device", "launch_digest",
                "unchanged")
# what the objective is made of, and which model it was made for: never the agent's edit
MODEL_DECLARATIONS = ("MODEL_SHAPES", "MODEL_CALLS", "MODEL_SOURCE")
# One bench's host clock can be tens of percent off (H200: 18-50 us per call of the same rotary launcher); the
# least of two benches differs by a few percent, while a launcher that really costs more (another launch, a
# torch op, a sync) costs tens of percent. On a GPU the rule is judged on the least of two benches of each
# (Loop._confirm); within this margin the GPU decides.
HOST_NOISE_PCT = 5.0
MIN_GAIN_PCT = 1.0  # a change must beat the best by more than this (or the baseline noise, if larger)
LAST_LOG_CHARS = 8000  # of the harness output kept for the next prompt
# KernelBench: the bridge, and the read-only problem copies that are its references
HARNESS_FILES = ("bench.py", "reference.py", "autokernel/*.py", "autokernel/**/*.py", "kernelbench/*.py",
                 "workspace/kernelbench/level*/*.py")


@dataclass
class LoopConfig:
    tag: str
    hours: float = 8.0  # wall-clock budget of this run
    max_experiments: int | None = None  # benches in this run, baselines included
    per_kernel_minutes: float | None = None  # default: hours spread evenly over the kernels left
    max_reverts: int = 5
    target_speedup: float = 2.0  # over the kernel's baseline
    target_pct_peak: float = 90.0  # of the GPU's roofline ceiling (ignored in CPU mode)
    min_gain_pct: float = MIN_GAIN_PCT
    device: str | None = None
    quick: bool = False
    dtype: str = "fp16"
    bench_timeout: float | None = None
    seed: int = 0  # of the builtin agent's search order
    results_path: str | None = None  # default <repo>/results.tsv; --gpus workers share the main repo's
    worker: str | None = None  # the results.tsv worker column; default the host name


def decide(result: dict, best_us: float | None, threshold_pct: float,
           best_host_us: float | None = None) -> tuple[str, str]:
    """(status, why) of a benched candidate: keep, revert, crash or timeout.

    Times are the objective (results.objective_us: the time in the model when the kernel has model
    shapes). A change faster on the GPU is still reverted when the host's cost per forward pass
    (model_host_us, measured on a GPU only) grew by more than the GPU time it saves (beyond the host
    clock's noise, HOST_NOISE_PCT): in an eager model the host would eat the gain."""
    status = result.get("status")
    if status in ("crash", "timeout"):
        return status, _first_line(result.get("reason")) or status
    if status != "pass" or result.get("correctness") != "PASS":
        return "revert", f"FAIL at {result.get('failed_stage') or 'harness'}: {_first_line(result.get('reason'))}"
    value = results.objective_us(result)
    if best_us is None:
        return "keep", "first correct version"
    gain = 100.0 * (best_us - value) / best_us
    if gain <= threshold_pct:
        return "revert", f"{gain:+.1f}% vs {format_us(best_us)}, needs > {threshold_pct:.1f}%"
    if result.get("model_timing") == "cuda_graph":
        costlier = host_grew(result.get("model_host_us"), best_host_us, best_us - value)
        if costlier:
            return "revert", f"{gain:.1f}% faster on the GPU, but {costlier}"
    return "keep", f"{gain:.1f}% faster than {format_us(best_us)}"


def host_grew(host_us: float | None, best_host_us: float | None, saved_us: float) -> str | None:
    """Why a change that saves saved_us of GPU time per forward costs more on the host than it saves, or
    None when it does not (or either host figure is missing)."""
    if host_us is None or best_host_us is None:
        return None
    grew = host_us - best_host_us
    if grew <= saved_us + best_host_us * HOST_NOISE_PCT / 100:
        return None
    return f"the host's cost per forward grew by {format_us(grew)}, more than the {format_us(saved_us)} saved"


def _shape_summary(out: dict) -> list[dict]:
    """Per model shape, what the report shows of a kept version: calls, and the kernel's, eager's,
    torch.compile's and the host's microseconds per call."""
    keys = ("shape", "calls", "us", "eager_us", "compile_us", "host_us")
    return [{k: s.get(k) for k in keys} for s in out.get("model_shapes") or []]


def harness_hashes(root: Path) -> dict[str, str]:
    found = {p for pattern in HARNESS_FILES for p in root.glob(pattern) if p.is_file()}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(found)}


def _least(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _first_line(text) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:300] if lines else ""


class Loop:
    def __init__(self, root: str | Path, config: LoopConfig, agent: Agent, jobs: list[dict] | None = None,
                 bench=None, ui=None):
        self.root = Path(root).resolve()
        self.cfg = config
        self.agent = agent
        self.new_jobs = jobs or []
        self.bench = bench
        self.ui = ui  # .print(text) for a line, .status(text) for the live line; None: quiet
        self.results_path = Path(config.results_path) if config.results_path else self.root / "results.tsv"
        self.worker = config.worker or socket.gethostname()
        self.state = StateFile(self.root, config.tag)
        self.git: GitLog | None = None
        self.started = time.time()
        self.benched = 0  # benches in this run

    # ---------------------------------------------------------------------- public
    def run(self) -> str:
        """Work until every kernel is done or a budget runs out. Returns why it stopped."""
        with repo_lock(self.root):
            self._start()
            if self.bench is None:  # harness children fork from a process that has imported torch and triton
                from autokernel.harness import runner

                warm = runner.start_warm(self.cfg.device)
            try:
                return self._work()
            except KeyboardInterrupt:
                self._interrupted()
                raise
            except Exception:
                self._abandon()
                raise
            finally:
                if self.bench is None and warm:
                    self._say(f"warm launcher stopped: {runner.stop_warm()}")

    # ---------------------------------------------------------------------- start and resume
    def _start(self) -> None:
        self.git = GitLog(self.root)
        branch = f"autokernel/{self.cfg.tag}"
        if not self.state.load():
            if self.git.branch_exists(branch):
                raise LoopError(f"branch {branch} exists but {self.state.path} holds no state for it: "
                                f"choose another --tag, or delete the branch (git branch -D {branch})")
            if not self.new_jobs:
                raise LoopError("nothing to optimize: pass --plan or --kernel")
            self.git.require_clean()
            self.git.checkout_branch(branch)
            self.state.create(branch, self.new_jobs, self.git.head())
            self._say(f"started {branch} with {len(self.new_jobs)} kernel(s)")
        else:
            if self.git.branch() != branch:
                self.git.require_clean()
                self.git.checkout_branch(branch)
            self._reconcile()
            self.git.require_clean()
            if self.git.head() != self.state.data["head"]:
                raise LoopError(f"{branch} is at {self.git.head()[:10]} but the loop left it at "
                                f"{self.state.data['head'][:10]}: put it back (git reset --hard "
                                f"{self.state.data['head'][:10]}) or start a new --tag")
            self._say(f"resumed {branch} at experiment {self.state.data['next_experiment']}")
        if self.bench is None:
            from autokernel.harness.gpu import pick_device

            if pick_device(self.cfg.device) == "cpu":
                self._say(f"CPU mode: the times and speedups below are {CPU_CAVEAT} (they show that the loop "
                          "runs; near-identical kernels can differ by 100x)")
        self.state.data["seed"] = self.cfg.seed  # `orchestrate.py next` shows the same search order
        self.harness = harness_hashes(self.root)
        for job in self.state.jobs:
            job["budget_s"] = None  # each run shares its own hours (set when the kernel starts)
        if self.cfg.per_kernel_minutes is None:
            self._say("time by Amdahl (each kernel's share of what is left when it starts):")
            for line in budget.describe(self.state.jobs, self._time_left()):
                self._say(line)

    def _reconcile(self) -> None:
        """Finish or undo the experiment a kill interrupted (see the module docstring)."""
        inflight = self.state.data.get("inflight")
        if not inflight:
            return
        keep_untracked = set(inflight["untracked"])
        if inflight.get("outcome"):
            row = inflight["row"]
            if not any(r["tag"] == row["tag"] and r["experiment"] == str(row["experiment"])
                       for r in results.read_rows(self.results_path)):
                results.append_row(row, self.results_path)
            kept = inflight["outcome"]["status"] in ("keep", "baseline")
            self._reset_to(row["commit"] if kept else inflight["base"], keep_untracked,
                           inflight["phase"] == "bench")
            self._apply(self.state.job(inflight["kernel"]), inflight)
            self._say(f"resume: recorded experiment {row['experiment']} that a kill interrupted")
        else:
            self._reset_to(inflight["base"], keep_untracked, inflight["phase"] == "bench")
            self.state.data["inflight"] = None
            self.state.save()
            self._say(f"resume: experiment {inflight['experiment']} was interrupted; it is done again")

    def _reset_to(self, sha: str, keep_untracked: set, kernel_only: bool = False) -> None:
        head = self.git.head()
        if head != sha and not self.git.is_ancestor(sha, head):
            raise LoopError(f"cannot resume: {sha[:10]} is not an ancestor of HEAD {head[:10]}")
        if kernel_only:
            self.git.reset_kernel(sha)
        else:
            self.git.reset_hard(sha, keep_untracked)

    def _undo(self, inflight: dict) -> None:
        """Back to the best: all the agent touched while it worked, only kernel.py once it is done."""
        if inflight["phase"] == "bench":
            self.git.reset_kernel(inflight["base"])
        else:
            self.git.reset_hard(inflight["base"], set(inflight["untracked"]))

    # ---------------------------------------------------------------------- the loop
    def _work(self) -> str:
        while True:
            closing = self._closing_finale()
            job = closing or self.state.next_job() or self._new_round()
            if job is None:
                return self._run_budget_left() or "every kernel is done"
            reason = self._kernel_finished(job)
            if reason and not self._finale_due(job):
                self._finish(job, reason)
                continue
            parked = None if reason or closing else self._kernel_parked(job)
            if parked:
                self._park(job, parked)
                continue
            stop = self._run_budget_left()
            if stop:
                return stop
            self._check_harness()  # before the agent too: an edit made meanwhile is not the agent's
            if job["baseline_sha"] is None:
                self._baseline(job)
            else:
                self._experiment(job, final=bool(reason or closing))

    @staticmethod
    def _finale_due(job: dict) -> bool:
        """A kernel gets one last experiment of the agent's choosing (Agent.finish: the builtin agent's
        per-shape table), once, when it has a correct best to start from: when it is done for good, or
        at the end of the run (_closing_finale)."""
        return bool(job["best_us"]) and not job.get("finale_done")

    def _closing_finale(self) -> dict | None:
        """The kernel whose finale runs now because the run is near its end: the time left no longer
        covers the finales still due (each at its kernel's mean experiment time), or the benches left
        (--max-experiments) no longer outnumber them. None while the run has room for more."""
        due = [j for j in self.state.jobs if j["status"] != "done" and self._finale_due(j)]
        if not due:
            return None
        need_s = sum(j["seconds"] / max(1, j["experiments"]) for j in due)
        benches_left = None if self.cfg.max_experiments is None else self.cfg.max_experiments - self.benched
        if self._time_left() > need_s and (benches_left is None or benches_left > len(due)):
            return None
        return sorted(due, key=budget.order_key)[0]

    def _new_round(self) -> dict | None:
        """Every kernel is parked or done: with time left, the parked ones go round again (reverts in a
        row reset, the time left shared anew by the potential each has left)."""
        if self._run_budget_left() or not any(j["status"] == "parked" for j in self.state.jobs):
            return None
        resumed = unpark(self.state.jobs)
        self.state.data["round"] = self.state.data.get("round", 1) + 1
        self.state.save()
        self._say(f"round {self.state.data['round']}: {len(resumed)} parked kernel(s) go on, "
                  f"{format_duration(self._time_left())} left:")
        for line in budget.describe(self.state.jobs, self._time_left()):
            self._say(line)
        return self.state.next_job()

    def _run_budget_left(self) -> str | None:
        if time.time() - self.started >= self.cfg.hours * 3600:
            return f"the {self.cfg.hours:g} h budget is used"
        if self.cfg.max_experiments is not None and self.benched >= self.cfg.max_experiments:
            return f"{self.benched} experiments run (--max-experiments)"
        return None

    def _kernel_finished(self, job: dict) -> str | None:
        """Why the kernel is done for good, or None: a target reached, the agent with nothing left to try,
        no correct version (or no change that reached the harness) in --max-reverts tries in a row, or its
        --per-kernel-minutes used."""
        if job["baseline_sha"] is None:
            return None
        if job.get("best_pct_peak") is not None and job["best_pct_peak"] >= self.cfg.target_pct_peak:
            return f"{job['best_pct_peak']:.0f}% of peak reached"
        if job["baseline_us"] and job["best_us"] and job["baseline_us"] / job["best_us"] >= self.cfg.target_speedup:
            return f"{job['baseline_us'] / job['best_us']:.2f}x over the baseline reached"
        if job.get("exhausted"):
            return "the agent has nothing left to try"
        if not job["best_us"] and job["reverts_in_row"] >= self.cfg.max_reverts:
            return f"failed: no correct version in {job['experiments']} experiments"
        if job.get("unbenched_in_row", 0) >= self.cfg.max_reverts:  # another round would only spin
            return f"failed: the agent's last {job['unbenched_in_row']} changes never reached the harness"
        if self.cfg.per_kernel_minutes is not None and job["seconds"] >= self._budget_s(job):
            return f"its {self.cfg.per_kernel_minutes:g} min (--per-kernel-minutes) are used"
        return None

    def _kernel_parked(self, job: dict) -> str | None:
        """Why the loop leaves the kernel for now (it goes on in the next round), or None."""
        if job["reverts_in_row"] >= self.cfg.max_reverts:
            return f"{job['reverts_in_row']} reverts in a row"
        if self.cfg.per_kernel_minutes is not None:
            return None
        if job.get("budget_s") is None and not budget.shares(self.state.jobs)[job["name"]]:
            return "nothing to gain over PyTorch while others can: waits for the time they leave"
        if job["baseline_sha"] is not None and job["seconds"] >= self._budget_s(job):
            return f"its {self._budget_s(job) / 60:.1f} min share is used"
        return None

    def _budget_s(self, job: dict) -> float:
        """The kernel's time: --per-kernel-minutes, else its Amdahl share of this run's time left when it
        started (budget.py), on top of what earlier runs spent on it."""
        if self.cfg.per_kernel_minutes is not None:
            return self.cfg.per_kernel_minutes * 60
        if job.get("budget_s") is None:
            job["budget_s"] = job["seconds"] + budget.shares(self.state.jobs)[job["name"]] * self._time_left()
            self.state.save()
        return job["budget_s"]

    def _finish(self, job: dict, reason: str) -> None:
        job["status"], job["reason"] = "done", reason
        self._save_optimized(job)
        self.state.save()
        self._say(f"[bold]{job['name']} done[/bold] ({reason}); best {format_us(job['best_us'])} "
                  f"saved to {self._optimized_path(job).relative_to(self.root)}")

    def _park(self, job: dict, reason: str) -> None:
        job["status"], job["reason"] = "parked", reason
        self.state.save()
        self._say(f"{job['name']} parked ({reason}); it goes on in the next round if time is left")

    def _optimized_path(self, job: dict) -> Path:
        return self.root / "workspace" / "kernels" / f"{job['name']}_optimized.py"

    def _save_optimized(self, job: dict) -> None:
        if job["best_sha"]:
            path = self._optimized_path(job)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.git.file_at(job["best_sha"], KERNEL_PATH) + "\n")

    # ---------------------------------------------------------------------- one experiment
    def _begin(self, job: dict, kind: str) -> dict:
        if kind != "finale":  # the end of the run's finale leaves the queue as it is
            job["status"] = "active"
        inflight = {"experiment": self._next_number(), "kernel": job["name"], "kind": kind,
                    "phase": "edit", "base": self.git.head(), "untracked": sorted(self.git.untracked()),
                    "started": time.time()}
        self.state.data["inflight"] = inflight
        self.state.save()
        if kind != "baseline" and self.git.blob(job["best_sha"], KERNEL_PATH) != self.git.blob("HEAD", KERNEL_PATH):
            self._switch_to(job, inflight)
        return inflight

    def _switch_to(self, job: dict, inflight: dict) -> None:
        """The kernel comes back after others (a new round, its finale at the end of the run): kernel.py
        back to its best, as a commit of its own that the experiment starts from. A kill before the
        state records it is undone on restart like any experiment in its edit phase."""
        self.git.restore([KERNEL_PATH], job["best_sha"])
        sha = self.git.commit_kernel(f"{job['name']}: back to its best ({job['best_sha'][:10]})")
        inflight["base"] = self.state.data["head"] = sha
        self.state.save()

    def _next_number(self) -> int:
        """The next experiment's number: on from the highest in results.tsv (bench.py's rows by hand, an
        earlier tag's), so the column never restarts at 1. A log shared by --gpus workers, each appending
        while the others run, is numbered per worker tag instead: two workers never take the same number."""
        number = self.state.data["next_experiment"]
        if self.results_path.is_relative_to(self.root):
            number = max(number, results.next_experiment(self.results_path))
        return number

    def _baseline(self, job: dict) -> None:
        inflight = self._begin(job, "baseline")
        source = Path(job["source"]) if Path(job["source"]).is_absolute() else self.root / job["source"]
        (self.root / KERNEL_PATH).write_text(source.read_text())
        self._bench_commit(job, inflight, Proposal(f"baseline from {job['source']}"))

    def _experiment(self, job: dict, final: bool = False) -> None:
        inflight = self._begin(job, "finale" if final else "experiment")
        task = self._task(job, inflight["experiment"])
        log_before = self.results_path.read_bytes() if self.results_path.exists() else None
        self._status(job, "agent at work" + (" (its last move)" if final else ""))
        try:
            proposal = self.agent.finish(task) if final else self.agent.propose(task)
        except AgentError as e:
            return self._discard(job, inflight, Proposal("(agent failed)"), str(e))
        if proposal is None:
            self._undo(inflight)
            self.state.data["inflight"] = None
            job["finale_done" if final else "exhausted"] = True
            return self.state.save()
        others = self._touched(inflight, log_before)
        if others:
            return self._discard(job, inflight, proposal, f"touched other files: {', '.join(others[:5])}")
        if KERNEL_PATH not in self.git.changes():
            return self._discard(job, inflight, proposal, "kernel.py is unchanged")
        if self._model_shapes_changed(job):
            return self._discard(job, inflight, proposal, "changed MODEL_SHAPES, MODEL_CALLS or MODEL_SOURCE: the "
                                                          "model's shapes and call counts are the objective, and the "
                                                          "model they came from its record, not the agent's to edit")
        self._bench_commit(job, inflight, proposal)

    def _model_shapes_changed(self, job: dict) -> bool:
        try:
            before = declarations(self.git.file_at(job["baseline_sha"], KERNEL_PATH))
            now = declarations((self.root / KERNEL_PATH).read_text())
        except KernelFileError:
            return False  # a file that does not parse is the harness's to report
        return any(before.get(name) != now.get(name) for name in MODEL_DECLARATIONS)

    def _touched(self, inflight: dict, log_before: bytes | None) -> list[str]:
        """Paths other than kernel.py the agent changed; undoes any commit or branch switch it made."""
        branch = self.state.data["branch"]
        if self.git.branch() != branch:
            self.git.repo.git.checkout("-f", branch)
            return [f"git branch (switched to {self.git.branch() or 'a detached HEAD'})"]
        if self.git.head() != inflight["base"]:
            self.git.reset_mixed(inflight["base"])  # the agent committed: keep its edit, drop its commit
        before = set(inflight["untracked"])
        others = [p for p, code in self.git.changes().items() if p != KERNEL_PATH and not
                  (code == "??" and p in before)]
        log_now = self.results_path.read_bytes() if self.results_path.exists() else None
        if not self.results_path.is_relative_to(self.root):  # shared: other workers append meanwhile
            if not (log_now or b"").startswith(log_before or b""):
                others.append("results.tsv (rewritten; not restored: other workers' rows are in it)")
        elif log_now != log_before:
            if log_before is None:
                self.results_path.unlink()
            else:
                self.results_path.write_bytes(log_before)
            others.append("results.tsv")
        return sorted(others)

    def _discard(self, job: dict, inflight: dict, proposal: Proposal, why: str) -> None:
        """An experiment that never reached the harness: tree back to the best, a revert row."""
        self.git.reset_hard(inflight["base"], set(inflight["untracked"]))
        self._record(job, inflight, proposal, "revert", None, None, why)

    def _bench_commit(self, job: dict, inflight: dict, proposal: Proposal) -> None:
        n = inflight["experiment"]
        subject = f"exp {n} {job['name']}: {proposal.description}"
        inflight.update(phase="bench", candidate=self.git.commit_kernel(subject),
                        proposal={"description": proposal.description, "meta": proposal.meta})
        self.state.save()
        self._check_harness()
        self._status(job, f"benching: {proposal.description}")
        baseline = inflight["kind"] == "baseline"
        same_as = None if baseline else job.get("best_launch_digest")
        result = self._run_bench(reuse_baselines=not baseline, same_as=same_as)
        self.benched += 1
        if baseline:
            status, why = "baseline", _first_line(result.get("reason")) if result.get("status") != "pass" else ""
        elif result.get("unchanged") and result.get("correctness") == "PASS":
            status, why = "revert", ("launches exactly what the best launches at every timed shape (the same "
                                     "compiled kernels, grids and arguments, the same torch ops): not timed")
        else:
            threshold = max(self.cfg.min_gain_pct, job.get("noise_pct") or 0.0)
            status, why = decide(result, job["best_us"], threshold, job.get("best_host_us"))
            # on a GPU, anything faster on it is benched again, the host's cost included: one bench's host
            # clock can be tens of percent off
            if result.get("cpu_mode") is False and decide(result, job["best_us"], threshold)[0] == "keep":
                status, why = self._confirm(job, result, threshold)
        sha = self.git.amend_message(self._message(subject, status, why, result, job))
        if status not in ("keep", "baseline"):
            self.git.reset_kernel(inflight["base"])
        self._record(job, inflight, proposal, status, sha, result, why)

    def _confirm(self, job: dict, result: dict, threshold: float) -> tuple[str, str]:
        """A change faster on the GPU benched again, against the best benched again (its source in a file
        of its own: the tree and the branch stay as they are): kept only if the candidate's slower time
        beats the best's faster time by more than the threshold, and the host's cost per forward, the
        least of each one's two measurements (the host clock's noise only ever adds), did not grow by more
        than the GPU time saved. The best's times are what they are measured at from now on."""
        with tempfile.TemporaryDirectory(prefix="autokernel-best-") as tmp:
            best = Path(tmp) / KERNEL_PATH
            best.write_text(self.git.file_at(job["best_sha"], KERNEL_PATH))
            self._status(job, "confirming: the best kept version benched again")
            again_best = self._run_bench(reuse_baselines=True, path=best)
        self._status(job, "confirming: the candidate benched again")
        again = self._run_bench(reuse_baselines=True)
        if again_best.get("status") != "pass" or again.get("status") != "pass" or \
                again.get("correctness") != "PASS":
            failed = "the best" if again_best.get("status") != "pass" else "the candidate"
            return "revert", f"not confirmed: {failed} failed when benched again"
        first = 100.0 * (job["best_us"] - results.objective_us(result)) / job["best_us"]
        first = f"{first:.1f}% faster than {format_us(job['best_us'])}"
        best_us = min(job["best_us"], results.objective_us(again_best))
        slower = max(results.objective_us(result), results.objective_us(again))
        job["best_us"] = best_us
        job["best_host_us"] = _least(job.get("best_host_us"), again_best.get("model_host_us"))
        gain = 100.0 * (best_us - slower) / best_us
        if gain <= threshold:
            return "revert", (f"not confirmed: benched again {format_us(slower)} against the best's "
                              f"{format_us(best_us)} ({gain:+.1f}%, needs > {threshold:.1f}%)")
        host = _least(result.get("model_host_us"), again.get("model_host_us"))
        costlier = host_grew(host, job["best_host_us"], best_us - slower) \
            if result.get("model_timing") == "cuda_graph" else None
        if costlier:
            return "revert", f"{gain:.1f}% faster on the GPU benched again, but {costlier} (both benched twice)"
        result["model_host_us"] = host  # what the keep's host cost is taken to be from now on
        return "keep", f"{first}; confirmed: {gain:.1f}% benched again against the best benched again"

    def _run_bench(self, reuse_baselines: bool, path: Path | None = None, same_as: str | None = None) -> dict:
        """The harness on kernel.py (or on path). torch.compile's time is measured at the baseline and reused
        after: the shape does not change between experiments, and compiling it again costs seconds each.
        same_as: the best's launch digest; a candidate that launches exactly that is not timed."""
        bench = self.bench
        if bench is None:
            from autokernel.harness.runner import run_bench as bench  # imports torch: only when benching
        timeout = self.cfg.bench_timeout
        if timeout is None and self.bench is None:
            from autokernel.harness.gpu import pick_device

            timeout = LOOP_BENCH_TIMEOUT_S[pick_device(self.cfg.device)]
            timeout *= 1 if reuse_baselines else BASELINE_TIMEOUT_FACTOR
        return bench(str(path or self.root / KERNEL_PATH), device=self.cfg.device, quick=self.cfg.quick,
                     timeout=timeout, dtype=self.cfg.dtype, reuse_baselines=reuse_baselines,
                     **({"same_as": same_as} if same_as else {}))

    def _check_harness(self) -> None:
        now = harness_hashes(self.root)
        changed = sorted(p for p in set(now) | set(self.harness) if now.get(p) != self.harness.get(p))
        if changed:
            raise LoopError(f"harness files changed while the loop ran ({', '.join(changed[:5])}); "
                            "benchmarks would not be comparable, so the loop stops. Restore them "
                            "(git checkout -- <file>) and start the loop again.")

    def _message(self, subject: str, status: str, why: str, result: dict, job: dict) -> str:
        latency = results.objective_us(result) if result.get("status") == "pass" else None
        parts = [status] + ([format_us(latency)] if latency else [])
        base = job["baseline_us"] or (latency if status == "baseline" else None)
        if latency and base:
            parts.append(f"{base / latency:.2f}x baseline")
        body = [f"{k}: {result.get(k)}" for k in ("correctness", "model_us", "model_vs_pytorch", "host_us",
                                                  "latency_us", "speedup_vs_pytorch", "speedup_vs_compile",
                                                  "pct_peak", "device", "gpu") if k in result]
        return f"{subject} | {' '.join(parts)}\n\n{why}\n\n" + "\n".join(body)

    # ---------------------------------------------------------------------- recording
    def _record(self, job, inflight, proposal, status, sha, result, why) -> None:
        """Outcome into the state first, then the row, then the state moves on (see the docstring)."""
        result = result or {}
        description = proposal.description + (f" ({why})" if why else "")
        row = {
            "experiment": inflight["experiment"], "tag": self.cfg.tag, "kernel_type": job["type"],
            "kernel_file": job["source"], "commit": sha or "", "status": status, **results.metrics(result),
            "worker": self.worker, "agent": self.agent.name, "description": description,
        }
        passed = result.get("status") == "pass"
        inflight["proposal"] = {"description": proposal.description, "meta": proposal.meta}
        inflight["row"] = row
        inflight["outcome"] = {
            "status": status, "passed": passed, "seconds": time.time() - inflight["started"],
            "log": (result.get("log") or "")[-LAST_LOG_CHARS:] or why,
            **{k: result.get(k) for k in OUTCOME_KEYS},
        }
        self.state.save()
        results.append_row(row, self.results_path)
        self._apply(job, inflight)
        self._say(progress_line(row, job, self._time_left()))

    def _apply(self, job: dict, inflight: dict) -> None:
        """Move the state past a recorded experiment (also used when resuming)."""
        out, row = inflight["outcome"], inflight["row"]
        job["experiments"] += 1
        if inflight["kind"] == "finale":
            job["finale_done"] = True
        job["seconds"] += out["seconds"]
        status = out["status"]
        if status == "baseline":
            job["baseline_sha"] = job["best_sha"] = row["commit"]
            in_model = out.get("model_us") is not None
            job["objective"] = "model_us" if in_model else "latency_us"
            job["noise_pct"] = out.get("model_noise_pct") if in_model else out["noise_pct"]
            if out["passed"]:
                job["baseline_us"] = results.objective_us(out)
                job["baseline_shapes"] = _shape_summary(out)
                self._set_best(job, out)
        elif status == "keep":
            job["best_sha"] = row["commit"]
            self._set_best(job, out)
            job["kept"] += 1
            job["reverts_in_row"] = 0
        else:
            job["reverts_in_row"] += 1
        # an agent that failed, touched other files or changed nothing: no bench, and no time spent on one
        job["unbenched_in_row"] = 0 if row["commit"] else job.get("unbenched_in_row", 0) + 1
        proposal = inflight.get("proposal") or {}
        task = self._task(job, inflight["experiment"])
        task.model_shapes = out.get("model_shapes") or []
        # the agent hears of a revert untimed because the candidate launched what the best launches as "unchanged"
        self.agent.observe(task, None if status == "baseline" else
                           Proposal(proposal.get("description", ""), proposal.get("meta", {})),
                           "unchanged" if status == "revert" and out.get("unchanged") else status)
        if status in ("keep", "baseline"):
            self._save_optimized(job)
        self.state.data.update(head=self.git.head(), next_experiment=inflight["experiment"] + 1,
                               last_log=out["log"], inflight=None)
        self.state.save()

    @staticmethod
    def _set_best(job: dict, out: dict) -> None:
        job["best_us"] = results.objective_us(out)
        job["best_pct_peak"], job["best_host_us"] = out["pct_peak"], out.get("model_host_us")
        job["best_vs_pytorch"] = out.get("model_vs_pytorch") or out["speedup_vs_pytorch"]
        job["best_launch_digest"] = out.get("launch_digest")
        job["measured_on"] = out.get("device")
        job["best_shapes"] = _shape_summary(out)

    def _abandon(self) -> None:
        """The loop stops on an error: the experiment in flight is undone, unless it was decided."""
        inflight = self.state.data.get("inflight")
        if not inflight or inflight.get("outcome"):
            return
        try:
            self._undo(inflight)
        except Exception:  # noqa: BLE001  (the error being raised matters more; a restart reconciles)
            return
        self.state.data["inflight"] = None
        self.state.save()

    def _interrupted(self) -> None:
        """Ctrl-C: the experiment in flight is undone and logged as interrupted, then the loop exits."""
        inflight = self.state.data.get("inflight")
        if not inflight or inflight.get("outcome"):
            return
        self._undo(inflight)
        row = {"experiment": inflight["experiment"], "tag": self.cfg.tag, "status": "revert", "worker": self.worker,
               "kernel_file": self.state.job(inflight["kernel"])["source"], "agent": self.agent.name,
               "kernel_type": self.state.job(inflight["kernel"])["type"], "commit": inflight.get("candidate", ""),
               "description": f"{(inflight.get('proposal') or {}).get('description', '')} (interrupted: Ctrl-C)"}
        results.append_row(row, self.results_path)
        self.state.data.update(inflight=None, next_experiment=inflight["experiment"] + 1)
        self.state.save()
        self._say(f"stopped: experiment {inflight['experiment']} interrupted and undone")

    # ---------------------------------------------------------------------- helpers
    def _task(self, job: dict, experiment: int) -> Task:
        return Task(root=self.root, kernel_name=job["name"], kernel_type=job["type"], experiment=experiment,
                    memory=job.setdefault("memory", {}), seed=self.cfg.seed, last_log=self.state.data["last_log"],
                    history=job_row_history(self.results_path, self.cfg.tag, job["source"]))

    def _time_left(self) -> float:
        return max(0.0, self.cfg.hours * 3600 - (time.time() - self.started))

    def _status(self, job: dict, what: str) -> None:
        if self.ui is None:
            return
        best = (f"best {job['baseline_us'] / job['best_us']:.2f}x baseline"
                if job["baseline_us"] and job["best_us"] else "no best yet")
        reverted = max(0, job["experiments"] - job["kept"] - 1)
        self.ui.status(f"{job['name']} exp {self.state.data['next_experiment']}: {what} | kept {job['kept']}, "
                       f"reverted {reverted}, {best} | {format_duration(time.time() - self.started)} used, "
                       f"{format_duration(self._time_left())} left")

    def _say(self, text: str) -> None:
        if self.ui is not None:
            self.ui.print(text)


__all__ = ["Loop", "LoopConfig", "LoopError", "GitError", "decide", "harness_hashes"]
