"""progress.png: the night at a glance, made from results.tsv and workspace/verify.json alone.

x is wall-clock time since the tag's first experiment (results.tsv's timestamps), y the speedup over each
kernel's own baseline (its time in the model when it has model shapes, else its primary shape's latency).
Every experiment is a marker by its outcome as results.tsv records it (report.outcome, which the report
counts with too): each kernel's baseline, kept (a commit on autokernel/<tag>), reverted (correct but not
faster by the margin; one not timed because it launches exactly what the best launches sits at the best's
level, an edit that never reached the harness on the floor), failed (a crash, a timeout, an incorrect
kernel). Each kernel's best so far is a step line, labelled at its last step with the kernel's name and best
speedup (labels that would overlap are stacked, and the time axis leaves room for them). verify.py's
measured end-to-end speedup of the model, when there is one, is a dashed line inside the y range (on a log
scale when the range spans more than LOG_ABOVE, as a CPU run's 0.001x does), so that the kernels' gains are
never the only number. In CPU mode the title and a line across the foot of the figure say the times are the
Triton interpreter's.

    python orchestrate.py report --tag TAG --png progress.png   # the same figure again, any time
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from autokernel.loop import report
from autokernel.loop.report import CPU_CAVEAT, is_cpu, measured_speedup, outcome, outcome_counts
from autokernel.results import objective_us

PNG_DPI = 150  # progress.png resolution: sharp enough for a report page at 8 inches wide
HOURS_AFTER_MIN = 120  # the time axis is in hours past this many minutes
HEADROOM = 0.12  # of the y range, above the highest point, for the kernel labels
FLOOR = 0.9  # failed and far slower experiments sit on the axis's floor, this fraction of the lowest line
LOG_ABOVE = 10.0  # a y range wider than this ratio is drawn on a log scale
OUTCOMES = {  # outcome (report.outcome) -> (matplotlib marker style, legend label)
    "baseline": ({"marker": "D", "color": "black", "s": 30, "zorder": 4}, "baseline (the kernel as it started)"),
    "kept": ({"marker": "o", "color": "tab:green", "s": 36, "zorder": 4}, "kept (a commit)"),
    "reverted": ({"marker": "o", "facecolors": "none", "edgecolors": "tab:gray", "s": 28, "zorder": 3},
                 "reverted (not faster, or the same launches as the best)"),
    "failed": ({"marker": "x", "color": "tab:red", "s": 36, "zorder": 3}, "failed (crash, timeout, incorrect)"),
    "by hand": ({"marker": "^", "color": "tab:blue", "s": 30, "zorder": 3}, "bench.py by hand with this tag"),
}


def _elapsed_s(rows: list[dict]) -> list[float]:
    times = [datetime.fromisoformat(r["timestamp"]) for r in rows]
    return [(t - times[0]).total_seconds() for t in times]


def _kernel_points(rows: list[dict], elapsed: list[float], names: dict[str, str]) -> dict[str, dict]:
    """Per kernel: its experiments as (time, speedup over its baseline or None, outcome) and its best-so-far steps."""
    kernels: dict[str, dict] = {}
    for row, t in zip(rows, elapsed):
        k = kernels.setdefault(row["kernel_file"], {"name": names.get(row["kernel_file"]) or Path(
            row["kernel_file"]).stem, "base": None, "points": [], "steps": []})
        us, kind = objective_us(row), outcome(row)
        if kind in ("baseline", "kept") and us:
            k["base"] = k["base"] or us
            k["steps"].append((t, k["base"] / us))
        k["points"].append((t, _speedup(k, us, kind, row), kind))
    return kernels


def _speedup(kernel: dict, us: float | None, kind: str, row: dict) -> float | None:
    """Where an experiment is drawn: its speedup over the kernel's baseline; a correct revert that was not timed
    (it launches what the best launches) at the best's; None (the floor) for a failure or an edit never benched."""
    if kind == "failed" or not kernel["base"]:
        return None
    if us:
        return kernel["base"] / us
    untimed_twin = kind == "reverted" and row.get("correctness") == "PASS" and kernel["steps"]
    return kernel["steps"][-1][1] if untimed_twin else None


def _y_limits(ax, floor: float, top: float) -> None:
    """The y range from floor to top, with HEADROOM above for the labels; a log scale for a wide range."""
    if top / floor > LOG_ABOVE:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.set_yscale("log")
        ax.set_ylim(floor, top * (top / floor) ** HEADROOM)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))  # 0.01, not 10^-2
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(floor, top + HEADROOM * (top - floor))


