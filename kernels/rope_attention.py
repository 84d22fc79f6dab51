"""Attention with its prologue (forward): O = softmax(rope(Q) rope(K)^T * sm_scale [+ causal mask]) V, with
grouped-query attention. Built from kernels/flash_attention.py's "split" loop (see its docstring and
BENCHMARKS.md for the tile choices this starts from).

Q is [B, Hq, S, D], K and V [B, Hkv, S, D] with Hkv dividing Hq; cos and sin are [S, R] or, as HF's
rotary module gives them, [1 or B, S, R] (rotate-half convention: q * cos + rotate_half(q) * sin; interleaved:
features 2i and 2i+1 turn together by the angle of the tables' entry i, as GLM and Cohere rotate). R is D or,
for partial rotary (GPT-NeoX: D/4, Phi-2: 32 of 80), less: the first R features of each head are rotated and the
rest pass (_halves takes each half as R/2 rotated features and (D-R)/2 that pass).
Eager (HF Llama) runs RoPE as ~10 elementwise kernels over q and k, copies K and V to Hq heads
(repeat_kv), then SDPA. Here none of that touches memory: one call must move Q, K, V and O once plus
the tables, (2*B*Hq*S*D + 2*B*Hkv*S*D + 2*S*D) * element_size bytes, and does 4*B*Hq*S*S*D FLOPs
(half when causal). At TinyLlama's attention (B=1, Hq=32, Hkv=4, S=2048, D=64, fp16) that is 8.6
GFLOP against 10 MB: compute-bound, so the prologue's whole gain is the memory round trips and
launches it removes (eager RoPE + repeat_kv move ~60 MB at this shape).

Algorithm: one program owns BLOCK_M query rows of one query head and reads K/V of its kv head
(h // (Hq // Hkv): no copy). Its Q tile is loaded once as two halves, rotated in fp32 registers
(lo = q1*cos1 - q2*sin1, hi = q2*cos2 + q1*sin2) and rounded to the input dtype, as eager rounds it (and
as the tensor cores need it). The scores are one dot over the rotated features interleaved (lo_0, hi_0, lo_1, ...:
tl.interleave, a shuffle in registers), K's in the same order: a dot sums its features in any order, and one dot
as wide as the head ran 1.02-1.13x faster than two over the halves at the Llama, Mistral and Phi-2 shapes and at S
8192 on an H100 (CUDA-graphed calls; GPT-NeoX's D 64 with a quarter rotated read 0.83x, to be timed again). The online
softmax (running max, running sum, rescaled accumulator) is flash_attention's, on scores scaled by
sm_scale*log2(e) in fp32 after the dot. Folding that scale into q before its rounding (one multiply per
score less) costs a relative rounding of every score: at +-64 sigma scores (the large_scores inputs) 0.1
of output error in fp16, where the scale after the dot leaves a quarter-turn rotation exact.

Variants (how K is rotated):
  "fused"           each K tile is rotated in registers as it streams (its two halves and the four
                    half-rows of the tables: table reads come from L2, shared by every program).
  "rotate_k_first"  a small kernel rotates K once into a [B, Hkv, S, D] scratch buffer in the interleaved order (D
                    padded to a power of two; a K-sized write and read, one more launch), then the attention loop
                    streams plain K tiles.
Q, K, V may be strided views ([B, S, H, D] projections viewed as [B, H, S, D]): strides, no copies. The output is
laid out as [B, S, H, D] too (sequence-major), so the model's transpose and reshape to [B, S, H * D] for the output
projection view it instead of copying it.
PACK_GQA (either variant) gives one program the Hq/Hkv query heads of one kv head: its BLOCK_M rows are those
heads x BLOCK_M/(Hq/Hkv) positions, so each K and V tile is loaded (and with "fused" rotated) once for the whole
group instead of once per query head, and the causal diagonal is cut finer. Not yet timed on a GPU: the screen
tries it (a group that does not divide BLOCK_M runs unpacked). KV_LOADS "tma" ("rotate_k_first", a Hopper GPU, D 64,
128 or 256) loads each K tile of the pre-pass and each V tile with one bulk copy through descriptors each program
makes (step 1 below, without Q's): 17% slower at TinyLlama's D 64, 1.09-1.10x at Gemma-2's D 256 (its "auto").
CAUSAL_ORDER, which query blocks a causal program takes: "longest_first" one block, the longest (last) launched first
to shorten the tail; "launch" one block in launch order; "paired", where the grid holds at most two programs per SM,
the longest blocks to the first SM-count programs and the rest shortest first, so the program the block scheduler's
second pass puts beside a long one is a short one (a guess at the hardware's placement); "fold" block j and then its
mirror n-1-j, so every program does the same work, whatever the placement; "auto": "fold" at D 256, else
"longest_first". On an H100 (fp16, the model's strided layout, 64x32 tiles, TMA loads) at Gemma-2's attention
(B1 Hq8 Hkv4 D256): S 2048 96.3 us longest first, 85.2 paired, 88.0 folded; S 4096 263.5, 262.6, 201.9. At D 64
and 128 the orders trade places by tile and shape (0.48x to 1.40x of longest first): a choice for the search.

"rotate_k_first" is the default: its pre-pass costs less than rotating every K tile once per query block, at
D 64 and D 128 (BENCHMARKS.md: the starter defaults; rope_attention at model shapes, where cuDNN's attention loop
is still ahead at batch 2-4 with D 128). Toward FlashAttention-3 from here, in order: (1) K and V
through TMA descriptors as flash_attention's "tma" variant does (plain K after "rotate_k_first"; Q once, its two
halves as two [BLOCK_M, D/2] boxes); (2) pack GQA (PACK_GQA above); (3) warp specialization (a producer warp
issuing the TMA copies, tl.range(..., warp_specialize=True) on triton >= 3.4) and ping-pong softmax between two
consumer warpgroups, which is where cuDNN's and FA3's lead over a FlashAttention-2 loop comes from on Hopper.
"""

