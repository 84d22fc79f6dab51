"""add_rmsnorm and add_layernorm (issue #19): a kernel returning (sum, normed) through the harness, HF decoder layers
whose residual add and post-attention norm become one kernel call (optimize / verify), and the profiler giving the
pair's time to the fused type. CPU: kernels run through Triton's interpreter."""

import functools
import inspect
import json

import pytest
import torch
from helpers import TOKEN_IDS, sites_of, starter_source

import autokernel
import bench
from autokernel.harness import checking
from autokernel.harness.runner import run_bench
from autokernel.ops import addnorm_sites, swap
from autokernel.profile import attribution
from autokernel.profile.attribution import Op
from autokernel.profile.profiling import profile_model

transformers = pytest.importorskip("transformers")

SUM_STORE = "tl.store(sum_ptr + rows[:, None] * N + cols[None, :], s, mask=mask)"
NORM_STATS = "rstd = tl.rsqrt(tl.sum(s * s, axis=1) / N + eps)"


def _starter(kernel_type, old=None, new=None, variant=None) -> str:
    source = starter_source(kernel_type, old, new)
    if variant is not None:
        source = source.replace('VARIANT = "auto"', f'VARIANT = "{variant}"').replace("CHUNK = 4096", "CHUNK = 256")
    return source


# ------------------------------------------------------------------------------------ the harness
def test_a_tuple_output_is_checked_element_by_element():
    want = (torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64))
    good = (torch.ones(3), torch.zeros(3))
    assert checking.compare(good, want, torch.float32, 1e-4, 1e-4) is None
    wrong_first = checking.compare((torch.ones(3) * 1.1, torch.zeros(3)), want, torch.float32, 1e-4, 1e-4)
    assert wrong_first.startswith("output 0: max_abs 1.000e-01")
    assert "expected a tuple of 2" in checking.compare(torch.ones(3), want, torch.float32, 1e-4, 1e-4)
    assert "1 outputs" in checking.compare((torch.ones(3),), want, torch.float32, 1e-4, 1e-4)
    assert checking.bitwise_equal(good, (torch.ones(3), torch.zeros(3)))
    assert not checking.bitwise_equal(good, (torch.ones(3), torch.ones(3)))


@pytest.mark.slow(5)
@pytest.mark.usefixtures("warm_launcher")
def test_bench_py_runs_add_rmsnorm_through_the_five_stages(repo_root, tmp_path, capsys):
    out = tmp_path / "result.json"
    code = bench.main([str(repo_root / "kernels" / "add_rmsnorm.py"), "--quick", "--device", "cpu", "--no-log",
                       "--seed", "5", "--json", str(out)])
    assert code == 0, capsys.readouterr().out[-3000:]
    result = json.loads(out.read_text())
    assert (result["status"], result["kernel_type"]) == ("pass", "add_rmsnorm")
    assert [s["passed"] for s in result["stages"]] == [True] * 5


@pytest.mark.slow
@pytest.mark.usefixtures("warm_launcher")
def test_a_kernel_whose_sum_is_wrong_fails(repo_root, tmp_path):
    # the sum stored 2% high while the norm is taken of the right one: only the first output is wrong
    wrong = "tl.store(sum_ptr + rows[:, None] * N + cols[None, :], (s * 1.02).to(s.dtype), mask=mask)"
    path = tmp_path / "add_rmsnorm_wrong_sum.py"
    path.write_text(_starter("add_rmsnorm", SUM_STORE, wrong))
    result = run_bench(path, device="cpu", timed=False, quick=True)
    assert result["status"] == "fail" and result["failed_stage"] == "smoke"
    assert "output 0:" in result["reason"]


@pytest.mark.usefixtures("warm_launcher")
@pytest.mark.parametrize("kernel_type", [pytest.param("add_rmsnorm", marks=pytest.mark.slow(8)),
                                         pytest.param("add_layernorm", marks=pytest.mark.slow(11))])
def test_the_looped_variants_pass_the_harness(repo_root, tmp_path, kernel_type):
    path = tmp_path / f"{kernel_type}_looped.py"
    # 256-wide chunks: several per row from N 257 on, a ragged last one where N is not a multiple
    path.write_text(_starter(kernel_type, variant="looped"))
    result = run_bench(path, device="cpu", timed=False, quick=True)
    assert result["status"] == "pass", f"{result['failed_stage']}: {result['reason']}"


