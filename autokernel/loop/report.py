"""What the user sees of the loop: the live line, the per-kernel report, the Amdahl estimate (progress.png: plot.py).

Everything here is read from results.tsv (the rows of one tag) and, for each kernel's share of the
model's time, from the loop's state; nothing is recomputed from git. A kernel's time is its time in
the model (model_us: every model shape, weighted by its calls per forward) when it has model shapes,
else its primary shape's latency. The end-to-end estimate is Amdahl's law over the kernels the plan
ranked: a kernel taking a fraction f of the model's time, of which a fraction r is left, gives
1 / ((1 - sum f) + sum f r). r is the kernel's best time in the model over the time the profile measured
for its type (both GPU time per forward pass), or 1 / s for a kernel without model shapes (s: its speedup
over PyTorch), and never above 1 (verify.py leaves out a kernel the model is faster without).
It is printed beside the last end-to-end measurement, workspace/verify.json as verify.py writes it, so
that the estimate is never the only number; `orchestrate.py run --verify` takes that measurement. A
measurement of another model or input than the kernels were extracted for says so, naming both.
The report and progress.png count the experiments by outcome with one function (outcome_counts).
"""

from __future__ import annotations

import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

from rich.markup import escape

from autokernel.profile.plan import COMPILED, describe_input, describe_origin, fraction_left, kernel_origin, other_model
from autokernel.results import objective_us

VERIFY_JSON = Path("workspace/verify.json")  # verify.py's full report, written on every run
KERNELS_DIR = Path("workspace/kernels")  # extract.py's files and the loop's winners, each with its MODEL_SOURCE
# verify.py's timing rows the estimate is compared with, (row, its speedup's key, what it is), by the side the
# plan was ranked for (profile.py --deploy): first GPU time alone (the profile's f is GPU time), the estimate's
# counterpart, then the model as a user of that side runs it
COUNTERPART = " (GPU time, the estimate's counterpart)"
VERIFY_ROWS = {
    "eager": (("optimized_graph", "speedup_vs_eager", "over eager with CUDA graphs" + COUNTERPART),
              ("optimized", "speedup_vs_eager", "over eager in eager mode (launch costs included)"),
              ("optimized_compile", "speedup_vs_eager", "over eager under torch.compile")),
    "compiled": (("optimized_compile_graph", "speedup_vs_compile",
                  "over torch.compile, both with CUDA graphs" + COUNTERPART),
                 ("optimized_compile", "speedup_vs_compile",
                  "over torch.compile without graphs (launch costs included)"),
                 ("optimized_graph", "speedup_vs_eager", "over eager with CUDA graphs")),
}

CPU_CAVEAT = "Triton interpreter timings, not performance figures"  # what every CPU-mode figure says of itself
NON_TTY_WIDTH = 200  # characters per line when the output goes to a file


def format_us(us) -> str:
    if us is None:
        return "-"
    us = float(us)
    return f"{us / 1000:.2f} ms" if us >= 10_000 else f"{us:.1f} us"


def format_x(ratio) -> str:
    """A speedup; three significant digits, so that 0.0005x in CPU mode does not read as 0.00x."""
    return "-" if not ratio else f"{float(ratio):.3g}x"


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _float(value) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


STATUS_STYLE = {"keep": "green", "baseline": "cyan", "revert": "yellow", "crash": "red", "timeout": "red"}


def progress_line(row: dict, job: dict, seconds_left: float, took: str = "") -> str:
    """One line per experiment: what was tried, what came of it, where the kernel stands, what it took (took)."""
    status = row["status"]
    speedup = (f"{job['baseline_us'] / job['best_us']:.2f}x baseline"
               if job.get("baseline_us") and job.get("best_us") else "no correct version yet")
    vs_torch = f", {format_x(job['best_vs_pytorch'])} pytorch" if job.get("best_vs_pytorch") else ""
    return (f"exp {row['experiment']:>3} {escape(job['name'])} [{STATUS_STYLE.get(status, 'white')}]"
            f"{status:<8}[/] {format_us(objective_us(row)):>10}  {escape(row['description'][:90])}"
            f"  | best {speedup}{vs_torch}, kept {job['kept']}/{job['experiments']}"
            f"{f' | {took}' if took else ''} | {format_duration(seconds_left)} left")