import functools
import math

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rope_attention"

VARIANT = "rotate_k_first"  # "rotate_k_first" | "fused" (slower at every shape timed; see the docstring)
BLOCK_M = 0  # query rows per program; 0 = by head dim and dtype (64 for 16-bit tiles)
BLOCK_N = 0  # keys per inner step; 0 = by head dim and dtype (64); capped at BLOCK_M
NUM_WARPS = 0  # 0 = by tile (4 for 16-bit tiles)
NUM_STAGES = 0  # K/V pipeline depth; 0 = by tile (3; 2 at D = 128 when K tiles are rotated in the loop)
CAUSAL_ORDER = "auto"  # which query blocks a causal program takes, and when: see the docstring
ROTATE_BLOCK_S = 64  # positions per program of the "rotate_k_first" pre-pass
PACK_GQA = False  # one program takes the Hq/Hkv query heads of one kv head: BLOCK_M rows = heads x positions
KV_LOADS = "auto"  # "rotate_k_first": "pointers" | "tma" (K and V tiles through descriptors made on the device) |
# "auto": "tma" at a head dim of 256 (1.09-1.10x at Gemma-2's attention on an H100), else "pointers"

TUNABLES = {
    "VARIANT": ["fused", "rotate_k_first"],
    "BLOCK_M": [0, 32, 64, 128],
    "BLOCK_N": [0, 32, 64, 128],
    "NUM_WARPS": [0, 4, 8],
    "NUM_STAGES": [0, 1, 2, 3, 4],
    "CAUSAL_ORDER": ["auto", "longest_first", "launch", "paired", "fold"],
    "ROTATE_BLOCK_S": [32, 64, 128],
    "PACK_GQA": [False, True],
    "KV_LOADS": ["auto", "pointers", "tma"],
}

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)); folded into the score scale


