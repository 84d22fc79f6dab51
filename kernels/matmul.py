"""Matmul starter: C = A @ B, A [..., M, K] (leading dims folded into M), B [K, N].

Compute-bound. One call does 2*M*N*K FLOPs and must move (M*K + K*N + M*N) * element_size bytes.
At 4096^3 fp16 that is 137 GFLOP against 101 MB: on an H100 SXM (989 TFLOP/s dense fp16 on paper,
~750 reachable by cuBLAS; 3.35 TB/s) the compute floor is ~140 us at peak, ~185 us at cuBLAS speed,
while the bytes alone take ~30 us. So the game is tensor-core utilisation: big tiles, a deep
pipeline, and an L2-friendly tile order so each A and B panel is fetched from HBM about once.

Variants:
  "grouped"     one program per C tile, tiles ordered in GROUP_M-row groups (L2 swizzle);
                pointer loads, masked only when the shape is ragged. Runs anywhere.
  "persistent"  the same tile math, but one program per SM walks over tiles in grouped order:
                no launch tail, the next tile's loads overlap the previous tile's epilogue.
  "tma"         persistent, with Hopper's TMA engine loading tiles through tensor descriptors
                (no address arithmetic in registers, out-of-bounds zero-filled by hardware).
                Needs compute capability >= 9 and 16-byte aligned rows; otherwise "grouped".
  "auto"        "tma" where it applies and the problem is large (TMA_MIN_FLOPS), else "grouped".
DESCRIPTORS: where "tma" makes its descriptors. "host": TensorDescriptor.from_tensor, encoded by the launcher on
every call (torch.compile cannot trace such a launch: traced, the file runs "device"). "device": each program makes
them from pointers (tl.make_tensor_descriptor, 128 bytes of global scratch per descriptor and program, asked of
triton's allocator at launch): nothing encoded on the host, and Inductor launches the kernel from its own code.
Tile sizes left at 0 are chosen by shape and dtype (see _auto_config); a non-zero CAPS value wins.
fp32 inputs use input_precision="ieee": TF32 would miss the 1e-4 fp32 tolerance.
"""

import functools

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors arrived in triton 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the "tma" variant falls back
    TensorDescriptor = None

KERNEL_TYPE = "matmul"

VARIANT = "auto"  # "auto" | "grouped" | "persistent" | "tma"
BLOCK_M = 0  # rows of C per tile; 0 = by shape (128 for large M)
BLOCK_N = 0  # columns of C per tile; 0 = by shape (256 for large 16-bit problems)
BLOCK_K = 0  # reduction depth per pipeline stage; 0 = by dtype (64 for 16-bit, 32 for fp32)
GROUP_M = 8  # tile rows per L2 swizzle group
NUM_WARPS = 0  # warps per program; 0 = by tile size (8 for 128x256)
NUM_STAGES = 0  # software pipeline depth (shared-memory buffers); 0 = by tile size
PROGRAMS_PER_SM = 1  # persistent variants: programs launched per SM
DESCRIPTORS = "host"  # "tma": "host" | "device" (made by each program; see the docstring)
WARP_SPECIALIZE = False  # "tma": the K loop as tl.range(warp_specialize=True) (Triton >= 3.4: async load / MMA partitions)
# "auto" takes TMA only from this many FLOPs: a launch on host-side descriptors costs the host more than a
# pointer launch (docs/launch-cost.md), which a model's small matmuls cannot amortize; at 4096^3 (137 GFLOP)
# it is noise.
TMA_MIN_FLOPS = 2**34

TUNABLES = {
    "VARIANT": ["auto", "grouped", "persistent", "tma"],
    "BLOCK_M": [0, 64, 128, 256],
    "BLOCK_N": [0, 64, 128, 256],
    "BLOCK_K": [0, 32, 64, 128],
    "GROUP_M": [1, 4, 8, 16],
    "NUM_WARPS": [0, 4, 8],
    "NUM_STAGES": [0, 2, 3, 4, 5],
    "PROGRAMS_PER_SM": [1, 2],
    "DESCRIPTORS": ["host", "device"],
    "WARP_SPECIALIZE": [False, True],
}

