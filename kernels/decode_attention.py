"""Decode attention starter: a few new query tokens against a KV cache's filled prefix (split-KV, then a reduction).

Q [B, H, T, D], K and V [B, Hkv, L, D] (a cache of L entries, the first seqlens[b] filled), seqlens [B] int32; query
t of sequence b sits at position seqlens[b] - T + t and sees the keys up to it. Or, with mask (bool [B, T or 1, L], a
model's attention mask: left padding, a static cache's empty tail), token t sees the keys below seqlens[b] that
mask[b, t] (or mask[b, 0]) holds True for. Out [B, H, T, D] in Q's dtype.

Bandwidth-bound: a step reads the filled cache once (2 * B * Hkv * seqlen * D elements) for 4 FLOPs per element and
query head. One program per (sequence, K/V head) would leave most of the GPU idle at batch 1, so the cache is cut
into splits (SPLITS_PER_SM programs per SM in all, at least BLOCK_N keys each): each program runs an online softmax
over its split for all the query heads of its K/V head's group and all T tokens at once (GROUP * T rows of one
tl.dot, padded to 16: the group shares every K/V load), and writes its unnormalized output with its row max and
sum; a second kernel weighs the splits by exp2(max - max of all) and divides. Scores are scaled by sm_scale * log2(e)
to use exp2. Keys past seqlens[b] are never loaded.
"""

import functools
import math

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "decode_attention"

BLOCK_N = 64  # keys per step of a program's loop
SPLITS_PER_SM = 4  # programs per SM over all sequences and K/V heads (split-KV); more splits, a longer reduction
MAX_SPLITS = 128  # splits of one cache at most
NUM_WARPS = 4
NUM_STAGES = 2
CPU_SMS = 4  # SMs to plan for in Triton's CPU interpreter

TUNABLES = {
    "BLOCK_N": [32, 64, 128],
    "SPLITS_PER_SM": [1, 2, 4, 8],
    "MAX_SPLITS": [32, 64, 128, 256],
    "NUM_WARPS": [2, 4, 8],
    "NUM_STAGES": [1, 2, 3, 4],
}

