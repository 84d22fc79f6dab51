"""Fused SwiGLU MLP starter: out = (silu(x @ w_gate^T) * (x @ w_up^T)) @ w_down^T.

Compute-bound. x is [..., T, H] (leading dims folded into T); w_gate, w_up are [I, H] and w_down
[H, I], nn.Linear-shaped. One call does 6*T*H*I FLOPs; it must read x and the three weights and write
the output: (2*T*H + 3*H*I) * element_size bytes. At T=4096, H=2048, I=5632 fp16 that is 283 GFLOP
against 86 MB: on an H100 SXM (989 TFLOP/s dense fp16 on paper, ~750 reachable) the floor is
~290 us at peak, ~380 us at cuBLAS speed; memory is ~25 us.

Eager PyTorch runs three cuBLAS GEMMs plus silu and mul as separate kernels, writing and re-reading
three [T, I] intermediates (gate, up, silu(gate)): ~280 MB, ~90 us more at 3 TB/s. Here two GEMM
kernels do it all:
  phase 1  h = silu(x @ w_gate^T) * (x @ w_up^T): one x tile feeds two accumulators (gate, up), and
           the SwiGLU is the epilogue; h [T, I] is written once, in the input dtype (as eager does).
  phase 2  out = h @ w_down^T, a plain GEMM.
Both phases are "A @ W^T" with W K-contiguous, so one kernel (GATED on or off) serves both.

PRECISE_H: h is rounded to fp16/bf16 as eager PyTorch rounds it (~1e-3 relative per element). Where an
output cancels to near zero that rounding shows; with PRECISE_H phase 1 also writes h's rounding error
as a second 16-bit tensor and phase 2 multiplies both halves (hi + lo carries ~16 mantissa bits) at 1/3
more tensor-core work. Off by default: it is eager's own precision, without the extra third.

Variants: "grouped" (pointer loads, one program per tile, GROUP_M L2 swizzle; runs anywhere) and
"tma" (persistent, Hopper TMA descriptors; needs compute capability >= 9 and 16-byte aligned rows,
else falls back per phase). "auto" = "tma" where it applies and the phase is large (TMA_MIN_FLOPS).
DESCRIPTORS: where "tma" makes its descriptors. "host": TensorDescriptor.from_tensor, encoded by the launcher on
every call (torch.compile cannot trace such a launch: traced, the file runs "device"). "device": each program makes
them from pointers (tl.make_tensor_descriptor, 128 bytes of global scratch per descriptor and program, asked of
triton's allocator at launch): nothing encoded on the host, and Inductor launches the kernel from its own code.
A tile size left at 0 is chosen by dtype and shape; a non-zero CAPS value wins. fp32 uses input_precision="ieee"
(TF32 misses the 1e-4 tolerance).
"""

import functools

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors arrived in triton 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the "tma" variant falls back
    TensorDescriptor = None

KERNEL_TYPE = "fused_mlp"

VARIANT = "auto"  # "auto" | "grouped" | "tma"
BLOCK_M = 0  # phase 1 (gate+up) tokens per tile; 0 = by shape (128; 64 where fewer leave SMs idle)
BLOCK_N = 0  # phase 1 intermediate columns per tile; 0 = by dtype (128: two 128x128 accumulators)
BLOCK_K = 0  # phase 1 hidden-dim depth per stage; 0 = by dtype (64 for 16-bit)
NUM_WARPS = 0  # phase 1 warps; 0 = 8
NUM_STAGES = 0  # phase 1 pipeline depth; 0 = by tile (4: 48 KB per stage for x, w_gate, w_up)
DOWN_BLOCK_M = 0  # phase 2 tokens per tile; 0 = by shape (128; 64 where fewer tiles leave SMs idle)
DOWN_BLOCK_N = 0  # phase 2 hidden columns per tile; 0 = by shape (256; 128 where fewer leave SMs idle)
DOWN_BLOCK_K = 0  # phase 2 intermediate depth per stage; 0 = by dtype (64)
DOWN_NUM_WARPS = 0  # phase 2 warps; 0 = 8
DOWN_NUM_STAGES = 0  # phase 2 pipeline depth; 0 = 3
GROUP_M = 8  # tile rows per L2 swizzle group (both phases)
PRECISE_H = False  # 16-bit: carry h as hi + lo halves (phase 2 does two MMAs); see the docstring
DESCRIPTORS = "host"  # "tma": "host" | "device" (made by each program; see the docstring)
WARP_SPECIALIZE = False  # "tma": the K loop as tl.range(warp_specialize=True) (Triton >= 3.4: async load / MMA partitions)

