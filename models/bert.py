"""BERT, self-contained: word + position + segment embeddings, post-LayerNorm encoder, GELU MLP.

Presets (pass the name to the constructor, or `--config NAME` to profile.py):
  tiny    2 layers of width 128 for CPU tests
  base    BERT-base, 110M parameters (the default)
  large   BERT-large, 340M parameters

Attention is bidirectional (not causal) through F.scaled_dot_product_attention. Forward:
input_ids [batch, seq] -> the last hidden states [batch, seq, hidden] (no task head), as
transformers' BertModel returns them.
"""

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12


PRESETS = {
    "tiny": BertConfig(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=512, max_position_embeddings=512),
    "base": BertConfig(),
    "large": BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


def resolve_config(config, presets: dict, overrides: dict):
    """A preset name or a config object, with field overrides applied."""
    if isinstance(config, str):
        if config not in presets:
            raise ValueError(f"unknown config {config!r}; presets: {', '.join(presets)}")
        config = presets[config]
    return replace(config, **overrides)


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.n_head = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x):
        b, s, c = x.shape
        q, k, v = (lin(x).view(b, s, self.n_head, c // self.n_head).transpose(1, 2)
                   for lin in (self.query, self.key, self.value))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=False)
        return self.dense(out.transpose(1, 2).reshape(b, s, c))


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = BertSelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.intermediate = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.output = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.output_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x):
        x = self.attention_norm(x + self.attention(x))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class BertModel(nn.Module):
    def __init__(self, config: BertConfig | str = "base", **overrides):
        super().__init__()
        cfg = resolve_config(config, PRESETS, overrides)
        self.config = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.embedding_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.apply(_init_weights)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        seq = input_ids.shape[1]
        if seq > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {seq} exceeds max_position_embeddings "
                             f"{self.config.max_position_embeddings}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        pos = torch.arange(seq, device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos)
        x = self.embedding_norm(x + self.token_type_embeddings(token_type_ids))
        for layer in self.layers:
            x = layer(x)
        return x


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
