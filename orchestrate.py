"""orchestrate.py: the autonomous keep-or-reset loop. Start it before bed; read the report in the morning.

    python orchestrate.py demo     # profile -> extract -> loop -> verify -> report on a shipped model, one command
    python orchestrate.py run --plan workspace/plan.json          # the builtin agent, no LLM needed
    python orchestrate.py run --kernel kernels/rmsnorm.py --hours 1 --quick
    python orchestrate.py run --agent command --agent-cmd "claude -p --dangerously-skip-permissions"
    python orchestrate.py run --agent openai --base-url http://localhost:8000/v1 --model qwen2.5-coder
    python orchestrate.py run --plan workspace/plan.json --gpus 0,1,2,3   # one worker per GPU (or --gpus all)
    python orchestrate.py run --hours 0.5 --verify                 # then verify.py on the plan's model
    python orchestrate.py status | next | report [--verify]

Experiments live on branch autokernel/<tag>: one commit per experiment, kept or reset. Every
experiment is a row in results.tsv. Killed at any moment, `run` with the same tag resumes.
With --gpus, each worker runs this loop on its own kernel in a git worktree, on branch
autokernel/<tag>/<kernel> (see autokernel/loop/workers.py); in CPU mode the ids are only worker labels.

Exit status: 0 when the command ran, 2 when it could not (bad arguments, a missing plan or kernel file, an
unknown dtype, --device cuda without a GPU, a dirty tree or a second loop), 130 when interrupted.
"""

import argparse
import signal
import sys
from datetime import datetime
from pathlib import Path

from autokernel import cli
from autokernel.loop import LoopConfig, LoopError, report
from autokernel.loop import demo as pipeline_demo
from autokernel.loop.agents import AGENT_NAMES, make_agent
from autokernel.loop.agents.builtin import describe_next
from autokernel.loop.gitlog import KERNEL_PATH, GitError, GitLog
from autokernel.loop.plot import write_progress_png
from autokernel.loop.raycluster import RayRun
from autokernel.loop.report import LiveLine, amdahl, format_us, kernel_summaries, report_table
from autokernel.loop.runs import Run, SingleRun, single_loop_tag
from autokernel.loop.workers import WorkersRun, parse_gpus

RECORDED_KINDS = (WorkersRun, RayRun)  # a tag one of them recorded is theirs; any other, a single loop's


def default_tag(root: Path) -> str:
    """The tag of the state on disk (so that a bare `run` resumes), else today's date."""
    recorded = (kind.latest_tag(root) for kind in RECORDED_KINDS)
    return single_loop_tag(root) or next(filter(None, recorded), None) or datetime.now().strftime("%b%d").lower()


def recorded_run(root: Path, tag: str, plan: str | None = None) -> Run:
    """The run of `tag` as status, next and report read it, whichever way it ran."""
    kind = next((kind for kind in RECORDED_KINDS if kind.recorded(root, tag)), None)
    return kind(root, tag) if kind else SingleRun(root, tag, plan)


def new_run(args, root: Path) -> Run:
    """The way `run` goes, from its flags: one process, one worker per GPU, or a Ray cluster."""
    if args.ray and args.gpus:
        raise LoopError("--ray and --gpus: choose one (a Ray task asks for one GPU of the cluster)")
    agent = build_agent(args)  # an agent that cannot work fails here, before any worker starts
    spec = {"name": args.agent, "options": agent_options(args)}
    if args.ray:
        return RayRun(root, args.tag, spec, args.ray)
    if args.gpus:
        return WorkersRun(root, args.tag, spec, parse_gpus(args.gpus))
    return SingleRun(root, args.tag, agent=agent)


def build_parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="orchestrate.py", description=__doc__.split("\n\n")[0], epilog=__doc__)
    p.add_argument("--repo", default=".", help="repository root (default: the current directory)")
    cli.add_debug_argument(p)
    sub = p.add_subparsers(dest="command", required=True)
    add_run_command(sub)
    add_demo_command(sub)
    add_view_commands(sub)
    for cmd in sub.choices.values():
        cmd.add_argument("--tag", help="experiment tag; branch autokernel/<tag> (default: the last one; "
                                       "demo: a fresh one, demo, demo-2, ...)")
        cmd.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="show the full traceback on errors")  # also after the command
    return p