# "auto" takes TMA only from this many FLOPs per GEMM phase: a launch on host-side descriptors costs the host
# more than a pointer launch (docs/launch-cost.md), which small phases cannot amortize.
TMA_MIN_FLOPS = 2**34
# tiles chosen by shape (a size left at 0) shrink until the grid has this many programs per SM (_filling)
FILL = 0.75

TUNABLES = {
    "VARIANT": ["auto", "grouped", "tma"],
    "BLOCK_M": [0, 64, 128],
    "BLOCK_N": [0, 64, 128, 256],
    "BLOCK_K": [0, 32, 64, 128],
    "NUM_WARPS": [0, 4, 8],
    "NUM_STAGES": [0, 2, 3, 4, 5],
    "DOWN_BLOCK_M": [0, 64, 128, 256],
    "DOWN_BLOCK_N": [0, 64, 128, 256],
    "DOWN_BLOCK_K": [0, 32, 64, 128],
    "DOWN_NUM_WARPS": [0, 4, 8],
    "DOWN_NUM_STAGES": [0, 2, 3, 4, 5],
    "GROUP_M": [1, 4, 8, 16],
    "PRECISE_H": [True, False],
    "DESCRIPTORS": ["host", "device"],
    "WARP_SPECIALIZE": [False, True],
}


