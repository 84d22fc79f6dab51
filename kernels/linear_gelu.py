"""Linear + bias + GELU starter: out = gelu(x @ weight^T + bias), the up-projection of a GELU MLP with its
bias and activation as the GEMM's epilogue (GPT-2, BERT, GPT-NeoX/Pythia, Phi).

x is [..., H] (leading dims folded into T rows), weight [I, H] with any strides (nn.Linear's [I, H], or
GPT-2's Conv1D [H, I] passed as its transposed view: never copied), bias [I] or None. approximate "none" is
the exact GELU, 0.5 * y * (1 + erf(y / sqrt 2)); "tanh" is GPT-2's gelu_new, computed as y * sigmoid(2u)
with u = sqrt(2/pi) * (y + 0.044715 y^3) (0.5 * (1 + tanh(u)) is that sigmoid), through exp2: no tanh
needed from the Triton version, and no inf/inf for large |y| (exp2 of a huge argument gives inf, y / inf = -0).

Compute-bound. One call does 2*T*H*I FLOPs and must move (T*H + I*H + T*I + I) * element_size bytes. At
GPT-2 medium's T=4096, H=1024, I=4096 fp16 that is 34 GFLOP against 50 MB: ~45 us at cuBLAS speed on an
H100/H200 (~750 TFLOP/s), the bytes ~12 us. Eager runs the GEMM (cuBLAS, the bias in its epilogue) and then
GELU as a second kernel that reads and writes the [T, I] activation again: 2 * T * I * 2 bytes, 67 MB here,
~15-20 us more. torch.compile fuses the bias and GELU into one pointwise kernel but cannot fuse it into
cuBLAS. Here bias + GELU are applied to the fp32 accumulator in registers and the activation is written
once, in the input dtype.

Variants (as kernels/matmul.py):
  "grouped"     one program per output tile, tiles ordered in GROUP_M-row groups (L2 swizzle); pointer
                loads, masked only when the shape is ragged. Runs anywhere, and under torch.compile.
  "persistent"  the same tile math, one program per SM walking the tiles in grouped order.
  "tma"         persistent, tiles loaded through Hopper TMA descriptors (compute capability >= 9,
                16-byte aligned rows), the bias read through a plain pointer.
  "auto"        "tma" where it applies and the problem is large (TMA_MIN_FLOPS), else "grouped". Traced by
                torch.compile (fake tensors) it takes "grouped": Inductor cannot follow a host TMA descriptor
                (autokernel/ops/launchers.py), and the op would run opaque.
Tile sizes left at 0 are chosen by shape and dtype (_auto_config); a non-zero CAPS value wins. fp32 inputs
use input_precision="ieee": TF32 would miss the 1e-4 fp32 tolerance.
"""

import functools

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors arrived in triton 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the "tma" variant falls back
    TensorDescriptor = None

KERNEL_TYPE = "linear_gelu"

VARIANT = "auto"  # "auto" | "grouped" | "persistent" | "tma"
BLOCK_M = 0  # rows (tokens) per tile; 0 = by shape (128 for large T)
BLOCK_N = 0  # intermediate columns per tile; 0 = by shape (256 for large 16-bit problems)
BLOCK_K = 0  # hidden-dim depth per pipeline stage; 0 = by dtype (64 for 16-bit, 32 for fp32)
GROUP_M = 8  # tile rows per L2 swizzle group
NUM_WARPS = 0  # warps per program; 0 = by tile size (8 for 128x256)
NUM_STAGES = 0  # software pipeline depth (shared-memory buffers); 0 = by tile size
PROGRAMS_PER_SM = 1  # persistent variants: programs launched per SM
WARP_SPECIALIZE = False  # "tma": the K loop as tl.range(warp_specialize=True) (Triton >= 3.4: async load / MMA partitions)
# "auto" takes TMA only from this many FLOPs: a launch on host-side descriptors costs the host more than a
# pointer launch (docs/launch-cost.md), which a model's small GEMMs cannot amortize.
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
    "WARP_SPECIALIZE": [False, True],
}

CPU_PROGRAMS = 4  # persistent programs in the interpreter, enough to exercise the tile loop


