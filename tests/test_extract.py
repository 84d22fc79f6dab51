"""extract.py: kernel files from a plan, carrying the model's shapes; bench.py accepts them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import bench
from autokernel.harness import sourcecheck
from autokernel.kernelfile import declarations
from autokernel.profile.extraction import ExtractError, extract, set_model_shapes

STARTER = '''"""A starter."""

KERNEL_TYPE = "rmsnorm"

BLOCK = 128  # columns per program
'''


def test_model_shapes_are_inserted_after_kernel_type_then_replaced():
    once = set_model_shapes(STARTER, [{"M": 128, "N": 768}], "shapes of a model")
    assert declarations(once)["MODEL_SHAPES"] == [{"M": 128, "N": 768}]
    assert once.index("KERNEL_TYPE") < once.index("MODEL_SHAPES") < once.index("BLOCK")
    many = [{"M": m, "N": 4096} for m in range(1, 30)]  # long enough to span lines
    twice = set_model_shapes(once, many, "shapes of a model")
    assert declarations(twice)["MODEL_SHAPES"] == many
    assert twice.count("MODEL_SHAPES") == 1 and twice.count("# shapes of a model") == 1
    assert declarations(twice)["BLOCK"] == 128
    with pytest.raises(ExtractError, match="KERNEL_TYPE"):
        set_model_shapes('"""no type"""\n', many)


def test_call_counts_follow_the_shapes_and_are_replaced_whole():
    once = set_model_shapes(STARTER, [{"M": 128, "N": 768}, {"M": 1, "N": 768}], "shapes of a model", [33, 1])
    assert declarations(once)["MODEL_CALLS"] == [33, 1]
    assert once.index("MODEL_SHAPES") < once.index("MODEL_CALLS") < once.index("BLOCK")
    twice = set_model_shapes(once, [{"M": 64, "N": 768}], "shapes of a model", [16])
    assert declarations(twice)["MODEL_CALLS"] == [16] and twice.count("MODEL_CALLS") == 1
    assert twice.count("# calls per forward pass") == 1
    with pytest.raises(ExtractError, match="2 call counts for 1 model shapes"):
        set_model_shapes(STARTER, [{"M": 1, "N": 8}], "", [1, 2])


def _plan(*types):
    return {"model": "TinyModel", "input_shape": [2, 64], "dtype": "float32", "entries": [
        {"type": t, "rank": i + 1, "f": 0.1, "shapes": [{"shape": {"M": 128, "N": 64 * (i + 1)}, "time_us": 1.0}]}
        for i, t in enumerate(types)]}


def test_extract_writes_ranked_files_and_reports_missing_starters(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "rmsnorm.py").write_text(STARTER)
    results = extract(_plan("not_written_yet", "rmsnorm"), top=5, backend="triton", out_dir=tmp_path / "out",
                      root=tmp_path)
    missing, written = results
    assert missing.path is None and "kernels/not_written_yet.py does not exist" in missing.problem
    assert written.path == tmp_path / "out" / "02_rmsnorm.py"
    assert declarations(written.path.read_text())["MODEL_SHAPES"] == [{"M": 128, "N": 128}]
    cuda = extract(_plan("rmsnorm"), top=1, backend="cuda", out_dir=tmp_path / "out", root=tmp_path)
    assert cuda[0].path is None and "kernels/cuda/rmsnorm.py does not exist" in cuda[0].problem


def test_an_opt_in_type_chosen_brings_its_rivals_once(tmp_path):
    """rope_attention takes flash_attention's and rotary_embedding's time in an attention module, and verify's prune
    may deploy those in its place: extracted, it brings them (ranked after the plan's types), not otherwise; a rival
    the plan ranks already (for a call of its own) takes the rival's shapes and time into its entry, so its file
    carries the shapes the model would run it at; a second extract of the plan it wrote adds and merges none again."""
    from autokernel.profile.extraction import record_kernel_files, with_rivals

    (tmp_path / "kernels").mkdir()
    for t in ("rope_attention", "flash_attention", "rotary_embedding", "rmsnorm"):
        (tmp_path / "kernels" / f"{t}.py").write_text(STARTER.replace('"rmsnorm"', f'"{t}"'))
    plan = _plan("rmsnorm", "rope_attention", "rotary_embedding")
    own = next(e for e in plan["entries"] if e["type"] == "rotary_embedding")
    own.update(f=0.001, time_us=3.0, calls=1, shapes=[])  # TinyLlama's: the tables' one call, no shape of the kernel
    plan["rivals"] = [{"type": t, "f": 0.05, "s": 1.25, "time_us": 100.0, "calls": 22, "floor_us": 40.0,
                       "rival_of": ["rope_attention"],
                       "shapes": [{"shape": {"M": 1, "N": 64}, "time_us": 90.0, "calls": 22},
                                  {"shape": {"M": 1, "N": 8}, "time_us": 10.0, "calls": 22}]}
                      for t in ("flash_attention", "rotary_embedding")]
    assert with_rivals(plan, top=1) == plan  # rmsnorm alone: no rivals
    written = extract(with_rivals(plan, top=1), top=1, backend="triton", out_dir=tmp_path / "one", root=tmp_path)
    assert [w.path.name for w in written] == ["01_rmsnorm.py"]
    plan = with_rivals(plan, top=2)
    assert [(e["type"], e["rank"]) for e in plan["entries"]] == [("rmsnorm", 1), ("rope_attention", 2),
                                                                 ("rotary_embedding", 3), ("flash_attention", 4)]
    rotary = plan["entries"][2]
    assert rotary["f"] == pytest.approx(0.051) and rotary["calls"] == 23 and rotary["rival_of"] == ["rope_attention"]
    assert [s["share_of_type"] for s in rotary["shapes"]] == [0.9, 0.1]
    assert rotary["gain"] == pytest.approx(1 / (1 - 0.051 + 0.051 / 1.25)) and rotary["floor_us"] == 40.0
    written = extract(plan, top=2, backend="triton", out_dir=tmp_path / "two", root=tmp_path)
    assert [w.path.name for w in written] == ["01_rmsnorm.py", "02_rope_attention.py", "03_rotary_embedding.py",
                                              "04_flash_attention.py"]
    declared = declarations(written[2].path.read_text())
    assert declared["MODEL_SHAPES"] == [{"M": 1, "N": 64}, {"M": 1, "N": 8}] and declared["MODEL_CALLS"] == [22, 22]
    again = record_kernel_files(plan, written, tmp_path)
    assert with_rivals(again, top=2) == again


def test_a_starter_of_the_wrong_type_is_refused(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "softmax.py").write_text(STARTER)  # declares rmsnorm
    with pytest.raises(ExtractError, match="expected 'softmax'"):
        extract(_plan("softmax"), top=1, backend="triton", out_dir=tmp_path / "out", root=tmp_path)
    # the good starter ranked first is not written either: a refused extract leaves no half-made kernels
    (tmp_path / "kernels" / "rmsnorm.py").write_text(STARTER)
    with pytest.raises(ExtractError, match="expected 'softmax'"):
        extract(_plan("rmsnorm", "softmax"), top=2, backend="triton", out_dir=tmp_path / "out2", root=tmp_path)
    assert not (tmp_path / "out2").exists()


def _run(repo_root, *args):
    return subprocess.run([sys.executable, *args], cwd=repo_root, capture_output=True, text=True, timeout=600,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1"})


@pytest.fixture(scope="session")  # read only: one profile for the run (its tests no longer sit together: conftest.py)
def llama_plan(tmp_path_factory):
    root = Path(__file__).resolve().parent.parent
    out = tmp_path_factory.mktemp("ws")
    r = _run(root, "profile.py", "--model", "models/llama.py", "--class-name", "LlamaModel", "--config", "tiny",
             "--input-shape", "2,64", "--dtype", "float32", "--device", "cpu", "--output-dir", str(out))
    assert r.returncode == 0, r.stderr
    return out / "plan.json"


def test_extract_cli_embeds_the_profiled_shapes(repo_root, llama_plan, tmp_path):
    r = _run(repo_root, "extract.py", "--plan", str(llama_plan), "--top", "9", "--output-dir", str(tmp_path))
    plan = json.loads(llama_plan.read_text())
    for entry in plan["entries"]:
        out = tmp_path / f"{entry['rank']:02d}_{entry['type']}.py"
        if (repo_root / "kernels" / f"{entry['type']}.py").is_file():
            decl = declarations(out.read_text())
            assert decl["KERNEL_TYPE"] == entry["type"]
            assert decl["MODEL_SHAPES"] == [s["shape"] for s in entry["shapes"]]
            assert decl["MODEL_SOURCE"] == {"model": "models/llama.py:LlamaModel", "config": "tiny",
                                            "input_shape": [2, 64], "dtype": "float32"}
            assert sourcecheck.violations(out.read_text(), out.name) == []  # the harness still takes it
        else:
            assert not out.exists() and f"kernels/{entry['type']}.py does not exist" in r.stdout
    assert r.returncode == (0 if all((repo_root / "kernels" / f"{e['type']}.py").is_file()
                                     for e in plan["entries"]) else 1)


def test_extract_cli_errors_are_one_line(repo_root, tmp_path):
    r = _run(repo_root, "extract.py", "--plan", str(tmp_path / "none.json"))
    assert r.returncode == 2 and "plan not found" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow(15)
@pytest.mark.usefixtures("warm_launcher")
def test_extracted_rmsnorm_passes_bench(repo_root, llama_plan, tmp_path, capsys):
    r = _run(repo_root, "extract.py", "--plan", str(llama_plan), "--top", "9", "--output-dir", str(tmp_path))
    kernel = next(tmp_path.glob("*_rmsnorm.py"), None)
    assert kernel is not None, r.stdout + r.stderr
    code = bench.main([str(kernel), "--device", "cpu", "--no-log", "--quick"])  # forked from the warm launcher
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert "correctness: PASS" in out and "shape: M=128 N=128" in out


@pytest.mark.parametrize("plan", sorted((Path(__file__).resolve().parent.parent / "profiles").glob("*.plan.json")),
                         ids=lambda p: p.stem)
def test_every_shipped_gpu_plan_extracts_at_once(repo_root, plan, tmp_path):
    data = json.loads(plan.read_text())
    assert data["cpu_mode"] is False and "cuda" in data["command"] and data["covered_f"] >= 0.8
    proc = _run(repo_root, "extract.py", "--plan", str(plan), "--top", "3", "--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = sorted(tmp_path.glob("0[1-3]_*.py"))
    assert [p.name.split("_", 1)[1][:-3] for p in written] == [e["type"] for e in data["entries"][:3]]
    assert all("MODEL_SHAPES = [" in p.read_text() for p in written)