SLOW_STAGES_S = 10.0  # stages this long: the line names the slowest (a cold compile cache, mostly)


def took_text(seconds: float, result: dict) -> str:
    """Where an experiment's seconds went, as far as the bench says: "16 s (bench 14 s: stages 3 s)". The rest is
    the agent (a screen included), the commit and the child's start."""
    wall = result.get("wall_s")
    timed = [(s.get("seconds") or 0.0, s.get("name", "?")) for s in result.get("stages") or []]
    stages = sum(t for t, _ in timed)
    slowest = f", {max(timed)[1]} {max(timed)[0]:.0f} s" if stages >= SLOW_STAGES_S else ""  # what a cold cache cost
    bench = f" (bench {wall:.0f} s: stages {stages:.0f} s{slowest})" if wall else ""
    return f"{seconds:.0f} s{bench}"


class LiveLine:
    """Experiment lines printed as they come, under one live status line (rich; silent off a terminal)."""

    def __init__(self, console=None):
        from rich.console import Console

        if console is None:
            console = Console(highlight=False)
            if not console.is_terminal:  # a log file: one line per experiment, no wrapping at 80
                console = Console(highlight=False, width=NON_TTY_WIDTH)
        self.console = console
        self._live = None

    def __enter__(self):
        self._live = self.console.status("starting")
        self._live.start()
        return self

    def __exit__(self, *exc):
        self._live.stop()

    def print(self, text: str) -> None:
        self.console.print(text)

    def status(self, text: str) -> None:
        if self._live is not None:
            self._live.update(escape(text))


# ------------------------------------------------------------------------------ what became of each experiment
OUTCOMES = ("baseline", "kept", "reverted", "failed")  # the loop's; a tag's rows may also hold bench.py's "by hand"
LOOP_STATUSES = {"baseline": "baseline", "keep": "kept", "revert": "reverted"}


def outcome(row: dict) -> str:
    """What became of one experiment, as its results.tsv row records it: "failed" for a crash, a timeout or an
    incorrect kernel (correctness FAIL); else its status: "baseline", "kept", "reverted" (timed and not faster,
    not timed because it launches exactly what the best launches, or an edit that never reached the harness),
    or "by hand" (a bench.py row given the tag)."""
    if row.get("status") in ("crash", "timeout", "fail") or row.get("correctness") == "FAIL":
        return "failed"
    return LOOP_STATUSES.get(row.get("status"), "by hand")


