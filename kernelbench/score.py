"""fast_p over a set of KernelBench problems, from the best solution of each.

fast_p is the fraction of the problems whose solution is correct and more than p times faster than the
baseline (fast_0: the fraction correct), for p in P_VALUES, against PyTorch eager and against
torch.compile (max-autotune-no-cudagraphs, timed on a GPU only). A problem without a solution counts
as not correct: the denominator is the whole set.

Each solution is benched by the real harness in its own child process (autokernel.harness.runner: a crash or
a hang is that problem's result, not the scorer's end). Results go to a JSON file after every problem,
written atomically; a problem already scored with the same solution, problem, device and dtype (by
content hash) is not benched again, so an interrupted score resumes where it stopped. The scorer only
reads solutions: it never writes kernel.py nor a kernel of workspace/kernels/.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from autokernel import results
from autokernel.loop.state import lock_holder
from kernelbench import workspace
from kernelbench.problems import Problem, ProblemError
from kernelbench.spec import ENV_WORKSPACE, WORKSPACE_DIR, parse_dtype, type_name

P_VALUES = (0.0, 1.0, 1.5, 2.0, 3.0)
BASELINES = {"eager": "speedup_vs_pytorch", "compile": "speedup_vs_compile"}
JSON_VERSION = 1
SCORE_TAG = "kernelbench-score"


def fast_p(records: list[dict], baseline: str) -> dict[str, float | None]:
    """{p: fraction} over `records` (one per problem); None where the baseline was never timed."""
    n = len(records)
    correct = [r for r in records if r.get("correct")]
    speedups = [r.get(BASELINES[baseline]) for r in correct]
    if n == 0 or (correct and all(s is None for s in speedups)):
        return {f"{p:g}": None for p in P_VALUES}
    out = {}
    for p in P_VALUES:
        hits = len(correct) if p == 0 else sum(1 for s in speedups if s is not None and s > p)
        out[f"{p:g}"] = hits / n
    return out


@contextmanager
def problems_of(root: Path):
    """The harness child takes its references from `root`'s problem copies (inherited environment)."""
    old = os.environ.get(ENV_WORKSPACE)
    os.environ[ENV_WORKSPACE] = str(Path(root).resolve() / WORKSPACE_DIR)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_WORKSPACE, None)
        else:
            os.environ[ENV_WORKSPACE] = old


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load(path: Path) -> dict:
    if path.is_file():
        data = json.loads(path.read_text())
        if data.get("version") == JSON_VERSION:
            return data
        raise ProblemError(f"{path} was written by another version of the scorer: pass another --json")
    return {"version": JSON_VERSION, "problems": {}}


def save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)  # a kill leaves the old file or the new one, never half


def _record(problem: Problem, solution: Path | None, result: dict | None, key: dict) -> dict:
    record = {"problem": problem.key, "solution": str(solution) if solution else None, **key,
              "scored_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if result is None:
        return {**record, "status": "missing", "correct": False, "reason": "no solution found"}
    reason = (result.get("reason") or "").strip().splitlines()
    return {**record, "status": result["status"], "correct": result.get("correctness") == "PASS",
            "failed_stage": result.get("failed_stage"), "reason": reason[0][:300] if reason else "",
            **{k: result.get(k) for k in ("latency_us", "eager_us", "compile_us", "speedup_vs_pytorch",
                                          "speedup_vs_compile", "noise_pct", "shape", "gpu", "device")}}


class Scorer:
    """Scores problems one by one into a resumable JSON file; `on_result(record, reused)` reports each."""

    def __init__(self, root: Path, out_json: Path, solutions: Path | None = None, device: str | None = None,
                 quick: bool = False, timeout: float | None = None, dtype: str = "fp32",
                 results_path: Path | None = None, bench=None):
        self.root, self.out_json, self.solutions = Path(root).resolve(), Path(out_json), solutions
        self.device, self.quick, self.timeout, self.dtype = device, quick, timeout, dtype
        self.results_path = results_path  # None: no results.tsv rows
        self.bench = bench
        self.data = load(self.out_json)

    def score(self, chosen: list[Problem], on_result=None) -> dict:
        from autokernel.harness.gpu import pick_device

        device = pick_device(self.device)
        self._check_no_loop(chosen)
        records = []
        for problem in chosen:
            record, reused = self._one(problem, device)
            records.append(record)
            if on_result:
                on_result(record, reused)
        summary = {"problems": [p.key for p in chosen], "count": len(chosen), "device": device,
                   "dtype": self.dtype, "fast_p": {b: fast_p(records, b) for b in BASELINES}}
        self.data["last"] = summary
        save(self.out_json, self.data)
        return {**summary, "records": records}

    def _check_no_loop(self, chosen: list[Problem]) -> None:
        """A loop running here stops when a reference appears or changes: score only problems set up."""
        holder = lock_holder(self.root)
        new = [p.key for p in chosen if not workspace.is_installed(self.root, p)]
        if holder and new:
            raise ProblemError(f"a loop (pid {holder}) is running in {self.root} and {', '.join(new[:5])} "
                               "is not set up here: score these after it stops (or in another clone)")

    def _one(self, problem: Problem, device: str) -> tuple[dict, bool]:
        solution = workspace.find_solution(self.root, problem, self.solutions)
        key = {"problem_sha256": problem.sha256, "device": device, "dtype": self.dtype, "quick": self.quick,
               "solution_sha256": _sha(solution) if solution else None}
        old = self.data["problems"].get(problem.key)
        if old and all(old.get(k) == v for k, v in key.items()):  # still missing, or the same solution
            return old, True
        result = self._bench(problem, solution) if solution else None
        record = _record(problem, solution, result, key)
        self.data["problems"][problem.key] = record
        save(self.out_json, self.data)
        return record, False

    def _bench(self, problem: Problem, solution: Path) -> dict:
        from autokernel.harness.runner import run_bench

        kernel_type = type_name(problem, parse_dtype(self.dtype))
        workspace.install_problem(self.root, problem)
        try:
            path = workspace.prepared(self.root, problem, solution, kernel_type)
        except ProblemError as e:
            return {"status": "fail", "correctness": "FAIL", "failed_stage": "source", "reason": str(e)}
        with problems_of(self.root):
            result = (self.bench or run_bench)(path, device=self.device, quick=self.quick, timeout=self.timeout,
                                               dtype=self.dtype)
        if self.results_path is not None:
            results.append_row({"tag": SCORE_TAG, "kernel_type": kernel_type, "kernel_file": str(solution),
                                "status": result["status"], **results.metrics(result), "agent": "score",
                                "description": (result.get("reason") or "").strip()[:200] or "kernelbench score"},
                               self.results_path)
        return result
