"""Reduce starter: y = x.sum(dim), the last dimension by default, accumulated in fp32 (fp64 for fp32 input).

Memory-bound. One call must read x once and write one value per row: (M * N + M) * element_size
bytes. At the bench shape 16384x4096 fp16 that is 134 MB, so on an H100 (about 3 TB/s for a device
copy) the floor is ~45 us. Sums of large values that cancel (+100 -100 +100 ...) are the numerical
trap: each accumulator lane sees every CHUNK-th column, all of one sign, and grows to N/CHUNK * 100
before the signs meet in the final reduction. An fp32 accumulator keeps that within the fp16/bf16
tolerance; fp32 input (tolerance 1e-4 relative) is accumulated in fp64, which an H100 adds at 1/2
the fp32 rate, far above what the memory can feed.

Variants: "rows" gives each program whole rows (BLOCK_M of them when rows are short), streamed in
CHUNK-wide pieces into an fp32 accumulator tile that is summed once at the end. "split" also cuts
each row into SPLITS column ranges on a second grid axis, so that a few very long rows (32 x 65536)
still fill every SM; a second small kernel adds each row's partial sums in a fixed order (no
atomics, so the result is bitwise reproducible). "auto" splits only when the rows alone would give
fewer than MIN_PROGRAMS programs. "persistent" reads rows up to MAX_SINGLE_PASS wide whole, in
tiles of PERSISTENT_TILE elements (4 rows of 4096: 32 KB of fp16 per load at 16 warps, 4 16-byte
loads per thread), on a grid of PROGRAMS_PER_SM programs per SM that stride over the tiles in a
software-pipelined loop (NUM_STAGES): the next tile's loads are in flight while the current one is
summed, so each SM keeps more bytes outstanding than one 8 KB row per program gives. x is loaded
evict_first (read once). Each row is summed as a tree over its whole width (no long same-sign
lanes); wider rows go to the "auto" plan.
"""

import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"

VARIANT = "auto"  # "auto" | "rows" | "split" | "persistent"
CHUNK = 64  # columns per step of the loop over a row (64 x 4 rows x 2 warps: H200 sweep best, as Inductor picks)
SPLITS = 0  # column ranges per row in the split variant; 0 = auto: enough to reach MIN_PROGRAMS programs
ROWS_PER_PROGRAM = 4  # rows per program (a power of two); 0 = auto: pack short rows up to TILE elements
TILE = 4096  # elements; the auto tile size for short rows (16 per thread at 8 warps)
MIN_PROGRAMS = 512  # programs; fewer would leave SMs idle (~4 per SM on H100)
ELEMENTS_PER_WARP = 512  # elements; auto warps = tile / this (16 per thread = two 16-byte fp16 loads)
NUM_WARPS = 2  # warps per program; 0 = auto from ELEMENTS_PER_WARP, 1..16
MAX_SINGLE_PASS = 16384  # columns; the persistent variant holds rows up to this wide in registers
PERSISTENT_TILE = 16384  # elements per tile of the persistent variant (whole rows, a power of two)
PROGRAMS_PER_SM = 2  # programs; persistent grid = SMs x this (all resident: mind registers at 16 warps)
NUM_STAGES = 2  # tiles in flight per program in the persistent loop (1 = no pipelining)
LOOP_STAGES = 1  # software-pipeline depth of the chunk loops (Triton num_stages; 1 = no shared-memory staging)
CPU_PROGRAMS = 4  # programs; the persistent grid in Triton's CPU interpreter (no SMs to count)

TUNABLES = {
    "LOOP_STAGES": [1, 2, 3],
    "VARIANT": ["auto", "rows", "split", "persistent"],
    "CHUNK": [64, 128, 256, 512, 1024, 2048, 4096, 8192],
    "SPLITS": [0, 2, 4, 8, 16, 32],
    "ROWS_PER_PROGRAM": [0, 1, 2, 4, 8, 16],
    "TILE": [2048, 4096, 8192],
    "MIN_PROGRAMS": [132, 264, 512, 1024],
    "ELEMENTS_PER_WARP": [256, 512, 1024],
    "NUM_WARPS": [0, 1, 2, 4, 8, 16, 32],
    "MAX_SINGLE_PASS": [8192, 16384, 32768],
    "PERSISTENT_TILE": [4096, 8192, 16384, 32768],
    "PROGRAMS_PER_SM": [1, 2, 3, 4, 8],
    "NUM_STAGES": [1, 2, 3, 4],
}


