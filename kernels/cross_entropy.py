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
rows are packed several to a program (a 2-D tile). "persistent" runs the lanes kernel on a grid of
PROGRAMS_PER_SM programs per SM, each striding over the row tiles; its chunk loop along the
vocabulary is software-pipelined (NUM_STAGES: the next chunk's loads are in flight while the
current one is folded into the lanes) with the logits loaded evict_first (read once). Each program
also adds up its own rows' losses and counts, so the final program sums one partial per program
instead of one loss per row.
"""

import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "cross_entropy"

VARIANT = "online"  # "online" | "lanes" | "persistent"
CHUNK = 4096  # columns per step along the vocabulary; rows up to this wide are read in one step
ROWS_PER_PROGRAM = 0  # rows per program (a power of two); 0 = auto: pack short rows up to TILE elements
TILE = 4096  # elements; the auto tile size for short rows (16 per thread at 8 warps)
MIN_PROGRAMS = 512  # programs; auto packing stops before the grid gets smaller (~4 per SM on H100)
ELEMENTS_PER_WARP = 1024  # elements; auto warps = tile / this (32 per thread: 4 warps for a 4096 chunk; H200 sweep best)
NUM_WARPS = 0  # warps per program; 0 = auto from ELEMENTS_PER_WARP, 1..16
MEAN_BLOCK = 1024  # losses per step of the final (single-program) mean
PROGRAMS_PER_SM = 3  # programs; persistent grid = SMs x this (all resident: ~144 regs at 4 warps on sm_90)
NUM_STAGES = 2  # chunks in flight per program in the persistent variant's vocabulary loop (1 = none)
LOOP_STAGES = 1  # software-pipeline depth of the chunk loops (Triton num_stages; 1 = no shared-memory staging)
CPU_PROGRAMS = 4  # programs; the persistent grid in Triton's CPU interpreter (no SMs to count)
IGNORE_INDEX = -100  # F.cross_entropy's default: such targets add no loss and are not counted

TUNABLES = {
    "LOOP_STAGES": [1, 2, 3],
    "VARIANT": ["online", "lanes", "persistent"],
    "CHUNK": [1024, 2048, 4096, 8192, 16384],
    "ROWS_PER_PROGRAM": [0, 1, 2, 4, 8, 16],
    "TILE": [2048, 4096, 8192],
    "ELEMENTS_PER_WARP": [256, 512, 1024],
    "NUM_WARPS": [0, 1, 2, 4, 8, 16, 32],
    "PROGRAMS_PER_SM": [1, 2, 3, 4, 8],
    "NUM_STAGES": [1, 2, 3, 4],
}


@triton.jit
def _lanes_update(lane_max, lane_sum, x):
    """Fold x into per-lane running (max, sum of exp(. - max)) with one exp per element."""
    new_max = tl.maximum(lane_max, x)
    # an all -inf lane (padding) keeps max -inf and sum 0: shift by 0 so that no -inf - -inf appears
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)
    e = tl.exp(tl.minimum(x, lane_max) - shift)
    lane_sum = tl.where(x > lane_max, lane_sum * e + 1.0, lane_sum + e)
    return new_max, lane_sum


@triton.jit
def _lanes_merge(lane_max, lane_sum):
    """(row max, row sum of exp(x - row max)) from the per-lane running values."""
    row_max = tl.max(lane_max, axis=1)
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    return row_max, tl.sum(lane_sum * tl.exp(lane_max - shift[:, None]), axis=1)


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
            lane_max, lane_sum = _lanes_update(lane_max, lane_sum, x)
        row_max, row_sum = _lanes_merge(lane_max, lane_sum)
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
def _cross_entropy_persistent_kernel(logits_ptr, targets_ptr, part_ptr, count_ptr, R, V, stride_l, ignore_index,
                                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Program p takes row tiles p, p + P, ... (P programs); writes its loss sum and count to part[p]."""
    loss_acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    count_acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    for tile in range(tl.program_id(0), tl.cdiv(R, BLOCK_M), tl.num_programs(0)):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # the interpreter yields ints
        row_mask = rows < R
        l_rows = logits_ptr + rows[:, None] * stride_l
        lane_max = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32)
        lane_sum = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in tl.range(0, V, BLOCK_N, num_stages=NUM_STAGES):
            cols = start + tl.arange(0, BLOCK_N)
            mask = row_mask[:, None] & (cols < V)[None, :]
            x = tl.load(l_rows + cols[None, :], mask=mask, other=float("-inf"),
                        eviction_policy="evict_first").to(tl.float32)
            lane_max, lane_sum = _lanes_update(lane_max, lane_sum, x)
        row_max, row_sum = _lanes_merge(lane_max, lane_sum)
        target = tl.load(targets_ptr + rows, mask=row_mask, other=0)
        counted = row_mask & (target != ignore_index) & (target >= 0) & (target < V)
        x_target = tl.load(logits_ptr + rows * stride_l + target, mask=counted, other=0.0).to(tl.float32)
        loss_acc += tl.where(counted, (row_max - x_target) + tl.log(row_sum), 0.0)
        # the same count as _cross_entropy_mean_kernel: every target but IGNORE_INDEX
        count_acc += tl.where(row_mask & (target != ignore_index), 1.0, 0.0)
    tl.store(part_ptr + tl.program_id(0), tl.sum(loss_acc, axis=0))
    tl.store(count_ptr + tl.program_id(0), tl.sum(count_acc, axis=0))