# --------------------------------------------------------------------------------- HF models
def _llama():
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _gpt2():
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_hf_llama_layers_fuse_the_residual_add_into_the_post_attention_norm(interpreter, tmp_path):
    model = _llama()
    optimized = autokernel.optimize(model, tmp_path, ["rmsnorm", "add_rmsnorm"], verified=None, quiet=True)
    got, want = _logits(optimized, TOKEN_IDS), _logits(model, TOKEN_IDS)
    assert swap.rel_l2(got, want) < 1e-4
    fused = sites_of(optimized, "add_rmsnorm")
    assert sorted(fused) == ["model.layers.0", "model.layers.1"]
    assert all(s.swapped and s.calls == 1 and not s.fallbacks for s in fused.values())
    # the input norms and the final norm stay rmsnorm sites; the post-attention norms are the fused call's
    assert sorted(sites_of(optimized, "rmsnorm")) == ["model.layers.0.input_layernorm",
                                                    "model.layers.1.input_layernorm", "model.norm"]
    assert "forward" not in vars(model.model.layers[0])  # the original model is left as it was
    layer = optimized.model.layers[0]
    assert inspect.signature(layer.forward) == inspect.signature(model.model.layers[0].forward)


def test_a_wrong_add_rmsnorm_kernel_changes_the_output(repo_root, interpreter, tmp_path):
    (tmp_path / "01_add_rmsnorm.py").write_text(_starter("add_rmsnorm", NORM_STATS,
                                                         NORM_STATS.replace("/ N", "/ N * 1.1")))
    model = _llama()
    optimized = autokernel.optimize(model, tmp_path, ["add_rmsnorm"], verified=None, quiet=True)
    assert optimized.autokernel.choices["add_rmsnorm"].source == "extracted"
    assert swap.rel_l2(_logits(optimized, TOKEN_IDS), _logits(model, TOKEN_IDS)) > 1e-2


def test_hf_gpt2_blocks_fuse_the_residual_add_into_ln_2(interpreter, tmp_path):
    model = _gpt2()
    optimized = autokernel.optimize(model, tmp_path, ["layernorm", "add_layernorm"], verified=None, quiet=True)
    assert swap.rel_l2(_logits(optimized, TOKEN_IDS), _logits(model, TOKEN_IDS)) < 1e-4
    fused = sites_of(optimized, "add_layernorm")
    assert sorted(fused) == ["transformer.h.0", "transformer.h.1"]
    assert all(s.swapped and s.calls == 1 for s in fused.values())
    assert sorted(sites_of(optimized, "layernorm")) == ["transformer.h.0.ln_1", "transformer.h.1.ln_1",
                                                      "transformer.ln_f"]


@pytest.mark.slow(10)
def test_hf_llama_verifies_and_compiles_whole_with_the_fused_layers(repo_root, tmp_path, capsys, interpreter):
    import verify

    _llama().config.save_pretrained(tmp_path / "cfg")
    report = tmp_path / "report.json"
    code = verify.main(["--module", "transformers", "--class-name", "AutoModelForCausalLM", "--config",
                        str(tmp_path / "cfg"), "--input-shape", "1,8", "--dtype", "fp32", "--device", "cpu",
                        "--kernels", str(tmp_path), "--types", "add_rmsnorm,rmsnorm", "--checks", "1",
                        "--compile", "--report", str(report)])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    result = json.loads(report.read_text())
    assert result["correctness"]["status"] == "PASS"
    assert {"add_rmsnorm", "rmsnorm"} <= set(result["swapped_types"])
    fused = [s for s in result["sites"] if s["kernel_type"] == "add_rmsnorm"]
    assert [(s["where"], s["swapped"], s["calls"]) for s in fused] == [("model.layers.0", True, 1),
                                                                       ("model.layers.1", True, 1)]
    assert result["graph"]["graph_breaks"] == 0 and result["graph"]["graphs"] == 1  # the rewritten forward traces