@triton.jit
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # GROUP_M tile rows sweep the N tiles together, so their x rows and the current weight panel are
    # reused from L2 instead of refetched from HBM.
    tiles_per_group = GROUP_M * num_pid_n
    first_m = (tile // tiles_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % tiles_per_group) % group_rows
    pid_n = (tile % tiles_per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _bias_gelu(acc, bias_ptr, cols, N, HAS_BIAS: tl.constexpr, TANH: tl.constexpr):
    """The epilogue on the fp32 accumulator: + bias, then GELU, all in fp32."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if TANH:
        # y * sigmoid(2u) = y / (1 + 2^(-2 u log2 e)), u = sqrt(2/pi) (y + 0.044715 y^3); -2.3022... is
        # -2 sqrt(2/pi) log2(e). exp2 of a large positive argument is inf and y / inf = -0: the limit for y << 0
        return acc / (1.0 + tl.exp2(-2.302208198144325 * (acc + 0.044715 * acc * acc * acc)))
    else:
        return 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))  # erf(y / sqrt 2)


@triton.jit
def _linear_gelu_tile(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                      stride_om, stride_on, pid_m, pid_n,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MASKED: tl.constexpr,
                      HAS_BIAS: tl.constexpr, TANH: tl.constexpr, DOT_PRECISION: tl.constexpr):
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # The tile origin in int64: T*H or I*H may pass 2^31 elements; offsets inside a tile stay int32.
    x_ptrs = (x_ptr + (pid_m * BLOCK_M).to(tl.int64) * stride_xm
              + tl.arange(0, BLOCK_M)[:, None] * stride_xm + offs_k[None, :] * stride_xk)
    w_ptrs = (w_ptr + (pid_n * BLOCK_N).to(tl.int64) * stride_wn
              + offs_k[:, None] * stride_wk + tl.arange(0, BLOCK_N)[None, :] * stride_wn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if MASKED:
            k_left = K - k * BLOCK_K
            a = tl.load(x_ptrs, mask=(rows[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(w_ptrs, mask=(offs_k[:, None] < k_left) & (cols[None, :] < N), other=0.0)
        else:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    out = _bias_gelu(acc, bias_ptr, cols, N, HAS_BIAS, TANH)
    out_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :] * stride_on
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _linear_gelu_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                        stride_om, stride_on, num_programs,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        PERSISTENT: tl.constexpr, MASKED: tl.constexpr, HAS_BIAS: tl.constexpr, TANH: tl.constexpr,
                        DOT_PRECISION: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    if PERSISTENT:
        for tile in range(tl.program_id(0), num_pid_m * num_pid_n, num_programs):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            _linear_gelu_tile(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                              stride_om, stride_on, pid_m, pid_n, BLOCK_M, BLOCK_N, BLOCK_K, MASKED, HAS_BIAS, TANH,
                              DOT_PRECISION)
    else:
        pid_m, pid_n = _tile_coords(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
        _linear_gelu_tile(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                          stride_om, stride_on, pid_m, pid_n, BLOCK_M, BLOCK_N, BLOCK_K, MASKED, HAS_BIAS, TANH,
                          DOT_PRECISION)


@triton.jit
def _linear_gelu_tma_kernel(x_desc, w_desc, bias_ptr, out_desc, M, N, K, num_programs,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                            W_KMAJOR: tl.constexpr, HAS_BIAS: tl.constexpr, TANH: tl.constexpr,
                            DOT_PRECISION: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    # W_KMAJOR: w_desc describes weight [N, K] (nn.Linear), its tiles transposed on chip; else weight^T [K, N]
    # (a Conv1D weight). Out-of-bounds loads are zero-filled and out-of-bounds stores dropped by TMA.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, num_programs):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in tl.range(0, tl.cdiv(K, BLOCK_K), warp_specialize=WARP_SPECIALIZE):
            a = x_desc.load([off_m, k * BLOCK_K])
            if W_KMAJOR:
                b = tl.trans(w_desc.load([off_n, k * BLOCK_K]))
            else:
                b = w_desc.load([k * BLOCK_K, off_n])
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        cols = off_n + tl.arange(0, BLOCK_N)
        out_desc.store([off_m, off_n], _bias_gelu(acc, bias_ptr, cols, N, HAS_BIAS, TANH).to(out_desc.dtype))


def _auto_config(m, n, k, dtype, num_sms):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for this problem on a Hopper-class GPU."""
    if dtype == torch.float32:  # 4-byte tiles: half the depth, and ieee dots run on CUDA cores
        return (64 if m <= 64 else 128), 128, 32, 8, 3
    if m <= 16:  # decode-sized T: stream the weight, spread I over many programs, go deep on H
        return 16, 64, 128, 4, 4
    if m <= 64:
        return 64, 128, 64, 4, 4
    if _cdiv(m, 128) * _cdiv(n, 256) < num_sms:  # too few big tiles to fill the GPU (GPT-2 medium at T=1024)
        return 128, 128, 64, 8, 3  # 3 stages beat 4 at GPT-2's T=1024 (BENCHMARKS.md, the starter defaults)
    # 128x256x64 with 3 stages: 144 KB of shared memory, 8 warps feeding two warpgroup MMAs; the epilogue's
    # fp32 bias + GELU works on the 128x256 accumulator the two warpgroups already hold
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


def _traced(t) -> bool:
    """Whether t is a fake tensor (torch.compile tracing the op): it has no data pointer."""
    try:
        t.data_ptr()
    except RuntimeError:
        return True
    return False


def _tma_ok(x, w_rows, out):
    """TMA needs a Hopper+ GPU, real tensors, 16-byte aligned bases and rows, and a unit inner stride."""
    if TensorDescriptor is None or not x.is_cuda or _capability_major(x.get_device()) < 9 or _traced(x):
        return False
    return all(t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
               for t in (x, w_rows, out))


def _flags(x, bias, approximate, cfg):
    bm, bn, bk, warps, stages = cfg
    # tf32 is ignored for 16-bit inputs
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M, HAS_BIAS=bias is not None,
                TANH=approximate == "tanh", DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                num_warps=warps, num_stages=stages)


def _launch_tma(x, weight, bias, out, approximate, cfg, num_sms):
    bm, bn, bk = cfg[:3]
    m, k = x.shape
    n = weight.shape[0]
    w_kmajor = weight.stride(1) == 1
    w_desc = (TensorDescriptor.from_tensor(weight, [bn, bk]) if w_kmajor
              else TensorDescriptor.from_tensor(weight.t(), [bk, bn]))
    programs = min(_cdiv(m, bm) * _cdiv(n, bn), num_sms * PROGRAMS_PER_SM)
    _linear_gelu_tma_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), w_desc, out if bias is None else bias,
        TensorDescriptor.from_tensor(out, [bm, bn]), m, n, k, programs, W_KMAJOR=w_kmajor,
        WARP_SPECIALIZE=WARP_SPECIALIZE, **_flags(x, bias, approximate, cfg))