def outcome_counts(rows: list[dict]) -> dict[str, int]:
    """Experiments per outcome (every one of OUTCOMES, "by hand" only when there is one): the plot and the
    report count with this, so that both say what results.tsv says."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for row in rows:
        kind = outcome(row)
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def outcome_text(counts: dict[str, int]) -> str:
    """"2 baselines, 3 kept, 6 reverted, 1 failed" (and "1 by hand" when there is one)."""
    return ", ".join(f"{n} {'baselines' if kind == 'baseline' and n != 1 else kind}" for kind, n in counts.items())


# ------------------------------------------------------------------------------ the report
def kernel_summaries(rows: list[dict], jobs: list[dict]) -> list[dict]:
    """Per kernel (in queue order, then any other kernel_file seen): baseline, best, runs, and its runs by
    outcome (outcome_counts)."""
    names = [j["source"] for j in jobs] + sorted({r["kernel_file"] for r in rows} - {j["source"] for j in jobs})
    by_source = {j["source"]: j for j in jobs}
    out = []
    for source in names:
        mine = [r for r in rows if r["kernel_file"] == source]
        base = next((r for r in mine if r["status"] == "baseline"), None)
        good = [r for r in mine if r["status"] in ("baseline", "keep") and r["correctness"] == "PASS"]
        best = good[-1] if good else None  # kept versions only ever get faster
        job = by_source.get(source, {})
        out.append({
            "kernel": job.get("name", Path(source).stem), "source": source, "f": job.get("f"),
            "time_us": job.get("time_us"), "type": job.get("type"), "rival_of": job.get("rival_of") or [],
            "status": job.get("status", ""), "reason": job.get("reason", ""),
            "runs": len(mine), "outcomes": outcome_counts(mine),
            "baseline_us": objective_us(base) if base else None,
            "best_us": objective_us(best) if best else None,
            "best_vs_pytorch": (_float(best.get("model_vs_pytorch")) or _float(best["speedup_vs_pytorch"]))
            if best else None,
            "host_us": _float(best.get("host_us")) if best else None,
            "in_model": bool(best and _float(best.get("model_us"))),
            "screened": len(job.get("memory", {}).get("screened", [])), "seconds": job.get("seconds") or 0.0,
        })
    return out


def rate_text(summaries: list[dict]) -> str:
    """How many experiments an hour of the loop ran, and how many configurations the builtin agent's screens timed
    at the model's shapes beside them (each checked against the reference there, not through the five stages):
    " (78 an hour); 288 configurations screened at the model's shapes (864 an hour)"; "" before an hour's
    measure."""
    hours = sum(s["seconds"] for s in summaries) / 3600
    if hours <= 0:
        return ""
    runs, screened = sum(s["runs"] for s in summaries), sum(s["screened"] for s in summaries)
    text = f" ({runs / hours:.0f} an hour)"
    return text + (f"; {screened} configurations screened at the model's shapes ({screened / hours:.0f} an hour)"
                   if screened else "")


def amdahl(summaries: list[dict]) -> float | None:
    """End-to-end speedup if every kernel with a plan share ran at its best (see remaining_fraction). An opt-in
    type's rivals (extract.py writes them beside it) count in its place where they leave less of its share than it
    does, as verify's prune deploys the faster; their shares overlap its own, so never both."""
    ranked = [s for s in summaries if s["f"]]
    if not ranked:
        return None
    rivals = [s for s in ranked if s.get("rival_of")]
    ranked = [s for s in ranked if not s.get("rival_of")]
    rest = 1.0 - sum(s["f"] for s in ranked)
    left = 0.0
    for s in ranked:
        own = s["f"] * remaining_fraction(s)
        theirs = [r for r in rivals if s.get("type") in r["rival_of"]]
        instead = max(0.0, s["f"] - sum(r["f"] for r in theirs)) + sum(r["f"] * remaining_fraction(r) for r in theirs)
        left += min(own, instead) if theirs else own
    return 1.0 / (rest + left)


def remaining_fraction(summary: dict) -> float:
    return fraction_left(summary.get("time_us"), summary.get("best_us"), summary.get("in_model"),
                         summary["best_vs_pytorch"])


def shape_lines(jobs: list[dict]) -> list[str]:
    """Each kernel's time per call at each model shape, baseline -> best, beside eager and compile."""
    lines = []
    for job in jobs:
        before = {json.dumps(s["shape"]): s for s in job.get("baseline_shapes") or []}
        best = job.get("best_shapes") or []
        if best:
            lines.append(f"{job['name']} at the model's shapes (us per call; calls per forward):")
        for s in best:
            base = before.get(json.dumps(s["shape"]), {}).get("us")
            label = " ".join(f"{k}={v}" for k, v in s["shape"].items())
            lines.append(f"  {label:<28} x{s['calls']:<4} {format_us(base)} -> {format_us(s['us'])}"
                         f"  eager {format_us(s['eager_us'])}  compile {format_us(s['compile_us'])}"
                         f"  host {format_us(s['host_us'])}")
    return lines


# ------------------------------------------------------------------------------ the measurement beside it
def measured_speedup(verify: dict) -> tuple[float, str] | None:
    """(speedup, over what and how it was run, e.g. "over eager with CUDA graphs") of the first of VERIFY_ROWS
    verify.py timed, on the side of the modes it was deployed in (its prune's modes)."""
    for row, key, label in VERIFY_ROWS[side((verify.get("prune") or {}).get("mode"))]:
        speedup = (verify["timing"].get(row) or {}).get(key)
        if speedup:
            return speedup, label.split(" (")[0]
    return None


