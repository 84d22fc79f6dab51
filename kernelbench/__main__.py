"""python -m kernelbench: KernelBench problems through AutoKernel's harness, loop and scorer.

    python -m kernelbench list --root ~/KernelBench level1             # the problems of a checkout
    python -m kernelbench setup level1/19_ReLU --root ~/KernelBench    # kernel.py: a ModelNew starter
    python orchestrate.py run --kernel kernel.py                       # the loop, unchanged, any agent
    python -m kernelbench eval kernel.py                               # five stages + timing, fp32
    python -m kernelbench score --problems level1 --json out.json      # fast_p of the best solutions

The problem source is --root (a KernelBench checkout) or --dataset (a JSON/JSONL/parquet file of
{level, problem_id, name, code}), else $KERNELBENCH_ROOT / $KERNELBENCH_DATASET, else (list, eval,
score) the problems already set up in workspace/kernelbench/. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from kernelbench import problems, skeleton, workspace
from kernelbench.problems import ProblemError

LOG_WIDTH = 160  # columns of the tables when the output is not a terminal


def _source(args, fallback_to_workspace: bool = True) -> list[problems.Problem]:
    try:
        return problems.catalog(args.root, args.dataset)
    except ProblemError:
        copies = Path(args.project) / workspace.WORKSPACE_DIR
        if fallback_to_workspace and not (args.root or args.dataset) and copies.is_dir():
            return problems.from_checkout(copies)
        raise


def cmd_list(args) -> int:
    from rich.table import Table

    found = _source(args)
    chosen = problems.select(found, args.patterns) if args.patterns else found
    table = Table(title=f"KernelBench problems ({chosen[0].origin.rsplit('/', 2)[0] if chosen else ''})")
    for col in ("problem", "id", "what"):
        table.add_column(col)
    for p in chosen:
        table.add_row(p.key, str(p.problem_id), skeleton.summary(p))
    _console().print(table)
    levels = sorted({p.level for p in chosen})
    print(", ".join(f"{level}: {sum(p.level == level for p in chosen)}" for level in levels) or "no problems")
    return 0


def cmd_setup(args) -> int:
    chosen = problems.select(_source(args, fallback_to_workspace=False), args.problems)
    root = Path(args.project).resolve()
    done = workspace.setup(root, chosen, args.backend, args.dtype, not args.no_kernel_py, args.force)
    for problem, starter in done:
        print(f"{problem.key}: reference {workspace.problem_copy(root, problem).relative_to(root)} (read-only), "
              f"starter {starter.relative_to(root)}")
    starters = " ".join(f"--kernel {s.relative_to(root)}" for _, s in done)
    if len(done) == 1 and not args.no_kernel_py:
        print(f"kernel.py is the {args.backend} starter of {done[0][0].key}. Next: write ModelNew.forward, then\n"
              f"  python -m kernelbench eval kernel.py\n"
              f"  git commit -m '{done[0][0].key}' kernel.py && python orchestrate.py run --kernel kernel.py")
    else:
        print(f"next: python orchestrate.py run {starters}")
    return 0


def _kernel_for(args, root: Path) -> Path:
    """The file bench.py runs: the kernel itself, or a copy declaring --problem's type."""
    path = Path(args.kernel)
    if not path.is_file():
        raise ProblemError(f"no kernel file {path}")
    if not args.problem:
        declared = workspace._declared_type(path)
        if not (declared or "").startswith("kb/"):
            raise ProblemError(f"{path} declares no KernelBench KERNEL_TYPE: name its problem with --problem")
        return path
    level, name = problems.parse_key(args.problem)
    found = [p for p in _source(args) if (p.level, p.name) == (level, name)]
    if not found:
        raise ProblemError(f"no problem {args.problem} in the source")
    workspace.install_problem(root, found[0])
    from kernelbench.spec import parse_dtype, type_name

    return workspace.prepared(root, found[0], path, type_name(found[0], parse_dtype(args.dtype)))


def cmd_eval(args) -> int:
    from kernelbench.spec import ENV_WORKSPACE

    root = Path(args.project).resolve()
    path = _kernel_for(args, root)
    bench = Path(__file__).resolve().parent.parent / "bench.py"
    cmd = [sys.executable, str(bench), str(path), "--dtype", args.dtype, "--device", args.device]
    cmd += ["--quick"] * args.quick + ["--no-log"] * args.no_log + ["--results", args.results]
    cmd += (["--json", args.json] if args.json else []) + (["--timeout", str(args.timeout)] if args.timeout else [])
    env = {**os.environ, ENV_WORKSPACE: str(root / workspace.WORKSPACE_DIR)}
    return subprocess.run(cmd, env=env).returncode