@triton.jit
def _load_f32(ptrs, mask, ROW_MASK: tl.constexpr, EVEN_HALF: tl.constexpr):
    if ROW_MASK:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    elif EVEN_HALF:  # interior tiles of a power-of-two head dim load bare
        return tl.load(ptrs).to(tl.float32)
    else:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _halves(base, cos_base, sin_base, offs_r, row_off, offs_h, stride_d, stride_cr, stride_sr, n_rows,
            HALF: tl.constexpr, ROT_HALF: tl.constexpr, ROW_MASK: tl.constexpr, EVEN_HALF: tl.constexpr,
            INTERLEAVED: tl.constexpr):
    """The rows at positions offs_r (at element offsets row_off from base) of a [rows, 2*HALF] tile as two halves
    in fp32, rotated (rotate-half RoPE). With partial rotary (ROT_HALF < HALF: the tables hold 2*ROT_HALF features)
    each half takes ROT_HALF rotated features (lo: x[:ROT_HALF], hi: x[ROT_HALF:2*ROT_HALF], the pairs RoPE rotates
    together) and then half of the features that pass unrotated; a dot over the halves sums every feature once,
    whatever order they come in. INTERLEAVED: the rotated pairs are features 2i and 2i+1 (GLM's and Cohere's RoPE),
    at the angles of the tables' first half."""
    mask = (offs_r[:, None] < n_rows) & (offs_h[None, :] < HALF)
    if INTERLEAVED:
        lo_cols = tl.where(offs_h < ROT_HALF, 2 * offs_h, offs_h + ROT_HALF)
        hi_cols = tl.where(offs_h < ROT_HALF, 2 * offs_h + 1, offs_h + HALF)
    elif ROT_HALF == HALF:
        lo_cols = offs_h
        hi_cols = offs_h + HALF
    else:
        lo_cols = tl.where(offs_h < ROT_HALF, offs_h, offs_h + ROT_HALF)
        hi_cols = tl.where(offs_h < ROT_HALF, offs_h + ROT_HALF, offs_h + HALF)
    x1 = _load_f32(base + row_off[:, None] + lo_cols[None, :] * stride_d, mask, ROW_MASK, EVEN_HALF)
    x2 = _load_f32(base + row_off[:, None] + hi_cols[None, :] * stride_d, mask, ROW_MASK, EVEN_HALF)
    c_ptrs = cos_base + offs_r[:, None] * stride_cr + offs_h[None, :]
    s_ptrs = sin_base + offs_r[:, None] * stride_sr + offs_h[None, :]
    if ROT_HALF == HALF:
        c1 = _load_f32(c_ptrs, mask, ROW_MASK, EVEN_HALF)
        c2 = _load_f32(c_ptrs + HALF, mask, ROW_MASK, EVEN_HALF)
        s1 = _load_f32(s_ptrs, mask, ROW_MASK, EVEN_HALF)
        s2 = _load_f32(s_ptrs + HALF, mask, ROW_MASK, EVEN_HALF)
    else:  # the unrotated features: cos 1, sin 0
        rot = mask & (offs_h[None, :] < ROT_HALF)
        c1 = tl.load(c_ptrs, mask=rot, other=1.0).to(tl.float32)
        c2 = tl.load(c_ptrs + ROT_HALF, mask=rot, other=1.0).to(tl.float32)
        s1 = tl.load(s_ptrs, mask=rot, other=0.0).to(tl.float32)
        s2 = tl.load(s_ptrs + ROT_HALF, mask=rot, other=0.0).to(tl.float32)
    if INTERLEAVED:  # pair i turns by angle i, the first half's (HF's cat(freqs, freqs) tables hold it twice)
        c2, s2 = c1, s1
    return x1 * c1 - x2 * s1, x2 * c2 + x1 * s2


