"""RMSNorm starter: y = x * rsqrt(mean(x^2) + eps) * weight, over the last dimension.

Memory-bound. One call must read x once and write y once: 2 * M * N * element_size bytes (plus N for
the weight, which stays in L2). At 8192x8192 fp16 that is 268 MB, so on an H100 (about 3 TB/s for a
device copy) the floor is ~90 us. PyTorch eager runs the decomposition as five kernels (pow, mean,
add+rsqrt, mul, mul) and moves the row about five times; one pass here is the whole speedup.

Variants: "single_pass" keeps a whole row in registers (one read of x); "looped" streams the row in
CHUNK-wide pieces twice (two reads of x, but any N fits). "auto" picks single_pass up to
MAX_SINGLE_PASS columns. Short rows are packed several to a program (a 2-D tile) so that each
program still moves a few KB per load instead of one 256-byte row. "persistent" is the single pass
on a grid of PROGRAMS_PER_SM programs per SM, each striding over the row tiles: the weight is
loaded once per program instead of once per tile, and the loop is software-pipelined
(NUM_STAGES): the next tile's loads are in flight while the current one is reduced, so each SM
keeps more bytes outstanding and no SM idles between one short program and the next. x is loaded
evict_first (read once), the weight evict_last. Rows wider than MAX_SINGLE_PASS go to "looped".
"""

import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rmsnorm"

VARIANT = "auto"  # "auto" | "single_pass" | "looped" | "persistent"
# columns; wider rows stream in CHUNKs: at 8192 columns the looped kernel at 4096-wide chunks and 16 warps beats
# the single pass (it is torch.compile's own design; BENCHMARKS.md, the starter defaults). Two reads of each
# row, the second from L2, but 8 values per thread instead of 16: more rows in flight.
MAX_SINGLE_PASS = 4096
CHUNK = 4096  # columns per step of the looped variant
ROWS_PER_PROGRAM = 0  # rows per program (a power of two); 0 = auto: pack short rows up to TILE elements
TILE = 4096  # elements; the auto tile size for short rows (16 per thread at 8 warps)
MIN_PROGRAMS = 512  # programs; auto packing stops before the grid gets smaller (~4 per SM on H100)
ELEMENTS_PER_WARP = 512  # elements; auto warps = tile / this (16 per thread = two 16-byte fp16 loads)
LOOP_ELEMENTS_PER_WARP = 256  # elements; looped warps = CHUNK / this (8 per thread: one 16-byte fp16 load)
NUM_WARPS = 0  # warps per program; 0 = auto from ELEMENTS_PER_WARP, 1..16
PROGRAMS_PER_SM = 2  # programs; persistent grid = SMs x this (all resident: mind registers at 16 warps)
NUM_STAGES = 2  # tiles in flight per program in the persistent loop (1 = no pipelining)
LOOP_STAGES = 1  # software-pipeline depth of the chunk loops (Triton num_stages; 1 = no shared-memory staging)
CPU_PROGRAMS = 4  # programs; the persistent grid in Triton's CPU interpreter (no SMs to count)

