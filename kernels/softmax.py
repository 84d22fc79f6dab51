"""Softmax starter: y = exp(x - max(x)) / sum(exp(x - max(x))), over the last dimension.

Memory-bound. One call must read x once and write y once: 2 * M * N * element_size bytes. At the
bench shape 8192x8192 fp16 that is 268 MB, so on an H100 (about 3 TB/s for a device copy) the floor
is ~90 us. PyTorch eager already runs softmax as one fused kernel, so the win over eager is small;
the target is the copy roofline (>= 92%) and beating torch.compile's generated kernel.

Variants: "single_pass" holds whole rows in registers (one read of x, one exp per element);
"online" streams the row in CHUNK-wide pieces keeping a running max and a rescaled running sum
(Milakov & Gimelshein), then streams it again to write y: two reads of x, but any N fits (a
128256-wide vocabulary row does not fit in registers). "auto" picks single_pass up to
MAX_SINGLE_PASS columns. Short rows are packed several to a program (a 2-D tile) so that each
program still moves a few KB per load instead of one 256-byte row. "persistent" is the single pass
on a grid of PROGRAMS_PER_SM programs per SM, each striding over the row tiles in a
software-pipelined loop (NUM_STAGES): the next tile's loads are in flight while the current one
is reduced, so each SM keeps more bytes outstanding and no SM idles between one short program and
the next. x is loaded evict_first (read once). Rows wider than MAX_SINGLE_PASS go to "online".
"""

import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"

VARIANT = "auto"  # "auto" | "single_pass" | "online" | "persistent"
MAX_SINGLE_PASS = 16384  # columns; wider rows would spill registers in one pass
CHUNK = 4096  # columns per step of the online variant
ROWS_PER_PROGRAM = 0  # rows per program (a power of two); 0 = auto: pack short rows up to TILE elements
TILE = 4096  # elements; the auto tile size for short rows (16 per thread at 8 warps)
MIN_PROGRAMS = 512  # programs; auto packing stops before the grid gets smaller (~4 per SM on H100)
ELEMENTS_PER_WARP = 512  # elements; auto warps = tile / this (16 per thread = two 16-byte fp16 loads)
NUM_WARPS = 0  # warps per program; 0 = auto from ELEMENTS_PER_WARP, 1..16
PROGRAMS_PER_SM = 2  # programs; persistent grid = SMs x this (all resident: mind registers at 16 warps)
NUM_STAGES = 2  # tiles in flight per program in the persistent loop (1 = no pipelining)
CPU_PROGRAMS = 4  # programs; the persistent grid in Triton's CPU interpreter (no SMs to count)

TUNABLES = {
    "VARIANT": ["auto", "single_pass", "online", "persistent"],
    "MAX_SINGLE_PASS": [8192, 16384, 32768],
    "CHUNK": [1024, 2048, 4096, 8192],
    "ROWS_PER_PROGRAM": [0, 1, 2, 4, 8, 16],
    "TILE": [2048, 4096, 8192],
    "ELEMENTS_PER_WARP": [256, 512, 1024],
    "NUM_WARPS": [0, 1, 2, 4, 8, 16, 32],
    "PROGRAMS_PER_SM": [1, 2, 3, 4, 8],
    "NUM_STAGES": [1, 2, 3, 4],
}


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, M, N, stride_x, stride_out,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    # padding is -inf so it neither wins the max nor adds to the sum; rows past M are never stored
    x = tl.where(mask, x, float("-inf"))
    row_max = tl.max(x, axis=1)
    e = tl.exp(x - row_max[:, None])
    y = e * (1.0 / tl.sum(e, axis=1))[:, None]
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_persistent_kernel(x_ptr, out_ptr, M, N, stride_x, stride_out,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Program p handles row tiles p, p + P, p + 2P, ... (P programs); see _softmax_kernel."""
    cols = tl.arange(0, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0), num_stages=NUM_STAGES):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # the interpreter yields ints
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=float("-inf"),
                    eviction_policy="evict_first").to(tl.float32)
        row_max = tl.max(x, axis=1)
        e = tl.exp(x - row_max[:, None])
        y = e * (1.0 / tl.sum(e, axis=1))[:, None]
        tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_online_kernel(x_ptr, out_ptr, N, stride_x, stride_out, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    run_max = tl.full([], float("-inf"), tl.float32)
    run_sum = tl.full([], 0.0, tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.where(mask, x, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(x, axis=0))
        # a chunk of only -inf (masked attention) keeps the max at -inf: shift by 0, not by -inf
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(tl.exp(x - shift), axis=0)
        run_max = new_max
    inv_sum = 1.0 / run_sum
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        y = tl.exp(x - run_max) * inv_sum
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


# Host-side integer helpers in plain Python: triton.cdiv and triton.next_power_of_2 are ConstexprFunctions
# (triton 3.6), a few microseconds per call from the host, which a launch-bound model pays on every call.
def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _tile(m: int, block_n: int) -> tuple[int, int]:
    """(rows per program, warps) for tiles BLOCK_N columns wide."""
    rows = ROWS_PER_PROGRAM or max(1, min(TILE // block_n, _pow2_floor(m // MIN_PROGRAMS)))
    warps = NUM_WARPS or min(16, max(1, rows * block_n // ELEMENTS_PER_WARP))
    return rows, warps


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _persistent_plan(x2) -> tuple[int, int, int, int]:
    """(rows per tile, BLOCK_N, warps, programs) for the persistent variant over rows of x2."""
    m, n = x2.shape
    block_n = _next_pow2(n)
    programs = _sm_count(x2.device.index) * PROGRAMS_PER_SM if x2.is_cuda else CPU_PROGRAMS
    # pack short rows, but keep at least one tile per program
    rows = ROWS_PER_PROGRAM or max(1, min(TILE // block_n, _pow2_floor(m // programs)))
    warps = NUM_WARPS or min(16, max(1, rows * block_n // ELEMENTS_PER_WARP))
    return rows, block_n, warps, min(programs, _cdiv(m, rows))


def kernel_fn(x):
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    m = x2.shape[0]
    if m == 0 or n == 0:
        return out.view(x.shape)
    full_row = _next_pow2(n)
    if VARIANT == "persistent" and full_row <= MAX_SINGLE_PASS:
        rows, block_n, warps, programs = _persistent_plan(x2)
        _softmax_persistent_kernel[(programs,)](x2, out, m, n, x2.stride(0), out.stride(0), BLOCK_M=rows,
                                                BLOCK_N=block_n, NUM_STAGES=NUM_STAGES, num_warps=warps)
        return out.view(x.shape)
    single = VARIANT == "single_pass" or (VARIANT == "auto" and full_row <= MAX_SINGLE_PASS)
    if single:
        rows, warps = _tile(m, full_row)
        _softmax_kernel[(_cdiv(m, rows),)](x2, out, m, n, x2.stride(0), out.stride(0),
                                                 BLOCK_M=rows, BLOCK_N=full_row, num_warps=warps)
    else:
        block = min(CHUNK, full_row)
        warps = NUM_WARPS or min(16, max(1, block // ELEMENTS_PER_WARP))
        _softmax_online_kernel[(m,)](x2, out, n, x2.stride(0), out.stride(0), BLOCK_N=block, num_warps=warps)
    return out.view(x.shape)
