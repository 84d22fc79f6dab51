"""The morning report and progress.png from a synthetic results.tsv: what a practitioner sees of the night.

Two kernels, each with a baseline, kept, reverted and crashed experiments; verify.py's end-to-end figure
beside them. The figure is inspected through the matplotlib objects progress_figure returns.
"""

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from helpers import unwrapped

import orchestrate
from autokernel import results
from autokernel.loop import plot, report
from autokernel.loop.plot import OUTCOMES, progress_figure

START = datetime(2026, 11, 23, 22, 0, tzinfo=timezone.utc)
# (minutes after START, kernel file, status, correctness, model_us)
NIGHT = [
    (0, "workspace/kernels/01_rmsnorm.py", "baseline", "PASS", 100.0),
    (4, "workspace/kernels/01_rmsnorm.py", "keep", "PASS", 80.0),
    (8, "workspace/kernels/01_rmsnorm.py", "revert", "PASS", 95.0),
    (12, "workspace/kernels/01_rmsnorm.py", "crash", "FAIL", None),
    (16, "workspace/kernels/01_rmsnorm.py", "keep", "PASS", 62.5),
    (20, "workspace/kernels/02_matmul.py", "baseline", "PASS", 400.0),
    (24, "workspace/kernels/02_matmul.py", "revert", "FAIL", None),
    (28, "workspace/kernels/02_matmul.py", "keep", "PASS", 320.0),
    (32, "workspace/kernels/02_matmul.py", "timeout", "FAIL", None),
]
NAMES = {"workspace/kernels/01_rmsnorm.py": "01_rmsnorm", "workspace/kernels/02_matmul.py": "02_matmul"}


def write_night(root, device: str) -> list[dict]:
    path = root / "results.tsv"
    for minutes, kernel, status, correctness, us in NIGHT:
        results.append_row({"timestamp": (START + timedelta(minutes=minutes)).isoformat(), "tag": "night",
                            "kernel_type": kernel.split("_", 1)[1][:-3], "kernel_file": kernel, "status": status,
                            "correctness": correctness, "model_us": us, "latency_us": us, "device": device,
                            "description": f"{status} at {minutes} min"}, path)
    return results.read_rows(path)


def write_verify(root, cpu: bool) -> dict:
    report = {"model": "LlamaModel (1.1B parameters)", "input_shape": [1, 2048], "cpu_mode": cpu,
              "gpu": None if cpu else "NVIDIA H200",
              "timing": {"optimized": {"ms": 10.0, "speedup_vs_eager": 1.18},
                         "optimized_graph": {"ms": 9.0, "speedup_vs_eager": 1.07}}}
    (root / "workspace").mkdir(exist_ok=True)
    (root / "workspace" / "verify.json").write_text(json.dumps(report))
    return {**report, "written": START.isoformat()}


def texts(fig) -> list[str]:
    ax = fig.axes[0]
    return [t.get_text() for t in [*ax.texts, *fig.texts, ax.title, ax.xaxis.label]]


