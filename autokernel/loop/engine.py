"""The loop itself: start or resume a run, pick the kernel to work on, park it or call it done.

One experiment's steps are in experiment.py and its recording in recording.py (Loop's mixins); the keep-or-revert
rule is decision.py's. autokernel/loop/__init__.py's docstring tells the whole protocol.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path

from autokernel import results
from autokernel.loop import budget
from autokernel.loop.agents import Agent, Task, search, standing
from autokernel.loop.decision import MIN_GAIN_PCT
from autokernel.loop.experiment import Experiments, harness_hashes
from autokernel.loop.gitlog import KERNEL_PATH, GitLog
from autokernel.loop.recording import Recording
from autokernel.loop.report import CPU_CAVEAT, format_duration, format_us, outcome_counts
from autokernel.loop.state import LoopError, StateFile, job_row_history, repo_lock, unpark


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


class Loop(Experiments, Recording):
    """The keep-or-reset loop on one repository's branch autokernel/<tag> (autokernel/loop/__init__.py)."""

    def __init__(self, root: str | Path, config: LoopConfig, agent: Agent, jobs: list[dict] | None = None,
                 bench=None, ui=None, screen=None):
        self.root = Path(root).resolve()
        self.cfg = config
        self.agent = agent
        self.new_jobs = jobs or []
        self.bench = bench
        # screen(configs): the harness's screen of kernel.py's configurations (the builtin agent's wide search);
        # with a stand-in bench, only the one given
        self.screen = screen if screen is not None or bench is not None else self._screen
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
        """Finish or undo the experiment a kill interrupted (autokernel/loop/__init__.py: Crash safety)."""
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
            if not (reason or closing) and self._waits_for_rivals(job):
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
                deciding = job["name"] in budget.time_first(self.state.jobs)
                self._baseline(job)
                if deciding:
                    self._say_if_rivals_timed()
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
        return sorted(due, key=budget.order(self.state.jobs))[0]

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

    def _waits_for_rivals(self, job: dict) -> bool:
        """A kernel timed at the model's shapes whose rivalry still has an untimed side goes back to the queue, its
        share unset: which side the model runs decides its time (budget.undecided), and the untimed sides' baselines
        come first (budget.order)."""
        if self.cfg.per_kernel_minutes is not None or job["baseline_sha"] is None or \
                not budget.undecided(job, self.state.jobs):
            return False
        job.update(status="pending", budget_s=None)
        self.state.save()
        self._say(f"{job['name']} waits for its rivals' baselines: the model's shapes decide which side gets the time")
        return True

    def _say_if_rivals_timed(self) -> None:
        """After a rivalry's baseline: once every side of every rivalry is timed, the split they decide."""
        if self.cfg.per_kernel_minutes is None and not budget.time_first(self.state.jobs):
            self._say("every side of the rivalries timed at the model's shapes; time by Amdahl now:")
            for line in budget.describe(self.state.jobs, self._time_left()):
                self._say(line)

    def _kernel_parked(self, job: dict) -> str | None:
        """Why the loop leaves the kernel for now (it goes on in the next round), or None."""
        if job["reverts_in_row"] >= self.cfg.max_reverts:
            return f"{job['reverts_in_row']} reverts in a row"
        if self.cfg.per_kernel_minutes is not None or job["name"] in budget.time_first(self.state.jobs):
            return None  # an untimed side of a rivalry: its baseline first, whatever the plan guessed
        if job.get("budget_s") is None and not budget.shares(self.state.jobs)[job["name"]]:
            if job["name"] in budget.outrun(self.state.jobs):  # its rival side is the one the model runs
                return f"{budget.waiting_reason(job, self.state.jobs)}: waits for the time the others leave"
            return "nothing to gain over PyTorch while others can: waits for the time they leave"
        first = job["baseline_sha"] is None and self.state.data.get("round", 1) == 1
        took = self._baseline_seconds() if first else None
        if took and self._budget_s(job) - job["seconds"] < took:
            return (f"its {self._budget_s(job) / 60:.1f} min share is less than a baseline takes here "
                    f"(~{took:.0f} s): waits for the time the others leave")
        if job["baseline_sha"] is not None and job["seconds"] >= self._budget_s(job):
            return f"its {self._budget_s(job) / 60:.1f} min share is used"
        return None

    def _baseline_seconds(self) -> float | None:
        """What a kernel's baseline took in this run so far, on average (None before the first)."""
        took = [j["baseline_s"] for j in self.state.jobs if j.get("baseline_s")]
        return sum(took) / len(took) if took else None

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

    # ---------------------------------------------------------------------- helpers
    def _task(self, job: dict, experiment: int) -> Task:
        return Task(root=self.root, kernel_name=job["name"], kernel_type=job["type"], experiment=experiment,
                    memory=job.setdefault("memory", {}), seed=self.cfg.seed, last_log=self.state.data["last_log"],
                    history=job_row_history(self.results_path, self.cfg.tag, job["source"]), screen=self.screen,
                    standing=standing(job, self._kernel_text()), dtype=self.cfg.dtype)

    def _kernel_text(self) -> str:
        path = self.root / KERNEL_PATH
        return path.read_text() if path.is_file() else ""

    def _screen(self, configs: list[dict]) -> dict:
        """The harness's screen of `configs` of kernel.py at its model shapes (autokernel/harness/screen.py)."""
        from autokernel.harness.gpu import pick_device
        from autokernel.harness.screen import run_screen

        device = pick_device(self.cfg.device)
        most, seconds = search.SCREEN_LIMITS[device]
        self._say(f"  screening {min(most, len(configs))} configurations of kernel.py at its model shapes")
        return run_screen(self.root / KERNEL_PATH, configs[:most], device=device, dtype=self.cfg.dtype,
                          seconds=seconds)

    def _time_left(self) -> float:
        return max(0.0, self.cfg.hours * 3600 - (time.time() - self.started))

    def _status(self, job: dict, what: str) -> None:
        if self.ui is None:
            return
        best = (f"best {job['baseline_us'] / job['best_us']:.2f}x baseline"
                if job["baseline_us"] and job["best_us"] else "no best yet")
        counts = outcome_counts(job_row_history(self.results_path, self.cfg.tag, job["source"]))
        self.ui.status(f"{job['name']} exp {self.state.data['next_experiment']}: {what} | kept {counts['kept']}, "
                       f"reverted {counts['reverted']}, failed {counts['failed']}, {best} | "
                       f"{format_duration(time.time() - self.started)} used, "
                       f"{format_duration(self._time_left())} left")

    def _say(self, text: str) -> None:
        if self.ui is not None:
            self.ui.print(text)
