"""`orchestrate.py demo`: the whole pipeline on a shipped model in one command, as the README runs it.

    profile.py -> extract.py -> orchestrate.py run --verify (the loop, then verify.py, then the report)

Each step is the script itself in a child process, with the command line printed before it runs, so
that the demo is the pipeline a user runs by hand, not a second implementation of it. The model is
models/llama.py's LlamaModel: on a GPU at the TinyLlama-1.1B shape for a short night (an hour), on a
CPU at its tiny preset for a few minutes through Triton's interpreter (timings that show the pipeline
runs, not performance figures). It ends with verify.py's measured end-to-end speedup and where the
kernels and the experiments are.

It never overwrites an earlier run: it refuses while workspace/ holds a plan, kernels or a verify.py
report, or progress.png exists (move them aside first), and it takes a fresh tag (demo, demo-2, ...) so
that its results.tsv rows and its branch autokernel/<tag> stand apart from any other. Ctrl-C stops the
step in flight the way that step stops on its own (the loop undoes its experiment in flight), and the
demo prints the commands that finish the pipeline from there.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from autokernel import cli
from autokernel.loop import report
from autokernel.loop.gitlog import GitLog
from autokernel.loop.state import StateFile

MODEL_FILE, MODEL_CLASS = "models/llama.py", "LlamaModel"
TAG = "demo"  # the first demo's tag; later ones are demo-2, demo-3, ...
INTERRUPT_GRACE_S = 30  # a step told to stop gets this long to undo its work before it is asked again
# an earlier run's files, which the demo's own steps would write over
EARLIER_RUN = ("workspace/plan.json", "workspace/profile.json", "workspace/verify.json", "workspace/kernels",
               "progress.png")


@dataclass(frozen=True)
class Preset:
    config: str  # models/llama.py's preset
    input_shape: str  # batch,seq
    dtype: str
    hours: float  # the loop's wall-clock budget
    max_experiments: int | None  # the loop's benches, baselines included
    top: int = 9  # plan entries extracted (every type the plan ranks: the loop takes them in Amdahl order)


PRESETS = {
    # a short night at a real size: the shape of TinyLlama-1.1B, a 2048-token prompt, fp16
    "cuda": Preset("tinyllama", "1,2048", "fp16", hours=1.0, max_experiments=None),
    # a few minutes on a CPU: the tiny preset on 1 x 32 tokens in fp32 through Triton's interpreter
    "cpu": Preset("tiny", "1,32", "fp32", hours=0.25, max_experiments=8),
}


@dataclass
class Step:
    name: str
    argv: list[str]  # the script and its arguments, as the README writes them (python <argv>)


def steps(preset: Preset, device: str, tag: str, hours: float, max_experiments: int | None) -> list[Step]:
    model = ["--model", MODEL_FILE, "--class-name", MODEL_CLASS, "--config", preset.config,
             "--input-shape", preset.input_shape, "--dtype", preset.dtype, "--device", device]
    loop = ["orchestrate.py", "run", "--tag", tag, "--device", device, "--dtype", preset.dtype, "--hours", f"{hours:g}"]
    loop += ["--max-experiments", str(max_experiments)] if max_experiments is not None else []
    loop += ["--quick"] if device == "cpu" else []  # fewer shapes per stage: every stage still runs
    return [Step("profile", ["profile.py", *model]), Step("extract", ["extract.py", "--top", str(preset.top)]),
            Step("loop, verify and report", [*loop, "--verify"])]


def earlier_run(root: Path) -> list[str]:
    """The files of an earlier run that the demo would write over."""
    found = []
    for name in EARLIER_RUN:
        path = root / name
        if path.is_file() or (path.is_dir() and any(path.glob("*.py"))):
            found.append(name)
    return found


def fresh_tag(root: Path, wanted: str | None) -> str:
    """The tag the demo runs under: `wanted` if free, else the first of demo, demo-2, ... with no branch
    autokernel/<tag> and no loop state."""
    git = GitLog(root)

    def taken(t: str) -> bool:
        return git.branch_exists(f"autokernel/{t}") or StateFile(root, t).read() is not None
    if wanted:
        if taken(wanted):
            raise cli.UsageError(f"tag {wanted} is taken (branch autokernel/{wanted} or its loop state exists): "
                                 "choose another --tag, or leave it out for a fresh one")
        return wanted
    n = 1
    while taken(TAG if n == 1 else f"{TAG}-{n}"):
        n += 1
    return TAG if n == 1 else f"{TAG}-{n}"


def check_start(root: Path) -> None:
    """UsageError when the demo cannot start cleanly: before any step has written anything."""
    found = earlier_run(root)
    if found:
        raise cli.UsageError(f"an earlier run's files are here ({', '.join(found)}) and the demo would write over "
                             f"them: move them aside first (mkdir before-demo && mv {' '.join(found)} before-demo/)")
    GitLog(root).require_clean()  # the loop's own rule, checked before the profile rather than after it


def run_step(step: Step, root: Path, number: int, total: int) -> int:
    """One script in a child process, its command line printed first. On Ctrl-C the child, which got the
    signal too, is given time to stop the way it stops on its own (SIGTERM's KeyboardInterrupt reaches only
    this process: the child is then asked with SIGINT)."""
    print(f"\n[demo {number}/{total}] {step.name}: python {' '.join(step.argv)}", flush=True)
    child = subprocess.Popen([sys.executable, *step.argv], cwd=root)
    try:
        return child.wait()
    except KeyboardInterrupt:
        try:
            child.wait(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGINT)
            child.wait()
        raise


def measured_line(root: Path) -> str:
    """verify.py's end-to-end figure for the model, from workspace/verify.json."""
    verify = report.read_verify(root)
    if verify is None:
        return "the model: no verify.py report (workspace/verify.json): run the verify step again"
    where = f"CPU mode: {report.CPU_CAVEAT}" if verify.get("cpu_mode") else verify.get("gpu") or "GPU"
    head = (f"the model, {verify.get('model')} input {'x'.join(map(str, verify.get('input_shape') or []))}: "
            f"correctness {verify['correctness']['status']}")
    measured = report.measured_speedup(verify)
    if measured is None:
        return f"{head}, not timed ({where})"
    speedup, how = measured
    return f"{head}, {speedup:.3g}x {how}, measured by verify.py ({where})"