def read_verify(root: Path, kernel_files: list[Path] | None = None) -> dict | None:
    """verify.py's last report (workspace/verify.json) with its file time, or None when there is none; its
    "warnings" say when it measured another model or input than the kernels were extracted for (kernel_files,
    by default the workspace's kernels: verify_warnings)."""
    path = root / VERIFY_JSON
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("timing"), dict):
        return None
    written = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
    files = sorted((root / KERNELS_DIR).glob("*.py")) if kernel_files is None else kernel_files
    return {**data, "written": written.isoformat(timespec="seconds"), "warnings": verify_warnings(data, files)}


def verify_warnings(verify: dict, kernel_files: list[Path]) -> list[str]:
    """One line per model (or input) the kernels were extracted for (their MODEL_SOURCE) that verify.json did not
    measure, naming both: compared as verify.py compares a kernel file with its model (plan.other_model)."""
    from autokernel.profile.extraction import model_origin

    measured = model_origin(verify)
    origins = {json.dumps(o, sort_keys=True): o for o in map(kernel_origin, kernel_files) if o is not None}
    if measured is None or not origins:
        return []
    lines = []
    for origin in origins.values():
        differs = other_model(origin, measured)
        if differs == "model":
            lines.append(f"warning: {VERIFY_JSON} measured {describe_origin(measured)}, not "
                         f"{describe_origin(origin)} that the kernels were extracted for: its end-to-end figure is "
                         "another model's (run verify.py on this one: orchestrate.py report --verify)")
        elif differs == "input":
            lines.append(f"warning: {VERIFY_JSON} measured this model at input {describe_input(measured)}, the "
                         f"kernels were extracted at {describe_input(origin)}: its figure is another input's")
    return lines


def side(deploy: str | None) -> str:
    """"compiled" where every mode of `deploy` (a plan's, or verify.py's "mode[,mode...]") compiles, else "eager"."""
    modes = (deploy or "eager").split(",")
    return "compiled" if all(m in COMPILED for m in modes) else "eager"


def estimate_lines(estimate: float | None, verify: dict | None, last_kept: str | None, cpu: bool = False,
                   deploy: str = "eager") -> list[str]:
    """The Amdahl estimate beside verify.py's measurement (or what to run to get one).
    last_kept: ISO time of the tag's last kept experiment; a measurement older than it is said to be.
    cpu: the kernels were timed in CPU mode, and the estimate is made of those times.
    deploy: the mode the plan was ranked for; under torch.compile its shares are of the compiled forward, so the
    estimate is over torch.compile and its counterpart is verify.py's compiled + graphed row."""
    lines, compiled = [], side(deploy) == "compiled"
    rows = VERIFY_ROWS["compiled" if compiled else "eager"]
    if estimate:
        caveat = f" (from CPU mode's {CPU_CAVEAT})" if cpu else ""
        base = "torch.compile" if compiled else "PyTorch eager"
        lines.append(f"end-to-end estimate (Amdahl over the plan's shares): {estimate:.3f}x over {base}{caveat}")
    if verify is None:
        return lines + ["no end-to-end measurement yet: run verify.py (or `orchestrate.py run --verify`); "
                        "the estimate alone is not a measurement"]
    where = f"CPU mode, {CPU_CAVEAT}" if verify.get("cpu_mode") else (verify.get("gpu") or "GPU")
    stale = " (older than the last kept experiment: run verify.py again)" if last_kept and \
        verify["written"] < last_kept else ""
    lines.append(f"measured by verify.py, {verify.get('model', '?')} input {verify.get('input_shape')} "
                 f"({where}, {verify['written']}){stale}:")
    lines += [f"  {line}" for line in verify.get("warnings") or []]
    for row, key, label in rows:
        speedup = (verify["timing"].get(row) or {}).get(key)
        if speedup:
            off = f"; the estimate is off by {100 * (estimate / speedup - 1):+.1f}%" \
                if estimate and row == rows[0][0] else ""
            lines.append(f"  {speedup:.3f}x {label}{off}")
    if not verify["timing"]:
        lines.append("  (no timing: correctness only, or the optimized model failed its check)")
    against = verify.get("against") or {}
    for how, a in (("", against), (" under torch.compile", against.get("compiled") or {})):
        if "verdict" in a:  # verify.py --against: the kernels in turns with the ones the loop began from
            lines.append(f"  the kept kernels against the {against['against']} ones ({', '.join(against['differs'])} "
                         f"differ), timed in turns{how}: {a['speedup']:.4f}x, {a['verdict']} (this run's faster "
                         f"in {a['won_rounds']} of {a['rounds']} turns, sign test p={a['p_value']:.2g})")
    return lines