class TupleReturningLlamaLayer(transformers.models.llama.modeling_llama.LlamaDecoderLayer):
    """LlamaDecoderLayer's forward as transformers 4.4x wrote it: other arguments, a tuple returned."""

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None,
                output_attentions=False, use_cache=False, cache_position=None, position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        # Self Attention
        hidden_states, self_attn_weights = self.self_attn(
            hidden_states=hidden_states, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=past_key_value, use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
        hidden_states = residual + hidden_states

        # Fully Connected
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        outputs = (hidden_states,)
        if output_attentions:
            outputs += (self_attn_weights,)
        return outputs


def test_an_older_transformers_layer_gets_its_own_arguments_and_return_value(interpreter, tmp_path):
    model = _llama()
    old = TupleReturningLlamaLayer(model.config, 0).eval()
    old.load_state_dict(model.model.layers[0].state_dict())
    holder = torch.nn.ModuleDict({"layer": old})
    optimized = autokernel.optimize(holder, tmp_path, ["add_rmsnorm"], verified=None, quiet=True)
    h = torch.randn(2, 12, 64)
    rope = model.model.rotary_emb(h, torch.arange(12)[None].expand(2, -1))
    with torch.no_grad():
        got = optimized.layer(h, position_embeddings=rope, output_attentions=True)
        want = old(h, position_embeddings=rope, output_attentions=True)
    assert isinstance(got, tuple) and len(got) == len(want) == 2
    assert swap.rel_l2(got[0], want[0]) < 1e-5
    assert [s.calls for s in sites_of(optimized, "add_rmsnorm").values()] == [1]


def _renamed_argument(old: str, new: str):
    """A decorator in the manner of transformers' deprecate_kwarg (>= 5.24 wraps decoder layers' forward in it)."""
    def decorate(forward):
        @functools.wraps(forward)
        def renaming(*args, **kwargs):
            if old in kwargs:
                kwargs[new] = kwargs.pop(old)
            return forward(*args, **kwargs)
        return renaming
    return decorate


class DecoratedLayer(torch.nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        rmsnorm = transformers.models.llama.modeling_llama.LlamaRMSNorm
        self.input_layernorm, self.post_attention_layernorm = rmsnorm(hidden), rmsnorm(hidden)
        self.self_attn, self.mlp = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, hidden)

    @_renamed_argument("past_key_values", "cache")
    def forward(self, hidden_states: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        residual = hidden_states
        hidden_states = self.self_attn(self.input_layernorm(hidden_states))
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        if cache is not None:
            cache["calls"] = cache.get("calls", 0) + 1
        return residual + hidden_states


def test_a_decorated_forward_keeps_its_decorator_and_its_signature(interpreter, tmp_path):
    model = torch.nn.Sequential(DecoratedLayer()).eval()
    optimized = autokernel.optimize(model, tmp_path, ["add_rmsnorm"], verified=None, quiet=True)
    assert inspect.signature(optimized[0].forward) == inspect.signature(model[0].forward)  # annotations too
    x, cache = torch.randn(2, 3, 16), {}
    with torch.no_grad():
        got = optimized[0](x, past_key_values=cache)  # the old name: the decorator still renames it
        assert swap.rel_l2(got, model[0](x)) < 1e-4
    assert cache == {"calls": 1}
    assert [s.calls for s in sites_of(optimized, "add_rmsnorm").values()] == [1]


class PostNormLayer(torch.nn.Module):
    """The Llama layout, but the norm applied after the residual add's sum is used: not the pattern."""

    def __init__(self, hidden=16):
        super().__init__()
        self.input_layernorm = transformers.models.llama.modeling_llama.LlamaRMSNorm(hidden)
        self.post_attention_layernorm = transformers.models.llama.modeling_llama.LlamaRMSNorm(hidden)
        self.self_attn, self.mlp = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, hidden)

    def forward(self, x):
        h = x + self.self_attn(self.input_layernorm(x))
        return self.post_attention_layernorm(h + self.mlp(h))


def test_a_layer_without_the_pattern_is_left_alone_with_the_reason(interpreter, tmp_path):
    model = torch.nn.Sequential(PostNormLayer()).eval()
    optimized = autokernel.optimize(model, tmp_path, ["add_rmsnorm", "rmsnorm"], verified=None, quiet=True)
    (site,) = sites_of(optimized, "add_rmsnorm").values()
    assert not site.swapped and "no residual add followed by" in site.reason
    assert "forward" not in vars(optimized[0])
    # the norm that was not fused is still an rmsnorm site
    assert "0.post_attention_layernorm" in sites_of(optimized, "rmsnorm")
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        assert swap.rel_l2(optimized(x), model(x)) < 1e-4


def test_a_forward_whose_file_changed_since_the_import_is_not_rewritten(tmp_path, monkeypatch):
    # inspect.getsource reads the file as it is now: compiling that would run code the model never had
    source = inspect.getsource(TupleReturningLlamaLayer).replace("(transformers.models.llama.modeling_llama."
                                                                 "LlamaDecoderLayer)", "")
    (tmp_path / "edited_layer.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    import edited_layer

    edited = source.replace("outputs = (hidden_states,)", "outputs = (hidden_states, 1)")
    (tmp_path / "edited_layer.py").write_text(edited)
    factory, why = addnorm_sites.rewritten_forward(edited_layer.TupleReturningLlamaLayer.forward,
                                                   "post_attention_layernorm")
    assert factory is None and "differs from the code loaded" in why


def test_gpt2s_cross_attention_branch_runs_the_original_statements(interpreter, tmp_path):
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64,
                                     add_cross_attention=True)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    optimized = autokernel.optimize(model, tmp_path, ["add_layernorm"], verified=None, quiet=True)
    encoder = torch.randn(2, 5, 64)
    with torch.no_grad():
        got, want = (m(TOKEN_IDS, encoder_hidden_states=encoder).logits for m in (optimized, model))
    assert torch.equal(got, want)  # the taken branch: the original add, cross-attention, ln_2
    assert [s.calls for s in sites_of(optimized, "add_layernorm").values()] == [0, 0]
    assert swap.rel_l2(_logits(optimized, TOKEN_IDS), _logits(model, TOKEN_IDS)) < 1e-4
    assert [s.calls for s in sites_of(optimized, "add_layernorm").values()] == [1, 1]


# ---------------------------------------------------------------------------------- profiling
def test_profile_gives_the_add_and_the_post_attention_norm_to_the_fused_type():
    llama = profile_model(_llama(), (TOKEN_IDS,), "cpu")["types"]
    assert llama["add_rmsnorm"]["calls"] == 2 and llama["rmsnorm"]["calls"] == 3  # 2 input norms + the final one
    assert [s["shape"] for s in llama["add_rmsnorm"]["shapes"]] == [{"M": 24, "N": 64}]
    gpt2 = profile_model(_gpt2(), (TOKEN_IDS,), "cpu")["types"]
    assert gpt2["add_layernorm"]["calls"] == 2 and gpt2["layernorm"]["calls"] == 3


def test_the_add_right_before_the_norm_is_counted_with_it():
    def layer(norm_name, first_add_shapes):
        module = {"cls": "LlamaRMSNorm", "input_shape": [4, 16]}
        return [Op("autokernel.step", "step"),
                Op("autokernel.module#0", "module", parent=0, module={"name": "layers.0", "cls": "LlamaDecoderLayer",
                                                                       "input_shape": [4, 16]}, start=0),
                Op("aten::add", "op", parent=1, self_us=2.0, shapes=first_add_shapes, start=1),
                Op("autokernel.module#1", "module", parent=1, module={**module, "name": f"layers.0.{norm_name}"},
                   start=2),
                Op("aten::rsqrt", "op", parent=3, self_us=5.0, start=3),
                Op("aten::add", "op", parent=1, self_us=2.0, shapes=[[4, 16], [4, 16]], start=4)]

    def by_type(ops):
        table = {}
        for g in attribution.attribute(ops):
            table[g.type] = table.get(g.type, 0.0) + g.time_us
        return table
    assert by_type(layer("post_attention_layernorm", [[4, 16], [4, 16]])) == {"add_rmsnorm": 7.0, "other": 2.0}
    # another norm after an add, or an add of another shape (a bias, a broadcast): the plain rmsnorm
    assert by_type(layer("pre_feedforward_layernorm", [[4, 16], [4, 16]])) == {"rmsnorm": 5.0, "other": 4.0}
    assert by_type(layer("post_attention_layernorm", [[4, 16], [16]])) == {"rmsnorm": 5.0, "other": 4.0}
