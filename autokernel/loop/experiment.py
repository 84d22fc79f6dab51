"""One experiment of the loop: the agent's edit, its commit, its bench, and the verdict on it.

Methods of Loop (autokernel/loop/engine.py), kept here so that the loop's schedule and one experiment's steps
read apart. An experiment begins with its state written (the phase "edit", the commit it starts from), and
anything the agent touched besides kernel.py is put back before the bench; see autokernel/loop/__init__.py for
the whole protocol.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from pathlib import Path

from autokernel import results
from autokernel.kernelfile import KernelFileError, declarations
from autokernel.loop.agents import AgentError, Proposal
from autokernel.loop.decision import decide, first_line, host_counts, host_grew, least
from autokernel.loop.gitlog import KERNEL_PATH
from autokernel.loop.report import format_us
from autokernel.loop.state import LoopError

# A full harness run takes tens of seconds on a GPU; a candidate still going after this long is a hang (a
# one-warp, 8192-wide single-pass rmsnorm compiled for minutes), and the night moves on.
LOOP_BENCH_TIMEOUT_S = {"cuda": 120, "cpu": 600}
# The baseline also compiles torch.compile's reference (max-autotune) at every model shape: minutes for a GEMM
# type with several shapes, where an experiment reuses those times.
BASELINE_TIMEOUT_FACTOR = 4
# what the objective is made of, and which model it was made for: never the agent's edit
MODEL_DECLARATIONS = ("MODEL_SHAPES", "MODEL_CALLS", "MODEL_SOURCE")
# KernelBench: the bridge, and the read-only problem copies that are its references
HARNESS_FILES = ("bench.py", "reference.py", "autokernel/*.py", "autokernel/**/*.py", "kernelbench/*.py",
                 "workspace/regions/*.py",
                 "workspace/kernelbench/level*/*.py")


def harness_hashes(root: Path) -> dict[str, str]:
    """sha256 of each file the bench's verdict rests on (HARNESS_FILES): the loop stops when one changes."""
    found = {p for pattern in HARNESS_FILES for p in root.glob(pattern) if p.is_file()}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(found)}


class Experiments:
    """Loop's steps of one experiment (mixed into Loop, whose state they read and write)."""

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
            status, why = "baseline", first_line(result.get("reason")) if result.get("status") != "pass" else ""
        elif result.get("unchanged") and result.get("status") in ("unchanged", "pass"):  # before its stages, or after
            status, why = "revert", ("launches exactly what the best launches at every timed shape (the same "
                                     "compiled kernels, grids and arguments, the same torch ops): not timed")
        else:
            threshold = max(self.cfg.min_gain_pct, job.get("noise_pct") or 0.0)
            best_host = job.get("best_host_us") if host_counts(job) else None  # a graphed deploy: no host
            status, why = decide(result, job["best_us"], threshold, best_host)
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
        job["best_host_us"] = least(job.get("best_host_us"), again_best.get("model_host_us"))
        gain = 100.0 * (best_us - slower) / best_us
        if gain <= threshold:
            return "revert", (f"not confirmed: benched again {format_us(slower)} against the best's "
                              f"{format_us(best_us)} ({gain:+.1f}%, needs > {threshold:.1f}%)")
        host = least(result.get("model_host_us"), again.get("model_host_us"))
        costlier = host_grew(host, job["best_host_us"], best_us - slower) \
            if result.get("model_timing") == "cuda_graph" and host_counts(job) else None
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
