"""Flash attention starter (forward): O = softmax(Q K^T * sm_scale [+ causal mask]) V.

Compute-bound. Q, K, V, O are [B, H, S, D], or K and V [B, H/G, S, D] (grouped-query attention: query head h reads
K/V head h // G, no copy of K and V). kernel_fn's window (a causal sliding window: query i sees keys i - window < j
<= i; Mistral, Gemma-2), softcap (scores become softcap * tanh(score / softcap); Gemma-2) and alibi (None, or one
slope m per query head: m * (j - i) added to the score; BLOOM, MPT) run the pointer kernel with those masks, the cap
and the slope as compile-time switches (a window masks every block, from the window's first); 0 is none. One call
does 4*B*H*S*S*D FLOPs (half when causal) and must move 4*B*H*S*D*element_size bytes: the S x S score matrix
never leaves the chip. At the bench shape (B=2, H=32, S=2048, D=128, causal, fp16): 69 GFLOP against 67 MB, on an
H100 SXM ~70 us of tensor-core time vs ~20 us of memory. SDPA there is cuDNN's warp-specialized WGMMA kernel.

Algorithm (FlashAttention-2): one program owns BLOCK_M query rows, keeps its Q tile in registers
and streams K/V in BLOCK_N blocks, with an online softmax (running max m, running sum l, rescaled
accumulator), so scores of +-64 sigma never overflow. Scores are scaled by sm_scale*log2(e) in fp32
and exponentiated with exp2. The head dim is padded to a power of two and masked (D=80 -> 128).

Variants:
  "split"        the causal key loop in two parts: the blocks left of the diagonal run without any
                 mask, only the BLOCK_M-wide diagonal block is masked; non-causal: full key blocks
                 unmasked, only the ragged tail masked. Causal programs start from the longest rows, or
                 each takes a block and its mirror ("fold", every variant; CAUSAL_ORDER "auto" folds the
                 small grids).
  "single_loop"  one loop with every mask on every block: simpler, slower; a baseline for the split.
  "tma"          the split loop as Triton's tutorial 06-fused-attention writes it for Hopper: Q, K, V and O
                 through tensor descriptors over a matrix of D-wide rows, each K/V tile one bulk copy
                 issued by one thread (no per-thread addresses and cp.async: those registers and issue
                 slots go to the softmax); the scale folded into one FMA (qk * scale - m). OVERLAP issues
                 each block's QK^T before the previous block's softmax (FlashAttention-3's intra-warpgroup
                 overlap: the tensor cores' next GEMM beside the exponentials). Applies on compute
                 capability >= 9, fp16/bf16, D in {64, 128}, S a multiple of BLOCK_M, sm_scale > 0 and
                 tensors whose rows a descriptor can walk (_tma_rows: dense [B, H, S, D]; [B, S, H, D] in
                 memory, as a model's transpose(1, 2) of its projections leaves them and as the output is
                 written; a packed qkv's slices); else (the interpreter, fp32, ragged S) "split", silently.
  "auto"         "tma" where it applies, the call is large (TMA_MIN_FLOPS) and its grid not folded, else "split"
                 (folded, "split" ran 1.17-1.22x faster than "tma" at D 128, S 2048-8192, 512-1024 programs).
PACK_GQA (the pointer path): one program takes the H/Hkv query heads of one K/V head, its BLOCK_M rows those heads x
BLOCK_M/(H/Hkv) positions: each K and V tile is loaded once for the whole group, not once per query head, and the
causal diagonal is cut finer (a group that does not divide BLOCK_M runs unpacked). Off until a screen finds it faster.
DESCRIPTORS: where "tma" makes its descriptors. "host": encoded by the launcher on every call (torch.compile cannot
trace such a launch: traced, the file runs "device"). "device": each program makes its four (tl.make_tensor_descriptor,
global scratch from triton's allocator): nothing encoded on the host, and Inductor launches the kernel itself.
Tiles: 64x64, 4 warps, 3 stages beat the 128-row tiles for "tma" at the bench shape and "split" at TinyLlama's
(BENCHMARKS.md, the starter defaults). Tried and slower on an H100 (Triton 3.6): warp specialization (no compile at 4
warps); exp2 as ex2.approx.f16x2, two exponentials an instruction (1.01-1.07x slower at D 64 and 128).
Q, K, V may be strided views: strides are passed, no copies. The [B, H, S, D] output is laid out as [B, S, H, D]: the
model's transpose(1, 2) and reshape to [B, S, H * D] are then views, not a copy of it (a clone kernel a layer).
"""

