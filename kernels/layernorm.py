"""LayerNorm starter: y = (x - mean(x)) * rsqrt(var(x) + eps) * weight + bias, over the last dimension.

Memory-bound. One call must read x once and write y once: 2 * M * N * element_size bytes (plus 2N
for weight and bias, which stay in L2). At the bench shape 8192x8192 fp16 that is 268 MB, so on an
H100 (about 3 TB/s for a device copy) the floor is ~90 us. Eager F.layer_norm is already one fused
kernel; the target is the copy roofline (>= 92%) and beating torch.compile.

The variance is computed from centred values, never as E[x^2] - E[x]^2, which cancels
catastrophically when the mean is large against the spread (a row around 1000 with unit spread).
For the same reason the statistics are taken of x - x[row, 0]: an fp32 sum of 1000-sized values
loses ~1e-4 of the mean, more than the fp32 tolerance; the shifted values are small and exact.

Variants: "single_pass" holds whole rows in registers: the mean, then the centred sum of squares,
from the one read of x. "looped" streams the row in CHUNK-wide pieces, merging per-chunk means and
centred sums of squares (Chan et al.'s parallel variance, as stable as the single pass), then
streams it again to write y: two reads of x, but any N fits. "auto" picks single_pass up to
MAX_SINGLE_PASS columns. Short rows are packed several to a program (a 2-D tile). "persistent" is
the single pass on a grid of PROGRAMS_PER_SM programs per SM, each striding over the row tiles:
weight and bias are loaded once per program instead of once per tile, and the loop is
software-pipelined (NUM_STAGES): the next tile's loads are in flight while the current one is
reduced, so each SM keeps more bytes outstanding and no SM idles between one short program and
the next. x is loaded evict_first (read once), weight and bias evict_last. Rows wider than
MAX_SINGLE_PASS go to "looped".
"""

import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "layernorm"

VARIANT = "auto"  # "auto" | "single_pass" | "looped" | "persistent"
MAX_SINGLE_PASS = 16384  # columns; wider rows would spill registers in one pass
CHUNK = 4096  # columns per step of the looped variant
ROWS_PER_PROGRAM = 0  # rows per program (a power of two); 0 = auto: pack short rows up to TILE elements
TILE = 4096  # elements; the auto tile size for short rows (16 per thread at 8 warps)
MIN_PROGRAMS = 512  # programs; auto packing stops before the grid gets smaller (~4 per SM on H100)
ELEMENTS_PER_WARP = 1024  # elements; auto warps = tile / this (32 per thread: 4 warps for a 4096 chunk; H200 sweep best)
NUM_WARPS = 0  # warps per program; 0 = auto from ELEMENTS_PER_WARP, 1..16
PROGRAMS_PER_SM = 2  # programs; persistent grid = SMs x this (all resident: mind registers)
NUM_STAGES = 2  # tiles in flight per program in the persistent loop (1 = no pipelining)
LOOP_STAGES = 1  # software-pipeline depth of the chunk loops (Triton num_stages; 1 = no shared-memory staging)
CPU_PROGRAMS = 4  # programs; the persistent grid in Triton's CPU interpreter (no SMs to count)

