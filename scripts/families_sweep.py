"""Developer tool (CPU or GPU): autokernel.optimize on tiny configs of many HF decoder families, logits against the
original's (and, on a GPU, the optimized model under torch.compile too). (#17)

    DT=float16 python scripts/families_sweep.py [FAMILY ...]       # CPU: TRITON_INTERPRET=1; default: every family

One line per family: the relative L2 error of the optimized model's logits (and the compiled one's), or the error
that stopped it. A family whose config class the installed transformers lacks says so and the sweep goes on.
"""

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import autokernel  # noqa: E402
from autokernel.ops.swap import rel_l2  # noqa: E402

# family -> (config class, model class, config entries beyond the shared tiny ones; None: one of those left out)
FAMILIES = {
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {}),
    "phi": ("PhiConfig", "PhiForCausalLM", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", {"num_local_experts": 4, "pad_token_id": 0}),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", {"pad_token_id": 0}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {"moe_intermediate_size": 32, "num_experts": 4,
                                                           "shared_expert_intermediate_size": 64,
                                                           "num_experts_per_tok": 2}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {"moe_intermediate_size": 32, "num_experts": 4,
                                                           "num_experts_per_tok": 2}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", {}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"n_embd": 64, "n_layer": 2, "n_head": 4}),
    "opt": ("OPTConfig", "OPTForCausalLM", {"ffn_dim": 128, "word_embed_proj_dim": 64, "pad_token_id": 0}),
    "bloom": ("BloomConfig", "BloomForCausalLM", {"n_head": 4, "n_layer": 2}),
    "falcon": ("FalconConfig", "FalconForCausalLM", {"new_decoder_architecture": True, "num_kv_heads": 2,
                                                     "head_dim": None}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "ministral": ("MinistralConfig", "MinistralForCausalLM", {}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {}),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {"pad_token_id": 0}),
    "glm": ("GlmConfig", "GlmForCausalLM", {"pad_token_id": 0}),
    "nemotron": ("NemotronConfig", "NemotronForCausalLM", {"pad_token_id": 0}),
    "helium": ("HeliumConfig", "HeliumForCausalLM", {"pad_token_id": 0}),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", {"pad_token_id": 0}),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", {"pad_token_id": 0}),
}
# what every family gets: two layers, four heads over two kv heads, a 128-token vocabulary
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=64)


def sweep(name: str, dtype: torch.dtype, device: str) -> str:
    config_class, model_class, extra = FAMILIES[name]
    config = getattr(transformers, config_class)(**{k: v for k, v in {**TINY, **extra}.items() if v is not None})
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval().to(device, dtype)
    ids = torch.randint(0, TINY["vocab_size"], (1, 64)).to(device)
    with torch.no_grad():
        want = model(ids).logits
        optimized = autokernel.optimize(model, quiet=True)
        line = f"{name}: rel_l2 {rel_l2(optimized(ids).logits, want):.2e}"
        if device == "cuda":
            line += f", compiled {rel_l2(torch.compile(optimized)(ids).logits, want):.2e}"
            torch._dynamo.reset()
    return line


def main() -> None:
    p = argparse.ArgumentParser(description="autokernel.optimize on tiny configs of HF decoder families, logits "
                                            "against the original's (DT=float16 for fp16)")
    p.add_argument("families", nargs="*", metavar="FAMILY", help=f"default: every one of {', '.join(FAMILIES)}")
    names = p.parse_args().families or list(FAMILIES)
    if unknown := [n for n in names if n not in FAMILIES]:
        p.error(f"no family {unknown[0]!r}: one of {', '.join(FAMILIES)}")
    dtype = getattr(torch, os.environ.get("DT", "float32"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in names:
        start = time.time()
        try:
            print(f"{sweep(name, dtype, device)} ({time.time() - start:.1f} s)", flush=True)
        except Exception as e:  # one family's failure is a line of the report, not the end of the sweep
            print(f"{name}: ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
            traceback.print_exc(limit=3)


if __name__ == "__main__":
    main()