import functools
import math

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors arrived in triton 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the "tma" variant falls back
    TensorDescriptor = None

KERNEL_TYPE = "flash_attention"

VARIANT = "auto"  # "auto" | "tma" | "split" | "single_loop"
BLOCK_M = 0  # query rows per program; 0 = by head dim and dtype (64 for 16-bit D = 128)
BLOCK_N = 0  # keys per inner step; 0 = by head dim and dtype (64); capped at BLOCK_M
NUM_WARPS = 0  # 0 = by tile (4 for 16-bit tiles)
NUM_STAGES = 0  # K/V pipeline depth; 0 = by tile (3)
CAUSAL_ORDER = "auto"  # causal: "longest_first" (the longest blocks launched first) | "launch" | "fold" (a block and
# its mirror: the same work for all) | "auto": fold where the grid has at most FOLD_PER_SM programs an SM, else longest
FOLD_PER_SM = 8  # H100, fp16 (BENCHMARKS.md, the causal orders): folded, 512 programs 1.30x (D 128), 1.23x (D 256),
# 1024 1.07x (D 64), 256 0.98x; 2048 and 4096 on TMA 0.75x
DESCRIPTORS = "host"  # "tma": "host" | "device" (made by each program; see the docstring)
PACK_GQA = False  # the pointer path: one program takes the H/Hkv query heads of one K/V head (see the docstring)
OVERLAP = False  # "tma": the next block's scores issued before this block's softmax (see the docstring)
TMA_MIN_FLOPS = 2**35  # "auto" takes TMA from this many FLOPs: host descriptors cost the launch more

TUNABLES = {
    "VARIANT": ["auto", "tma", "split", "single_loop"],
    "BLOCK_M": [0, 64, 128, 256],
    "BLOCK_N": [0, 32, 64, 128],
    "NUM_WARPS": [0, 4, 8],
    "NUM_STAGES": [0, 1, 2, 3, 4, 5],
    "CAUSAL_ORDER": ["auto", "longest_first", "launch", "fold"],
    "DESCRIPTORS": ["host", "device"],
    "PACK_GQA": [False, True],
    "OVERLAP": [False, True],
}

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)); folded into the score scale