def _print_scores(summary: dict) -> None:
    from rich.table import Table

    table = Table(title=f"KernelBench: {summary['count']} problem(s) on {summary['device']}, {summary['dtype']}")
    for col in ("problem", "status", "kernel us", "eager us", "compile us", "vs eager", "vs compile", "note"):
        table.add_column(col, justify="right" if " " in col or col.startswith("vs") else "left")
    for r in summary["records"]:
        table.add_row(r["problem"], r["status"], *(_fmt(r.get(k), ".1f") for k in ("latency_us", "eager_us",
                      "compile_us")), *(_fmt(r.get(k), ".2f", "x") for k in ("speedup_vs_pytorch",
                      "speedup_vs_compile")), _note(r.get("reason")))
    fast = Table(title="fast_p: correct and faster than the baseline by more than p")
    fast.add_column("p")
    for baseline in summary["fast_p"]:
        fast.add_column(f"vs {baseline}", justify="right")
    for p in summary["fast_p"]["eager"]:
        fast.add_row(f"fast_{p}", *(_fmt(v[p], ".3f") if v[p] is not None else "n/a"
                                    for v in summary["fast_p"].values()))
    console = _console()
    console.print(table)
    console.print(fast)
    if summary["device"] == "cpu":
        print("note: CPU mode (Triton interpreter): speedups are not performance figures; torch.compile is "
              "timed on a GPU only")


def _note(reason: str | None) -> str:
    """A failure's reason without the label of the check that failed (the op or the error is the news)."""
    reason = reason or ""
    if reason.startswith(("smoke ", "inputs=", "determinism ", "output of timed", "after timing")):
        reason = reason.split(": ", 1)[-1]
    return reason[:70]


def _console():
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=LOG_WIDTH)  # a log file: no wrapped cells


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "" if value is None else f"{value:{spec}}{suffix}"


def cmd_score(args) -> int:
    from kernelbench.score import Scorer

    chosen = problems.select(_source(args), args.problems)
    root = Path(args.project).resolve()
    out_json = Path(args.json) if args.json else root / workspace.WORKSPACE_DIR / "score.json"
    scorer = Scorer(root, out_json, Path(args.solutions) if args.solutions else None, args.device, args.quick,
                    args.timeout, args.dtype, None if args.no_log else Path(args.results))

    def report(record, reused):
        again = " (scored before, same solution)" if reused and record["solution"] else ""
        why = f"  {_note(record.get('reason'))}" if record.get("reason") else ""
        print(f"{record['problem']}: {record['status']}{again}{why}", flush=True)

    summary = scorer.score(chosen, on_result=report)
    _print_scores(summary)
    print(f"results: {out_json}")
    return 0


def _add_source(p) -> None:
    p.add_argument("--root", help=f"a KernelBench checkout (default ${problems.ENV_ROOT})")
    p.add_argument("--dataset", help=f"a dataset file: JSON, JSONL or parquet (default ${problems.ENV_DATASET})")
    p.add_argument("--project", default=".", help="the AutoKernel project to work in (default: here)")


def _add_bench(p) -> None:
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="default: cuda if visible")
    p.add_argument("--quick", action="store_true", help="3 correctness trials instead of 5")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"],
                   help="dtype of checks and timing (KernelBench's is fp32)")
    p.add_argument("--timeout", type=float, help="seconds per bench before it counts as a hang")
    p.add_argument("--results", default="results.tsv", help="the experiment log (default results.tsv)")
    p.add_argument("--no-log", action="store_true", help="append no results.tsv row")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m kernelbench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    lst = sub.add_parser("list", help="list problems by level")
    lst.add_argument("patterns", nargs="*", help="level1, level1/19_ReLU or level1/19 (default: all)")
    setup = sub.add_parser("setup", help="set problems up: read-only reference, ModelNew starter, kernel.py")
    setup.add_argument("problems", nargs="+", help="level1/19_ReLU, level1/19, or a whole level")
    setup.add_argument("--backend", choices=skeleton.BACKENDS, default="triton", help="starter kind")
    setup.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"], help="dtype of the problem")
    setup.add_argument("--no-kernel-py", action="store_true", help="write the starters only, not kernel.py")
    setup.add_argument("--force", action="store_true", help="overwrite edited starters and kernel.py")
    ev = sub.add_parser("eval", help="check and time one ModelNew file (bench.py on it)")
    ev.add_argument("kernel", nargs="?", default="kernel.py", help="kernel file (default kernel.py)")
    ev.add_argument("--problem", help="its problem, for a file in KernelBench's form (no KERNEL_TYPE)")
    ev.add_argument("--json", help="also write the full result as JSON")
    sc = sub.add_parser("score", help="fast_p over a set of problems, from the best solution of each")
    sc.add_argument("--problems", nargs="+", required=True, help="level1, level1/19_ReLU, level1/19 ...")
    sc.add_argument("--solutions", help="a folder of solutions named by problem (default: the loop's "
                                        "workspace/kernels/*_optimized.py)")
    sc.add_argument("--json", help="resumable results (default workspace/kernelbench/score.json)")
    for cmd in (lst, setup, ev, sc):
        _add_source(cmd)
    for cmd in (ev, sc):
        _add_bench(cmd)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    handlers = {"list": cmd_list, "setup": cmd_setup, "eval": cmd_eval, "score": cmd_score}
    try:
        return handlers[args.command](args)
    except ProblemError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
