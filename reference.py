"""PyTorch ground truth for every kernel type. Agents never edit this file.

Each function is written the way a user writes the op in plain PyTorch. bench.py uses it twice:
on the kernel's own dtype it is the "PyTorch eager" baseline that gets timed, and on float64
copies of the inputs it is the correctness oracle. So every function must stay dtype-generic:
low-precision inputs are computed in float32 (as eager PyTorch does), float64 stays float64.
A kernel file's `kernel_fn` has exactly the signature of its reference.
"""

import math

import torch
import torch.nn.functional as F


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    # fp16/bf16 -> fp32 (what eager code does by hand); fp32 and fp64 are kept as they are.
    return torch.promote_types(x.dtype, torch.float32)


def matmul_ref(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """A [..., M, K] @ B [K, N] -> [..., M, N]."""
    return A @ B


def softmax_ref(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension."""
    return torch.softmax(x, dim=-1)


def layernorm_ref(x, weight, bias, eps: float = 1e-5):
    """LayerNorm over the last dimension with affine weight and bias."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rmsnorm_ref(x, weight, eps: float = 1e-6):
    """LLaMA's RMSNorm, written out as users write it: x * rsqrt(mean(x^2) + eps) * weight."""
    xf = x.to(_compute_dtype(x))
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


def flash_attention_ref(Q, K, V, causal: bool = True, sm_scale: float | None = None):
    """Scaled dot-product attention; Q, K, V are [batch, heads, seq, head_dim]."""
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(Q.shape[-1])
    return F.scaled_dot_product_attention(Q, K, V, is_causal=causal, scale=scale)


def fused_mlp_ref(x, w_gate, w_up, w_down):
    """SwiGLU MLP: down(silu(x @ w_gate.T) * (x @ w_up.T)); weights are nn.Linear-shaped."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def cross_entropy_ref(logits, targets):
    """Mean cross-entropy of logits [..., V] against integer targets [...]."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def rotary_embedding_ref(x, cos, sin):
    """Rotary embedding, rotate-half convention (LLaMA, GPT-NeoX).

    x is [..., seq, head_dim]; cos and sin are [seq, head_dim // 2]. The first half of each head
    is rotated against the second: out = cat(x1*cos - x2*sin, x2*cos + x1*sin).
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def reduce_ref(x, dim: int = -1):
    """Sum over one dimension (the last by default)."""
    return x.sum(dim=dim)


def add_rmsnorm_ref(x, residual, weight, eps: float = 1e-6):
    """A decoder layer's residual add and the RMSNorm after it: (sum, normed). The sum is rounded to the
    input dtype before it is normalized, as eager computes `residual + x` and then normalizes that tensor."""
    total = x + residual
    return total, rmsnorm_ref(total, weight, eps)


def add_layernorm_ref(x, residual, weight, bias, eps: float = 1e-5):
    """The residual add and the LayerNorm after it (GPT-2's `attn_out + residual`, then ln_2): (sum, normed)."""
    total = x + residual
    return total, layernorm_ref(total, weight, bias, eps)


def linear_cross_entropy_ref(hidden, weight, target, ignore_index: int = -100):
    """An LM head and its loss: mean cross-entropy of the logits hidden [N, H] @ weight [V, H].T against
    integer targets [N], targets equal to ignore_index left out. The logits are upcast before the loss, as
    transformers' loss does (fp16/bf16 logits -> fp32), so the loss is fp32 (fp64 for fp64 inputs)."""
    logits = hidden @ weight.T
    return F.cross_entropy(logits.to(_compute_dtype(logits)), target, ignore_index=ignore_index)


def _rotate_half(x):
    """[x1, x2] -> [-x2, x1] over the last dimension's halves (transformers' rotate_half)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_attention_ref(q, k, v, cos, sin, causal: bool = True, sm_scale: float | None = None):
    """Attention with its prologue, as HF Llama's attention runs it: rotate-half RoPE on q and k
    (apply_rotary_pos_emb), K/V repeated for grouped-query attention (repeat_kv), then SDPA.

    q is [batch, heads, seq, head_dim]; k and v are [batch, kv_heads, seq, head_dim] with kv_heads
    dividing heads; cos and sin are [seq, head_dim] or, as HF's rotary module gives them,
    [batch or 1, seq, head_dim] (both halves present: cat(freqs, freqs)).
    """
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    batch, kv_heads, seq, head_dim = k.shape
    repeated = (batch, q.shape[1], seq, head_dim)
    groups = q.shape[1] // kv_heads
    k, v = (t[:, :, None].expand(batch, kv_heads, groups, seq, head_dim).reshape(repeated) for t in (k, v))
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def linear_gelu_ref(x, weight, bias=None, approximate: str = "none"):
    """The first GEMM of a GELU MLP with its bias and activation: gelu(x @ weight.T + bias). x is [..., H], weight
    [I, H] as nn.Linear holds it, bias [I] or None; approximate "none" is the exact erf GELU (BERT, GPT-NeoX, Phi),
    "tanh" the tanh approximation (GPT-2's gelu_new)."""
    return F.gelu(F.linear(x, weight, bias), approximate=approximate)