@triton.jit
def _load_tile(base, offs_r, offs_d, stride_r, stride_d, n_rows,
               HEAD_DIM: tl.constexpr, ROW_MASK: tl.constexpr, EVEN_D: tl.constexpr):
    # Masks only where the shape needs them: interior K/V blocks of a power-of-two head dim load bare.
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
def _attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                 offs_m, offs_d, lo, hi, S, qk_scale, window, cap, slope,
                 BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, EVEN_D: tl.constexpr,
                 CAUSAL_MASK: tl.constexpr, KEY_MASK: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 WINDOW_MASK: tl.constexpr, CAPPED: tl.constexpr, ALIBI: tl.constexpr):
    """Fold keys [lo, hi) into the running (acc, l, m); masks, the soft cap and the slope are compile-time switches."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base, offs_n, offs_d, stride_kn, stride_kd, S, HEAD_DIM, KEY_MASK, EVEN_D)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if CAPPED:  # cap * tanh(score / cap) in the scores' log2 units (cap too); tanh(x) = 2 sigmoid(2x) - 1
            qk = cap * (2.0 * tl.sigmoid(2.0 * qk / cap) - 1.0)
        if ALIBI:  # each row's head's slope (log2 units) times the key's distance: slope * (j - i)
            qk += slope[:, None] * (offs_n[None, :] - offs_m[:, None]).to(tl.float32)
        if CAUSAL_MASK:
            qk = tl.where(offs_m[:, None] >= offs_n[None, :], qk, float("-inf"))
        if KEY_MASK:
            qk = tl.where(offs_n[None, :] < S, qk, float("-inf"))
        if WINDOW_MASK:  # a sliding window: key j is seen by the rows i with i - j < window
            qk = tl.where(offs_m[:, None] - offs_n[None, :] < window, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        if WINDOW_MASK:  # a block at a window's edge can hold no live key for a row: its max stays -inf
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:  # every row sees at least one live key in its first block, so m_new is finite
            m_use = m_new
        p = tl.math.exp2(qk - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_tile(v_base, offs_n, offs_d, stride_vn, stride_vd, S, HEAD_DIM, KEY_MASK, EVEN_D)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, alibi_ptr, S, H, GROUP, qk_scale, window, cap,
                            stride_qb, stride_qh, stride_qs, stride_qd,
                            stride_kb, stride_kh, stride_ks, stride_kd,
                            stride_vb, stride_vh, stride_vs, stride_vd,
                            stride_ob, stride_oh, stride_os, stride_od,
                            BLOCK_M: tl.constexpr, BLOCK_POS: tl.constexpr, BLOCK_N: tl.constexpr,
                            HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, CAUSAL: tl.constexpr, SPLIT: tl.constexpr,
                            EVEN_D: tl.constexpr, REVERSE: tl.constexpr, FOLD: tl.constexpr, PACK: tl.constexpr,
                            DOT_PRECISION: tl.constexpr, WINDOWED: tl.constexpr, CAPPED: tl.constexpr,
                            ALIBI: tl.constexpr):
    """One program: BLOCK_M query rows against the keys of one K/V head. Unpacked (H: the query heads) the rows are
    BLOCK_M positions of one query head; packed (PACK, H: the K/V heads) they are the GROUP query heads of the K/V
    head, BLOCK_POS = BLOCK_M / GROUP positions each, so each K and V tile is loaded once for the whole group."""
    qk_scale = tl.full([], qk_scale, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    cap = tl.full([], cap, tl.float32)
    start_m = tl.program_id(0)
    if REVERSE:
        start_m = tl.num_programs(0) - 1 - start_m
    b = (tl.program_id(1) // H).to(tl.int64)
    if PACK:
        kv = (tl.program_id(1) % H).to(tl.int64)
        rows = tl.arange(0, BLOCK_M)
        head = kv * GROUP + (rows // BLOCK_POS).to(tl.int64)  # each row's query head
        offs_pos = rows % BLOCK_POS  # and its position in the block
    else:
        h = tl.program_id(1) % H
        kv = (h // GROUP).to(tl.int64)  # grouped-query attention: GROUP query heads share one K/V head
        head = h.to(tl.int64)
        offs_pos = tl.arange(0, BLOCK_M)
    q_base = q_ptr + b * stride_qb
    k_base = k_ptr + b * stride_kb + kv * stride_kh
    v_base = v_ptr + b * stride_vb + kv * stride_vh
    o_base = o_ptr + b * stride_ob
    slope = 0.0
    if ALIBI:  # each row's head's ALiBi slope, in the scores' log2 units
        slope = tl.load(alibi_ptr + head + tl.zeros((BLOCK_M,), dtype=tl.int64)).to(tl.float32) * 1.4426950408889634
    if FOLD:  # block j, then its mirror n-1-j (none for the middle one): every program does the same work
        mirror = tl.cdiv(S, BLOCK_POS) - 1 - start_m
        for fold in range(0, tl.where(mirror > start_m, 2, 1)):
            _query_block(start_m + fold * (mirror - start_m), q_base, k_base, v_base, o_base, head, offs_pos, S,
                         qk_scale, window, cap, slope, stride_qh, stride_qs, stride_qd, stride_ks, stride_kd,
                         stride_vs, stride_vd, stride_oh, stride_os, stride_od, BLOCK_M, BLOCK_POS, BLOCK_N,
                         HEAD_DIM, D_PAD, CAUSAL, SPLIT, EVEN_D, DOT_PRECISION, WINDOWED, CAPPED, ALIBI)
    else:
        _query_block(start_m, q_base, k_base, v_base, o_base, head, offs_pos, S, qk_scale, window, cap, slope,
                     stride_qh, stride_qs, stride_qd, stride_ks, stride_kd, stride_vs, stride_vd, stride_oh, stride_os,
                     stride_od, BLOCK_M, BLOCK_POS, BLOCK_N, HEAD_DIM, D_PAD, CAUSAL, SPLIT, EVEN_D, DOT_PRECISION,
                     WINDOWED, CAPPED, ALIBI)


@triton.jit
def _query_block(start_m, q_base, k_base, v_base, o_base, head, offs_pos, S, qk_scale, window, cap, slope,
                 stride_qh, stride_qs, stride_qd, stride_ks, stride_kd, stride_vs, stride_vd,
                 stride_oh, stride_os, stride_od,
                 BLOCK_M: tl.constexpr, BLOCK_POS: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                 D_PAD: tl.constexpr, CAUSAL: tl.constexpr, SPLIT: tl.constexpr, EVEN_D: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, WINDOWED: tl.constexpr, CAPPED: tl.constexpr, ALIBI: tl.constexpr):
    """Query block start_m of one program's rows (offs_pos: each row's position in the block, head: its query head,
    or the program's one): Q loaded, the keys folded in, O stored."""
    offs_m = start_m * BLOCK_POS + offs_pos
    offs_d = tl.arange(0, D_PAD)
    rows_q = head * stride_qh + offs_m.to(tl.int64) * stride_qs
    in_rows = (offs_m[:, None] < S) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_base + rows_q[:, None] + offs_d[None, :] * stride_qd, mask=in_rows, other=0.0)
    acc = tl.zeros((BLOCK_M, D_PAD), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    # Key ranges: [0, free) needs no mask at all, [free, end) is masked (diagonal or ragged tail).
    if CAUSAL:
        end = tl.minimum((start_m + 1) * BLOCK_POS, S)
        free = start_m * BLOCK_POS // BLOCK_N * BLOCK_N if SPLIT else 0
    else:
        end = S
        free = (S // BLOCK_N) * BLOCK_N if SPLIT else 0
    if WINDOWED:  # causal, from the first block that holds a key of the block's first row's window: every block masked
        lo = tl.maximum(start_m * BLOCK_POS - window + 1, 0) // BLOCK_N * BLOCK_N
        acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
                                     offs_m, offs_d, lo, end, S, qk_scale, window, cap, slope,
                                     BLOCK_N, HEAD_DIM, EVEN_D, True, True, DOT_PRECISION, True, CAPPED, ALIBI)
    else:
        acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
                                     offs_m, offs_d, 0, free, S, qk_scale, window, cap, slope,
                                     BLOCK_N, HEAD_DIM, EVEN_D, False, False, DOT_PRECISION, False, CAPPED, ALIBI)
        acc, l_i, m_i = _attn_blocks(acc, l_i, m_i, q, k_base, v_base, stride_ks, stride_kd, stride_vs, stride_vd,
                                     offs_m, offs_d, free, end, S, qk_scale, window, cap, slope,
                                     BLOCK_N, HEAD_DIM, EVEN_D, CAUSAL, True, DOT_PRECISION, False, CAPPED, ALIBI)
    out = acc / l_i[:, None]
    rows_o = head * stride_oh + offs_m.to(tl.int64) * stride_os
    tl.store(o_base + rows_o[:, None] + offs_d[None, :] * stride_od, out.to(o_base.dtype.element_ty), mask=in_rows)


