"""flash_attention: scaled dot-product attention, causal or not, on [batch, heads, seq, head_dim], and where a
model runs it (F.scaled_dot_product_attention calls without a mask). The SDPA rules of the profiler
(ATTENTION_OPS, attention_shape) are here too: rope_attention reads its shape through them."""

import functools
import math
import re

import torch
import torch.nn.functional as F

from autokernel import compat
from autokernel.kerneltype import Deployment, KernelSpec, Profiling, SuiteTarget
from autokernel.ops import attention_interface, attention_sites, customops
from autokernel.ops.customops import CallSites, grad_reason, in_eager
from autokernel.types._common import esize, numel, randn, sdpa_operands_unfit, sequence_major

NAME = "flash_attention"


def flash_attention_ref(Q, K, V, causal: bool = True, sm_scale: float | None = None, window: int = 0,
                        softcap: float = 0.0, alibi=None):
    """Scaled dot-product attention; Q is [batch, heads, seq, head_dim], K and V the same or with heads / group heads
    (grouped-query attention: query head h reads K/V head h // group). window: a causal sliding window (query i sees
    keys j with i - window < j <= i; Mistral, Gemma-2), 0 for none; softcap: scores become softcap * tanh(score /
    softcap) before the mask and the softmax (Gemma-2), 0 for none; alibi: None, or each query head's slope m (a
    [heads] tensor), adding m * (j - i) to the (capped) score of query i and key j (ALiBi: BLOOM, MPT), where SDPA
    takes it as a float mask."""
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(Q.shape[-1])
    gqa = K.shape[1] != Q.shape[1]
    if not window and not softcap and alibi is None:
        return F.scaled_dot_product_attention(Q, K, V, is_causal=causal, scale=scale, enable_gqa=gqa)
    i = torch.arange(Q.shape[2], device=Q.device)[:, None]
    j = torch.arange(K.shape[2], device=Q.device)[None, :]
    keep = attention_interface.sees(i, j, causal, window)
    bias = None if alibi is None else alibi.to(Q.dtype)[:, None, None] * (j - i).to(Q.dtype)
    if not softcap:  # SDPA takes the window and the slopes as one float mask
        mask = torch.zeros(keep.shape, dtype=Q.dtype, device=Q.device) if bias is None else bias
        mask = mask.masked_fill(~keep, float("-inf"))
        return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, scale=scale, enable_gqa=gqa)
    group = Q.shape[1] // K.shape[1]
    scores = Q @ K.repeat_interleave(group, 1).transpose(-1, -2) * scale
    scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias
    return scores.masked_fill(~keep, float("-inf")).softmax(-1) @ V.repeat_interleave(group, 1)


def alibi_slopes(heads: int) -> torch.Tensor:
    """ALiBi's slopes for `heads` query heads: the geometric sequence 2^(-8 (h + 1) / heads) (Press et al.)."""
    return torch.exp2(-8.0 * torch.arange(1, heads + 1, dtype=torch.float32) / heads)


def _inputs(scale: float = 1.0):
    def make(shape, dtype, device, gen):
        heads = (shape["H"], shape.get("Hkv", shape["H"]), shape.get("Hkv", shape["H"]))  # Q's, K's, V's
        q, k, v = (randn((shape["B"], h, shape["S"], shape["D"]), dtype, device, gen, scale if i < 2 else 1.0)
                   for i, h in enumerate(heads))
        variant = (shape.get("window", 0), shape.get("softcap", 0.0))  # passed only where the shape has them
        if shape.get("alibi"):
            variant += (alibi_slopes(shape["H"]).to(device),)
        elif not any(variant):
            variant = ()
        return (q, k, v, shape["causal"], shape.get("sm_scale"), *variant)
    return make


