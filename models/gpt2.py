"""GPT-2, self-contained: learned positions, pre-LayerNorm blocks, causal attention, GELU MLP.

Presets (pass the name to the constructor, or `--config NAME` to profile.py):
  tiny    2 layers of width 128 for CPU tests
  small   GPT-2 small, 124M parameters (the default)
  medium  GPT-2 medium, 350M parameters

`sdpa=False` computes attention the way the original GPT-2 code does (matmul, mask, softmax,
matmul) instead of F.scaled_dot_product_attention: the profile then shows softmax as its own type.
The LM head shares the embedding matrix. Forward: input_ids [batch, seq] -> logits [batch, seq, vocab].
"""

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_eps: float = 1e-5
    sdpa: bool = True


PRESETS = {
    "tiny": GPT2Config(vocab_size=512, n_positions=512, n_embd=128, n_layer=2, n_head=4),
    "small": GPT2Config(),
    "medium": GPT2Config(n_embd=1024, n_layer=24, n_head=16),
}


def resolve_config(config, presets: dict, overrides: dict):
    """A preset name or a config object, with field overrides applied."""
    if isinstance(config, str):
        if config not in presets:
            raise ValueError(f"unknown config {config!r}; presets: {', '.join(presets)}")
        config = presets[config]
    return replace(config, **overrides)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.n_head, self.sdpa = cfg.n_head, cfg.sdpa
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        b, s, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (t.view(b, s, self.n_head, c // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            out = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
        return self.c_proj(out.transpose(1, 2).reshape(b, s, c))


class GPT2MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, config: GPT2Config | str = "small", **overrides):
        super().__init__()
        cfg = resolve_config(config, PRESETS, overrides)
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.apply(_init_weights)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        if seq > self.config.n_positions:
            raise ValueError(f"sequence length {seq} exceeds n_positions {self.config.n_positions}")
        pos = torch.arange(seq, device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied LM head


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
