"""LLaMA, self-contained: RMSNorm, rotary embeddings, SwiGLU MLP, grouped-query attention.

Presets (pass the name to the constructor, or `--config NAME` to profile.py):
  tiny       a few layers of width 128 for CPU tests (seconds on a laptop)
  compact    ~160M parameters (width 768, 16 layers, 12 heads, 4 KV heads): the default
  tinyllama  the shape of TinyLlama-1.1B (width 2048, 22 layers, 32 heads, 4 KV heads, MLP 5632)
  7b         LLaMA-2 7B (width 4096, 32 layers, 32 heads, MLP 11008)

The ops are written the way the kernel types' references write them (reference.py), so that an
optimized kernel can replace them one for one: `rms_norm` is rmsnorm_ref, `apply_rotary` is
rotary_embedding_ref (rotate-half, cos/sin tables of [seq, head_dim / 2]), LlamaMLP is fused_mlp_ref.
The rotary tables are real cos/sin computed in float64 once, never complex numbers, so casting the
model to fp16 or bf16 rounds them like any other buffer instead of silently dropping an imaginary part.

`rmsnorm_as_ops=True` keeps the RMSNorm modules (and so the same state_dict) but has each block call
the norm as plain tensor ops, the way many user models write it, so that profiling can be tested on
both forms. Forward: input_ids [batch, seq] -> logits [batch, seq, vocab].
"""

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 32000
    dim: int = 768
    n_layers: int = 16
    n_heads: int = 12
    n_kv_heads: int = 4  # grouped-query attention: each KV head serves n_heads / n_kv_heads queries
    intermediate: int = 2304  # SwiGLU hidden width
    max_seq_len: int = 2048
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rmsnorm_as_ops: bool = False

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


PRESETS = {
    "tiny": LlamaConfig(vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, intermediate=352,
                        max_seq_len=512),
    "compact": LlamaConfig(),
    "tinyllama": LlamaConfig(vocab_size=32000, dim=2048, n_layers=22, n_heads=32, n_kv_heads=4,
                             intermediate=5632, max_seq_len=2048, norm_eps=1e-5),
    "7b": LlamaConfig(vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, intermediate=11008,
                      max_seq_len=4096, norm_eps=1e-5),
}


def resolve_config(config, presets: dict, overrides: dict):
    """A preset name or a config object, with field overrides applied."""
    if isinstance(config, str):
        if config not in presets:
            raise ValueError(f"unknown config {config!r}; presets: {', '.join(presets)}")
        config = presets[config]
    return replace(config, **overrides)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight, the statistics in fp32 (an fp16 sum of squares overflows)."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency, [seq_len, head_dim // 2], computed in float64.

    Angles reach seq_len radians; in fp16 a position of 2048 would carry an error of ~1 rad.
    """
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on x [batch, heads, seq, head_dim] with cos/sin [seq, head_dim // 2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.n_kv_heads != self.n_heads:
            # Expanding K/V keeps every SDPA backend (flash included) usable on every torch version.
            groups = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.w_gate = nn.Linear(cfg.dim, cfg.intermediate, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.intermediate, bias=False)
        self.w_down = nn.Linear(cfg.intermediate, cfg.dim, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.norm_as_ops = cfg.rmsnorm_as_ops
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = LlamaAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = LlamaMLP(cfg)

    def _norm(self, norm: RMSNorm, x):
        if self.norm_as_ops:
            xf = x.float()
            normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + norm.eps)
            return normed.to(x.dtype) * norm.weight
        return norm(x)

    def forward(self, x, cos, sin):
        h = x + self.attn(self._norm(self.attn_norm, x), cos, sin)
        return h + self.mlp(self._norm(self.mlp_norm, h))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig | str = "compact", **overrides):
        super().__init__()
        cfg = resolve_config(config, PRESETS, overrides)
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.max_seq_len, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(_init_weights)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        if seq > self.config.max_seq_len:
            raise ValueError(f"sequence length {seq} exceeds max_seq_len {self.config.max_seq_len}")
        x = self.embed(input_ids)
        cos, sin = self.rope_cos[:seq].to(x.dtype), self.rope_sin[:seq].to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def _init_weights(module: nn.Module) -> None:
    # GPT-style N(0, 0.02): activations stay O(1) through the layers, in fp16 as in fp32.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