def add_run_command(sub) -> None:
    """`run`: start or resume the loop (its agent, budgets, targets, bench settings, parallel runs)."""
    run = sub.add_parser("run", help="start or resume the loop")
    what = run.add_mutually_exclusive_group()
    what.add_argument("--plan", help="plan from profile.py (default workspace/plan.json)")
    what.add_argument("--kernel", action="extend", nargs="+", metavar="FILE",
                      help="kernel files (repeatable; a shell glob such as workspace/kernels/R*.py takes each)")
    run.add_argument("--agent", choices=AGENT_NAMES, default="builtin", help="who edits kernel.py")
    run.add_argument("--agent-cmd", help="command agent: the CLI to run; {prompt_file} or stdin gets the prompt")
    run.add_argument("--agent-timeout", type=float, default=1800, help="command agent: seconds per edit")
    run.add_argument("--base-url", default="https://api.openai.com/v1", help="openai agent: endpoint")
    run.add_argument("--model", help="openai agent: model name")
    run.add_argument("--api-key-env", default="OPENAI_API_KEY", help="openai agent: env var with the key")
    run.add_argument("--hours", type=float, default=8.0, help="wall-clock budget of this run (default 8)")
    run.add_argument("--max-experiments", type=int, help="stop after this many benches in this run")
    run.add_argument("--per-kernel-minutes", type=float, help="minutes per kernel, after which it is done "
                     "(default: its Amdahl share of the time left, anew each round)")
    run.add_argument("--max-reverts", type=int, default=5,
                     help="park a kernel after this many reverts in a row: the next kernel goes on, and "
                          "parked kernels go round again while time is left")
    run.add_argument("--target-speedup", type=float, default=2.0, help="a kernel is done at this speedup over baseline")
    run.add_argument("--target-pct-peak", type=float, default=90.0, help="a kernel is done at this %% of the roofline")
    run.add_argument("--min-gain", type=float, default=1.0, help="keep only if faster by more than this %%")
    cli.add_device_argument(run)
    run.add_argument("--quick", action="store_true", help="fewer shapes per harness stage")
    run.add_argument("--dtype", default="fp16", help=f"dtype of the timing run: {cli.DTYPE_HELP} (default fp16)")
    run.add_argument("--bench-timeout", type=float, help="seconds before a bench counts as a hang "
                                                         "(default 120 on a GPU, 600 on the CPU)")
    run.add_argument("--seed", type=int, default=0, help="seed of the builtin agent's search order")
    run.add_argument("--gpus", help="one worker per GPU, each on its own kernel: 0,1,2,3 or all "
                                    "(--max-experiments then counts per kernel; CPU mode: ids are labels)")
    run.add_argument("--ray", metavar="ADDRESS", help="each kernel as a task on the Ray cluster at ADDRESS (as "
                                                      "`ray start` prints it), or `local` to start one here "
                                                      "(pip install 'autokernel[ray]'); "
                                                      "see autokernel/loop/raycluster.py")
    run.add_argument("--verify", action="store_true",
                     help="when the loop stops, run verify.py on the plan's model (--cuda-graph on a GPU), so that the "
                          "report shows the measured end-to-end speedup beside the estimate")


def add_demo_command(sub) -> None:
    """`demo`: the whole pipeline on a shipped model."""
    demo = sub.add_parser("demo", help="the whole pipeline on a shipped model in one command "
                                       "(see autokernel/loop/demo.py)",
                          description=pipeline_demo.__doc__.split("\n\n")[0],
                          epilog="\n\n".join(pipeline_demo.__doc__.split("\n\n")[1:]),
                          formatter_class=cli.HelpFormatter)
    cli.add_device_argument(demo)
    demo.add_argument("--hours", type=float, help="the loop's wall-clock budget (default 1 on a GPU, 0.25 on a CPU)")
    demo.add_argument("--max-experiments", type=int,
                      help="the loop's benches, baselines included (default: no limit on a GPU, 8 on a CPU)")


