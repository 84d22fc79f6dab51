"""The shipped models (tiny presets) and loading a model from a file or a package."""

import sys

import pytest
import torch
from helpers import import_file

import reference
from autokernel.models import ModelError, example_inputs, load_model, parse_shape

MODELS = [("models/llama.py", "LlamaModel"), ("models/gpt2.py", "GPT2Model"), ("models/bert.py", "BertModel")]


@pytest.mark.parametrize("path,cls", MODELS)
def test_tiny_models_run_and_give_finite_outputs(repo_root, path, cls):
    model = load_model(cls, model_file=str(repo_root / path), config="tiny")
    (ids,) = example_inputs(model, (2, 17), "cpu", torch.float32)
    out = model(ids)
    assert out.shape[:2] == (2, 17) and torch.isfinite(out).all()


@pytest.mark.parametrize("preset,params_m,dims", [
    ("compact", (140, 180), {"dim": 768, "n_kv_heads": 4}),
    ("tinyllama", (1050, 1150), {"dim": 2048, "n_layers": 22, "n_heads": 32, "n_kv_heads": 4,
                                 "intermediate": 5632, "vocab_size": 32000}),
    ("7b", (6500, 7000), {"dim": 4096, "n_layers": 32, "intermediate": 11008}),
])
def test_llama_presets_have_their_published_sizes(repo_root, preset, params_m, dims):
    model = load_model("LlamaModel", model_file=str(repo_root / "models/llama.py"), config=preset, device="meta")
    params = sum(p.numel() for p in model.parameters()) / 1e6
    assert params_m[0] <= params <= params_m[1]
    assert {k: getattr(model.config, k) for k in dims} == dims


def _llama_module(repo_root):
    return import_file(repo_root / "models" / "llama.py", "llama_under_test")


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 1e-2), (torch.bfloat16, 2e-2)])
def test_rope_in_low_precision_matches_float64(repo_root, dtype, atol):
    llama = _llama_module(repo_root)
    model = llama.LlamaModel("tiny").to(dtype)
    assert model.rope_cos.dtype == dtype and not model.rope_cos.is_complex()
    seq, dim = 300, model.config.head_dim
    x = torch.randn(1, 2, seq, dim, dtype=torch.float64)
    cos64, sin64 = (t.double() for t in llama.rope_tables(seq, dim, model.config.rope_theta))
    want = reference.rotary_embedding_ref(x, cos64, sin64)
    got = llama.apply_rotary(x.to(dtype), model.rope_cos[:seq], model.rope_sin[:seq]).double()
    assert (got - want).abs().max() < atol + atol * want.abs().max()


def test_rmsnorm_as_ops_computes_the_same_model(repo_root):
    llama = _llama_module(repo_root)
    torch.manual_seed(0)
    as_module = llama.LlamaModel("tiny")
    as_ops = llama.LlamaModel("tiny", rmsnorm_as_ops=True)
    as_ops.load_state_dict(as_module.state_dict())
    ids = torch.randint(0, 512, (1, 9))
    torch.testing.assert_close(as_ops(ids), as_module(ids))


def test_missing_file_and_class_are_named(repo_root, tmp_path):
    with pytest.raises(ModelError, match="model file not found: .*nope.py"):
        load_model("X", model_file=str(tmp_path / "nope.py"))
    with pytest.raises(ModelError, match="no class 'Llama'.*LlamaModel"):
        load_model("Llama", model_file=str(repo_root / "models/llama.py"))
    with pytest.raises(ModelError, match="unknown config 'huge'"):
        load_model("LlamaModel", model_file=str(repo_root / "models/llama.py"), config="huge")


def test_a_package_that_is_not_installed_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    with pytest.raises(ModelError, match="cannot import transformers.*pip install transformers"):
        load_model("AutoModelForCausalLM", module="transformers", config="gpt2")


def test_a_huggingface_model_builds_offline_from_a_local_config(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    config.save_pretrained(tmp_path / "tiny-llama")
    model = load_model("AutoModelForCausalLM", module="transformers", config=str(tmp_path / "tiny-llama"))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) < 200_000


def test_a_class_from_an_installed_package_builds():
    model = load_model("Identity", module="torch.nn", dtype=torch.float16)
    assert isinstance(model, torch.nn.Identity) and not model.training
    with pytest.raises(ModelError, match="torch.nn has no attribute 'Nope'"):
        load_model("Nope", module="torch.nn")


@pytest.mark.parametrize("text", ["1,x", "0,512", "", "1,-4"])
def test_bad_shapes_are_rejected(text):
    with pytest.raises(ModelError, match="bad input shape"):
        parse_shape(text)


def test_inputs_must_fit_the_model(repo_root):
    model = load_model("LlamaModel", model_file=str(repo_root / "models/llama.py"), config="tiny")
    with pytest.raises(ModelError, match="at most 512"):
        example_inputs(model, (1, 4096), "cpu", torch.float32)
    with pytest.raises(ModelError, match="batch,seq"):
        example_inputs(model, (1, 2, 3), "cpu", torch.float32)
    custom = load_model("CustomModel", model_file=str(repo_root / "models/custom.py"), config="tiny")
    assert example_inputs(custom, (3, 64), "cpu", torch.float32)[0].shape == (3, 64)
    with pytest.raises(ModelError, match="does not fit CustomModel"):
        example_inputs(custom, (3, 65), "cpu", torch.float32)