@triton.jit
def _attn_tma_blocks(acc, l_i, m_i, q, k_desc, v_desc, k_row, k_col, v_row, v_col, offs_m, lo, hi, qk_scale,
                     BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr):
    """Fold keys [lo, hi) of one (batch, head), whose K and V start at (row, column) of their descriptors, into
    (acc, l, m)."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        qk = tl.dot(q, tl.trans(k_desc.load([k_row + start_n, k_col])))
        if CAUSAL_MASK:
            keep = offs_m[:, None] >= start_n + tl.arange(0, BLOCK_N)[None, :]
            qk = tl.where(keep, qk * qk_scale, float("-inf"))
        acc, l_i, m_i = _fold(acc, l_i, m_i, qk, v_desc, v_row + start_n, v_col, qk_scale, CAUSAL_MASK)
    return acc, l_i, m_i


@triton.jit
def _attn_tma_overlapped(acc, l_i, m_i, q, k_desc, v_desc, k_row, k_col, v_row, v_col, lo, hi, qk_scale,
                         BLOCK_N: tl.constexpr):
    """_attn_tma_blocks' unmasked keys with each block's scores issued before the previous block's softmax (OVERLAP:
    FlashAttention-3's intra-warpgroup overlap, the tensor cores' next QK^T beside this softmax's exponentials)."""
    if hi > lo:
        qk = tl.dot(q, tl.trans(k_desc.load([k_row + lo, k_col])))
        for start_n in range(lo + BLOCK_N, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            following = tl.dot(q, tl.trans(k_desc.load([k_row + start_n, k_col])))
            acc, l_i, m_i = _fold(acc, l_i, m_i, qk, v_desc, v_row + start_n - BLOCK_N, v_col, qk_scale, False)
            qk = following
        acc, l_i, m_i = _fold(acc, l_i, m_i, qk, v_desc, v_row + hi - BLOCK_N, v_col, qk_scale, False)
    return acc, l_i, m_i


@triton.jit
def _fold(acc, l_i, m_i, qk, v_desc, v_row, v_col, qk_scale, SCALED: tl.constexpr):
    """One block of scores qk (SCALED: already scaled and masked) and its V tile, at (v_row, v_col) of v_desc and
    loaded after the softmax as Triton's tutorial orders them, into the online softmax (acc, l, m)."""
    if SCALED:
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        qk = qk - m_new[:, None]
    else:  # qk_scale > 0, so the row max of the scaled scores is the scaled row max: one FMA below
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_new[:, None]
    p = tl.math.exp2(qk)
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    v = v_desc.load([v_row, v_col])
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _describe(t, batches, heads, S, stride, per_batch, per_head, per_head_col, BLOCK: tl.constexpr,
              HEAD_DIM: tl.constexpr):
    """A device-made descriptor of `t`'s rows (_tma_rows' matrix, from the same figures)."""
    rows = (batches - 1) * per_batch + (heads - 1) * per_head + S
    cols = (heads - 1) * per_head_col + HEAD_DIM
    return tl.make_tensor_descriptor(t, [rows, cols], [stride, 1], [BLOCK, HEAD_DIM])


@triton.jit
def _flash_attention_tma_kernel(q_desc, k_desc, v_desc, o_desc, S, H, GROUP, qk_scale,
                                q_stride, q_batch, q_head, q_col, k_stride, k_batch, k_head, k_col,
                                v_stride, v_batch, v_head, v_col, o_stride, o_batch, o_head, o_col,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                                CAUSAL: tl.constexpr, REVERSE: tl.constexpr, FOLD: tl.constexpr,
                                ON_DEVICE: tl.constexpr, OVERLAP: tl.constexpr):
    qk_scale = tl.full([], qk_scale, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    # Each descriptor views its tensor as rows of HEAD_DIM (_tma_rows): (batch, head)'s S rows start at row
    # batch * *_batch + head * *_head, column head * *_col. S % BLOCK_M == 0, so no tile crosses a head.
    # ON_DEVICE: the *_desc arguments are the tensors, the descriptors are made here (a compile-time branch: with
    # host descriptors none of it is generated).
    batch = tl.program_id(1) // H
    head = tl.program_id(1) % H
    kv_head = head // GROUP
    if ON_DEVICE:
        batches = tl.num_programs(1) // H
        q_desc = _describe(q_desc, batches, H, S, q_stride, q_batch, q_head, q_col, BLOCK_M, HEAD_DIM)
        k_desc = _describe(k_desc, batches, H // GROUP, S, k_stride, k_batch, k_head, k_col, BLOCK_N, HEAD_DIM)
        v_desc = _describe(v_desc, batches, H // GROUP, S, v_stride, v_batch, v_head, v_col, BLOCK_N, HEAD_DIM)
        o_desc = _describe(o_desc, batches, H, S, o_stride, o_batch, o_head, o_col, BLOCK_M, HEAD_DIM)
    at = (batch * q_batch + head * q_head, head * q_col, batch * k_batch + kv_head * k_head, kv_head * k_col,
          batch * v_batch + kv_head * v_head, kv_head * v_col, batch * o_batch + head * o_head, head * o_col)
    start_m = tl.program_id(0)
    if REVERSE:
        start_m = tl.num_programs(0) - 1 - start_m
    if FOLD:  # block j, then its mirror n-1-j (none for the middle one): every program does the same work
        mirror = S // BLOCK_M - 1 - start_m
        for fold in range(0, tl.where(mirror > start_m, 2, 1)):
            _tma_query_block(start_m + fold * (mirror - start_m), q_desc, k_desc, v_desc, o_desc, at, S, qk_scale,
                             BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, OVERLAP)
    else:
        _tma_query_block(start_m, q_desc, k_desc, v_desc, o_desc, at, S, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM,
                         CAUSAL, OVERLAP)


@triton.jit
def _tma_query_block(start_m, q_desc, k_desc, v_desc, o_desc, at, S, qk_scale, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, OVERLAP: tl.constexpr):
    """Query block start_m of one (batch, head), whose Q, K, V and O start at `at`'s (row, column) pairs."""
    q_row, q_col, k_row, k_col, v_row, v_col, o_row, o_col = at
    first = start_m * BLOCK_M
    offs_m = first + tl.arange(0, BLOCK_M)
    q = q_desc.load([q_row + first, q_col])
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    free = first if CAUSAL else S  # the keys no mask touches: left of the diagonal, or all
    if OVERLAP:
        acc, l_i, m_i = _attn_tma_overlapped(acc, l_i, m_i, q, k_desc, v_desc, k_row, k_col, v_row, v_col, 0, free,
                                             qk_scale, BLOCK_N)
    else:
        acc, l_i, m_i = _attn_tma_blocks(acc, l_i, m_i, q, k_desc, v_desc, k_row, k_col, v_row, v_col, offs_m, 0,
                                         free, qk_scale, BLOCK_N, False)
    if CAUSAL:  # then the BLOCK_M-wide diagonal, masked
        acc, l_i, m_i = _attn_tma_blocks(acc, l_i, m_i, q, k_desc, v_desc, k_row, k_col, v_row, v_col, offs_m, first,
                                         first + BLOCK_M, qk_scale, BLOCK_N, True)
    o_desc.store([o_row + first, o_col], (acc / l_i[:, None]).to(o_desc.dtype))


def _auto_config(d_pad, dtype):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) that fit an H100's 228 KB of shared memory."""
    if dtype == torch.float32:  # 4-byte tiles and CUDA-core (ieee) dots: smaller tiles
        return (64, 32, 4, 2) if d_pad <= 128 else (32, 32, 4, 2)
    if d_pad <= 128:  # one warpgroup per 64 query rows; at D = 128, Q 16 KB + 3 stages of K and V at 16 KB each
        return 64, 64, 4, 3
    return 64, 32, 4, 2


@functools.cache
def _capability_major(device_index: int) -> int:  # once per device: the query costs host time on every call
    return torch.cuda.get_device_capability(device_index)[0]


def _tma_applies(q, k, v, block_m, scale):
    """TMA needs Hopper+, 16-bit tensors with 16-byte aligned bases, D in {64, 128}, S a multiple of BLOCK_M (a tile
    never straddles two heads) and a positive scale (the unmasked blocks take the row max before scaling); their
    layouts are _tma_rows' question."""
    if TensorDescriptor is None or not q.is_cuda or _capability_major(q.get_device()) < 9:
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or q.shape[-1] not in (64, 128):
        return False
    if q.numel() == 0 or q.shape[2] % block_m or scale <= 0:
        return False
    return all(_address(t) % 16 == 0 for t in (q, k, v))


def _tma_rows(t):
    """t [B, H, S, D] as a descriptor walks it, (rows, cols, stride, per_batch, per_head, per_head_col): unit-stride
    rows `stride` apart, (b, h)'s S x D block from row b * per_batch + h * per_head, column h * per_head_col; None if
    no such matrix holds t. Dense: heads in rows; [B, S, H, D] in memory (a model's transposed projections, this
    file's output) and a packed qkv's slices: heads in columns."""
    batches, heads, seq, head_dim = t.shape
    stride = t.stride(2)
    per_batch = t.stride(0) if batches > 1 else 0  # a dimension of one may carry any stride
    head_stride = t.stride(1) if heads > 1 else 0
    if t.stride(3) != 1 or stride < head_dim or stride * t.element_size() % 16 or per_batch % stride:
        return None
    if head_stride % stride == 0:  # heads one below the other (or all one head: a K/V expanded over the group)
        per_head, per_head_col, cols = head_stride // stride, 0, head_dim
    elif (heads - 1) * head_stride + head_dim <= stride:  # heads side by side in each row
        per_head, per_head_col, cols = 0, head_stride, (heads - 1) * head_stride + head_dim
    else:
        return None
    rows = (batches - 1) * (per_batch // stride) + (heads - 1) * per_head + seq
    return rows, cols, stride, per_batch // stride, per_head, per_head_col


def _address(t):
    """t's data pointer; traced (a FakeTensor has none) its offset into an allocation: PyTorch aligns those to 256."""
    try:
        return t.data_ptr()
    except RuntimeError:
        return t.storage_offset() * t.element_size()


def _use_tma(q, k, v, causal, block_m, scale):
    batch, heads, seq, head_dim = q.shape
    flops = 4 * batch * heads * seq * seq * head_dim // (2 if causal else 1)
    wanted = VARIANT == "tma" or (VARIANT == "auto" and flops >= TMA_MIN_FLOPS and
                                  not _order(-(-seq // block_m), causal, batch * heads, q.device)[2])  # not folded
    return wanted and _tma_applies(q, k, v, block_m, scale)  # the cheap test first: small calls skip the rest


def _scratch(size: int, alignment: int, stream):
    """Global memory for the descriptors made on the device, which Triton's launcher asks for at each launch."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _launch_tma(q, k, v, out, causal, qk_scale, cfg, views):
    """The TMA kernel on q, k, v and out, each walked as its view (_tma_rows) says."""
    block_m, block_n, warps, stages = cfg
    batch, heads, seq, head_dim = q.shape
    on_device = DESCRIPTORS == "device"
    if on_device:
        triton.set_allocator(_scratch)
        descs = (q, k, v, out)
    else:
        descs = tuple(TensorDescriptor(t, [rows, cols], [stride, 1], [block, head_dim])
                      for t, (rows, cols, stride, *_), block in zip((q, k, v, out), views,
                                                                     (block_m, block_n, block_n, block_m)))
    programs, reverse, fold = _order(seq // block_m, causal, batch * heads, q.device)
    _flash_attention_tma_kernel[(programs, batch * heads)](
        *descs, seq, heads, heads // k.shape[1], qk_scale, *(n for view in views for n in view[2:]),
        BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, CAUSAL=bool(causal), REVERSE=reverse, FOLD=fold,
        ON_DEVICE=on_device, OVERLAP=OVERLAP, num_warps=warps, num_stages=stages)


def _order(blocks: int, causal, heads: int, device: torch.device) -> tuple[int, bool, bool]:
    """(programs along the query blocks, REVERSE, FOLD) of CAUSAL_ORDER for a call of `blocks` query blocks in each of
    `heads` (batch x heads) rows of the grid."""
    order = CAUSAL_ORDER
    if order == "auto":
        order = "fold" if blocks * heads <= FOLD_PER_SM * _sm_count(device) else "longest_first"
    fold = bool(causal) and order == "fold"
    return (blocks + 1) // 2 if fold else blocks, bool(causal) and order == "longest_first", fold


@functools.cache
def _sm_count(device: torch.device) -> int:  # once per device: the query costs host time on every call
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def _launch_pointers(q, k, v, out, causal, qk_scale, cfg, d_pad, window=0, softcap=0.0, alibi=None):
    block_m, block_n, warps, stages = cfg
    batch, heads, seq, head_dim = q.shape
    group = heads // k.shape[1]
    pack = PACK_GQA and group > 1 and block_m % group == 0  # the group's heads fill the tile evenly
    block_pos = block_m // group if pack else block_m
    rows = batch * (k.shape[1] if pack else heads)
    blocks = (seq + block_pos - 1) // block_pos  # not triton.cdiv: slow on triton 3.6
    programs, reverse, fold = _order(blocks, causal, rows, q.device)
    _flash_attention_kernel[(programs, rows)](
        q, k, v, out, q if alibi is None else alibi, seq, k.shape[1] if pack else heads, group, qk_scale, window,
        softcap * LOG2E, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        BLOCK_M=block_m, BLOCK_POS=block_pos, BLOCK_N=block_n, HEAD_DIM=head_dim, D_PAD=d_pad, CAUSAL=bool(causal),
        EVEN_D=head_dim == d_pad, SPLIT=VARIANT != "single_loop", REVERSE=reverse, FOLD=fold, PACK=pack,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", WINDOWED=window > 0, CAPPED=softcap > 0,
        ALIBI=alibi is not None, num_warps=warps, num_stages=stages)


def kernel_fn(Q, K, V, causal=True, sm_scale=None, window=0, softcap=0.0, alibi=None):
    batch, heads, seq, head_dim = Q.shape
    if K.shape != V.shape or heads % K.shape[1]:  # K/V heads: H (multi-head), or H / group (grouped-query)
        raise ValueError(f"K {tuple(K.shape)} and V {tuple(V.shape)}: one shape, heads dividing Q's {heads}")
    if window < 0 or (window and not causal) or softcap < 0:
        raise ValueError(f"window {window} (a causal attention's, 0: none), softcap {softcap} (0: none)")
    if alibi is not None:  # one fp32 slope per query head
        if alibi.numel() != heads:
            raise ValueError(f"alibi: {alibi.numel()} slopes for {heads} query heads")
        alibi = alibi.to(device=Q.device, dtype=torch.float32).contiguous()
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    d_pad = max(16, 1 << (head_dim - 1).bit_length())  # a power of two; tl.dot needs K >= 16
    auto = _auto_config(d_pad, Q.dtype)
    block_m, block_n, warps, stages = (c or a for c, a in zip((BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES), auto))
    # The split causal loop hands whole BLOCK_M diagonals to the masked part: BLOCK_N must divide it.
    cfg = (block_m, min(block_n, block_m), warps, stages)
    seq_major = (seq * heads * head_dim, head_dim, heads * head_dim, 1)  # [B, S, H, D] in memory
    out = torch.empty_strided(Q.shape, seq_major, dtype=Q.dtype, device=Q.device)
    tma = not window and not softcap and alibi is None and _use_tma(Q, K, V, causal, block_m, scale)  # variants: pointers
    views = [_tma_rows(t) for t in (Q, K, V, out)] if tma else [None]
    if None not in views:
        _launch_tma(Q, K, V, out, causal, scale * LOG2E, cfg, views)
    else:  # "tma" or "auto" where TMA does not apply run the split loop
        _launch_pointers(Q, K, V, out, causal, scale * LOG2E, cfg, d_pad, int(window), float(softcap), alibi)
    return out