def verify_command(plan: dict, device: str | None = None, json_path: Path = VERIFY_JSON) -> list[str]:
    """verify.py's command line for the model a plan was profiled on (profile.py records how it ran)."""
    source = plan.get("source")
    if not source or not plan.get("class_name"):
        raise ValueError("the plan does not say which model it profiled (no source/class_name): run verify.py "
                         "by hand")
    where = "--model" if source.endswith(".py") else "--module"
    cmd = [sys.executable, "verify.py", where, source, "--class-name", plan["class_name"]]
    if plan.get("config"):
        cmd += ["--config", str(plan["config"])]
    cmd += ["--input-shape", ",".join(map(str, plan.get("input_shape") or [])), "--dtype", plan.get("dtype", "float16")]
    device = device or ("cpu" if plan.get("cpu_mode") else "cuda")
    cmd += ["--device", device] + (["--cuda-graph"] if device == "cuda" else [])
    if plan.get("deploy", "eager") in COMPILED and device == "cuda":  # the mode the plan was ranked for decides
        cmd += ["--compile", "--deploy", plan["deploy"]]
    if any(e.get("kernel_file") for e in plan.get("entries", [])):  # extract.py wrote the files the loop began from
        cmd += ["--against", "extracted"]
    return cmd + ["--report", str(json_path)]


def shell_line(cmd: list[str]) -> str:
    return shlex.join(["python", *cmd[1:]])


def state_text(status: str, reason: str) -> str:
    """A kernel's state as the report and the loop say it: "parked (5 reverts in a row)", "done (...)"."""
    return f"{status} ({reason})" if reason else status


def rows_device(rows: list[dict]) -> str:
    """The device a tag's rows were timed on (results.tsv's device column, the last one given), "" if none."""
    return next((r["device"] for r in reversed(rows) if r.get("device")), "")


def is_cpu(device: str) -> bool:
    return device.startswith("cpu")  # bench.py writes "cpu (Triton interpreter)"


def report_table(summaries: list[dict], tag: str, device: str = ""):
    """Per kernel: its share, times, speedups, and its experiments by outcome (outcome_counts), the tag's
    totals in the title."""
    from rich.table import Table

    where = f" on {device}" if device else ""
    totals = outcome_counts([])
    for s in summaries:
        totals.update({kind: totals.get(kind, 0) + n for kind, n in s["outcomes"].items()})
    kinds = [kind for kind in totals if kind != "baseline"]
    table = Table(title=f"AutoKernel report: tag {tag}{where}\n{sum(s['runs'] for s in summaries)} experiments: "
                  f"{outcome_text(totals)}{rate_text(summaries)}",
                  caption=f"CPU mode: {CPU_CAVEAT}" if is_cpu(device) else None, caption_style="bold red")
    for col in ("kernel", "share f", "time", "baseline", "best", "vs baseline", "vs pytorch", "host/call", "runs",
                *kinds, "state"):
        table.add_column(col, justify="left" if col in ("kernel", "time", "state") else "right")
    for s in summaries:
        gain = f"{s['baseline_us'] / s['best_us']:.2f}x" if s["baseline_us"] and s["best_us"] else "-"
        table.add_row(escape(s["kernel"]), f"{s['f']:.1%}" if s["f"] else "-",
                      "in model" if s["in_model"] else "one call", format_us(s["baseline_us"]),
                      format_us(s["best_us"]), gain, format_x(s["best_vs_pytorch"]), format_us(s["host_us"]),
                      str(s["runs"]), *(str(s["outcomes"].get(k, 0)) for k in kinds),
                      escape(state_text(s["status"], s["reason"])))
    return table
