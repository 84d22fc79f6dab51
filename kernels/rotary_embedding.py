"""Rotary embedding starter (rotate-half, LLaMA / GPT-NeoX): out = cat(x1*cos - x2*sin, x2*cos + x1*sin).

x is [..., S, D] with halves x1 = x[..., :D/2] and x2 = x[..., D/2:]; cos and sin are [S, D/2].
Memory-bound. One call must read x once and write the output once, plus the two tables once:
(2 * B*H*S*D + S*D) * element_size bytes. At the bench shape 2x32x4096x128 fp16 that is 135 MB, so
on an H100 (about 3 TB/s for a device copy) the floor is ~45 us. PyTorch eager runs six elementwise
kernels and a cat, moving x about eight times; one pass here is the whole speedup.

A program takes BLOCK_S positions of one batch entry and loads their cos/sin rows once, then
rotates HEADS_PER_PROGRAM heads with them (the tables are reused from registers instead of being
re-read from L2 for every head). x is addressed through its batch, head and sequence strides, so
the transposed view models produce ([B, S, H, D] viewed as [B, H, S, D]) is read in place without a
copy: each head row of D elements is still contiguous. The output is a fresh contiguous tensor,
the layout the reference returns.

Variants: "grid" is the kernel above, one program per (BLOCK_S positions, HEADS_PER_PROGRAM heads).
"persistent" runs PROGRAMS_PER_SM programs per SM over work items of BLOCK_S positions of one
batch entry and HEAD_GROUP heads (0 = all of them): the cos/sin rows are loaded once per item
(evict_last: other items of the same positions want them) and reused for every head, and the loop
over the heads is software-pipelined (NUM_STAGES): the next head's x is in flight (evict_first,
read once) while the current one is rotated and stored. Each half row is one contiguous run of
D/2 elements, so both halves still move as 16-byte vectors.
"""

import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rotary_embedding"

VARIANT = "grid"  # "grid" | "persistent"
HEADS_PER_PROGRAM = 4  # heads that share one load of the cos/sin rows (unrolled)
BLOCK_S = 0  # positions per program (a power of two); 0 = auto: TILE elements of x per head
TILE = 4096  # elements of x per head per program in the auto BLOCK_S (32 positions at D=128)
ELEMENTS_PER_WARP = 512  # elements; auto warps = TILE / this (16 per thread = two 16-byte fp16 loads)
NUM_WARPS = 0  # warps per program; 0 = auto from ELEMENTS_PER_WARP, 1..16
HEAD_GROUP = 0  # heads per work item of the persistent variant; 0 = all heads
PROGRAMS_PER_SM = 2  # programs; persistent grid = SMs x this (all resident: mind registers)
NUM_STAGES = 3  # heads in flight per program in the persistent loop (1 = no pipelining)
CPU_PROGRAMS = 4  # programs; the persistent grid in Triton's CPU interpreter (no SMs to count)

TUNABLES = {
    "VARIANT": ["grid", "persistent"],
    "HEADS_PER_PROGRAM": [1, 2, 4, 8],
    "BLOCK_S": [0, 8, 16, 32, 64, 128],
    "TILE": [2048, 4096, 8192],
    "ELEMENTS_PER_WARP": [256, 512, 1024],
    "NUM_WARPS": [0, 1, 2, 4, 8, 16],
    "HEAD_GROUP": [0, 4, 8, 16],
    "PROGRAMS_PER_SM": [1, 2, 3, 4, 8],
    "NUM_STAGES": [1, 2, 3, 4],
}