@triton.jit
def _cross_entropy_partials_mean_kernel(part_ptr, count_ptr, out_ptr, P, BLOCK: tl.constexpr):
    """out = sum(part) / sum(count) over the P programs' partials, in a fixed order."""
    idx = tl.arange(0, BLOCK)
    total = tl.sum(tl.load(part_ptr + idx, mask=idx < P, other=0.0), axis=0)
    count = tl.sum(tl.load(count_ptr + idx, mask=idx < P, other=0.0), axis=0)
    tl.store(out_ptr, (total / count).to(out_ptr.dtype.element_ty))


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


# Host-side integer helpers in plain Python: triton.cdiv and triton.next_power_of_2 are ConstexprFunctions
# (triton 3.6), a few microseconds per call from the host, which a launch-bound model pays on every call.
def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _tile(r: int, v: int) -> tuple[int, int, int]:
    """(rows per program, BLOCK_N, warps) for R rows of V logits."""
    block_n = min(CHUNK, _next_pow2(v))
    rows = ROWS_PER_PROGRAM or max(1, min(TILE // block_n, _pow2_floor(r // MIN_PROGRAMS)))
    warps = NUM_WARPS or min(16, max(1, rows * block_n // ELEMENTS_PER_WARP))
    return rows, block_n, warps


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _persistent(logits2, targets1, out) -> None:
    """Launch the persistent lanes kernel and the mean over its per-program partials."""
    r, v = logits2.shape
    programs = _sm_count(logits2.device.index) * PROGRAMS_PER_SM if logits2.is_cuda else CPU_PROGRAMS
    block_n = min(CHUNK, _next_pow2(v))
    # pack short rows, but keep at least one tile per program
    rows = ROWS_PER_PROGRAM or max(1, min(TILE // block_n, _pow2_floor(r // programs)))
    warps = NUM_WARPS or min(16, max(1, rows * block_n // ELEMENTS_PER_WARP))
    programs = min(programs, _cdiv(r, rows))
    parts = torch.empty((2, programs), dtype=torch.float32, device=logits2.device)
    _cross_entropy_persistent_kernel[(programs,)](
        logits2, targets1, parts[0], parts[1], r, v, logits2.stride(0), IGNORE_INDEX,
        BLOCK_M=rows, BLOCK_N=block_n, NUM_STAGES=NUM_STAGES, num_warps=warps)
    block = _next_pow2(programs)
    _cross_entropy_partials_mean_kernel[(1,)](parts[0], parts[1], out, programs, BLOCK=block,
                                              num_warps=min(8, max(1, block // 128)))


def kernel_fn(logits, targets):
    v = logits.shape[-1]
    logits2 = logits.reshape(-1, v)
    if logits2.stride(-1) != 1:
        logits2 = logits2.contiguous()
    targets1 = targets.reshape(-1).contiguous()
    r = logits2.shape[0]
    out = torch.empty((), dtype=logits.dtype, device=logits.device)
    if VARIANT == "persistent" and r > 0:
        _persistent(logits2, targets1, out)
        return out
    losses = torch.empty((r,), dtype=torch.float32, device=logits.device)
    rows, block_n, warps = _tile(r, v)
    if r > 0:
        _cross_entropy_kernel[(_cdiv(r, rows),)](
            logits2, targets1, losses, r, v, logits2.stride(0), IGNORE_INDEX,
            BLOCK_M=rows, BLOCK_N=block_n, PER_LANE=VARIANT == "lanes", num_warps=warps, num_stages=LOOP_STAGES)
    # with no rows the mean is 0/0 = NaN, as in F.cross_entropy
    block = min(MEAN_BLOCK, _next_pow2(max(r, 1)))
    _cross_entropy_mean_kernel[(1,)](losses, targets1, out, r, IGNORE_INDEX, BLOCK=block,
                                     num_warps=min(8, max(1, block // 128)))
    return out