TUNABLES = {
    "LOOP_STAGES": [1, 2, 3],
    "VARIANT": ["auto", "single_pass", "looped", "persistent"],
    "MAX_SINGLE_PASS": [4096, 8192, 16384, 32768],
    "CHUNK": [512, 1024, 2048, 4096, 8192],
    "ROWS_PER_PROGRAM": [0, 1, 2, 4, 8, 16],
    "TILE": [2048, 4096, 8192],
    "LOOP_ELEMENTS_PER_WARP": [128, 256, 512, 1024],
    "ELEMENTS_PER_WARP": [256, 512, 1024],
    "NUM_WARPS": [0, 1, 2, 4, 8, 16, 32],
    "PROGRAMS_PER_SM": [1, 2, 3, 4, 8],
    "NUM_STAGES": [1, 2, 3, 4],
}


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, M, N, stride_x, stride_out, eps,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    eps = tl.full([], eps, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]
    # The weight's load first: issued after the row's reduction (the compiler does not hoist it over the
    # reduction's barrier), its L2 latency sits on every program's critical path.
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_persistent_kernel(x_ptr, w_ptr, out_ptr, M, N, stride_x, stride_out, eps,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Program p normalizes row tiles p, p + P, p + 2P, ... (P programs) with one load of the weight."""
    eps = tl.full([], eps, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    n_tiles = tl.cdiv(M, BLOCK_M)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=NUM_STAGES):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # the interpreter yields ints
        mask = (rows < M)[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        y = x * rstd[:, None] * w[None, :]
        tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_looped_kernel(x_ptr, w_ptr, out_ptr, N, stride_x, stride_out, eps, BLOCK_N: tl.constexpr):
    eps = tl.full([], eps, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        # evict_last: the second pass reads the row again, from L2 if it is still there
        x = tl.load(x_row + cols, mask=cols < N, other=0.0, eviction_policy="evict_last").to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        tl.store(out_row + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


# Host-side integer helpers in plain Python: triton.cdiv and triton.next_power_of_2 are ConstexprFunctions
# (triton 3.6), a few microseconds per call from the host, which a launch-bound model pays on every call.
def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _tile(m: int, block_n: int) -> tuple[int, int]:
    """(rows per program, warps) for tiles BLOCK_N columns wide."""
    rows = ROWS_PER_PROGRAM or max(1, min(TILE // block_n, _pow2_floor(m // MIN_PROGRAMS)))
    warps = NUM_WARPS or min(16, max(1, rows * block_n // ELEMENTS_PER_WARP))
    return rows, warps


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _persistent_plan(x2, m: int, n: int) -> tuple[int, int, int, int]:
    """(rows per tile, BLOCK_N, warps, programs) for the persistent variant over the m rows of x2."""
    block_n = _next_pow2(n)
    programs = _sm_count(x2.device.index) * PROGRAMS_PER_SM if x2.is_cuda else CPU_PROGRAMS
    # pack short rows, but keep at least one tile per program
    rows = ROWS_PER_PROGRAM or max(1, min(TILE // block_n, _pow2_floor(m // programs)))
    warps = NUM_WARPS or min(16, max(1, rows * block_n // ELEMENTS_PER_WARP))
    return rows, block_n, warps, min(programs, _cdiv(m, rows))


def kernel_fn(x, weight, eps=1e-6):
    n = x.shape[-1]
    # A contiguous x (the usual case) is launched as it is and out allocated like it: a reshape and a view
    # cost a dispatch each, microseconds of host time per call that a launch-bound model pays in full.
    x2 = x if x.is_contiguous() else x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    weight = weight.contiguous()
    out = torch.empty_like(x2)  # contiguous: x2 is, or its rows are unit-stride with gaps between them
    stride_x = n if x2 is x else x2.stride(0)  # (a contiguous tensor's size-1 dims may carry any stride)
    m = x2.numel() // n if n else 0
    if m == 0:
        return out.view(x.shape)
    full_row = _next_pow2(n)
    if VARIANT == "persistent" and full_row <= MAX_SINGLE_PASS:
        rows, block_n, warps, programs = _persistent_plan(x2, m, n)
        _rmsnorm_persistent_kernel[(programs,)](x2, weight, out, m, n, stride_x, n, eps,
                                                BLOCK_M=rows, BLOCK_N=block_n, NUM_STAGES=NUM_STAGES,
                                                num_warps=warps)
    elif VARIANT == "single_pass" or (VARIANT == "auto" and full_row <= MAX_SINGLE_PASS):
        rows, warps = _tile(m, full_row)
        _rmsnorm_kernel[(_cdiv(m, rows),)](x2, weight, out, m, n, stride_x, n, eps,
                                           BLOCK_M=rows, BLOCK_N=full_row, num_warps=warps)
    else:
        block = min(CHUNK, full_row)
        warps = NUM_WARPS or min(16, max(1, block // LOOP_ELEMENTS_PER_WARP))
        _rmsnorm_looped_kernel[(m,)](x2, weight, out, n, stride_x, n, eps,
                                     BLOCK_N=block, num_warps=warps, num_stages=LOOP_STAGES)
    return out if x2 is x else out.view(x.shape)