@pytest.mark.parametrize("device", ["NVIDIA H200", "cpu (Triton interpreter)"])
def test_progress_figure_shows_every_outcome_each_kernels_best_and_the_end_to_end_line(tmp_path, device):
    cpu = device.startswith("cpu")
    fig = progress_figure(write_night(tmp_path, device), NAMES, write_verify(tmp_path, cpu), "night")
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [OUTCOMES[kind][1] for kind in ("baseline", "kept", "reverted", "failed")] == legend[:4]
    e2e = [line for line in ax.get_lines() if line.get_label().startswith("the model end to end")]
    assert len(e2e) == 1 and e2e[0].get_ydata()[0] == pytest.approx(1.07)  # the CUDA-graph row, the estimate's kin
    assert "1.07x over eager with CUDA graphs" in e2e[0].get_label() and e2e[0].get_label() in legend
    # per outcome, the experiments drawn: 2 baselines, 3 keeps, 1 slower revert, 3 failures (a crash, an
    # incorrect kernel, a timeout), each kind in its own marker
    drawn = {kind: [c for c in ax.collections if c.get_gid() == kind] for kind in OUTCOMES if kind != "by hand"}
    assert {kind: sum(len(c.get_offsets()) for c in found) for kind, found in drawn.items()} == \
        {"baseline": 2, "kept": 3, "reverted": 1, "failed": 3}
    looks = {kind: (tuple(found[0].get_facecolors().ravel()), tuple(found[0].get_edgecolors().ravel()),
                    len(found[0].get_paths()[0].vertices)) for kind, found in drawn.items()}
    assert len(set(looks.values())) == 4
    labels = [t.get_text() for t in ax.texts if t.get_gid() == "kernel-label"]
    assert sorted(labels) == ["01_rmsnorm 1.60x", "02_matmul 1.25x"]  # each kernel's best, at its last step
    assert ax.xaxis.label.get_text() == "wall-clock time since the first experiment (minutes)"
    assert max(line.get_xdata()[-1] for line in ax.get_lines()[:2]) == pytest.approx(32.0)  # minutes, to the end
    title = ax.title.get_text()
    assert "9 experiments on" in title and "2 baselines, 3 kept, 1 reverted, 3 failed" in title
    caveat = [t for t in fig.texts if t.get_gid() == "cpu-caveat"]
    assert ("NVIDIA H200" in title) != cpu and len(caveat) == cpu and ("not performance figures" in title) == cpu


def test_the_end_to_end_line_stays_in_view_and_labels_at_one_height_are_stacked(tmp_path):
    rows = [r for r in write_night(tmp_path, "NVIDIA H200") if r["status"] == "baseline"]  # both ends at 1.00x
    verify = write_verify(tmp_path, cpu=False)
    verify["timing"]["optimized_graph"]["speedup_vs_eager"] = 3.0  # far above every kernel's step
    ax = progress_figure(rows, NAMES, verify, "night").axes[0]
    assert ax.get_ylim()[1] >= 3.0
    offsets = sorted(t.xyann[1] for t in ax.texts if t.get_gid() == "kernel-label")
    assert len(offsets) == 2 and offsets[1] > offsets[0]  # one above the other, not on top of each other


