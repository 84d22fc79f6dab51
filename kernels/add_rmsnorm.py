"""Residual add + RMSNorm starter: s = x + residual, y = s * rsqrt(mean(s^2) + eps) * weight; returns (s, y).

A decoder layer adds the attention output to its residual stream and normalizes the sum (Llama's
`residual + hidden_states`, then post_attention_layernorm). Memory-bound: one call must read x and
residual and write s and y, 4 * M * N * element_size bytes (plus N for the weight, which stays in
L2). At 16384x4096 fp16 that is 537 MB: ~110 us on an H200 at ~4.8 TB/s. Eager runs the add and the
norm as separate kernels (the sum goes to memory and is read back, ~1.5x the bytes); torch.compile
fuses them into one, so this kernel is judged against compile.

The sum is rounded to the input dtype before the statistics are taken: eager normalizes the rounded
tensor it stored, and so must the kernel, or the two disagree by the sum's rounding.

Variants: "single_pass" keeps a whole row of s in registers (one read of x and residual); "looped"
streams the row in CHUNK-wide pieces, writing s in the first pass and reading it back (from L2) in
the second, so any N fits. "auto" picks single_pass up to MAX_SINGLE_PASS columns. Short rows are
packed several to a program (a 2-D tile), as in kernels/rmsnorm.py.
"""

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "add_rmsnorm"

VARIANT = "auto"  # "auto" | "single_pass" | "looped"
MAX_SINGLE_PASS = 8192  # columns; wider rows stream in CHUNKs (two fp32 rows live per thread: x + residual)
CHUNK = 4096  # columns per step of the looped variant
ROWS_PER_PROGRAM = 0  # rows per program (a power of two); 0 = auto: pack short rows up to TILE elements
TILE = 4096  # elements; the auto tile size for short rows
MIN_PROGRAMS = 512  # programs; auto packing stops before the grid gets smaller (~4 per SM on H100)
ELEMENTS_PER_WARP = 1024  # elements; auto warps = tile / this (16 per thread = two 16-byte fp16 loads)
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
def _add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, out_ptr, M, N, stride_x, stride_r, eps,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    eps = tl.full([], eps, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(sum_ptr.dtype.element_ty)  # rounded as eager stores it
    tl.store(sum_ptr + rows[:, None] * N + cols[None, :], s, mask=mask)
    s = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(s * s, axis=1) / N + eps)
    y = s * rstd[:, None] * w[None, :]
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_rmsnorm_looped_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, out_ptr, N, stride_x, stride_r, eps,
                               BLOCK_N: tl.constexpr):
    eps = tl.full([], eps, tl.float32)  # under torch.compile Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    x_row, r_row = x_ptr + row * stride_x, r_ptr + row * stride_r
    sum_row, out_row = sum_ptr + row * N, out_ptr + row * N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        r = tl.load(r_row + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        s = (x + r).to(sum_ptr.dtype.element_ty)
        tl.store(sum_row + cols, s, mask=mask)
        s = s.to(tl.float32)
        acc += s * s
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = cols < N
        # the sum this program just wrote, read back while it is still in L2
        s = tl.load(sum_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        tl.store(out_row + cols, (s * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


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


def kernel_fn(x, residual, weight, eps=1e-6):
    n = x.shape[-1]
    x2, r2 = _rows(x, n), _rows(residual, n)
    weight = weight.contiguous()
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    m = x2.shape[0]
    if m == 0 or n == 0:
        return total, out
    full_row = _next_pow2(n)
    if VARIANT == "single_pass" or (VARIANT == "auto" and full_row <= MAX_SINGLE_PASS):
        rows = ROWS_PER_PROGRAM or max(1, min(TILE // full_row, _pow2_floor(m // MIN_PROGRAMS)))
        warps = NUM_WARPS or min(16, max(1, rows * full_row // ELEMENTS_PER_WARP))
        _add_rmsnorm_kernel[(_cdiv(m, rows),)](x2, r2, weight, total, out, m, n, x2.stride(0), r2.stride(0), eps,
                                               BLOCK_M=rows, BLOCK_N=full_row, num_warps=warps)
    else:
        block = min(CHUNK, full_row)
        warps = NUM_WARPS or min(16, max(1, block // ELEMENTS_PER_WARP))
        _add_rmsnorm_looped_kernel[(m,)](x2, r2, weight, total, out, n, x2.stride(0), r2.stride(0), eps,
                                         BLOCK_N=block, num_warps=warps, num_stages=LOOP_STAGES)
    return total, out
