"""Phi-3's layout (Phi-3, Phi-3.5, Phi-4-mini; benchmarks/hf/phi4-mini): one qkv_proj for every query head, then the
keys, then the values, and one gate_up_proj for the MLP's gate and up halves. optimize() places rope_attention and
fused_mlp there as for Llama's separate projections (interpreter, tiny shapes)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers

import autokernel
from autokernel.types import fused_mlp


def _tiny_phi3(partial_rotary_factor=1.0, kv_heads=2):
    torch.manual_seed(0)
    config = transformers.Phi3Config(hidden_size=128, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=kv_heads, vocab_size=256, pad_token_id=0, bos_token_id=0,
                                     eos_token_id=0, partial_rotary_factor=partial_rotary_factor)
    return transformers.Phi3ForCausalLM(config).eval()


def _ids():
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("rotary, kv_heads", [(1.0, 2), (0.5, 2), (0.75, 4)], ids=["gqa", "gqa_half_rotary", "mha"])
def test_phi3_attention_and_mlp_run_as_one_kernel_call_each(interpreter, tmp_path, rotary, kv_heads):
    """Hq = 2 Hkv makes the attention's qkv_proj and o_proj shaped like an MLP's gate_up_proj and down_proj: the
    attention is still rope_attention's and never a fused_mlp candidate. Logits and the cache's keys as the
    original's, with and without a cache; every layer's attention and MLP through the kernels."""
    model = _tiny_phi3(rotary, kv_heads)
    with torch.no_grad():
        optimized = autokernel.optimize(model, tmp_path / "none", ["rope_attention", "fused_mlp"], verified=None,
                                        quiet=True)
        for use_cache in (False, True):
            got, want = optimized(_ids(), use_cache=use_cache), model(_ids(), use_cache=use_cache)
            torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.past_key_values.layers[1].keys, want.past_key_values.layers[1].keys)
    sites = {(s.kernel_type, s.where): s for s in optimized.autokernel.sites()}
    assert set(sites) == {(t, f"model.layers.{i}.{m}") for i in (0, 1)
                          for t, m in (("rope_attention", "self_attn"), ("fused_mlp", "mlp"))}
    assert all(s.swapped and s.calls == 2 for s in sites.values())
    assert sites["rope_attention", "model.layers.0.self_attn"].what == f"Phi3Attention(Hq=4, Hkv={kv_heads}, D=32)"
    assert sites["fused_mlp", "model.layers.0.mlp"].what == "Phi3MLP(gate=gate_up_proj's first half, down=down_proj)"


def test_phi3_compiles_whole_with_the_kernels(interpreter, tmp_path):
    model = _tiny_phi3(0.5)
    graphs = []

    def backend(gm, example):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        optimized = autokernel.optimize(model, tmp_path / "none", ["rope_attention", "fused_mlp"], verified=None,
                                        quiet=True)
        got = torch.compile(optimized, backend=backend, fullgraph=True)(_ids(), use_cache=True)
        torch.testing.assert_close(got.logits, model(_ids(), use_cache=True).logits, atol=1e-4, rtol=1e-4)
    ops = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert sum("autokernel.rope_attention" in op for op in ops) == 2
    assert sum("autokernel.fused_mlp" in op for op in ops) == 2


class StackedMLP(nn.Module):
    """Two bias-free Linears, the first making both halves; `up_first` puts the up half first, `act` the gate's."""

    def __init__(self, h, i, up_first=False, act=F.silu):
        super().__init__()
        self.gate_up_proj, self.down_proj = nn.Linear(h, 2 * i, bias=False), nn.Linear(i, h, bias=False)
        self.up_first, self.act = up_first, act

    def forward(self, x):
        first, second = self.gate_up_proj(x).chunk(2, dim=-1)
        gate, up = (second, first) if self.up_first else (first, second)
        return self.down_proj(self.act(gate) * up)


def test_the_probe_finds_which_half_is_the_gate_and_leaves_another_activation_alone(interpreter, install_starter):
    install_starter("fused_mlp")
    x = torch.randn(2, 8, 32)
    for up_first, act, half in ((False, F.silu, "first"), (True, F.silu, "second"), (False, F.gelu, None)):
        mlp = StackedMLP(32, 48, up_first, act).eval()
        site, replacement = fused_mlp.swiglu_module_site("mlp", mlp)
        if half is None:
            assert replacement is None and not site.swapped and "something else" in site.reason
            continue
        assert site.swapped and f"gate=gate_up_proj's {half} half" in site.what
        with torch.no_grad():
            torch.testing.assert_close(replacement(x), mlp(x), atol=1e-5, rtol=1e-5)
            mlp.gate_up_proj.weight = nn.Parameter(torch.randn(96, 32) / 8)  # another weight: new halves taken
            torch.testing.assert_close(replacement(x), mlp(x), atol=1e-5, rtol=1e-5)


def test_two_linears_shaped_otherwise_are_no_candidate(interpreter, install_starter):
    install_starter("fused_mlp")
    assert fused_mlp.swiglu_module_site("mlp", StackedMLP(32, 48).requires_grad_(False)) is not None
    wide = nn.Module()
    wide.a, wide.b = nn.Linear(32, 144, bias=False), nn.Linear(48, 32, bias=False)  # 3I, not 2I (GPT-NeoX's qkv)
    assert fused_mlp.swiglu_module_site("m", wide) is None
    biased = StackedMLP(32, 48)
    biased.down_proj = nn.Linear(48, 32)
    assert fused_mlp.swiglu_module_site("m", biased) is None


def test_a_decode_sized_call_runs_the_original_mlp(interpreter, tmp_path, monkeypatch):
    """Fewer tokens a call than fused_mlp.DECODE_TOKENS (a decode step's GEMVs) run the original MLP on a GPU, the site
    saying why; a prefill-sized call the kernel. Here with the CPU counted as such a device."""
    monkeypatch.setattr(fused_mlp, "DECODE_DEVICES", ("cpu",))
    model = _tiny_phi3()
    with torch.no_grad():
        optimized = autokernel.optimize(model, tmp_path / "none", ["fused_mlp"], verified=None, quiet=True)
        for batch, seq in ((1, 1), (2, 31), (1, 64)):
            ids = torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(seq))
            torch.testing.assert_close(optimized(ids, use_cache=False).logits, model(ids, use_cache=False).logits,
                                       atol=1e-4, rtol=1e-4)
    site = next(s for s in optimized.autokernel.sites() if s.where == "model.layers.0.mlp")
    assert (site.calls, site.fallbacks) == (1, 2) and "decode step" in site.reason


@pytest.mark.gpu
def test_on_a_gpu_a_decode_step_s_mlp_is_the_original_s(tmp_path):
    """The rule as deployed: a CUDA model's one-token call runs the original MLP, a 64-token call the kernel."""
    model = _tiny_phi3().to("cuda", torch.float16)
    with torch.no_grad():
        optimized = autokernel.optimize(model, tmp_path / "none", ["fused_mlp"], verified=None, quiet=True)
        for seq in (1, 64):
            ids = torch.randint(0, 256, (1, seq), device="cuda")
            torch.testing.assert_close(optimized(ids, use_cache=False).logits, model(ids, use_cache=False).logits,
                                       atol=2e-2, rtol=2e-2)
    site = next(s for s in optimized.autokernel.sites() if s.where == "model.layers.0.mlp")
    assert (site.calls, site.fallbacks) == (1, 1) and "decode step" in site.reason