CPU_PROGRAMS = 4  # persistent programs in the interpreter, enough to exercise the tile loop


@triton.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # GROUP_M tile rows sweep the N tiles together, so their A rows and the current B panel are
    # reused from L2 instead of refetched from HBM.
    tiles_per_group = GROUP_M * num_pid_n
    first_m = (tile // tiles_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % tiles_per_group) % group_rows
    pid_n = (tile % tiles_per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _matmul_tile(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m, pid_n,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # The tile origin in int64: M*K or K*N may pass 2^31 elements; offsets inside a tile stay int32.
    a_ptrs = (a_ptr + (pid_m * BLOCK_M).to(tl.int64) * stride_am
              + tl.arange(0, BLOCK_M)[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = (b_ptr + (pid_n * BLOCK_N).to(tl.int64) * stride_bn
              + offs_k[:, None] * stride_bk + tl.arange(0, BLOCK_N)[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if MASKED:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=(rows[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (cols[None, :] < N), other=0.0)
        else:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _matmul_store_tile(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       stride_cm, stride_cn, pid_m, pid_n,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    acc = _matmul_tile(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       pid_m, pid_n, BLOCK_M, BLOCK_N, BLOCK_K, MASKED, DOT_PRECISION)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + rows[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                   stride_cm, stride_cn, num_programs,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, PERSISTENT: tl.constexpr, MASKED: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    if PERSISTENT:
        for tile in range(tl.program_id(0), num_pid_m * num_pid_n, num_programs):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            _matmul_store_tile(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               stride_cm, stride_cn, pid_m, pid_n,
                               BLOCK_M, BLOCK_N, BLOCK_K, MASKED, DOT_PRECISION)
    else:
        pid_m, pid_n = _tile_coords(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
        _matmul_store_tile(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                           stride_cm, stride_cn, pid_m, pid_n,
                           BLOCK_M, BLOCK_N, BLOCK_K, MASKED, DOT_PRECISION)


@triton.jit
def _matmul_tma_kernel(a_desc, b_desc, c_desc, M, N, K, num_programs, stride_a, stride_b, stride_c,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, B_KMAJOR: tl.constexpr, DOT_PRECISION: tl.constexpr,
                       ON_DEVICE: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    # B_KMAJOR: b_desc describes B^T [N, K] (B came as a W.t() view), tiles are transposed on chip.
    # ON_DEVICE: the *_desc arguments are pointers, the descriptors are made here from the row strides (a
    # compile-time branch: with host descriptors none of it is generated).
    if ON_DEVICE:
        a_desc = tl.make_tensor_descriptor(a_desc, [M, K], [stride_a, 1], [BLOCK_M, BLOCK_K])
        if B_KMAJOR:
            b_desc = tl.make_tensor_descriptor(b_desc, [N, K], [stride_b, 1], [BLOCK_N, BLOCK_K])
        else:
            b_desc = tl.make_tensor_descriptor(b_desc, [K, N], [stride_b, 1], [BLOCK_K, BLOCK_N])
        c_desc = tl.make_tensor_descriptor(c_desc, [M, N], [stride_c, 1], [BLOCK_M, BLOCK_N])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, num_programs):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, tl.cdiv(K, BLOCK_K), warp_specialize=WARP_SPECIALIZE):
            a = a_desc.load([off_m, k * BLOCK_K])
            if B_KMAJOR:
                b = tl.trans(b_desc.load([off_n, k * BLOCK_K]))
            else:
                b = b_desc.load([k * BLOCK_K, off_n])
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


def _auto_config(m, n, k, dtype, num_sms):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for this problem on a Hopper-class GPU."""
    if dtype == torch.float32:  # 4-byte tiles: half the depth, and ieee dots run on CUDA cores
        return (64 if m <= 64 else 128), 128, 32, 8, 3
    if m <= 16:  # GEMV-like: stream B, spread N over many programs, go deep on K
        return 16, 64, 128, 4, 4
    if m <= 64:
        return 64, 128, 64, 4, 4
    if _cdiv(m, 128) * _cdiv(n, 256) < num_sms:  # too few big tiles to fill the GPU
        return 128, 128, 64, 8, 4
    # 128x256x64 with 3 stages: 144 KB of shared memory, 8 warps feeding two warpgroup MMAs
    return 128, 256, 64, 8, 3


def _config(m, n, k, dtype, num_sms):
    auto = _auto_config(m, n, k, dtype, num_sms)
    chosen = (BLOCK_M, BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES)
    return tuple(c or a for c, a in zip(chosen, auto))


def _num_sms(device):
    if device.type != "cuda":
        return CPU_PROGRAMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


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


def _tma_ok(a, b, c):
    """TMA needs a Hopper+ GPU, 16-byte aligned bases and rows, and a unit inner stride."""
    if TensorDescriptor is None or not a.is_cuda or _capability_major(a.get_device()) < 9:
        return False
    b_rows = b if b.stride(1) == 1 else b.t()
    for t in (a, b_rows, c):
        if t.stride(1) != 1 or _address(t) % 16 or (t.stride(0) * t.element_size()) % 16:
            return False
    return True


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


def _launch_tma(a, b, c, cfg, num_sms):
    bm, bn, bk, warps, stages = cfg
    m, k = a.shape
    n = b.shape[1]
    b_kmajor = b.stride(1) != 1
    b_rows = b.t() if b_kmajor else b  # row-major as it lies: B^T [N, K] or B [K, N]
    on_device = DESCRIPTORS == "device"
    if on_device:
        triton.set_allocator(_scratch)
        descs = (a, b_rows, c)
    else:
        descs = (TensorDescriptor.from_tensor(a, [bm, bk]),
                 TensorDescriptor.from_tensor(b_rows, [bn, bk] if b_kmajor else [bk, bn]),
                 TensorDescriptor.from_tensor(c, [bm, bn]))
    programs = min(_cdiv(m, bm) * _cdiv(n, bn), num_sms * PROGRAMS_PER_SM)
    _matmul_tma_kernel[(programs,)](*descs, m, n, k, programs, a.stride(0), b_rows.stride(0), c.stride(0),
                                    BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M, B_KMAJOR=b_kmajor,
                                    DOT_PRECISION=_dot_precision(a.dtype), ON_DEVICE=on_device,
                                    WARP_SPECIALIZE=WARP_SPECIALIZE, num_warps=warps, num_stages=stages)


def _launch_pointers(a, b, c, cfg, num_sms, persistent):
    bm, bn, bk, warps, stages = cfg
    m, k = a.shape
    n = b.shape[1]
    tiles = _cdiv(m, bm) * _cdiv(n, bn)
    programs = min(tiles, num_sms * PROGRAMS_PER_SM) if persistent else tiles
    masked = m % bm != 0 or n % bn != 0 or k % bk != 0
    _matmul_kernel[(programs,)](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), programs,
                                BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M, PERSISTENT=persistent,
                                MASKED=masked, DOT_PRECISION=_dot_precision(a.dtype),
                                num_warps=warps, num_stages=stages)


def _dot_precision(dtype):
    return "ieee" if dtype == torch.float32 else "tf32"  # tf32 is ignored for 16-bit inputs


def kernel_fn(A, B):
    k, n = B.shape
    a = A if A.dim() == 2 else A.reshape(-1, k)  # a view when A's leading dims are contiguous, else a copy
    c = torch.empty((a.shape[0], n), dtype=A.dtype, device=A.device)
    num_sms = _num_sms(A.device)
    cfg = _config(a.shape[0], n, k, A.dtype, num_sms)
    variant = VARIANT
    if variant == "auto" and 2 * a.shape[0] * n * k < TMA_MIN_FLOPS:
        variant = "grouped"
    if variant in ("auto", "tma") and not _tma_ok(a, B, c):
        variant = "grouped"
    if variant in ("auto", "tma"):
        _launch_tma(a, B, c, cfg, num_sms)
    else:
        _launch_pointers(a, B, c, cfg, num_sms, persistent=variant == "persistent")
    return c if A.dim() == 2 else c.view(*A.shape[:-1], n)  # (a view costs a dispatch)