def add_view_commands(sub) -> None:
    """`status`, `next` and `report`: what the loop did and will do, read from its state."""
    for name, text in (("status", "where the loop stands"), ("next", "what the loop will try next"),
                       ("report", "per-kernel results, Amdahl estimate, progress.png")):
        cmd = sub.add_parser(name, help=text)
        if name != "status":
            cmd.add_argument("--plan", help="plan to rank by when no loop has started")
        if name == "report":
            cmd.add_argument("--png", default="progress.png", help="where to write the plot")
            cmd.add_argument("--verify", action="store_true", help="run verify.py on the plan's model first")


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def agent_options(args) -> dict:
    if args.agent == "command":
        return {"command": args.agent_cmd or "", "timeout_s": args.agent_timeout}
    if args.agent == "openai":
        return {"model": args.model, "base_url": args.base_url, "api_key_env": args.api_key_env}
    return {}


def build_agent(args):
    return make_agent(args.agent, **agent_options(args))


def check_run_input(args) -> str | None:
    """The device the loop asks for (None: auto), or UsageError: checked before any branch, commit or row."""
    cli.check_limits(args, positive=("hours", "max_experiments", "per_kernel_minutes", "max_reverts", "target_speedup",
                                     "target_pct_peak", "bench_timeout", "agent_timeout"), non_negative=("min_gain",))
    cli.dtype_name(args.dtype)
    device = None if args.device == "auto" else args.device
    if device == "cuda" and not args.ray:  # a Ray cluster's GPUs are not this machine's
        from autokernel.harness.gpu import has_cuda

        if not has_cuda():
            raise cli.UsageError("--device cuda was asked for, but no CUDA GPU is visible to PyTorch")
    return device


def cmd_run(args, root: Path) -> int:
    started_on = checkout_name(root)
    try:
        return run_loop(args, root)
    finally:  # normally, on a budget, on Ctrl-C or on an error alike
        note = back_note(root, started_on)
        if note:
            print(note, flush=True)


def checkout_name(root: Path) -> str | None:
    """The branch checked out in root (a sha when detached), or None outside a git repository."""
    try:
        log = GitLog(root)
    except GitError:
        return None
    return log.branch() or log.head()


def back_note(root: Path, started_on: str | None) -> str | None:
    """One line when the run leaves the checkout on an autokernel/ branch it was not on before: how to get
    back, and that the winners stay where verify.py and optimize() read them."""
    now = checkout_name(root)
    if not started_on or now == started_on or not (now or "").startswith("autokernel/"):
        return None
    return (f"the checkout is left on branch {now} (the experiments: git log {now}); back to your work: "
            f"git checkout {started_on}; the winners stay in workspace/kernels/*_optimized.py (untracked, "
            f"so the checkout keeps them; verify.py and autokernel.optimize read them there)")


def run_loop(args, root: Path) -> int:
    args.device = check_run_input(args)
    config = LoopConfig(tag=args.tag, hours=args.hours, max_experiments=args.max_experiments,
                        per_kernel_minutes=args.per_kernel_minutes, max_reverts=args.max_reverts,
                        target_speedup=args.target_speedup, target_pct_peak=args.target_pct_peak,
                        min_gain_pct=args.min_gain, device=args.device, quick=args.quick, dtype=args.dtype,
                        bench_timeout=args.bench_timeout, seed=args.seed)
    run = new_run(args, root)
    with LiveLine() as ui:
        why = run.start(config, args.plan, args.kernel, ui)
        ui.print(f"[bold]{run.stopped}[/bold]: {why}")
    if args.verify:
        run_verify(root, args.plan, run.verify_device(args.device))
        args.verify = False  # measured just now: the report does not measure again
    return cmd_report(args, root)


def run_verify(root: Path, plan: str | None, device: str | None) -> int:
    """verify.py on the model the plan was profiled on, writing workspace/verify.json for the report."""
    import json
    import subprocess

    plan_path = Path(plan) if plan else root / "workspace" / "plan.json"
    plan_path = plan_path if plan_path.is_absolute() else root / plan_path
    try:
        cmd = report.verify_command(json.loads(plan_path.read_text()), device)
    except (OSError, ValueError) as e:
        print(f"--verify: cannot run verify.py: {e}", file=sys.stderr)
        return 1
    print(f"verifying end to end: {report.shell_line(cmd)}", flush=True)
    code = subprocess.run(cmd, cwd=root).returncode
    if code:
        print(f"--verify: verify.py exited with {code}; see its output above", file=sys.stderr)
    return code