@triton.jit
def _rotary_embedding_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, H, S,
                             stride_xb, stride_xh, stride_xs, stride_cs, stride_ss,
                             stride_ob, stride_oh, stride_os,
                             HALF: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_HALF: tl.constexpr,
                             HEADS: tl.constexpr):
    pid_bh = tl.program_id(1)
    head_blocks = tl.cdiv(H, HEADS)
    b = (pid_bh // head_blocks).to(tl.int64)
    h0 = (pid_bh % head_blocks) * HEADS
    seq = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    cols = tl.arange(0, BLOCK_HALF)
    col_mask = cols < HALF
    mask = (seq < S)[:, None] & col_mask[None, :]
    cos = tl.load(cos_ptr + seq[:, None] * stride_cs + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + seq[:, None] * stride_ss + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x_tile = x_ptr + b * stride_xb + seq[:, None] * stride_xs + cols[None, :]
    out_tile = out_ptr + b * stride_ob + seq[:, None] * stride_os + cols[None, :]
    for i in tl.static_range(HEADS):
        h = (h0 + i).to(tl.int64)
        # a head past H is masked through the sequence limit: the interpreter rejects a mask built
        # as tensor & scalar-bool ('mask has unsupported dtype', triton 3.9)
        head_mask = (seq < tl.where(h < H, S, 0))[:, None] & col_mask[None, :]
        x1 = tl.load(x_tile + h * stride_xh, mask=head_mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_tile + h * stride_xh + HALF, mask=head_mask, other=0.0).to(tl.float32)
        o = out_tile + h * stride_oh
        tl.store(o, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=head_mask)
        tl.store(o + HALF, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=head_mask)


@triton.jit
def _rotary_embedding_persistent_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, B, H, S, group,
                                        stride_xb, stride_xh, stride_xs, stride_cs, stride_ss,
                                        stride_ob, stride_oh, stride_os,
                                        HALF: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_HALF: tl.constexpr,
                                        NUM_STAGES: tl.constexpr):
    """Program p takes items p, p + P, ...: BLOCK_S positions x `group` heads of one batch entry."""
    wide = tl.full([], 0, tl.int64)  # int64 offsets (the interpreter's loop variables are Python ints)
    cols = tl.arange(0, BLOCK_HALF)
    n_groups = tl.cdiv(H, group)
    n_blocks = tl.cdiv(S, BLOCK_S)
    for item in range(tl.program_id(0), B * n_blocks * n_groups, tl.num_programs(0)):
        # consecutive items share positions (and so their cos/sin rows in L2)
        h_lo = (item % n_groups) * group
        b = wide + item // (n_groups * n_blocks)
        seq = ((item // n_groups) % n_blocks * BLOCK_S + tl.arange(0, BLOCK_S)).to(tl.int64)
        mask = (seq < S)[:, None] & (cols < HALF)[None, :]
        cos = tl.load(cos_ptr + seq[:, None] * stride_cs + cols[None, :], mask=mask, other=0.0,
                      eviction_policy="evict_last").to(tl.float32)
        sin = tl.load(sin_ptr + seq[:, None] * stride_ss + cols[None, :], mask=mask, other=0.0,
                      eviction_policy="evict_last").to(tl.float32)
        x_tile = x_ptr + b * stride_xb + seq[:, None] * stride_xs + cols[None, :]
        out_tile = out_ptr + b * stride_ob + seq[:, None] * stride_os + cols[None, :]
        for h in tl.range(h_lo, tl.minimum(h_lo + group, H), num_stages=NUM_STAGES):
            x_h = x_tile + (wide + h) * stride_xh
            x1 = tl.load(x_h, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            x2 = tl.load(x_h + HALF, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            o = out_tile + (wide + h) * stride_oh
            tl.store(o, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
            tl.store(o + HALF, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# Host-side integer helpers in plain Python: triton.cdiv and triton.next_power_of_2 are ConstexprFunctions
# (triton 3.6), a few microseconds per call from the host, which a launch-bound model pays on every call.
def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _launch_persistent(x4, cos2, sin2, out, block_s, block_half, warps) -> None:
    bsz, heads, s, d = x4.shape
    group = HEAD_GROUP or heads
    items = bsz * _cdiv(s, block_s) * _cdiv(heads, group)
    programs = _sm_count(x4.device.index) * PROGRAMS_PER_SM if x4.is_cuda else CPU_PROGRAMS
    _rotary_embedding_persistent_kernel[(min(programs, items),)](
        x4, cos2, sin2, out, bsz, heads, s, group,
        *x4.stride()[:3], cos2.stride(0), sin2.stride(0), *out.stride()[:3],
        HALF=d // 2, BLOCK_S=block_s, BLOCK_HALF=block_half, NUM_STAGES=NUM_STAGES, num_warps=warps)


def _as_bhsd(x):
    """x as a 4-D [B, H, S, D] view (leading dims added or merged; merging may copy)."""
    if x.dim() < 4:
        return x.reshape((1,) * (4 - x.dim()) + tuple(x.shape))
    if x.dim() > 4:
        return x.reshape(-1, *x.shape[-3:])
    return x


def _table(t, s, half):
    """cos or sin as [S, D/2] with unit-stride rows; a 2-D table (the usual case) as it is, without a reshape's
    dispatch (host time a launch-bound model pays on every call)."""
    t2 = t if t.dim() == 2 else t.reshape(s, half)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def kernel_fn(x, cos, sin):
    *_, s, d = x.shape
    half = d // 2
    x4 = _as_bhsd(x)
    if x4.stride(-1) != 1:
        x4 = x4.contiguous()
    cos2, sin2 = _table(cos, s, half), _table(sin, s, half)
    # the output is contiguous whatever x's layout (the reference's); empty_like is the cheaper call
    out = torch.empty_like(x4) if x4.is_contiguous() else torch.empty(x4.shape, dtype=x.dtype, device=x.device)
    bsz, heads = x4.shape[0], x4.shape[1]
    if out.numel() == 0:
        return out.view(x.shape)
    block_half = _next_pow2(half)
    block_s = BLOCK_S or max(1, min(TILE // (2 * block_half), _next_pow2(s)))
    warps = NUM_WARPS or min(16, max(1, 2 * block_s * block_half // ELEMENTS_PER_WARP))
    if VARIANT == "persistent":
        _launch_persistent(x4, cos2, sin2, out, block_s, block_half, warps)
    else:
        grid = (_cdiv(s, block_s), bsz * _cdiv(heads, HEADS_PER_PROGRAM))
        _rotary_embedding_kernel[grid](
            x4, cos2, sin2, out, heads, s,  # (one stride() call per tensor: each call costs host time)
            *x4.stride()[:3], cos2.stride(0), sin2.stride(0), *out.stride()[:3],
            HALF=half, BLOCK_S=block_s, BLOCK_HALF=block_half, HEADS=HEADS_PER_PROGRAM, num_warps=warps)
    return out if x.dim() == 4 else out.view(x.shape)
