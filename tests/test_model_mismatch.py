"""Kernels extracted for one model, used or measured with another: the morning report and autokernel.optimize
say so, naming both models, as verify.py does (one comparison: autokernel.profile.plan.other_model)."""

import importlib.util
import json
import sys
import warnings

import pytest

import autokernel
import orchestrate
from autokernel import results
from autokernel.loop import report
from autokernel.profile.extraction import set_model_source

LLAMA = {"model": "models/llama.py:LlamaModel", "config": "tiny", "input_shape": [1, 8], "dtype": "fp32"}
GPT2 = {"model": "models/gpt2.py:GPT2Model", "config": "tiny", "input_shape": [1, 8], "dtype": "fp32"}


def extracted(repo_root, directory, origin: dict, name: str = "01_rmsnorm.py"):
    """The rmsnorm starter as extract.py writes it for the model `origin` names."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(set_model_source((repo_root / "kernels" / "rmsnorm.py").read_text(), origin))
    return path


def write_verify(root, measured: dict) -> None:
    """workspace/verify.json as verify.py writes it for the model `measured` names."""
    source, _, class_name = measured["model"].rpartition(":")
    data = {"model": f"{class_name} (0.1M parameters)", "source": source, "class_name": class_name,
            "config": measured["config"], "input_shape": measured["input_shape"], "dtype": measured["dtype"],
            "cpu_mode": True, "gpu": None, "timing": {"optimized": {"ms": 50.0, "speedup_vs_eager": 0.01}}}
    (root / "workspace").mkdir(exist_ok=True)
    (root / "workspace" / "verify.json").write_text(json.dumps(data))


@pytest.mark.parametrize("measured, says", [(GPT2, "model"), ({**LLAMA, "input_shape": [2, 64]}, "input"),
                                            (LLAMA, None)])
def test_the_report_says_when_verify_json_measured_another_model(repo_root, tmp_path, capsys, measured, says):
    kernel = extracted(repo_root, tmp_path / "workspace" / "kernels", LLAMA)
    write_verify(tmp_path, measured)
    for status in ("baseline", "revert"):
        results.append_row({"tag": "night", "kernel_type": "rmsnorm", "kernel_file": "workspace/kernels/01_rmsnorm.py",
                            "status": status, "correctness": "PASS", "latency_us": 10.0,
                            "device": "cpu (Triton interpreter)"}, tmp_path / "results.tsv")
    found = report.read_verify(tmp_path)["warnings"]
    assert found == report.read_verify(tmp_path, [kernel])["warnings"]  # the workspace's kernels by default
    if says is None:
        assert found == []
    elif says == "model":
        assert len(found) == 1 and "models/gpt2.py:GPT2Model" in found[0] and "models/llama.py:LlamaModel" in found[0]
        assert "another model's" in found[0]
    else:
        assert len(found) == 1 and "2,64 fp32" in found[0] and "1,8 fp32" in found[0]
    code = orchestrate.main(["--repo", str(tmp_path), "report", "--tag", "night", "--png", str(tmp_path / "p.png")])
    printed = capsys.readouterr().out.splitlines()  # printed plainly, one line each (no rich wrapping)
    assert code == 0 and [line.strip() for line in printed if "warning:" in line] == found


@pytest.fixture
def llama(repo_root):
    spec = importlib.util.spec_from_file_location("llama_for_mismatch", repo_root / "models" / "llama.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module.LlamaModel("tiny").eval()
    del sys.modules[spec.name]


def test_optimize_warns_of_kernels_extracted_for_another_model(llama, repo_root, tmp_path):
    kernels = tmp_path / "kernels"
    extracted(repo_root, kernels, GPT2)
    with pytest.warns(UserWarning) as caught:
        optimized = autokernel.optimize(llama, kernels, ["rmsnorm"], verified=None)
    lines = [str(w.message) for w in caught]
    assert lines == optimized.autokernel.warnings and len(lines) == 1
    assert "01_rmsnorm.py" in lines[0] and "models/gpt2.py:GPT2Model" in lines[0] and "LlamaModel" in lines[0]
    assert "llama.py" in lines[0]  # where this model's class comes from


def test_optimize_is_silent_for_kernels_of_this_model_and_follows_no_other_models_report(llama, repo_root,
                                                                                            tmp_path):
    kernels = tmp_path / "workspace" / "kernels"
    extracted(repo_root, kernels, LLAMA)  # the same file and class (the preset's name a model cannot tell)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimized = autokernel.optimize(llama, kernels, ["rmsnorm"])
    assert optimized.autokernel.warnings == []
    write_verify(tmp_path, GPT2)  # beside the kernels: verify.py's report on another model
    with pytest.warns(UserWarning, match="GPT2Model") as caught:
        optimized = autokernel.optimize(llama, kernels, ["rmsnorm"])
    assert len(caught) == 1 and "verify.json" in str(caught[0].message) and "LlamaModel" in str(caught[0].message)
    assert optimized.autokernel.left_out == {}  # its prune not followed
    quiet = autokernel.optimize(llama, kernels, ["rmsnorm"], quiet=True)
    assert len(quiet.autokernel.warnings) == 1  # kept on the model, not raised
