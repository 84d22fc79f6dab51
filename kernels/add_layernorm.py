"""Residual add + LayerNorm starter: s = x + residual, y = (s - mean(s)) * rsqrt(var(s) + eps) * weight + bias;
returns (s, y).

GPT-2's block adds the attention output to its residual stream and normalizes the sum (`attn_output +
residual`, then ln_2). Memory-bound: one call must read x and residual and write s and y, 4 * M * N *
element_size bytes (plus 2N for weight and bias, which stay in L2). At 16384x4096 fp16 that is 537 MB:
~110 us on an H200 at ~4.8 TB/s. Eager runs the add and the norm as two kernels; torch.compile fuses
them into one, so this kernel is judged against compile.

The sum is rounded to the input dtype before the statistics are taken, as eager normalizes the rounded
tensor it stored. The variance is taken of centred values, and the statistics of s - s[row, 0] (see
kernels/layernorm.py): E[s^2] - E[s]^2 cancels catastrophically around a large mean.

Variants: "single_pass" keeps whole rows of s in registers; "looped" streams the row in CHUNK-wide
pieces, writing s and merging per-chunk means and centred sums of squares (Chan et al.) in the first
pass, then reading s back (from L2) to write y, so any N fits. "auto" picks single_pass up to
MAX_SINGLE_PASS columns. Short rows are packed several to a program (a 2-D tile).
"""

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "add_layernorm"

VARIANT = "auto"  # "auto" | "single_pass" | "looped"
MAX_SINGLE_PASS = 8192  # columns; wider rows stream in CHUNKs (two fp32 rows live per thread: x + residual)
CHUNK = 4096  # columns per step of the looped variant
ROWS_PER_PROGRAM = 0  # rows per program (a power of two); 0 = auto: pack short rows up to TILE elements
TILE = 4096  # elements; the auto tile size for short rows
MIN_PROGRAMS = 512  # programs; auto packing stops before the grid gets smaller (~4 per SM on H100)
ELEMENTS_PER_WARP = 512  # elements; auto warps = tile / this
NUM_WARPS = 0  # warps per program; 0 = auto from ELEMENTS_PER_WARP, 1..16
LOOP_STAGES = 1  # software-pipeline depth of the chunk loops (Triton num_stages)

TUNABLES = {
    "VARIANT": ["auto", "single_pass", "looped"],
    "MAX_SINGLE_PASS": [4096, 8192, 16384],
    "CHUNK": [1024, 2048, 4096, 8192],
    "ROWS_PER_PROGRAM": [0, 1, 2, 4, 8, 16],
    "TILE": [2048, 4096, 8192],
    "ELEMENTS_PER_WARP": [256, 512, 1024],
    "NUM_WARPS": [0, 1, 2, 4, 8, 16],
    "LOOP_STAGES": [1, 2, 3],
}


@triton.jit
def _add_layernorm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, sum_ptr, out_ptr, M, N, stride_x, stride_r, eps,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    eps = tl.full([], eps, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    row_mask = rows < M
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(sum_ptr.dtype.element_ty)  # rounded as eager stores it
    tl.store(sum_ptr + rows[:, None] * N + cols[None, :], s, mask=mask)
    # each row's first element of s, the shift that keeps the statistics exact
    x0 = tl.load(x_ptr + rows * stride_x, mask=row_mask, other=0.0).to(tl.float32)
    r0 = tl.load(r_ptr + rows * stride_r, mask=row_mask, other=0.0).to(tl.float32)
    shift = (x0 + r0).to(sum_ptr.dtype.element_ty).to(tl.float32)
    ss = tl.where(mask, s.to(tl.float32) - shift[:, None], 0.0)
    mean_s = tl.sum(ss, axis=1) / N
    sc = tl.where(mask, ss - mean_s[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(sc * sc, axis=1) / N + eps)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = sc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_layernorm_looped_kernel(x_ptr, r_ptr, w_ptr, b_ptr, sum_ptr, out_ptr, N, stride_x, stride_r, eps,
                                 BLOCK_N: tl.constexpr):
    eps = tl.full([], eps, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    x_row, r_row = x_ptr + row * stride_x, r_ptr + row * stride_r
    sum_row, out_row = sum_ptr + row * N, out_ptr + row * N
    shift = (tl.load(x_row).to(tl.float32) + tl.load(r_row).to(tl.float32)).to(sum_ptr.dtype.element_ty)
    shift = shift.to(tl.float32)
    mean = tl.full([], 0.0, tl.float32)  # of s - shift
    m2 = tl.full([], 0.0, tl.float32)  # sum of squared deviations from `mean`
    count = tl.full([], 0.0, tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        r = tl.load(r_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        s = (x + r).to(sum_ptr.dtype.element_ty)
        tl.store(sum_row + cols, s, mask=mask)
        s = tl.where(mask, s.to(tl.float32) - shift, 0.0)
        n_chunk = tl.minimum(N - start, BLOCK_N).to(tl.float32)
        chunk_mean = tl.sum(s, axis=0) / n_chunk
        dev = tl.where(mask, s - chunk_mean, 0.0)
        total = count + n_chunk
        delta = chunk_mean - mean
        mean = mean + delta * (n_chunk / total)
        m2 = m2 + tl.sum(dev * dev, axis=0) + delta * delta * (count * n_chunk / total)
        count = total
    rstd = tl.rsqrt(m2 / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        # the sum this program just wrote, read back while it is still in L2
        s = tl.load(sum_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        tl.store(out_row + cols, (((s - shift) - mean) * rstd * w + b).to(out_ptr.dtype.element_ty), mask=mask)


# Host-side integer helpers in plain Python: triton.cdiv and triton.next_power_of_2 are ConstexprFunctions
# (triton 3.6), a few microseconds per call from the host, which a launch-bound model pays on every call.
def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _rows(t, n: int):
    """t as [M, N] rows with unit stride along N (a view where it can be)."""
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def kernel_fn(x, residual, weight, bias, eps=1e-5):
    n = x.shape[-1]
    x2, r2 = _rows(x, n), _rows(residual, n)
    weight, bias = weight.contiguous(), bias.contiguous()
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    m = x2.shape[0]
    if m == 0 or n == 0:
        return total, out
    full_row = _next_pow2(n)
    if VARIANT == "single_pass" or (VARIANT == "auto" and full_row <= MAX_SINGLE_PASS):
        rows = ROWS_PER_PROGRAM or max(1, min(TILE // full_row, _pow2_floor(m // MIN_PROGRAMS)))
        warps = NUM_WARPS or min(16, max(1, rows * full_row // ELEMENTS_PER_WARP))
        _add_layernorm_kernel[(_cdiv(m, rows),)](x2, r2, weight, bias, total, out, m, n, x2.stride(0),
                                                 r2.stride(0), eps, BLOCK_M=rows, BLOCK_N=full_row,
                                                 num_warps=warps)
    else:
        block = min(CHUNK, full_row)
        warps = NUM_WARPS or min(16, max(1, block // ELEMENTS_PER_WARP))
        _add_layernorm_looped_kernel[(m,)](x2, r2, weight, bias, total, out, n, x2.stride(0), r2.stride(0), eps,
                                           BLOCK_N=block, num_warps=warps, num_stages=LOOP_STAGES)
    return total, out
