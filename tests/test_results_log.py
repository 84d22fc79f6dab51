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