@triton.jit
def _load_v(base, offs_r, offs_d, stride_r, stride_d, n_rows,
            HEAD_DIM: tl.constexpr, ROW_MASK: tl.constexpr, EVEN_D: tl.constexpr):
    ptrs = base + offs_r[:, None] * stride_r + offs_d[None, :] * stride_d
    if ROW_MASK:
        if EVEN_D:
            return tl.load(ptrs, mask=offs_r[:, None] < n_rows, other=0.0)
        else:
            return tl.load(ptrs, mask=(offs_r[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    else:
        if EVEN_D:
            return tl.load(ptrs)
        else:
            return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)


@triton.jit
def _attn_blocks(acc, l_i, m_i, q, k_base, v_base, cos_base, sin_base,
                 stride_kn, stride_kd, stride_vn, stride_vd, stride_cs, stride_ss,
                 offs_m, offs_h, offs_k, offs_d, lo, hi, S, qk_scale,
                 BLOCK_N: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr, K_ROT_HALF: tl.constexpr,
                 HEAD_DIM: tl.constexpr,
                 EVEN_HALF: tl.constexpr, EVEN_D: tl.constexpr, ROTATE_K: tl.constexpr, CAUSAL_MASK: tl.constexpr,
                 KEY_MASK: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA_KV: tl.constexpr,
                 INTERLEAVED: tl.constexpr):
    """Fold keys [lo, hi) into the running (acc, l, m); q is rotated and interleaved, the scores are scaled to exp2
    units in fp32. TMA_KV: k_base and v_base are tensor descriptors (rows past S come as zeros)."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if ROTATE_K:
            k_lo, k_hi = _halves(k_base, cos_base, sin_base, offs_n, offs_n * stride_kn, offs_h,
                                 stride_kd, stride_cs, stride_ss, S, HALF, K_ROT_HALF, KEY_MASK, EVEN_HALF,
                                 INTERLEAVED)
            k = tl.interleave(k_lo.to(q.dtype), k_hi.to(q.dtype))
        elif TMA_KV:  # one bulk copy of the pre-pass's rows
            k = k_base.load([start_n, 0])
        else:  # rotated and interleaved by the pre-pass, padded to the dot's width with zeros
            k = _load_v(k_base, offs_n, offs_k, stride_kn, stride_kd, S, 2 * HALF_PAD, KEY_MASK, True)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if CAUSAL_MASK:
            qk = tl.where(offs_m[:, None] >= offs_n[None, :], qk, float("-inf"))
        if KEY_MASK:
            qk = tl.where(offs_n[None, :] < S, qk, float("-inf"))
        # Every row sees at least one live key in its first block, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if TMA_KV:
            v = v_base.load([start_n, 0])
        else:
            v = _load_v(v_base, offs_n, offs_d, stride_vn, stride_vd, S, HEAD_DIM, KEY_MASK, EVEN_D)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _rope_attention_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, o_ptr, S, H, GROUP, qk_scale, sms,
                           stride_qb, stride_qh, stride_qs, stride_qd,
                           stride_kb, stride_kh, stride_ks, stride_kd,
                           stride_vb, stride_vh, stride_vs, stride_vd,
                           stride_ob, stride_oh, stride_os, stride_od,
                           stride_cb, stride_cs, stride_sb, stride_ss,
                           BLOCK_M: tl.constexpr, BLOCK_POS: tl.constexpr, BLOCK_N: tl.constexpr,
                           HALF: tl.constexpr, ROT_HALF: tl.constexpr,
                           K_ROT_HALF: tl.constexpr, HALF_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                           D_PAD: tl.constexpr, EVEN_HALF: tl.constexpr, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr,
                           ROTATE_K: tl.constexpr, REVERSE: tl.constexpr, PAIRED: tl.constexpr, FOLD: tl.constexpr,
                           PACK: tl.constexpr,
                           DOT_PRECISION: tl.constexpr, TMA_KV: tl.constexpr, INTERLEAVED: tl.constexpr):
    """One program: BLOCK_M query rows against the keys of one kv head. Unpacked (H: the query heads) the rows are
    BLOCK_M positions of one query head; packed (PACK, H: the kv heads) they are the GROUP query heads of the kv
    head, BLOCK_POS = BLOCK_M / GROUP positions each, so each K and V tile is loaded once for the whole group."""
    qk_scale = tl.full([], qk_scale, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    start_m = tl.program_id(0)
    row = tl.program_id(1)  # (batch, query head), or (batch, kv head) packed
    if PAIRED:  # the launch position's rank among all tiles, longest first
        n_m, n_rows = tl.num_programs(0), tl.num_programs(1)
        pid = row * n_m + start_m  # the launch order: the grid's first axis fastest
        rank = tl.where(pid < sms, pid, n_m * n_rows - 1 - (pid - sms))
        start_m = n_m - 1 - rank // n_rows
        row = rank % n_rows
    elif REVERSE:
        start_m = tl.num_programs(0) - 1 - start_m
    b = (row // H).to(tl.int64)
    if PACK:
        kv = (row % H).to(tl.int64)
        rows = tl.arange(0, BLOCK_M)
        head = kv * GROUP + (rows // BLOCK_POS).to(tl.int64)  # each row's query head
        offs_pos = rows % BLOCK_POS  # and its position in the block
    else:
        h = row % H
        kv = (h // GROUP).to(tl.int64)  # grouped-query attention: the query head's kv head, no repeated copy
        head = h.to(tl.int64)
        offs_pos = tl.arange(0, BLOCK_M)
    q_base = q_ptr + b * stride_qb
    k_base = k_ptr + b * stride_kb + kv * stride_kh
    v_base = v_ptr + b * stride_vb + kv * stride_vh
    o_base = o_ptr + b * stride_ob
    cos_base = cos_ptr + b * stride_cb
    sin_base = sin_ptr + b * stride_sb
    if TMA_KV:  # the pre-pass's K rows (2 * HALF_PAD wide, contiguous) and V's rows of this (batch, kv head)
        k_base = tl.make_tensor_descriptor(k_base, [S, 2 * HALF_PAD], [stride_ks, 1], [BLOCK_N, 2 * HALF_PAD])
        v_base = tl.make_tensor_descriptor(v_base, [S, HEAD_DIM], [stride_vs, 1], [BLOCK_N, D_PAD])
    if FOLD:  # block j, then its mirror n-1-j (none for the middle one): every program does the same work
        mirror = tl.cdiv(S, BLOCK_POS) - 1 - start_m
        for fold in range(0, tl.where(mirror > start_m, 2, 1)):
            _query_block(start_m + fold * (mirror - start_m), q_base, k_base, v_base, o_base, cos_base,
                         sin_base, head, offs_pos, S, qk_scale, stride_qh, stride_qs, stride_qd,
                         stride_ks, stride_kd, stride_vs, stride_vd, stride_oh, stride_os, stride_od, stride_cs,
                         stride_ss, BLOCK_M, BLOCK_POS, BLOCK_N, HALF, ROT_HALF, K_ROT_HALF, HALF_PAD, HEAD_DIM,
                         D_PAD, EVEN_HALF, EVEN_D, CAUSAL, ROTATE_K, DOT_PRECISION, TMA_KV, INTERLEAVED)
    else:
        _query_block(start_m, q_base, k_base, v_base, o_base, cos_base, sin_base, head, offs_pos, S,
                     qk_scale, stride_qh, stride_qs, stride_qd, stride_ks, stride_kd, stride_vs, stride_vd,
                     stride_oh, stride_os, stride_od, stride_cs, stride_ss, BLOCK_M, BLOCK_POS, BLOCK_N, HALF,
                     ROT_HALF, K_ROT_HALF, HALF_PAD, HEAD_DIM, D_PAD, EVEN_HALF, EVEN_D, CAUSAL, ROTATE_K,
                     DOT_PRECISION, TMA_KV, INTERLEAVED)


@triton.jit
def _query_block(start_m, q_base, k_base, v_base, o_base, cos_base, sin_base, head, offs_pos, S, qk_scale,
                 stride_qh, stride_qs, stride_qd, stride_ks, stride_kd, stride_vs, stride_vd,
                 stride_oh, stride_os, stride_od, stride_cs, stride_ss,
                 BLOCK_M: tl.constexpr, BLOCK_POS: tl.constexpr, BLOCK_N: tl.constexpr, HALF: tl.constexpr,
                 ROT_HALF: tl.constexpr, K_ROT_HALF: tl.constexpr, HALF_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                 D_PAD: tl.constexpr, EVEN_HALF: tl.constexpr, EVEN_D: tl.constexpr, CAUSAL: tl.constexpr,
                 ROTATE_K: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA_KV: tl.constexpr,
                 INTERLEAVED: tl.constexpr):
    """Query block start_m of one program's rows (offs_pos: each row's position in the block, head: its query head):
    its Q rotated, the keys folded in, its output stored."""
    offs_m = start_m * BLOCK_POS + offs_pos
    offs_h = tl.arange(0, HALF_PAD)
    offs_d = tl.arange(0, D_PAD)
    q_lo, q_hi = _halves(q_base, cos_base, sin_base, offs_m, head * stride_qh + offs_m.to(tl.int64) * stride_qs,
                         offs_h, stride_qd, stride_cs, stride_ss, S, HALF, ROT_HALF, True, EVEN_HALF, INTERLEAVED)
    q = tl.interleave(q_lo.to(q_base.dtype.element_ty), q_hi.to(q_base.dtype.element_ty))
    offs_k = tl.arange(0, 2 * HALF_PAD)
    acc = tl.zeros((BLOCK_M, D_PAD), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    # Key ranges: [0, free) needs no mask at all, [free, end) is masked (the diagonal or the ragged tail).
    if CAUSAL:
        end = tl.minimum((start_m + 1) * BLOCK_POS, S)
        free = start_m * BLOCK_POS // BLOCK_N * BLOCK_N
    else:
        end = S
        free = (S // BLOCK_N) * BLOCK_N
    acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, k_base, v_base, cos_base, sin_base,
                                 stride_ks, stride_kd, stride_vs, stride_vd, stride_cs, stride_ss,
                                 offs_m, offs_h, offs_k, offs_d, 0, free, S, qk_scale,
                                 BLOCK_N, HALF, HALF_PAD, K_ROT_HALF, HEAD_DIM, EVEN_HALF, EVEN_D, ROTATE_K, False, False,
                                 DOT_PRECISION, TMA_KV, INTERLEAVED)
    acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, k_base, v_base, cos_base, sin_base,
                                 stride_ks, stride_kd, stride_vs, stride_vd, stride_cs, stride_ss,
                                 offs_m, offs_h, offs_k, offs_d, free, end, S, qk_scale,
                                 BLOCK_N, HALF, HALF_PAD, K_ROT_HALF, HEAD_DIM, EVEN_HALF, EVEN_D, ROTATE_K, CAUSAL, True,
                                 DOT_PRECISION, TMA_KV, INTERLEAVED)
    out = acc / l_i[:, None]
    o_rows = head * stride_oh + offs_m.to(tl.int64) * stride_os
    o_ptrs = o_base + o_rows[:, None] + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(o_base.dtype.element_ty), mask=(offs_m[:, None] < S) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _rotate_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, S, H,
                   stride_xb, stride_xh, stride_xs, stride_xd, stride_cb, stride_cs, stride_sb, stride_ss,
                   BLOCK_S: tl.constexpr, HALF: tl.constexpr, ROT_HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                   INTERLEAVED: tl.constexpr):
    """The "rotate_k_first" pre-pass: BLOCK_S positions of one (batch, head) of x, rotated into a contiguous out of
    rows 2*HALF_PAD wide: its two halves interleaved (with partial rotary, in _halves' order of the features), zero
    past HALF, the order and width of the attention's dot."""
    b = (tl.program_id(1) // H).to(tl.int64)
    h = (tl.program_id(1) % H).to(tl.int64)
    offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_h = tl.arange(0, HALF_PAD)
    lo, hi = _halves(x_ptr + b * stride_xb + h * stride_xh, cos_ptr + b * stride_cb, sin_ptr + b * stride_sb,
                     offs_s, offs_s * stride_xs, offs_h, stride_xd, stride_cs, stride_ss, S, HALF,
                     ROT_HALF, True, HALF == HALF_PAD, INTERLEAVED)
    offs_k = tl.arange(0, 2 * HALF_PAD)
    o_ptrs = out_ptr + (tl.program_id(1).to(tl.int64) * S + offs_s[:, None]) * (2 * HALF_PAD) + offs_k[None, :]
    rows = tl.interleave(lo.to(out_ptr.dtype.element_ty), hi.to(out_ptr.dtype.element_ty))  # zero past HALF
    tl.store(o_ptrs, rows, mask=offs_s[:, None] < S)


def _auto_config(d_pad, dtype, rotate_k):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): flash_attention's tiles (64x64, 4 warps on 16-bit inputs).
    64x64 with 4 warps and 3 stages was the best of the configurations swept at D 64 and D 128 when K comes
    rotated (fp16, causal, S 2048; BENCHMARKS.md, the starter defaults)."""
    if dtype == torch.float32:  # 4-byte tiles and CUDA-core (ieee) dots: smaller tiles
        return (64, 32, 4, 2) if d_pad <= 128 else (32, 32, 4, 2)
    if d_pad <= 64:
        return 64, 64, 4, 3
    if d_pad <= 128:
        return 64, 64, 4, (2 if rotate_k else 3)  # rotating K tiles in the loop needs the registers of a stage
    return 64, 32, 4, 2


def _tma_kv_ok(k, v) -> bool:
    """K and V tiles through TMA: a Hopper+ GPU, 16-bit, a head dim of 64, 128 or 256 (a tile as wide as the head), V's
    rows unit-stride and every stride and base 16-byte aligned (the pre-pass's K is a fresh contiguous buffer)."""
    if not v.is_cuda or _capability_major(v.get_device()) < 9 or v.dtype not in (torch.float16, torch.bfloat16):
        return False
    if v.shape[-1] not in (64, 128, 256):
        return False
    size = v.element_size()
    return v.stride(3) == 1 and all(st * size % 16 == 0 for st in v.stride()[:3]) and \
        all(_address(t) % 16 == 0 for t in (k, v))


@functools.cache
def _sm_count(device_index: int) -> int:  # once per device: the query costs host time on every call
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _capability_major(device_index: int) -> int:  # once per device: the query costs host time on every call
    return torch.cuda.get_device_capability(device_index)[0]


def _address(t):
    """t's data pointer; traced under torch.compile (a FakeTensor has none) its offset into an allocation, which
    PyTorch's allocators align to at least 256 bytes."""
    try:
        return t.data_ptr()
    except RuntimeError:
        return t.storage_offset() * t.element_size()


def _scratch(size: int, alignment: int, stream):
    """Global memory for the descriptors made on the device, which Triton's launcher asks for at each launch."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _table(t):
    """cos or sin as [1 or B, S, D] with unit-stride rows, and its batch stride (0 for a table shared by the batch)."""
    t3 = t if t.dim() == 3 else t.reshape(1, *t.shape[-2:])
    if t3.stride(-1) != 1:
        t3 = t3.contiguous()
    return t3, (0 if t3.shape[0] == 1 else t3.stride(0)), t3.stride(1)


def _rotate_k(k, cos3, cb, cs, sin3, sb, ss, half, rot_half, half_pad, interleaved):
    batch, kv_heads, seq, head_dim = k.shape
    out = torch.empty((batch, kv_heads, seq, 2 * half_pad), dtype=k.dtype, device=k.device)
    grid = ((seq + ROTATE_BLOCK_S - 1) // ROTATE_BLOCK_S, batch * kv_heads)
    _rotate_kernel[grid](k, cos3, sin3, out, seq, kv_heads, *k.stride(), cb, cs, sb, ss,
                         BLOCK_S=ROTATE_BLOCK_S, HALF=half, ROT_HALF=rot_half, HALF_PAD=half_pad,
                         INTERLEAVED=interleaved)
    return out


def kernel_fn(q, k, v, cos, sin, causal=True, sm_scale=None, interleaved=False):
    batch, heads, seq, head_dim = q.shape
    kv_heads = k.shape[1]
    seq_major = (seq * heads * head_dim, head_dim, heads * head_dim, 1)  # [B, S, H, D] in memory: see the docstring
    out = torch.empty_strided((batch, heads, seq, head_dim), seq_major, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    half = head_dim // 2
    half_pad = max(16, _next_pow2(half))  # tl.dot needs K >= 16
    d_pad = max(16, _next_pow2(head_dim))
    cos3, cb, cs = _table(cos)
    sin3, sb, ss = _table(sin)
    if cos3.shape[-1] % 2 or cos3.shape[-1] > head_dim:
        raise ValueError(f"tables of {cos3.shape[-1]} features for a head of {head_dim}: at most that, and even")
    rot_half = cos3.shape[-1] // 2  # under half: partial rotary
    rotate_k = VARIANT != "rotate_k_first"
    auto = _auto_config(d_pad, q.dtype, rotate_k)
    block_m, block_n, warps, stages = (c or a for c, a in zip((BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES), auto))
    block_n = min(block_n, block_m)  # the causal diagonal is whole BLOCK_N steps
    if not rotate_k:
        k = _rotate_k(k, cos3, cb, cs, sin3, sb, ss, half, rot_half, half_pad, bool(interleaved))
    wide = d_pad >= 256  # "auto": TMA loads and folded blocks at head dim 256 (Gemma-2's), as measured there
    loads = KV_LOADS if KV_LOADS != "auto" else ("tma" if wide else "pointers")
    tma_kv = loads == "tma" and not rotate_k and _tma_kv_ok(k, v)
    if tma_kv:
        triton.set_allocator(_scratch)
    group = heads // kv_heads
    pack = PACK_GQA and group > 1 and block_m % group == 0  # the group's heads fill the tile evenly
    block_pos = block_m // group if pack else block_m
    grid = ((seq + block_pos - 1) // block_pos, batch * (kv_heads if pack else heads))
    order = CAUSAL_ORDER if CAUSAL_ORDER != "auto" else ("fold" if wide else "longest_first")
    order = order if causal else "launch"
    tiles = grid[0] * grid[1]
    sms = _sm_count(q.get_device()) if q.is_cuda else max(1, tiles // 2)  # interpreted: a mapping at every shape
    paired = order == "paired" and tiles <= 2 * sms  # else longest first
    if order == "fold":
        grid = ((grid[0] + 1) // 2, grid[1])
    _rope_attention_kernel[grid](
        q, k, v, cos3, sin3, out, seq, kv_heads if pack else heads, group, scale * LOG2E, sms,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), cb, cs, sb, ss,
        BLOCK_M=block_m, BLOCK_POS=block_pos, BLOCK_N=block_n, HALF=half, ROT_HALF=rot_half,
        K_ROT_HALF=rot_half if rotate_k else half, HALF_PAD=half_pad, HEAD_DIM=head_dim, D_PAD=d_pad,
        EVEN_HALF=half == half_pad, EVEN_D=head_dim == d_pad, CAUSAL=bool(causal), ROTATE_K=rotate_k,
        REVERSE=order in ("longest_first", "paired"), PAIRED=paired, FOLD=order == "fold", PACK=pack, TMA_KV=tma_kv,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", INTERLEAVED=bool(interleaved),
        num_warps=warps, num_stages=stages)
    return out
