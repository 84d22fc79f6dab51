"""verify.py's site table says what became of each site: swapped, unused, left out (its type pruned: the model is
faster without it) or kept (the model's own code, for a reason). The prune times on a GPU only; here its decision
is given, and everything else runs for real on the CPU."""

import pytest

import verify
from autokernel.verify import verification

PRUNED = "the model is 3.0% faster without it in eager mode (9.700 ms vs 10.000 ms)"


@pytest.fixture
def rmsnorm_pruned(monkeypatch):
    """verify()'s measurement as on a GPU whose prune left out rmsnorm."""
    measure = verification._measure

    def pruned(*args):
        return {**measure(*args), "decided": True, "pruned": {"rmsnorm": PRUNED}, "pruned_traced": {"rmsnorm": PRUNED}}

    monkeypatch.setattr(verification, "_measure", pruned)


@pytest.mark.usefixtures("interpreter", "rmsnorm_pruned")
def test_the_site_table_says_left_out_for_a_pruned_type(repo_root, tmp_path):
    request = verification.Request(class_name="LlamaModel", model=str(repo_root / "models" / "llama.py"),
                                   config="tiny", input_shape="1,8", device="cpu", checks=1, kernels=tmp_path,
                                   types="rmsnorm,matmul", no_timing=True)
    report = verification.verify(request)
    assert report["correctness"]["status"] == "PASS" and report["swapped_types"] == ["matmul"]
    rows = verify.site_rows(report)
    norms = [r for r in rows if r["kernel"] == "rmsnorm"]
    assert norms and all(r["state"] == "left out" and r["why"] == PRUNED for r in norms)
    assert sum(r["count"] for r in norms) == sum(s["kernel_type"] == "rmsnorm" for s in report["sites"])
    assert {r["state"] for r in rows if r["kernel"] == "matmul"} == {"swapped"}
    assert all(r["state"] != "kept" or r["kernel"] != "rmsnorm" for r in rows)  # never "kept" for what it left out
    table = verify._site_table(report)  # as printed: the state column holds the same words
    states = list(table.columns[3]._cells)
    assert any("left out" in cell for cell in states) and len(states) == len(rows)


def test_each_site_state_from_the_report():
    site = {"swapped": True, "calls": 2, "kernel_type": "rmsnorm", "reason": ""}
    assert verification.site_state(site) == "swapped"
    assert verification.site_state({**site, "calls": 0}) == "unused"
    assert verification.site_state({**site, "swapped": False, "reason": "a mask"}) == "kept"
    marked = [dict(site)]
    verification._mark_pruned(marked, {"rmsnorm": PRUNED})
    assert verification.site_state(marked[0]) == "left out" and marked[0]["reason"] == PRUNED