def _noncontiguous(inputs):
    # Q, K, V sliced out of one packed [B, S, 3, H, D] projection, as models produce them; with grouped K/V heads,
    # each in the [B, S, H, D] layout of its own projection
    q, k, v = inputs[:3]
    if k.shape != q.shape:
        return tuple(sequence_major(t) for t in (q, k, v)) + tuple(inputs[3:])
    packed = torch.stack([t.transpose(1, 2) for t in (q, k, v)], dim=2).contiguous()
    return tuple(packed[:, :, i].transpose(1, 2) for i in range(3)) + tuple(inputs[3:])


def _model_layout(inputs):
    # as HF's attention modules hand SDPA (or the attention interface) their tensors: Q and K fresh from RoPE, V a view
    # of its [B, S, H, D] projection
    q, k, v = inputs[:3]
    return (q, k, sequence_major(v), *inputs[3:])


def flex_attention_call(flex, Q, K, V, causal: bool = True, sm_scale: float | None = None, window: int = 0,
                        softcap: float = 0.0, alibi=None):
    """The reference's variant as torch's flex_attention computes it: the soft cap and the ALiBi slopes as a score
    modification, causal and window as a block mask (made once per shape, as a model would). flex: flex_attention,
    compiled or not."""
    score = _score_mod(softcap, alibi) if softcap or alibi is not None else None
    mask = _block_mask(Q.shape[2], K.shape[2], causal, window, Q.device) if causal or window else None
    return flex(Q, K, V, score_mod=score, block_mask=mask, scale=sm_scale, enable_gqa=K.shape[1] != Q.shape[1])


_SCORE_MODS = {}  # (softcap, the slopes' tensor) -> its score_mod: one function per variant, or dynamo recompiles


def _score_mod(softcap: float, alibi):
    key = (softcap, None if alibi is None else (alibi.data_ptr(), alibi.dtype, alibi.device))
    if key not in _SCORE_MODS:
        if len(_SCORE_MODS) >= 32:  # each holds its slopes: a long process (the loop's screen) keeps a few
            _SCORE_MODS.clear()
        def score_mod(score, b, h, q, k):
            if softcap:
                score = softcap * torch.tanh(score / softcap)
            return score if alibi is None else score + alibi[h] * (k - q)
        _SCORE_MODS[key] = score_mod
    return _SCORE_MODS[key]


@functools.lru_cache(maxsize=16)
def _block_mask(q_len: int, kv_len: int, causal: bool, window: int, device):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(lambda b, h, q, k: attention_interface.sees(q, k, causal, window), None, None, q_len,
                             kv_len, device=device)