def where_lines(root: Path, tag: str, started_on: str | None) -> list[str]:
    kernels = sorted(p.name for p in (root / "workspace" / "kernels").glob("*_optimized.py"))
    lines = [f"kernels: workspace/kernels/ (the loop's best: {', '.join(kernels) or 'none kept yet'}; "
             "autokernel.optimize(model) and verify.py take them from there)",
             f"experiments: branch autokernel/{tag} (git log --oneline autokernel/{tag}) and the rows tagged {tag} "
             "in results.tsv",
             f"report and plot again: python orchestrate.py report --tag {tag} --png progress.png"]
    if started_on and GitLog(root).branch() != started_on:
        lines.append(f"back to your branch: git checkout {started_on}")
    return lines


def run_demo(root: Path, device: str, tag: str | None, hours: float | None, max_experiments: int | None) -> int:
    check_start(root)
    tag = fresh_tag(root, tag)
    preset = PRESETS[device]
    hours = preset.hours if hours is None else hours
    max_experiments = preset.max_experiments if max_experiments is None else max_experiments
    git = GitLog(root)
    started_on, started = git.branch() or git.head(), time.time()
    print(f"demo: {MODEL_CLASS} ({MODEL_FILE}, config {preset.config}) at input {preset.input_shape} {preset.dtype} "
          f"on {device}, tag {tag}; the loop for at most {hours:g} h"
          + (f" and {max_experiments} experiments" if max_experiments is not None else ""))
    if device == "cpu":
        print(f"CPU mode: no GPU, so the kernels run in Triton's interpreter: {report.CPU_CAVEAT}")
    plan = steps(preset, device, tag, hours, max_experiments)
    for i, step in enumerate(plan):
        try:
            code = run_step(step, root, i + 1, len(plan))
        except KeyboardInterrupt:
            rest = "; ".join(f"python {' '.join(s.argv)}" for s in plan[i:])
            print(f"\ndemo interrupted at {step.name}; what is done stays. To finish from here: {rest}",
                  file=sys.stderr)
            raise
        if code != 0:
            raise cli.UsageError(f"demo: {step.argv[0]} exited with {code} (its output is above); "
                                 f"to go on by hand: python {' '.join(step.argv)}")
    print(f"\ndemo done in {report.format_duration(time.time() - started)}")
    for line in [measured_line(root), *where_lines(root, tag, started_on)]:
        print(f"  {line}")
    return 0