def test_report_regenerates_the_png_and_states_cpu_mode(tmp_path, capsys):
    write_night(tmp_path, "cpu (Triton interpreter)")
    write_verify(tmp_path, cpu=True)
    png = tmp_path / "night.png"
    assert orchestrate.main(["--repo", str(tmp_path), "report", "--tag", "night", "--png", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(line.strip() == "CPU mode: Triton interpreter timings, not performance figures" for line in lines)
    measured = next(line for line in lines if line.startswith("measured by verify.py"))
    assert "CPU mode, Triton interpreter timings, not performance figures" in measured
    # printed through rich, which wraps a line longer than its width (a long temporary path would be)
    assert f"progress plot: {png} (Triton interpreter timings, not performance figures)" in unwrapped(out)


# (minutes, kernel file, status, correctness, model_us): every outcome the loop records, and a bench.py row by hand
EVERY_OUTCOME = [
    (0, "workspace/kernels/01_rmsnorm.py", "baseline", "PASS", 100.0),
    (2, "workspace/kernels/01_rmsnorm.py", "keep", "PASS", 80.0),
    (4, "workspace/kernels/01_rmsnorm.py", "revert", "PASS", 95.0),  # timed, not faster
    (6, "workspace/kernels/01_rmsnorm.py", "revert", "PASS", None),  # untimed: the same launches as the best
    (8, "workspace/kernels/01_rmsnorm.py", "revert", "PASS", None),
    (10, "workspace/kernels/01_rmsnorm.py", "revert", "", None),  # the agent's edit never reached the harness
    (12, "workspace/kernels/01_rmsnorm.py", "revert", "FAIL", None),  # incorrect
    (14, "workspace/kernels/01_rmsnorm.py", "crash", "FAIL", None),
    (16, "workspace/kernels/02_matmul.py", "baseline", "PASS", 400.0),
    (18, "workspace/kernels/02_matmul.py", "revert", "PASS", None),
    (20, "workspace/kernels/02_matmul.py", "timeout", "FAIL", None),
    (22, "workspace/kernels/02_matmul.py", "pass", "PASS", 390.0),  # bench.py --tag night, by hand
]


def write_rows(root, night, device="NVIDIA H200") -> list[dict]:
    path = root / "results.tsv"
    for minutes, kernel, status, correctness, us in night:
        results.append_row({"timestamp": (START + timedelta(minutes=minutes)).isoformat(), "tag": "night",
                            "kernel_type": kernel.split("_", 1)[1][:-3], "kernel_file": kernel, "status": status,
                            "correctness": correctness, "model_us": us, "latency_us": us, "device": device,
                            "description": f"{status} at {minutes} min"}, path)
    return results.read_rows(path)


def drawn_counts(ax) -> dict:
    counts = {}
    for c in ax.collections:
        if c.get_gid() in OUTCOMES:
            counts[c.get_gid()] = counts.get(c.get_gid(), 0) + len(c.get_offsets())
    return counts


def test_the_plot_and_the_report_count_the_outcomes_results_tsv_records(tmp_path):
    rows = write_rows(tmp_path, EVERY_OUTCOME)
    expected = {"baseline": 2, "kept": 1, "reverted": 5, "failed": 3, "by hand": 1}
    assert report.outcome_counts(rows) == expected  # an untimed revert is a revert; a failure is a failure
    fig = progress_figure(rows, NAMES, None, "night")
    ax = fig.axes[0]
    assert drawn_counts(ax) == expected
    assert "2 baselines, 1 kept, 5 reverted, 3 failed, 1 by hand" in ax.title.get_text()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [label for _, label in OUTCOMES.values()]  # "by hand" too, since there is one
    summaries = report.kernel_summaries(rows, [])
    assert [s["outcomes"] for s in summaries] == [{"baseline": 1, "kept": 1, "reverted": 4, "failed": 2},
                                                  {"baseline": 1, "kept": 0, "reverted": 1, "failed": 1,
                                                   "by hand": 1}]
    assert sum(s["runs"] for s in summaries) == len(rows) == sum(expected.values())
    table = report.report_table(summaries, "night", "NVIDIA H200")
    assert "12 experiments: 2 baselines, 1 kept, 5 reverted, 3 failed, 1 by hand" in str(table.title)
    columns = {c.header: list(c._cells) for c in table.columns}
    assert columns["reverted"] == ["4", "1"] and columns["failed"] == ["2", "1"] and columns["kept"] == ["1", "0"]


def test_the_report_says_the_loop_s_rate_and_what_its_screens_timed(tmp_path):
    """Experiments an hour of the loop's own time (the jobs' seconds), and the configurations the builtin agent's
    screens timed at the model's shapes beside them."""
    rows = write_rows(tmp_path, EVERY_OUTCOME)
    sources = sorted({r["kernel_file"] for r in rows})
    jobs = [{"name": Path(src).stem, "source": src, "seconds": 900.0,
             "memory": {"screened": [f"config {i}" for i in range(48 * n)]}} for n, src in enumerate(sources)]
    table = report.report_table(report.kernel_summaries(rows, jobs), "night", "NVIDIA H200")
    assert "12 experiments: 2 baselines, 1 kept, 5 reverted, 3 failed, 1 by hand (24 an hour); 48 configurations " \
           "screened at the model's shapes (96 an hour)" in str(table.title)
    bare = report.report_table(report.kernel_summaries(rows, []), "night")  # no loop state: no rate
    assert "an hour" not in str(bare.title)


def test_an_untimed_revert_sits_at_the_best_and_an_unbenched_one_on_the_floor(tmp_path):
    ax = progress_figure(write_rows(tmp_path, EVERY_OUTCOME[:6]), NAMES, None, "night").axes[0]
    reverted = sorted(y for c in ax.collections if c.get_gid() == "reverted" for _, y in c.get_offsets())
    floor = ax.get_ylim()[0]
    # the floor (never benched), 100/95 (timed), and twice the best's 100/80 (untimed: the best's launches)
    assert reverted == pytest.approx([floor, 100 / 95, 1.25, 1.25])


def test_a_cpu_end_to_end_line_far_below_one_is_drawn_in_view(tmp_path):
    rows = write_rows(tmp_path, EVERY_OUTCOME, device="cpu (Triton interpreter)")
    verify = write_verify(tmp_path, cpu=True)
    verify["timing"] = {"optimized": {"ms": 900.0, "speedup_vs_eager": 0.0005}}  # the interpreter against eager
    ax = progress_figure(rows, NAMES, verify, "night").axes[0]
    bottom, top = ax.get_ylim()
    e2e = next(line for line in ax.get_lines() if line.get_label().startswith("the model end to end"))
    assert e2e.get_ydata()[0] == pytest.approx(0.0005) and bottom < 0.0005 and 1.25 < top
    assert ax.get_yscale() == "log"  # 0.0005x and 1.25x both readable


def test_every_kernel_label_ends_inside_the_axes(tmp_path):
    names = {"workspace/kernels/01_rmsnorm.py": "01_rmsnorm_with_a_long_name",
             "workspace/kernels/02_matmul.py": "03_linear_cross_entropy_of_the_lm_head"}
    fig = progress_figure(write_rows(tmp_path, EVERY_OUTCOME), names, None, "night")
    fig.savefig(tmp_path / "p.png", dpi=plot.PNG_DPI)  # the labels as the PNG has them
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    axes_box, figure_box = ax.get_window_extent(renderer), fig.bbox
    labels = [t for t in ax.texts if t.get_gid() == "kernel-label"]
    assert len(labels) == 2
    for label in labels:
        box = label.get_window_extent(renderer)
        assert box.x1 <= axes_box.x1 + 1 and box.x1 <= figure_box.x1, label.get_text()


def test_each_experiment_s_line_says_what_it_took_and_the_bench_s_share():
    """Where a night's time goes, line by line (an H100 night spent 80% of its loop in cold baselines): the whole
    experiment's seconds, the bench's and its stages'."""
    result = {"wall_s": 14.2, "stages": [{"name": "smoke", "seconds": 1.2}, {"name": "shape_sweep", "seconds": 2.0}]}
    took = report.took_text(16.4, result)
    assert took == "16 s (bench 14 s: stages 3 s)" and report.took_text(0.4, {}) == "0 s"
    cold = {"wall_s": 96.0, "stages": [{"name": "smoke", "seconds": 4.0}, {"name": "shape_sweep", "seconds": 61.0},
                                       {"name": "edge_cases", "seconds": 27.0}]}
    assert report.took_text(145.0, cold) == "145 s (bench 96 s: stages 92 s, shape_sweep 61 s)"
    row = {"experiment": 7, "status": "revert", "description": "BLOCK_K 0 -> 32", "model_us": "5271.6",
           "latency_us": "242.6"}
    job = {"name": "01_fused_mlp", "baseline_us": 4778.0, "best_us": 4778.0, "kept": 0, "experiments": 3}
    line = report.progress_line(row, job, 251.0, took)
    assert "| 16 s (bench 14 s: stages 3 s) | 0:04:11 left" in line
    bare = report.progress_line(row, job, 251.0)
    assert bare.endswith("kept 0/3 | 0:04:11 left") and "bench" not in bare