def _flex_baseline(liger) -> dict:
    """torch.nn.attention.flex_attention compiled, with the variant's soft cap and mask: the bar where SDPA has no
    native path for the variant (a window, a soft cap), where torch offers one at all."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        return {}
    # compiled for each shape and variant as a model would (past dynamo's limit of 8 it would run uncompiled); a
    # benchmark's process only asks for baselines
    limit = compat.recompile_limit_option()
    setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 64))
    return {"flex_attention": functools.partial(flex_attention_call, torch.compile(flex_attention, dynamic=False))}


def _flops(s):
    full = 4 * s["B"] * s["H"] * s["S"] * s["S"] * s["D"]
    window = min(s.get("window") or s["S"], s["S"])
    if window < s["S"]:  # causal: row i sees min(i + 1, window) keys
        return 4 * s["B"] * s["H"] * s["D"] * (s["S"] * window - window * (window - 1) // 2)
    return full // 2 if s["causal"] else full


# ------------------------------------------------------------------------------ what the profiler reads
# SDPA entry points -> (index of is_causal, index of scale) among their arguments
ATTENTION_OPS = {
    "aten::scaled_dot_product_attention": (5, 6),
    "aten::_scaled_dot_product_flash_attention": (4, 6),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (4, 6),
    "aten::_scaled_dot_product_efficient_attention": (6, 7),
    "aten::_scaled_dot_product_cudnn_attention": (6, 8),
    "aten::_flash_attention_forward": (None, None),
    "aten::_efficient_attention_forward": (None, None),
    "aten::_cudnn_attention_forward": (None, None),  # what a compiled graph calls for cuDNN's SDPA (torch 2.11)
}


def attention_shape(op) -> dict:
    """{B, H, S, D, causal[, sm_scale]} of a recorded SDPA op."""
    b, h, s, d = op.shapes[0]
    causal_at, scale_at = ATTENTION_OPS.get(op.name, (None, None))
    causal = bool(op.args[causal_at]) if causal_at is not None and causal_at < len(op.args) else True
    shape = {"B": b, "H": h, "S": s, "D": d, "causal": causal}
    kv_heads = op.shapes[1][1] if len(op.shapes) > 1 and len(op.shapes[1] or ()) == 4 else h
    if kv_heads != h:  # grouped-query attention (SDPA with enable_gqa)
        shape = {"B": b, "H": h, "Hkv": kv_heads, "S": s, "D": d, "causal": causal}
    scale = op.args[scale_at] if scale_at is not None and scale_at < len(op.args) else None
    if isinstance(scale, float) and not math.isclose(scale, 1 / math.sqrt(d)):
        shape["sm_scale"] = scale
    return shape


# ---------------------------------------------------------------- the drop-in F.scaled_dot_product_attention
_F_SDPA = customops.original(F, "scaled_dot_product_attention")


def _unfit(q, k, v, attn_mask, dropout_p, enable_gqa) -> str | None:
    if attn_mask is not None:
        return "an attention mask is given (the kernel takes causal or none)"
    if dropout_p:
        return "attention dropout"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "not [batch, heads, seq, head_dim] tensors"
    if q.shape[2] != k.shape[2] or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        return "queries and keys differ in length (cross-attention or a KV cache)"
    return sdpa_operands_unfit(q, k, v, enable_gqa)


def replace_sdpa(sites: CallSites) -> dict:
    """F.scaled_dot_product_attention -> flash_attention where the call fits."""
    kernel = customops.op(NAME)

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     scale=None, enable_gqa=False):
        reason = _unfit(query, key, value, attn_mask, dropout_p, enable_gqa) or grad_reason(query, key, value)
        if in_eager():
            sites.hit("F.scaled_dot_product_attention", NAME, reason)
        if reason:
            extra = {"enable_gqa": True} if enable_gqa else {}
            return _F_SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **extra)
        return kernel(query, key, value, bool(is_causal), scale, 0, 0.0, None)  # grouped K/V heads as they are

    return {_F_SDPA: scaled_dot_product_attention}


SPEC = KernelSpec(
    name=NAME,
    reference=flash_attention_ref,
    make_inputs=_inputs(),
    shapes=[{"B": 2, "H": 32, "S": 2048, "D": 128, "causal": True},
            {"B": 2, "H": 32, "S": 2048, "D": 128, "causal": False},
            {"B": 1, "H": 16, "S": 4096, "D": 64, "causal": True, "alibi": True},  # BLOOM-like slopes
            {"B": 2, "H": 12, "S": 1024, "D": 64, "causal": True, "sm_scale": 0.1},
            {"B": 8, "H": 16, "S": 256, "D": 64, "causal": False},
            {"B": 1, "H": 8, "S": 8192, "D": 128, "causal": True},
            {"B": 1, "H": 32, "Hkv": 4, "S": 2048, "D": 64, "causal": True},  # TinyLlama's grouped heads
            {"B": 1, "H": 16, "Hkv": 8, "S": 2048, "D": 128, "causal": True},  # Qwen3-0.6B's
            {"B": 1, "H": 32, "Hkv": 8, "S": 8192, "D": 128, "causal": True, "window": 4096},  # Mistral's window
            {"B": 1, "H": 8, "Hkv": 4, "S": 4096, "D": 128, "causal": True, "window": 1024, "softcap": 50.0}],
    small_shapes=[{"B": 1, "H": 1, "S": 16, "D": 16, "causal": True},
                  {"B": 1, "H": 2, "S": 32, "D": 32, "causal": False},
                  {"B": 2, "H": 2, "S": 64, "D": 16, "causal": True},
                  {"B": 1, "H": 1, "S": 48, "D": 64, "causal": False, "sm_scale": 0.2},
                  {"B": 1, "H": 4, "Hkv": 2, "S": 32, "D": 32, "causal": True},
                  {"B": 1, "H": 2, "Hkv": 1, "S": 64, "D": 32, "causal": True, "window": 16},
                  {"B": 1, "H": 2, "S": 48, "D": 16, "causal": False, "softcap": 5.0},
                  {"B": 1, "H": 4, "Hkv": 2, "S": 64, "D": 32, "causal": True, "alibi": True},
                  {"B": 1, "H": 2, "S": 48, "D": 16, "causal": False, "alibi": True}],
    edge_shapes=[{"B": 1, "H": 4, "S": 1023, "D": 64, "causal": True},
                 {"B": 1, "H": 2, "S": 1537, "D": 128, "causal": False},
                 {"B": 1, "H": 2, "S": 4097, "D": 64, "causal": True},
                 {"B": 1, "H": 4, "S": 1000, "D": 80, "causal": True},
                 {"B": 1, "H": 8, "Hkv": 2, "S": 1023, "D": 64, "causal": True}],
    small_edge_shapes=[{"B": 1, "H": 1, "S": 1023, "D": 16, "causal": True},
                       {"B": 1, "H": 1, "S": 97, "D": 80, "causal": False},
                       {"B": 1, "H": 3, "Hkv": 1, "S": 33, "D": 16, "causal": True},
                       {"B": 1, "H": 2, "S": 97, "D": 32, "causal": True, "window": 7, "softcap": 2.0},
                       {"B": 1, "H": 3, "Hkv": 1, "S": 97, "D": 32, "causal": True, "softcap": 3.0, "alibi": True}],
    bench_shape={"B": 2, "H": 32, "S": 2048, "D": 128, "causal": True},
    small_bench_shape={"B": 1, "H": 2, "S": 128, "D": 64, "causal": True},
    bytes_moved=lambda s, dt: 2 * (s["H"] + s.get("Hkv", s["H"])) * numel(s, "B", "S", "D") * esize(dt),
    flops=_flops,
    # scores of +-64 sigma: exp() without a running max overflows even in fp32
    adversarial={"large_scores": _inputs(scale=8.0)},
    # fp32 rounding of scores near 250 moves a softmax weight by ~1e-5 relative, and the output with it, past the
    # 1e-4 fp32 tolerance; overflow still gives NaN or O(1) errors
    adversarial_tolerance={"large_scores": 4.0},
    noncontiguous=_noncontiguous,
    model_layout=_model_layout,  # timed so at the model's shapes
    extra_baselines=_flex_baseline,
    description="scaled dot-product attention, causal or not, [batch, heads, seq, head_dim], K/V heads grouped or "
                "not, with a sliding window, a logit soft cap and ALiBi slopes or not",
    profiling=Profiling(ops=frozenset(ATTENTION_OPS), kernels=re.compile(r"flash|fmha|attention|attn", re.I),
                        op_shape=attention_shape, precedence=-3),
    default_speedup=1.05,  # PyTorch's SDPA already runs FlashAttention-2 or cuDNN
    suite_target=SuiteTarget("0.9x SDPA", lambda r, b: r["speedup_vs_pytorch"] / 0.9),
    deployment=Deployment("(Tensor Q, Tensor K, Tensor V, bool causal, float? sm_scale, int window, float softcap, "
                          "Tensor? alibi) -> Tensor",
                          lambda Q, K, V, causal, sm_scale, window, softcap, alibi: (*Q.shape[:-1], V.shape[-1]),
                          functions=replace_sdpa, model_functions=attention_sites.causal_mask_patches,
                          model_site=lambda model: attention_interface.interface_site(model, NAME, customops.op(NAME)),
                          output_order=(0, 2, 1, 3)),  # [B, S, H, D] in memory: the model's transpose is a view
)