LOG2E = 1.4426950408889634


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, lens_ptr, mask_ptr, part_ptr, stats_ptr, HKV, T, SPLITS, split_len, qk_scale,
                  stride_qb, stride_qh, stride_qt, stride_qd, stride_kb, stride_kh, stride_kl, stride_kd,
                  stride_vb, stride_vh, stride_vl, stride_vd, stride_mb, stride_mt, stride_ml,
                  GROUP: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                  D_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr, MASKED: tl.constexpr):
    qk_scale = tl.full([], qk_scale, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    bh = tl.program_id(0)  # sequence b, K/V head kvh
    split = tl.program_id(1)
    b = bh // HKV
    kvh = bh % HKV
    rows = tl.arange(0, ROWS)  # row r: query head kvh * GROUP + r // T, token r % T
    head = kvh * GROUP + rows // T
    token = rows % T
    live = rows < GROUP * T
    offs_d = tl.arange(0, D_PAD)
    seqlen = tl.load(lens_ptr + b)
    last = seqlen - T + token  # the last key each row sees
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + head[:, None].to(tl.int64) * stride_qh
                + token[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                mask=live[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    k_base = k_ptr + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vh
    m = tl.full((ROWS,), float("-inf"), tl.float32)
    total = tl.zeros((ROWS,), tl.float32)
    acc = tl.zeros((ROWS, D_PAD), tl.float32)
    start = split * split_len
    end = tl.minimum(start + split_len, seqlen)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        in_cache = offs_n < end
        kv_mask = in_cache[:, None] & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kl + offs_d[None, :] * stride_kd, mask=kv_mask,
                    other=0.0)
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vl + offs_d[None, :] * stride_vd, mask=kv_mask,
                    other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if MASKED:  # the caller's mask says which keys each token sees (padding, a static cache's empty tail)
            seen = tl.load(mask_ptr + b.to(tl.int64) * stride_mb + token[:, None] * stride_mt
                           + offs_n[None, :].to(tl.int64) * stride_ml, mask=live[:, None] & in_cache[None, :], other=0)
            s = tl.where(in_cache[None, :] & (seen != 0), s, float("-inf"))
        else:
            s = tl.where(in_cache[None, :] & (offs_n[None, :] <= last[:, None]), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m - m_safe)
        total = total * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new
    # partials [B, H, T, SPLITS, D] and stats [B, H, T, SPLITS, 2] (row max, row sum), fp32
    slot = ((b.to(tl.int64) * HKV * GROUP + head) * T + token) * SPLITS + split
    tl.store(part_ptr + slot[:, None] * D_PAD + offs_d[None, :], acc, mask=live[:, None])
    tl.store(stats_ptr + slot * 2, m, mask=live)
    tl.store(stats_ptr + slot * 2 + 1, total, mask=live)


@triton.jit
def _combine_kernel(part_ptr, stats_ptr, out_ptr, H, T, SPLITS, stride_ob, stride_oh, stride_ot, stride_od,
                    SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr):
    row = tl.program_id(0)  # (b, h, t)
    t = row % T
    h = (row // T) % H
    b = row // (T * H)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, D_PAD)
    here = offs_s < SPLITS
    base = row.to(tl.int64) * SPLITS
    m = tl.load(stats_ptr + (base + offs_s) * 2, mask=here, other=float("-inf"))
    total = tl.load(stats_ptr + (base + offs_s) * 2 + 1, mask=here, other=0.0)
    top = tl.max(m, 0)
    weight = tl.where(m == float("-inf"), 0.0, tl.math.exp2(m - top))  # a split with no visible key weighs 0
    part = tl.load(part_ptr + (base + offs_s)[:, None] * D_PAD + offs_d[None, :], mask=here[:, None], other=0.0)
    out = tl.sum(part * weight[:, None], 0) / tl.sum(total * weight, 0)
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + t * stride_ot + offs_d * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


@functools.cache
def _sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << (max(n, 1) - 1).bit_length())


def kernel_fn(Q, K, V, seqlens, sm_scale=None, mask=None):
    batch, heads, tokens, head_dim = Q.shape
    kv_heads, length = K.shape[1], K.shape[2]
    if K.shape != V.shape or heads % kv_heads or seqlens.shape != (batch,):
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}, seqlens "
                         f"{tuple(seqlens.shape)}: K/V one shape, heads dividing Q's, one length per sequence")
    if mask is not None:
        if mask.dtype != torch.bool or mask.dim() != 3 or mask.shape[0] != batch or mask.shape[1] not in (1, tokens) \
                or mask.shape[2] != length:
            raise ValueError(f"mask {tuple(mask.shape)} {mask.dtype}: bool [batch, tokens or 1, cache length]")
    mask_strides = (0, 0, 0) if mask is None else (mask.stride(0), mask.stride(1) if mask.shape[1] > 1 else 0,
                                                   mask.stride(2))
    group = heads // kv_heads
    sms = _sms(Q.get_device()) if Q.is_cuda else CPU_SMS
    splits = max(1, min(MAX_SPLITS, triton.cdiv(length, BLOCK_N), triton.cdiv(sms * SPLITS_PER_SM, batch * kv_heads)))
    split_len = triton.cdiv(triton.cdiv(length, splits), BLOCK_N) * BLOCK_N
    splits = triton.cdiv(length, split_len)
    d_pad = _pow2(head_dim, 16)
    rows = _pow2(group * tokens, 16)  # tl.dot takes 16 rows at least
    part = torch.empty((batch, heads, tokens, splits, d_pad), dtype=torch.float32, device=Q.device)
    stats = torch.empty((batch, heads, tokens, splits, 2), dtype=torch.float32, device=Q.device)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    lens = seqlens if seqlens.dtype == torch.int32 else seqlens.to(torch.int32)
    _split_kernel[(batch * kv_heads, splits)](
        Q, K, V, lens, lens if mask is None else mask, part, stats, kv_heads, tokens, splits, split_len, scale * LOG2E,
        *Q.stride(), *K.stride(), *V.stride(), *mask_strides,
        GROUP=group, ROWS=rows, BLOCK_N=BLOCK_N, HEAD_DIM=head_dim, D_PAD=d_pad,
        DOT_PRECISION="ieee" if Q.dtype == torch.float32 else "tf32", MASKED=mask is not None, num_warps=NUM_WARPS,
        num_stages=NUM_STAGES)
    out = torch.empty((batch, heads, tokens, head_dim), dtype=Q.dtype, device=Q.device)
    _combine_kernel[(batch * heads * tokens,)](
        part, stats, out, heads, tokens, splits, *out.stride(),
        SPLITS_PAD=_pow2(splits), HEAD_DIM=head_dim, D_PAD=d_pad,
        num_warps=max(NUM_WARPS, min(16, _pow2(splits) * d_pad // 2048)))  # the splits' tile: ~64 fp32 per thread
    return out