def cmd_status(args, root: Path) -> int:
    run = recorded_run(root, args.tag)
    print("\n".join(run.status_lines()))
    if run.started():
        rows = run.rows()
        LiveLine().print(report_table(kernel_summaries(rows, run.jobs()), args.tag, report.rows_device(rows)))
    return 0


def cmd_next(args, root: Path) -> int:
    jobs = recorded_run(root, args.tag, args.plan).next_jobs()
    if not jobs:
        print(f"tag {args.tag}: every kernel is done")
    for job in jobs:
        print_next(job, root, job.get("seed", 0))
    return 0


def print_next(job: dict, root: Path, seed: int) -> int:
    share = f", {job['f']:.1%} of the model's time, gain {job['gain']:.3f}x" if job.get("f") else ""
    print(f"next kernel: {job['name']} ({job['type']}, {job['source']}{share})")
    if job.get("best_sha") is None:
        print("next experiment: its baseline")
        return 0
    source = GitLog(root).file_at(job["best_sha"], KERNEL_PATH)
    print(f"best so far {format_us(job['best_us'])}; {job['reverts_in_row']} reverts in a row")
    print(f"builtin agent's next move: {describe_next(source, job.get('memory', {}), seed)}")
    return 0


def cmd_report(args, root: Path) -> int:
    if getattr(args, "verify", False):
        run_verify(root, getattr(args, "plan", None), None)
    run = recorded_run(root, args.tag, getattr(args, "plan", None))
    jobs, rows = run.jobs(), run.rows()
    summaries = kernel_summaries(rows, jobs)
    device, verified = report.rows_device(rows), report.read_verify(root)
    console = LiveLine()
    console.print(report_table(summaries, args.tag, device))
    print("\n".join(report.shape_lines(jobs)))
    kept = [r["timestamp"] for r in rows if r["status"] in ("baseline", "keep")]
    deploy = next((j["deploy"] for j in jobs if j.get("deploy")), "eager")  # what the plan's shares are of
    print("\n".join(report.estimate_lines(amdahl(summaries), verified, max(kept) if kept else None,
                                         report.is_cpu(device), deploy)))
    png = Path(getattr(args, "png", "progress.png"))
    png = write_progress_png(rows, {s["source"]: s["kernel"] for s in summaries}, verified,
                             png if png.is_absolute() else root / png, args.tag)
    console.print(f"progress plot: {png}" + (f" ({report.CPU_CAVEAT})" if report.is_cpu(device) else ""))
    return 0


def _sigterm(signum, frame):
    raise KeyboardInterrupt  # `kill` stops the loop the way Ctrl-C does: a last row, a clean tree


def cmd_demo(args, root: Path) -> int:
    cli.check_limits(args, positive=("hours", "max_experiments"))
    device = args.device
    if device != "cpu":  # --device cpu decides without importing torch
        from autokernel.harness.gpu import pick_device

        try:
            device = pick_device(device)
        except RuntimeError as e:  # --device cuda without a GPU: bad input, before anything runs
            raise cli.UsageError(str(e)) from None
    return pipeline_demo.run_demo(root, device, args.tag, args.hours, args.max_experiments)


def dispatch(args) -> int:
    root = Path(args.repo).resolve()
    if args.command != "demo":  # the demo takes a fresh tag of its own
        args.tag = args.tag or default_tag(root)
    commands = {"run": cmd_run, "status": cmd_status, "next": cmd_next, "report": cmd_report, "demo": cmd_demo}
    return commands[args.command](args, root)


def main(argv=None) -> int:
    args = parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _sigterm)
    known = ("LoopError", "GitError", "AgentUnavailable")
    try:
        return cli.run_main("orchestrate.py", lambda: dispatch(args), args.debug, known=known)
    except KeyboardInterrupt:
        if args.command != "demo":  # the demo says where it stopped and what finishes it
            print("interrupted: the experiment in flight was undone and logged; run again to resume",
                  file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
