"""Which attention each HF decoder family gets (issue #37's site choice per attention class), with the original's
logits: RoPE and the attention as one kernel call where the module is LLaMA's shape (Llama, Qwen2, Qwen3 with its
per-head norms) or rotates part of each head (GPT-NeoX with its fused projection, Phi); flash_attention through
transformers' attention interface where the attention has a window or a soft cap (Mistral, Gemma-2), with the rotary
kernel beside it."""

import pytest
import torch

import autokernel

transformers = pytest.importorskip("transformers")

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "vocab_size": 256}
FUSED = {("rope_attention", "Attention")}
INTERFACE = {("flash_attention", "AttentionInterface"), ("rotary_embedding", "apply_rotary_pos_emb")}
FAMILIES = {  # config, model, the config's own fields, what runs the attention
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2, "head_dim": 16}, FUSED),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2}, FUSED),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"num_key_value_heads": 2, "head_dim": 16}, FUSED),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 2, "head_dim": 16,
                                                        "sliding_window": 8}, INTERFACE),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8,
                                                     "attn_logit_softcapping": 2.0, "query_pre_attn_scalar": 16,
                                                     "attn_implementation": "eager"}, INTERFACE),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"rotary_pct": 0.25}, FUSED),
    "phi": ("PhiConfig", "PhiForCausalLM", {"partial_rotary_factor": 0.5}, FUSED),
}


def _ran(optimized) -> set:
    """{(type, the site's kind)} of the attention types' sites that ran the kernel."""
    kinds = ("AttentionInterface", "F.scaled_dot_product_attention", "apply_rotary_pos_emb", "Attention")
    return {(s.kernel_type, next((k for k in kinds if k in s.what), s.what)) for s in optimized.autokernel.sites()
            if s.calls and s.kernel_type in ("rope_attention", "flash_attention", "rotary_embedding")}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_s_attention_runs_our_kernels_with_the_original_s_output(interpreter, tmp_path, family):
    config_class, model_class, fields, expected = FAMILIES[family]
    if not hasattr(transformers, model_class):
        pytest.skip(f"transformers {transformers.__version__} has no {model_class}")
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**SMALL, **fields)
    model = getattr(transformers, model_class)(config).eval()
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        optimized = autokernel.optimize(model, tmp_path / "none", ["rope_attention", "flash_attention",
                                                                    "rotary_embedding"], verified=None, quiet=True)
        torch.testing.assert_close(optimized(ids, use_cache=False).logits, model(ids, use_cache=False).logits,
                                   atol=1e-4, rtol=1e-4)
    assert _ran(optimized) == expected
