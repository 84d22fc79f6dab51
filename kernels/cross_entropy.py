"""Cross-entropy starter: mean over rows of logsumexp(logits[row]) - logits[row, target[row]].

Memory-bound. One call must read the logits once and the int64 targets once, and write one scalar:
R * V * element_size + R * 8 + 4 bytes for R rows. At the bench shape 8192x32000 fp16 that is 524 MB,
so on an H100 (about 3 TB/s for a device copy) the floor is ~175 us. PyTorch eager runs
log_softmax (which writes an R x V fp16 tensor) and then nll_loss, moving the logits about three
times; reading them once is the whole speedup.

Two kernels, no atomics: the first writes each row's loss in fp32 (computed as (max - x_t) +
log(sum(exp(x - max))), so that a confident row's loss near 0 is not the difference of two large
numbers); the second, one program, adds the losses in a fixed order and divides by the number of
counted targets (targets equal to IGNORE_INDEX count for nothing, as in F.cross_entropy). The
result is bitwise reproducible.

Variants of the row kernel, both streaming the row in CHUNK-wide pieces (one read of the logits;
a row no wider than CHUNK is a single pass): "online" keeps one running max and rescaled sum per
row, updated once per chunk (two block reductions per chunk, one exp per element); "lanes" keeps a
running max and sum per lane and reduces across lanes only at the end (no reductions inside the
loop, still one exp per element: exp(-|x - max|) serves both the rescale and the new term). Short
rows are packed several to a program (a 2-D tile).
"""

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "cross_entropy"

VARIANT = "online"  # "online" | "lanes"
CHUNK = 4096  # columns per step along the vocabulary; rows up to this wide are read in one step
ROWS_PER_PROGRAM = 0  # rows per program (a power of two); 0 = auto: pack short rows up to TILE elements
TILE = 4096  # elements; the auto tile size for short rows (16 per thread at 8 warps)
MIN_PROGRAMS = 512  # programs; auto packing stops before the grid gets smaller (~4 per SM on H100)
ELEMENTS_PER_WARP = 1024  # elements; auto warps = tile / this (32 per thread: 4 warps for a 4096 chunk; H200 sweep best)
NUM_WARPS = 0  # warps per program; 0 = auto from ELEMENTS_PER_WARP, 1..16
MEAN_BLOCK = 1024  # losses per step of the final (single-program) mean
IGNORE_INDEX = -100  # F.cross_entropy's default: such targets add no loss and are not counted

TUNABLES = {
    "VARIANT": ["online", "lanes"],
    "CHUNK": [1024, 2048, 4096, 8192, 16384],
    "ROWS_PER_PROGRAM": [0, 1, 2, 4, 8, 16],
    "TILE": [2048, 4096, 8192],
    "ELEMENTS_PER_WARP": [256, 512, 1024],
    "NUM_WARPS": [0, 1, 2, 4, 8, 16, 32],
}


@triton.jit
def _cross_entropy_kernel(logits_ptr, targets_ptr, loss_ptr, R, V, stride_l, ignore_index,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PER_LANE: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < R
    l_rows = logits_ptr + rows[:, None] * stride_l
    if PER_LANE:
        lane_max = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32)
        lane_sum = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, V, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = row_mask[:, None] & (cols < V)[None, :]
            x = tl.where(mask, tl.load(l_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32), float("-inf"))
            new_max = tl.maximum(lane_max, x)
            # an all -inf lane (padding) keeps max -inf and sum 0: shift by 0 so that no -inf - -inf appears
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            e = tl.exp(tl.minimum(x, lane_max) - shift)
            lane_sum = tl.where(x > lane_max, lane_sum * e + 1.0, lane_sum + e)
            lane_max = new_max
        row_max = tl.max(lane_max, axis=1)
        shift = tl.where(row_max == float("-inf"), 0.0, row_max)
        row_sum = tl.sum(lane_sum * tl.exp(lane_max - shift[:, None]), axis=1)
    else:
        row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        for start in range(0, V, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = row_mask[:, None] & (cols < V)[None, :]
            x = tl.where(mask, tl.load(l_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32), float("-inf"))
            new_max = tl.maximum(row_max, tl.max(x, axis=1))
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            row_sum = row_sum * tl.exp(row_max - shift) + tl.sum(tl.exp(x - shift[:, None]), axis=1)
            row_max = new_max
    target = tl.load(targets_ptr + rows, mask=row_mask, other=0)
    counted = row_mask & (target != ignore_index) & (target >= 0) & (target < V)
    x_target = tl.load(logits_ptr + rows * stride_l + target, mask=counted, other=0.0).to(tl.float32)
    loss = (row_max - x_target) + tl.log(row_sum)
    tl.store(loss_ptr + rows, tl.where(counted, loss, 0.0), mask=row_mask)


@triton.jit
def _cross_entropy_mean_kernel(loss_ptr, targets_ptr, out_ptr, R, ignore_index, BLOCK: tl.constexpr):
    total = tl.zeros([BLOCK], dtype=tl.float32)
    count = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, R, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        mask = idx < R
        total += tl.load(loss_ptr + idx, mask=mask, other=0.0)
        target = tl.load(targets_ptr + idx, mask=mask, other=0)
        count += tl.where(mask & (target != ignore_index), 1.0, 0.0)
    tl.store(out_ptr, (tl.sum(total, axis=0) / tl.sum(count, axis=0)).to(out_ptr.dtype.element_ty))


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _tile(r: int, v: int) -> tuple[int, int, int]:
    """(rows per program, BLOCK_N, warps) for R rows of V logits."""
    block_n = min(CHUNK, triton.next_power_of_2(v))
    rows = ROWS_PER_PROGRAM or max(1, min(TILE // block_n, _pow2_floor(r // MIN_PROGRAMS)))
    warps = NUM_WARPS or min(16, max(1, rows * block_n // ELEMENTS_PER_WARP))
    return rows, block_n, warps


def kernel_fn(logits, targets):
    v = logits.shape[-1]
    logits2 = logits.reshape(-1, v)
    if logits2.stride(-1) != 1:
        logits2 = logits2.contiguous()
    targets1 = targets.reshape(-1).contiguous()
    r = logits2.shape[0]
    out = torch.empty((), dtype=logits.dtype, device=logits.device)
    losses = torch.empty((r,), dtype=torch.float32, device=logits.device)
    rows, block_n, warps = _tile(r, v)
    if r > 0:
        _cross_entropy_kernel[(triton.cdiv(r, rows),)](
            logits2, targets1, losses, r, v, logits2.stride(0), IGNORE_INDEX,
            BLOCK_M=rows, BLOCK_N=block_n, PER_LANE=VARIANT == "lanes", num_warps=warps)
    # with no rows the mean is 0/0 = NaN, as in F.cross_entropy
    block = min(MEAN_BLOCK, triton.next_power_of_2(max(r, 1)))
    _cross_entropy_mean_kernel[(1,)](losses, targets1, out, r, IGNORE_INDEX, BLOCK=block,
                                     num_warps=min(8, max(1, block // 128)))
    return out