@triton.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # GROUP_M tile rows sweep the N tiles together: their A rows and the weight panel stay in L2.
    tiles_per_group = GROUP_M * num_pid_n
    first_m = (tile // tiles_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % tiles_per_group) % group_rows
    pid_n = (tile % tiles_per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _swiglu(gate, up):
    # silu(g) = g * sigmoid(g); exp(-g) overflowing to inf for g << 0 gives the right limit, -0.
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _load(ptrs, mask, MASKED: tl.constexpr):
    if MASKED:
        return tl.load(ptrs, mask=mask, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _epilogue(acc1, acc2, GATED: tl.constexpr, SPLIT_OUT: tl.constexpr, dtype: tl.constexpr):
    """The output tile in dtype and, with SPLIT_OUT, the rounding error it left, also in dtype."""
    if GATED:
        acc1 = _swiglu(acc1, acc2)
    hi = acc1.to(dtype)
    if SPLIT_OUT:
        return hi, (acc1 - hi.to(tl.float32)).to(dtype)
    else:
        return hi, hi


@triton.jit
def _mlp_gemm_kernel(a_ptr, a2_ptr, w1_ptr, w2_ptr, c_ptr, c2_ptr, M, N, K, stride_am, stride_ak,
                     stride_wn, stride_wk, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, GATED: tl.constexpr, SPLIT_A: tl.constexpr,
                     SPLIT_OUT: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """C = (A [+ A2]) @ W1^T, or silu(A @ W1^T) * (A @ W2^T) when GATED; A2, W2 share A's, W1's strides.

    SPLIT_OUT also writes C's rounding error to C2, so that the next GEMM (SPLIT_A) sees C + C2.
    """
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Tile origins in int64 (T*H or I*H may pass 2^31); in-tile offsets stay int32.
    a_offs = ((pid_m * BLOCK_M).to(tl.int64) * stride_am
              + tl.arange(0, BLOCK_M)[:, None] * stride_am + offs_k[None, :] * stride_ak)
    w_offs = ((pid_n * BLOCK_N).to(tl.int64) * stride_wn
              + offs_k[:, None] * stride_wk + tl.arange(0, BLOCK_N)[None, :] * stride_wn)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a_mask = (rows[:, None] < M) & (offs_k[None, :] < k_left)
        w_mask = (offs_k[:, None] < k_left) & (cols[None, :] < N)
        a = _load(a_ptr + a_offs, a_mask, MASKED)
        w1 = _load(w1_ptr + w_offs, w_mask, MASKED)
        acc1 = tl.dot(a, w1, acc1, input_precision=DOT_PRECISION)
        if SPLIT_A:
            acc1 = tl.dot(_load(a2_ptr + a_offs, a_mask, MASKED), w1, acc1, input_precision=DOT_PRECISION)
        if GATED:
            acc2 = tl.dot(a, _load(w2_ptr + w_offs, w_mask, MASKED), acc2, input_precision=DOT_PRECISION)
        a_offs += BLOCK_K * stride_ak
        w_offs += BLOCK_K * stride_wk
    hi, lo = _epilogue(acc1, acc2, GATED, SPLIT_OUT, c_ptr.dtype.element_ty)
    c_offs = rows[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn
    c_mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(c_ptr + c_offs, hi, mask=c_mask)
    if SPLIT_OUT:
        tl.store(c2_ptr + c_offs, lo, mask=c_mask)


@triton.jit
def _mlp_gemm_tma_kernel(a_desc, a2_desc, w1_desc, w2_desc, c_desc, c2_desc, M, N, K, num_programs,
                         stride_a, stride_a2, stride_w1, stride_w2, stride_c, stride_c2,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, GATED: tl.constexpr, SPLIT_A: tl.constexpr,
                         SPLIT_OUT: tl.constexpr, DOT_PRECISION: tl.constexpr, ON_DEVICE: tl.constexpr,
                         WARP_SPECIALIZE: tl.constexpr):
    """Persistent TMA version of _mlp_gemm_kernel; out-of-bounds loads are zero-filled by TMA. ON_DEVICE: the
    *_desc arguments are pointers, the descriptors are made here (the row strides serve only then)."""
    if ON_DEVICE:  # a compile-time branch: with host descriptors none of this is generated
        a_desc = tl.make_tensor_descriptor(a_desc, [M, K], [stride_a, 1], [BLOCK_M, BLOCK_K])
        a2_desc = tl.make_tensor_descriptor(a2_desc, [M, K], [stride_a2, 1], [BLOCK_M, BLOCK_K])
        w1_desc = tl.make_tensor_descriptor(w1_desc, [N, K], [stride_w1, 1], [BLOCK_N, BLOCK_K])
        w2_desc = tl.make_tensor_descriptor(w2_desc, [N, K], [stride_w2, 1], [BLOCK_N, BLOCK_K])
        c_desc = tl.make_tensor_descriptor(c_desc, [M, N], [stride_c, 1], [BLOCK_M, BLOCK_N])
        c2_desc = tl.make_tensor_descriptor(c2_desc, [M, N], [stride_c2, 1], [BLOCK_M, BLOCK_N])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, num_programs):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, tl.cdiv(K, BLOCK_K), warp_specialize=WARP_SPECIALIZE):
            a = a_desc.load([off_m, k * BLOCK_K])
            w1 = tl.trans(w1_desc.load([off_n, k * BLOCK_K]))
            acc1 = tl.dot(a, w1, acc1, input_precision=DOT_PRECISION)
            if SPLIT_A:
                acc1 = tl.dot(a2_desc.load([off_m, k * BLOCK_K]), w1, acc1, input_precision=DOT_PRECISION)
            if GATED:
                w2 = tl.trans(w2_desc.load([off_n, k * BLOCK_K]))
                acc2 = tl.dot(a, w2, acc2, input_precision=DOT_PRECISION)
        hi, lo = _epilogue(acc1, acc2, GATED, SPLIT_OUT, c_desc.dtype)
        c_desc.store([off_m, off_n], hi)
        if SPLIT_OUT:
            c2_desc.store([off_m, off_n], lo)


def _auto_config(m, n, dtype, gated, split_a, sms=None):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for one phase on a Hopper-class GPU of `sms` SMs (None:
    not known, the interpreter)."""
    if dtype == torch.float32:  # 4-byte tiles, CUDA-core (ieee) dots
        return (64, 64, 32, 4, 2) if gated else (64, 128, 32, 4, 3)
    block_m = 64 if m <= 64 else 128  # decode-sized T: don't waste half of each tile
    if gated or split_a:  # two 128x128 fp32 accumulators (or A tiles): 48 KB a stage
        bm, bn = _filling(m, n, [(block_m, 128), (64, 128)], sms)
        return bm, bn, 64, 8, 4
    bm, bn = _filling(m, n, [(block_m, 256 if block_m == 128 else 128), (block_m, 128), (64, 128)], sms)
    return bm, bn, 64, 8 if bm == 128 else 4, 3


def _filling(m, n, tiles, sms):
    """The first (BLOCK_M, BLOCK_N) of `tiles` (largest first) whose grid fills FILL of the SMs, else the last: at
    T=512 TinyLlama's down projection (N=2048) in 128x256 tiles is 32 programs on an H100's 132 SMs, a quarter of
    the GPU, and the model ran 0.71x with fused_mlp in, graphed. Filled, on an H100 (do_bench): TinyLlama's MLP at
    T=512 98.1 us against 139.3 us in the old tiles (torch's three GEMMs: 81.2 us); Qwen3-0.6B's at 2048 78.4 us
    against 99.3 (torch 87.8); Llama-3.2-1B's at 1024 191.6 against 209.8 (torch 188.5)."""
    if sms is None:
        return tiles[0]
    return next(((bm, bn) for bm, bn in tiles if _cdiv(m, bm) * _cdiv(n, bn) >= FILL * sms), tiles[-1])


def _config(m, n, dtype, gated, split_a, sms):
    if gated:
        chosen = (BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES)
    else:
        chosen = (DOWN_BLOCK_M, DOWN_BLOCK_N, DOWN_BLOCK_K, DOWN_NUM_WARPS, DOWN_NUM_STAGES)
    fixed = chosen[0] or chosen[1]  # a tile size the file sets: the others as by default, none shrunk
    auto = _auto_config(m, n, dtype, gated, split_a, None if fixed else sms)
    return tuple(c or a for c, a in zip(chosen, auto))


@functools.cache
def _sm_count(device_index: int) -> int:  # once per device: the query costs host time on every call
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _capability_major(device_index: int) -> int:  # once per device: the query costs host time on every call
    return torch.cuda.get_device_capability(device_index)[0]


# Host-side integer helper in plain Python: triton.cdiv is a ConstexprFunction (triton 3.6), a few
# microseconds per call from the host, which a launch-bound model pays on every call.
def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _tma_ok(*tensors):
    """TMA needs a Hopper+ GPU, 16-byte aligned bases and rows, and a unit inner stride."""
    first = tensors[0]
    if TensorDescriptor is None or not first.is_cuda or _capability_major(first.get_device()) < 9:
        return False
    return all(t.stride(1) == 1 and _address(t) % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
               for t in tensors)


def _address(t):
    """t's data pointer; traced under torch.compile (a FakeTensor has none) its offset into an allocation,
    which PyTorch's allocators align to at least 256 bytes."""
    try:
        return t.data_ptr()
    except RuntimeError:
        return t.storage_offset() * t.element_size()


def _scratch(size: int, alignment: int, stream):
    """Global memory for the descriptors made on the device, which Triton's launcher asks for at each launch."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _gemm(a, a2, w1, w2, c, c2, gated, split_a, split_out):
    """c = (a [+ a2]) @ w1^T, or silu(a @ w1^T) * (a @ w2^T); a [M, K], w [N, K], c [M, N]."""
    m, k = a.shape
    n = w1.shape[0]
    sms = _sm_count(a.get_device()) if a.is_cuda else None
    bm, bn, bk, warps, stages = _config(m, n, a.dtype, gated, split_a, sms)
    flags = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M, GATED=gated, SPLIT_A=split_a,
                 SPLIT_OUT=split_out, DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
                 num_warps=warps, num_stages=stages)  # tf32 is ignored for 16-bit inputs
    tiles = _cdiv(m, bm) * _cdiv(n, bn)
    large = 2 * m * n * k >= TMA_MIN_FLOPS
    if (VARIANT == "tma" or (VARIANT == "auto" and large)) and _tma_ok(a, a2, w1, w2, c, c2):
        on_device = DESCRIPTORS == "device"
        if on_device:
            triton.set_allocator(_scratch)
            descs = [a, a2, w1, w2, c, c2]
        else:
            descs = [TensorDescriptor.from_tensor(t, blk) for t, blk in
                     ((a, [bm, bk]), (a2, [bm, bk]), (w1, [bn, bk]), (w2, [bn, bk]), (c, [bm, bn]), (c2, [bm, bn]))]
        programs = min(tiles, sms or _sm_count(a.get_device()))  # the interpreter runs the TMA path on the CPU
        _mlp_gemm_tma_kernel[(programs,)](*descs, m, n, k, programs, a.stride(0), a2.stride(0), w1.stride(0),
                                          w2.stride(0), c.stride(0), c2.stride(0), ON_DEVICE=on_device,
                                          WARP_SPECIALIZE=WARP_SPECIALIZE, **flags)
        return
    masked = m % bm != 0 or n % bn != 0 or k % bk != 0
    _mlp_gemm_kernel[(tiles,)](a, a2, w1, w2, c, c2, m, n, k, *a.stride(), *w1.stride(), *c.stride(),
                               MASKED=masked, **flags)


def kernel_fn(x, w_gate, w_up, w_down):
    hidden = x.shape[-1]
    inter = w_gate.shape[0]
    x2 = x if x.dim() == 2 else x.reshape(-1, hidden)  # a view when the leading dims are contiguous, else a copy
    tokens = x2.shape[0]
    # The gated kernel walks w_gate and w_up with one set of strides; copy them only if those differ.
    if w_up.stride() != w_gate.stride():
        w_up = w_up.contiguous()
        w_gate = w_gate.contiguous()
    split = PRECISE_H and x.dtype != torch.float32
    h = torch.empty((tokens, inter), dtype=x.dtype, device=x.device)
    h_lo = torch.empty((tokens, inter), dtype=x.dtype, device=x.device) if split else h
    _gemm(x2, x2, w_gate, w_up, h, h_lo, gated=True, split_a=False, split_out=split)
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    _gemm(h, h_lo, w_down, w_down, out, out, gated=False, split_a=split, split_out=False)
    return out if x.dim() == 2 else out.view(*x.shape[:-1], hidden)  # (a view costs a dispatch)