TUNABLES = {
    "LOOP_STAGES": [1, 2, 3],
    "VARIANT": ["auto", "single_pass", "looped", "persistent"],
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
def _layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, stride_x, stride_out, eps,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    eps = tl.full([], eps, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    # shift by each row's first element before summing: sum(x) of a row around 1000 loses ~1e-4 of
    # its mean in fp32, the sum of the (small, exactly computed) shifted values does not
    shift = tl.load(x_ptr + rows * stride_x, mask=rows < M, other=0.0).to(tl.float32)
    xs = tl.where(mask, x - shift[:, None], 0.0)
    mean_s = tl.sum(xs, axis=1) / N
    xc = tl.where(mask, xs - mean_s[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
    y = xc * rstd[:, None]
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        y = y + tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layernorm_persistent_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, stride_x, stride_out, eps,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr,
                                 HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Program p normalizes row tiles p, p + P, ... (P programs) with one load of weight and bias."""
    eps = tl.full([], eps, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=col_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.num_programs(0), num_stages=NUM_STAGES):
        rows = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # the interpreter yields ints
        mask = (rows < M)[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        # see _layernorm_kernel; the row's first 16 bytes are in flight already, so this hits L1/L2
        shift = tl.load(x_ptr + rows * stride_x, mask=rows < M, other=0.0).to(tl.float32)
        xs = tl.where(mask, x - shift[:, None], 0.0)
        mean_s = tl.sum(xs, axis=1) / N
        xc = tl.where(mask, xs - mean_s[:, None], 0.0)
        y = xc * tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)[:, None]
        if HAS_WEIGHT:
            y = y * w[None, :]
        if HAS_BIAS:
            y = y + b[None, :]
        tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layernorm_looped_kernel(x_ptr, w_ptr, b_ptr, out_ptr, N, stride_x, stride_out, eps,
                             BLOCK_N: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    eps = tl.full([], eps, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    shift = tl.load(x_row).to(tl.float32)  # see _layernorm_kernel: statistics of x - x[0] stay exact
    mean = tl.full([], 0.0, tl.float32)  # of x - shift
    m2 = tl.full([], 0.0, tl.float32)  # sum of squared deviations from `mean`
    count = tl.full([], 0.0, tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        # evict_last: the second pass reads the row again, from L2 if it is still there
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        x = tl.where(mask, x - shift, 0.0)
        n_chunk = tl.minimum(N - start, BLOCK_N).to(tl.float32)
        chunk_mean = tl.sum(x, axis=0) / n_chunk
        dev = tl.where(mask, x - chunk_mean, 0.0)
        total = count + n_chunk
        delta = chunk_mean - mean
        mean = mean + delta * (n_chunk / total)
        m2 = m2 + tl.sum(dev * dev, axis=0) + delta * delta * (count * n_chunk / total)
        count = total
    rstd = tl.rsqrt(m2 / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        y = ((x - shift) - mean) * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
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


def kernel_fn(x, weight, bias, eps=1e-5):
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    # weight and bias may be None (elementwise_affine=False, bias=False); x stands in as a dummy pointer
    w = weight.contiguous() if weight is not None else x2
    b = bias.contiguous() if bias is not None else x2
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    m = x2.shape[0]
    if m == 0 or n == 0:
        return out.view(x.shape)
    flags = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None)
    full_row = _next_pow2(n)
    if VARIANT == "persistent" and full_row <= MAX_SINGLE_PASS:
        rows, block_n, warps, programs = _persistent_plan(x2)
        _layernorm_persistent_kernel[(programs,)](x2, w, b, out, m, n, x2.stride(0), out.stride(0), eps,
                                                  BLOCK_M=rows, BLOCK_N=block_n, NUM_STAGES=NUM_STAGES,
                                                  num_warps=warps, **flags)
        return out.view(x.shape)
    single = VARIANT == "single_pass" or (VARIANT == "auto" and full_row <= MAX_SINGLE_PASS)
    if single:
        rows, warps = _tile(m, full_row)
        _layernorm_kernel[(_cdiv(m, rows),)](x2, w, b, out, m, n, x2.stride(0), out.stride(0), eps,
                                                   BLOCK_M=rows, BLOCK_N=full_row, num_warps=warps, **flags)
    else:
        block = min(CHUNK, full_row)
        warps = NUM_WARPS or min(16, max(1, block // ELEMENTS_PER_WARP))
        _layernorm_looped_kernel[(m,)](x2, w, b, out, n, x2.stride(0), out.stride(0), eps,
                                       BLOCK_N=block, num_warps=warps, num_stages=LOOP_STAGES, **flags)
    return out.view(x.shape)
