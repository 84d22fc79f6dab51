"""results.tsv: header once, whole rows, no interleaving between concurrent writers."""

import multiprocessing as mp

import pytest

from autokernel import results


def _writer(path, worker, n):
    for i in range(n):
        results.append_row({"status": "keep", "correctness": "PASS", "kernel_type": "rmsnorm", "worker": worker,
                            "description": f"worker {worker} row {i} " + "x" * 2000}, path)


def test_concurrent_writers_never_interleave_rows(tmp_path):
    path = tmp_path / "results.tsv"
    procs = [mp.get_context("spawn").Process(target=_writer, args=(path, w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    lines = path.read_text().splitlines()
    assert lines[0].split("\t") == results.COLUMNS and len(lines) == 161
    assert all(len(line.split("\t")) == len(results.COLUMNS) for line in lines)
    rows = results.read_rows(path)
    assert sorted(int(r["experiment"]) for r in rows) == list(range(1, 161))


def test_fields_with_tabs_or_newlines_stay_in_one_row(tmp_path):
    path = tmp_path / "results.tsv"
    results.append_row({"status": "crash", "correctness": "FAIL", "description": "line one\n\tline two"}, path)
    (row,) = results.read_rows(path)
    assert row["description"] == "line one line two"


def test_unknown_status_or_column_is_refused(tmp_path):
    with pytest.raises(ValueError, match="status"):
        results.append_row({"status": "great"}, tmp_path / "r.tsv")
    with pytest.raises(ValueError, match="unknown results.tsv columns"):
        results.append_row({"status": "keep", "speed": 3}, tmp_path / "r.tsv")


def test_a_log_begun_before_the_model_columns_stays_whole(tmp_path):
    path = tmp_path / "results.tsv"
    old = [c for c in results.COLUMNS if c not in results.MODEL_COLUMNS]
    path.write_text("\t".join(old) + "\n" + "\t".join("1" if c == "experiment" else "keep" if c == "status" else ""
                                                       for c in old) + "\n")
    results.append_row({"status": "keep", "latency_us": 9.0, "model_us": 90.0, "description": "new"}, path)
    lines = path.read_text().splitlines()
    assert all(len(line.split("\t")) == len(old) for line in lines)  # written in the file's own columns
    first, second = results.read_rows(path)
    assert second["latency_us"] == "9" and second["model_us"] == "" and second["experiment"] == "2"
    assert results.objective_us(second) == 9.0  # the time in the model is not in this file: the latency
