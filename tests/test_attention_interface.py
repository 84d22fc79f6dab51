"""flash_attention through transformers' attention interface (issue #37): Gemma-2's soft-capped attention with
alternating sliding windows and Mistral's window shorter than the sequence run the kernel, with the original's
output; padding and decoding keep the model's own masks and attention. CPU: Triton's interpreter at small shapes."""

import pytest
import torch
from helpers import compiled_ops, tiny_gemma2

import autokernel
from autokernel.ops import attention_interface

transformers = pytest.importorskip("transformers")


def _mistral():
    torch.manual_seed(0)
    config = transformers.MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                                        sliding_window=8, attn_implementation="sdpa")
    return transformers.MistralForCausalLM(config).eval()


def _ids(batch=2, seq=24):
    return torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(1))


def _site(optimized):
    return next(s for s in optimized.autokernel.sites() if s.where == "model.config")


@pytest.mark.parametrize("make", [tiny_gemma2, _mistral], ids=["gemma2", "mistral"])
def test_windows_and_soft_caps_run_the_kernel_with_the_original_s_output(interpreter, tmp_path, make):
    model, ids = make(), _ids()
    with torch.no_grad():
        optimized = autokernel.optimize(model, tmp_path / "none", ["flash_attention"], verified=None, quiet=True)
        got = optimized(ids, use_cache=False).logits
        torch.testing.assert_close(got, model(ids, use_cache=False).logits, atol=1e-4, rtol=1e-4)
    site = _site(optimized)
    assert site.calls == 2 and not site.fallbacks, site  # both layers, the windowed one and the full one
    ours = attention_interface.IMPLEMENTATIONS[model.config._attn_implementation]  # the user's model is untouched
    assert optimized.config._attn_implementation == ours != model.config._attn_implementation


def test_a_padding_mask_and_decoding_keep_the_model_s_own_attention(interpreter, tmp_path):
    model, ids = tiny_gemma2(), _ids()
    padding = torch.ones_like(ids)
    padding[0, :5] = 0  # the first sequence is left-padded
    with torch.no_grad():
        optimized = autokernel.optimize(model, tmp_path / "none", ["flash_attention"], verified=None, quiet=True)
        got = optimized(ids, attention_mask=padding, use_cache=False).logits
        torch.testing.assert_close(got, model(ids, attention_mask=padding, use_cache=False).logits, atol=1e-4,
                                   rtol=1e-4)
        assert _site(optimized).fallbacks == 2 and "mask" in _site(optimized).reason
        # generation: the prefill runs the kernel, each new token the model's own attention against the cache
        new = optimized.generate(ids[:1, :12], max_new_tokens=4, do_sample=False)
        assert torch.equal(new, model.generate(ids[:1, :12], max_new_tokens=4, do_sample=False))


def _llama_eager():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                                      attn_implementation="eager")
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("make", [tiny_gemma2, _llama_eager], ids=["gemma2", "llama-eager"])
def test_a_call_the_kernel_refuses_gets_the_mask_the_interface_left_out(interpreter, tmp_path, make):
    """The causal (and window's) mask is left out for the kernel; a call the kernel cannot run (a gradient is
    wanted) runs the model's eager attention with the mask made explicit, not an unmasked attention."""
    model, ids = make(), _ids()
    optimized = autokernel.optimize(model, tmp_path / "none", ["flash_attention"], verified=None, quiet=True)
    optimized.model.embed_tokens.weight.requires_grad_(True)
    got = optimized(ids, use_cache=False).logits
    with torch.no_grad():
        torch.testing.assert_close(got, model(ids, use_cache=False).logits, atol=1e-4, rtol=1e-4)
    assert _site(optimized).fallbacks == 2 and "gradient" in _site(optimized).reason


def test_a_model_without_windows_or_caps_on_sdpa_is_left_to_the_sdpa_patch(interpreter, tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                                      attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        optimized = autokernel.optimize(model, tmp_path / "none", ["flash_attention"], verified=None, quiet=True)
        optimized(_ids(), use_cache=False)
    assert not [s for s in optimized.autokernel.sites() if s.where == "model.config"]
    assert optimized.config._attn_implementation == "sdpa"


@pytest.mark.slow(3)
def test_under_torch_compile_each_layer_runs_the_kernel(interpreter, tmp_path):
    """Traced, HF builds masks it would leave out eagerly; the interface's mask function leaves them out traced too:
    one kernel node per layer, windowed and soft-capped as the original."""
    model, ids = tiny_gemma2(), _ids()
    with torch.no_grad():
        optimized = autokernel.optimize(model, tmp_path / "none", ["flash_attention"], verified=None, quiet=True)
        ops = compiled_ops(optimized, model, ids)
    assert sum("autokernel.flash_attention" in op for op in ops) == 2
    torch._dynamo.reset()


@pytest.mark.gpu
def test_gemma2_s_head_dim_256_runs_the_kernel_on_the_gpu_eagerly_and_compiled(tmp_path):
    """Gemma-2's shape of the variants on the GPU: head_dim 256, a window of 128 in a 512-token sequence, a soft cap
    of 50, grouped K/V heads, fp16; eagerly and under torch.compile, the original's logits."""
    torch.manual_seed(0)
    config = transformers.Gemma2Config(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=256, vocab_size=1024,
                                       sliding_window=128, attn_logit_softcapping=50.0, query_pre_attn_scalar=256,
                                       attn_implementation="eager")
    model = transformers.Gemma2ForCausalLM(config).to("cuda", torch.float16).eval()
    ids = torch.randint(0, 1024, (1, 512), device="cuda", generator=torch.Generator("cuda").manual_seed(1))

    def rel_l2(got, want):
        return ((got.float() - want.float()).norm() / want.float().norm()).item()

    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        optimized = autokernel.optimize(model, tmp_path / "none", ["flash_attention"], verified=None, quiet=True)
        assert rel_l2(optimized(ids, use_cache=False).logits, want) < 1e-2
        assert _site(optimized).calls == 2 and not _site(optimized).fallbacks
        assert rel_l2(torch.compile(optimized)(ids, use_cache=False).logits, want) < 1e-2
    torch._dynamo.reset()