@triton.jit
def _reduce_kernel(x_ptr, out_ptr, M, N, stride_x, span, n_splits,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC_FP64: tl.constexpr):
    """Sums columns [split * span, (split + 1) * span) of BLOCK_M rows into out[row, split]."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(1)
    lo = split * span
    hi = tl.minimum(lo + span, N)
    row_mask = rows < M
    x_rows = x_ptr + rows[:, None] * stride_x
    if ACC_FP64:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float64)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, span, BLOCK_N):
        cols = lo + start + tl.arange(0, BLOCK_N)
        mask = row_mask[:, None] & (cols < hi)[None, :]
        # through fp32 first: the interpreter holds bf16 as raw bits
        acc += tl.load(x_rows + cols[None, :], mask=mask, other=0.0,
                       eviction_policy="evict_first").to(tl.float32).to(acc.dtype)
    total = tl.sum(acc, axis=1)
    tl.store(out_ptr + rows * n_splits + split, total.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _reduce_persistent_kernel(x_ptr, out_ptr, M, N, stride_x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              ACC_FP64: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Program p sums the whole rows of tiles p, p + P, p + 2P, ... (P programs, BLOCK_M rows a tile)."""
    cols = tl.arange(0, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0), num_stages=NUM_STAGES):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # the interpreter yields ints
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        # through fp32 first: the interpreter holds bf16 as raw bits
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        if ACC_FP64:
            total = tl.sum(x.to(tl.float64), axis=1)
        else:
            total = tl.sum(x, axis=1)
        tl.store(out_ptr + rows, total.to(out_ptr.dtype.element_ty), mask=rows < M)


@triton.jit
def _reduce_partials_kernel(part_ptr, out_ptr, M, n_splits, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    splits = tl.arange(0, BLOCK_S)
    mask = (rows < M)[:, None] & (splits < n_splits)[None, :]
    parts = tl.load(part_ptr + rows[:, None] * n_splits + splits[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + rows, tl.sum(parts, axis=1).to(out_ptr.dtype.element_ty), mask=rows < M)


# Host-side integer helpers in plain Python: triton.cdiv and triton.next_power_of_2 are ConstexprFunctions
# (triton 3.6), a few microseconds per call from the host, which a launch-bound model pays on every call.
def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _plan(m: int, n: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, splits, warps) for an [m, n] sum over rows."""
    block_n = min(CHUNK, _next_pow2(n))
    rows = ROWS_PER_PROGRAM or max(1, min(TILE // block_n, _pow2_floor(m // MIN_PROGRAMS)))
    splits = 1
    # rows too wide for the persistent variant take the auto plan
    if VARIANT == "split" or (VARIANT in ("auto", "persistent") and _cdiv(m, rows) < MIN_PROGRAMS):
        chunks = _cdiv(n, block_n)
        splits = min(chunks, SPLITS or _cdiv(MIN_PROGRAMS, _cdiv(m, rows)))
    warps = NUM_WARPS or min(16, max(1, rows * block_n // ELEMENTS_PER_WARP))
    return rows, block_n, splits, warps


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _persistent(x2, out) -> None:
    """Launch the persistent variant: tiles of whole rows, a grid of PROGRAMS_PER_SM per SM."""
    m, n = x2.shape
    block_n = _next_pow2(n)
    programs = _sm_count(x2.device.index) * PROGRAMS_PER_SM if x2.is_cuda else CPU_PROGRAMS
    # as many rows as fit the tile, but keep at least one tile per program
    rows = ROWS_PER_PROGRAM or max(1, min(PERSISTENT_TILE // block_n, _pow2_floor(m // programs)))
    warps = NUM_WARPS or min(16, max(1, rows * block_n // ELEMENTS_PER_WARP))
    _reduce_persistent_kernel[(min(programs, _cdiv(m, rows)),)](
        x2, out, m, n, x2.stride(0), BLOCK_M=rows, BLOCK_N=block_n, ACC_FP64=x2.dtype == torch.float32,
        NUM_STAGES=NUM_STAGES, num_warps=warps)


def kernel_fn(x, dim=-1):
    if x.dim() == 0:
        return x.clone()  # the sum of a single number
    dim = dim % x.dim()
    if dim != x.dim() - 1:
        x = x.movedim(dim, -1)  # a view; the reshape below copies it into rows
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    if n == 0:
        return out.fill_(0)
    if VARIANT == "persistent" and _next_pow2(n) <= MAX_SINGLE_PASS:
        _persistent(x2, out)
        return out
    rows, block_n, splits, warps = _plan(m, n)
    grid = (_cdiv(m, rows), splits)
    acc_fp64 = x.dtype == torch.float32
    if splits == 1:
        _reduce_kernel[grid](x2, out, m, n, x2.stride(0), n, 1, BLOCK_M=rows, BLOCK_N=block_n,
                             ACC_FP64=acc_fp64, num_warps=warps, num_stages=LOOP_STAGES)
        return out
    # each split covers whole chunks, so every column range but the last starts 16-byte aligned
    span = _cdiv(_cdiv(n, splits), block_n) * block_n
    splits = _cdiv(n, span)
    partial = torch.empty((m, splits), dtype=torch.float64 if acc_fp64 else torch.float32, device=x.device)
    _reduce_kernel[(grid[0], splits)](x2, partial, m, n, x2.stride(0), span, splits,
                                      BLOCK_M=rows, BLOCK_N=block_n, ACC_FP64=acc_fp64, num_warps=warps,
                                      num_stages=LOOP_STAGES)
    block_m = min(128, _next_pow2(m))
    _reduce_partials_kernel[(_cdiv(m, block_m),)](partial, out, m, splits, BLOCK_M=block_m,
                                                        BLOCK_S=_next_pow2(splits))
    return out