def progress_figure(rows: list[dict], names: dict[str, str], verify: dict | None, tag: str):
    """The figure (matplotlib, Agg) of one tag's rows; names: kernel_file -> kernel name."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = sorted(rows, key=lambda r: r["timestamp"])
    device = report.rows_device(rows)
    fig = Figure(figsize=(9, 5))
    FigureCanvasAgg(fig)  # Agg, whatever backend the user's matplotlib is set to
    ax = fig.add_subplot()
    elapsed = _elapsed_s(rows) if rows else []
    hours = bool(elapsed) and elapsed[-1] > HOURS_AFTER_MIN * 60
    scale = 3600 if hours else 60
    kernels = _kernel_points(rows, elapsed, names)
    counts = outcome_counts(rows)
    for kind, (style, label) in OUTCOMES.items():
        if kind in counts:  # the loop's outcomes in the legend, seen or not
            ax.scatter([], [], label=label, **style)
    model = measured_speedup(verify)[0] if verify and measured_speedup(verify) else None
    shown = [y for k in kernels.values() for _, y in k["steps"]] + ([model] if model else [])
    floor = FLOOR * min([1.0, *shown])  # the end-to-end line is drawn in view, however far below 1x
    ends = [end for k in kernels.values() if (end := _draw_kernel(ax, k, scale, floor))]
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    _end_to_end_line(ax, verify)
    _y_limits(ax, floor, max([1.0, *shown, *(y for k in kernels.values() for _, y, _ in k["points"] if y)]))
    ax.set_xlim(left=0)
    ax.set_xlabel(f"wall-clock time since the first experiment ({'hours' if hours else 'minutes'})")
    ax.set_ylabel("speedup over the kernel's baseline (x)")
    where = f"CPU, {CPU_CAVEAT}" if is_cpu(device) else (device or "device unknown")
    ax.set_title(f"AutoKernel, tag {tag}: {len(rows)} experiments on {where}\n{report.outcome_text(counts)}; "
                 "failed and far slower ones sit on the floor", fontsize="medium")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize="small", frameon=False)
    if is_cpu(device):
        fig.text(0.5, 0.01, f"{CPU_CAVEAT}: they show that the pipeline runs, not how fast a GPU is",
                 ha="center", color="tab:red", fontsize="small", gid="cpu-caveat")
    fig.tight_layout(rect=(0, 0.04 if is_cpu(device) else 0, 1, 1))
    _label_ends(ax, ends)  # after the layout: the labels' room on the time axis is measured on the final axes
    return fig


def _draw_kernel(ax, kernel: dict, scale: float, floor: float) -> tuple | None:
    """One kernel's experiments by outcome, and its best so far as a step line; (x, y, label, colour) of its
    last step, where its label goes."""
    for kind, (style, _) in OUTCOMES.items():
        mine = [(t / scale, max(y, floor) if y else floor) for t, y, o in kernel["points"] if o == kind]
        if mine:
            ax.scatter(*zip(*mine), clip_on=False, gid=kind, **style)
    if not kernel["steps"]:
        return
    end = max(t for t, _, _ in kernel["points"])
    xs = [t / scale for t, _ in kernel["steps"]] + [end / scale]
    ys = [y for _, y in kernel["steps"]] + [kernel["steps"][-1][1]]
    line, = ax.step(xs, ys, where="post", linewidth=1.8, zorder=2)
    return xs[-1], ys[-1], f"{kernel['name']} {ys[-1]:.2f}x", line.get_color()


LABEL_POINTS = 11  # a label's height: labels are kept at least this far apart, upwards
LABEL_OFFSET = 4  # points between a step line's end and its label
LABEL_SHARE = 0.25  # a label wider than all but this share of the axes is left running past its edge


def _label_ends(ax, ends: list[tuple]) -> None:
    """Each kernel's label at the end of its step line, pushed upwards where it would overlap the one below;
    the time axis then widened so that every label ends inside the axes."""
    points_per_pixel = 72 / ax.figure.dpi
    below = None
    labels = []
    for x, y, text, color in sorted(ends, key=lambda e: e[1]):
        at = ax.transData.transform((x, y))[1] * points_per_pixel  # the end's height on the page, in points
        height = at + LABEL_OFFSET if below is None else max(at + LABEL_OFFSET, below + LABEL_POINTS)
        below = height
        labels.append(ax.annotate(text, (x, y), xytext=(LABEL_OFFSET, height - at), textcoords="offset points",
                                  fontsize="small", color=color, gid="kernel-label"))
    _room_for(ax, labels)


def _room_for(ax, labels: list) -> None:
    """Widen the time axis so that each label, which starts at its line's end, also ends inside the axes: a label
    past the axes' right edge is cut off at the figure's."""
    if not labels:
        return
    renderer = ax.figure.canvas.get_renderer()
    width = ax.get_window_extent(renderer).width
    left, right = ax.get_xlim()
    for label in labels:
        room = label.get_window_extent(renderer).width + LABEL_OFFSET * ax.figure.dpi / 72
        share = max(LABEL_SHARE, 1 - room / width)  # of the axes' width, left of where the label may start
        right = max(right, left + (label.xy[0] - left) / share)
    ax.set_xlim(left, right)


def _end_to_end_line(ax, verify: dict | None) -> float | None:
    """verify.py's measured speedup of the whole model (report.measured_speedup), a dashed line."""
    measured = measured_speedup(verify) if verify else None
    if measured is None:
        return None
    speedup, how = measured
    cpu = " (CPU interpreter)" if verify.get("cpu_mode") else ""
    cpu += "; NOT the kernels' model or input (see the report)" if verify.get("warnings") else ""
    ax.axhline(speedup, color="black", linestyle="--", linewidth=1.2, zorder=1,
               label=f"the model end to end, verify.py: {speedup:.3g}x {how}{cpu}")
    ax.annotate(f"the model end to end: {speedup:.3g}x", (0, speedup), xycoords=("axes fraction", "data"),
                xytext=(4, 3), textcoords="offset points", fontsize="small", gid="end-to-end-label")
    return speedup


def write_progress_png(rows: list[dict], names: dict[str, str], verify: dict | None, path: Path, tag: str) -> Path:
    progress_figure(rows, names, verify, tag).savefig(path, dpi=PNG_DPI)
    return path
