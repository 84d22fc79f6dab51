"""BENCHMARKS.md is generated: exactly what benchmarks/render.py makes of the data under benchmarks/, every row with
its provenance, and so is the README's one table. A hand edit of either, or data changed without rendering again,
fails here."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def render():
    spec = importlib.util.spec_from_file_location("benchmarks_render", ROOT / "benchmarks" / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmarks_md_is_what_the_data_renders(render):
    want = render.render(list(render.load_tables().values()))
    assert (ROOT / "BENCHMARKS.md").read_text() == want, "BENCHMARKS.md is stale: run python benchmarks/render.py"


def test_the_readmes_table_is_the_end_to_end_data(render):
    readme = (ROOT / "README.md").read_text()
    table = render.load_tables()["end_to_end"]
    assert render.README_BEGIN in readme and readme == render.with_readme_table(readme, table)
    first_screen = readme[:readme.index(render.README_END)]
    for row in table["rows"]:  # each model's graphed speedup, as the data has it, is on the README's first screen
        assert f"({row['optimized_graph_speedup']:.2f}x)" in first_screen
    for row in render.rows_of(table):  # and where, with what, when and at which commit it was measured
        assert all(str(row[k]) in first_screen for k in ("gpu", "torch", "triton", "dtype", "date", "commit"))
    assert render.problems(render.load_tables()) == []


def test_every_row_carries_its_gpu_versions_dtype_shapes_date_command_and_commit(render):
    tables = list(render.load_tables().values())
    assert len(tables) == len(list((ROOT / "benchmarks" / "tables").glob("*.json"))) + 2  # + the starters' two
    assert [m for t in tables for m in render.missing_provenance(t)] == []
    for table in tables:
        for row in render.rows_of(table):
            assert len(str(row["commit"])) >= 7 and row["commit"] != "unknown", (table["title"], row)
            assert str(row["date"])[:4].isdigit(), (table["title"], row)


def test_every_table_is_rendered_with_its_provenance_under_it(render):
    text = (ROOT / "BENCHMARKS.md").read_text()
    for table in render.load_tables().values():
        section = text.split(f"## {table['title']}\n", 1)[1].split("\n## ", 1)[0]
        assert section.count("\n| ") == len(table["rows"]) + 1, table["title"]  # the header, then a line per row
        for row in render.rows_of(table):
            assert str(row["commit"]) in section and str(row["gpu"]) in section, table["title"]


def test_a_missing_field_reads_as_a_dash_and_an_optional_part_drops_out(render):
    assert render.cell("{ms:.2f}[ ({spread}%)][ **{x:.2f}x**]", {"ms": 9.4, "x": 1.216}) == "9.40 **1.22x**"
    assert render.cell("{ms:.2f}[ ({spread}%)]", {"spread": 2.0}) == "-"
    assert render.cell("{what}", {"what": "a | b"}) == "a \\| b"  # a pipe would split the markdown cell


def test_a_row_without_its_commit_is_reported_and_a_stale_file_is_caught(render, tmp_path):
    table = {"title": "T", "about": "a", "columns": [["x", "{x}"]],
             "provenance": {"gpu": "G", "torch": "2", "triton": "3", "dtype": "fp16", "shapes": "1x1",
                            "date": "2026-01-01", "command": "c"},
             "rows": [{"x": 1, "commit": "abcdef1"}, {"x": 2}]}
    assert render.missing_provenance(table) == ["T, row 2: commit"]
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "t.json").write_text(json.dumps(table))
    tables = render.load_tables(tmp_path / "starters.json", tmp_path / "tables")
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(render.render(list(tables.values())) + "a hand edit\n")
    stale = "BENCHMARKS.md is not what the data gives: run `python benchmarks/render.py`"
    assert render.problems(tables, out, tmp_path / "README.md") == ["T, row 2: commit", stale]
