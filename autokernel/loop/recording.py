"""Recording an experiment: its outcome into the loop state, its row into results.tsv, and the state moved on.

Methods of Loop (autokernel/loop/engine.py). The order is what makes a kill at any moment safe (see
autokernel/loop/__init__.py: Crash safety): the outcome is saved first, then the row is appended, then the
state moves past the experiment; a restart that finds an outcome finishes recording it (Loop._reconcile).
"""

from __future__ import annotations

import time

from autokernel import results
from autokernel.loop.agents import Proposal
from autokernel.loop.report import progress_line, took_text

# what an experiment's outcome keeps of the harness result (the loop state and the agent read them)
OUTCOME_KEYS = ("latency_us", "noise_pct", "pct_peak", "model_pct_peak", "speedup_vs_pytorch", "model_us",
                "model_noise_pct",
                "model_vs_pytorch", "model_host_us", "model_timing", "model_shapes", "device", "launch_digest",
                "unchanged")
LAST_LOG_CHARS = 8000  # of the harness output kept for the next prompt


def _shape_summary(out: dict) -> list[dict]:
    """Per model shape, what the report shows of a kept version: calls, and the kernel's, eager's,
    torch.compile's and the host's microseconds per call."""
    keys = ("shape", "calls", "us", "eager_us", "compile_us", "host_us", "pct_peak")
    return [{k: s.get(k) for k in keys} for s in out.get("model_shapes") or []]


class Recording:
    """Loop's recording of experiments (mixed into Loop, whose state they read and write)."""

    def _record(self, job, inflight, proposal, status, sha, result, why) -> None:
        """Outcome into the state first, then the row, then the state moves on (see the module docstring)."""
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
        self._say(progress_line(row, job, self._time_left(), took_text(inflight["outcome"]["seconds"], result)))

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
            job["baseline_s"] = out["seconds"]  # what a baseline takes here (engine: a share too small for one)
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
        # how far from its roofline: over the model's shapes, weighted by their time in it, where the kernel has them
        job["best_pct_peak"] = out.get("model_pct_peak") or out["pct_peak"]
        job["best_host_us"] = out.get("model_host_us")
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