def _launch_pointers(x, weight, bias, out, approximate, cfg, num_sms, persistent):
    bm, bn, bk = cfg[:3]
    m, k = x.shape
    n = weight.shape[0]
    tiles = _cdiv(m, bm) * _cdiv(n, bn)
    programs = min(tiles, num_sms * PROGRAMS_PER_SM) if persistent else tiles
    masked = m % bm != 0 or n % bn != 0 or k % bk != 0
    # without a bias the output stands in for its pointer (never read: HAS_BIAS is off)
    _linear_gelu_kernel[(programs,)](x, weight, out if bias is None else bias, out, m, n, k, *x.stride(),
                                     *weight.stride(), *out.stride(), programs, PERSISTENT=persistent,
                                     MASKED=masked, **_flags(x, bias, approximate, cfg))


def kernel_fn(x, weight, bias=None, approximate="none"):
    inter, hidden = weight.shape
    x2 = x if x.dim() == 2 else x.reshape(-1, hidden)  # a view when the leading dims allow, else a copy
    out = torch.empty((x2.shape[0], inter), dtype=x.dtype, device=x.device)
    num_sms = _num_sms(x.device)
    cfg = _config(x2.shape[0], inter, hidden, x.dtype, num_sms)
    variant = VARIANT
    if variant == "auto" and 2 * x2.shape[0] * inter * hidden < TMA_MIN_FLOPS:
        variant = "grouped"
    w_rows = weight if weight.stride(1) == 1 else weight.t()  # the layout TMA reads: unit stride inside a row
    if variant in ("auto", "tma") and not _tma_ok(x2, w_rows, out):
        variant = "grouped"
    if variant in ("auto", "tma"):
        _launch_tma(x2, weight, bias, out, approximate, cfg, num_sms)
    else:
        _launch_pointers(x2, weight, bias, out, approximate, cfg, num_sms, persistent=variant == "persistent")
    return out if x.dim() == 2 else out.view(*x.shape[:-1], inter)  # (a view costs a dispatch)
