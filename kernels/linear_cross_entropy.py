"""Linear + cross-entropy starter: the LM head and its loss, mean over counted rows of
logsumexp(h[row] @ W.T) - h[row] @ W[target[row]], without the [N, V] logits ever in memory.

Compute-bound. One call does 2*N*H*V FLOPs (the logits GEMM) and must read hidden [N, H], weight [V, H]
and the int64 targets once: (N*H + V*H) * element_size + 8*N bytes. At the bench shape N=8192 (batch 4 x
2048 tokens), H=2048, V=32000 fp16 that is 1.07 TFLOP against 164 MB: ~1.4 ms at cuBLAS speed on an H100.
Eager PyTorch writes the fp16 logits (524 MB), upcasts them to fp32 (1 GB more) and runs log_softmax and
nll_loss over them: ~2.6 GB of traffic and as much memory at once; at Qwen2's V=151936 the fp32 logits
of 8192 tokens alone are 5 GB.

Fused: a program takes BLOCK_M rows and a slice of the vocabulary. For each BLOCK_N-wide vocabulary tile
it computes the [BLOCK_M, BLOCK_N] logit tile with tl.dot over H (fp32 accumulator) and folds it into
each row's running max and sum of exp (online softmax) and picks the target's logit out of it: the
logits live in registers only. The vocabulary is split across SPLIT programs so that short inputs still
fill the GPU (N=2048 rows are only 16 row blocks); each writes its (max, sum, target logit) per row to a
[3, SPLIT, N] fp32 buffer. A second kernel merges the splits into each row's loss, (max - target logit)
+ log(sum), and sums the losses and counts of its rows; a third, one program, adds those in a fixed order
and divides: bitwise reproducible, no atomics. Peak memory is that buffer and the partial sums:
12 * SPLIT * N + O(N / COMBINE_BLOCK) bytes, whatever V.

Hopper: the tiles come through TMA tensor descriptors (hidden [N, H] and weight [V, H] as they lie: the weight
tile goes to the tensor cores K-major, rows past N or V and depth past H read as zeros), and each tile is
folded with exp2 and int32 target compares; elsewhere, or with fp32 inputs or unaligned rows, the pointer
kernel does the same with masked loads. DESCRIPTORS: where the TMA kernel's descriptors are made. "host":
TensorDescriptor.from_tensor, encoded by the launcher on every call (torch.compile cannot trace such a launch:
traced, the file runs "device"). "device": each program makes them from pointers (tl.make_tensor_descriptor, 128
bytes of global scratch per descriptor and program, asked of triton's allocator at launch): nothing encoded on the
host, and Inductor launches the kernel from its own code.

Time and memory against eager, torch.compile and Liger-Kernel at the TinyLlama and Qwen2 heads, and the
alternatives timed beside the defaults (pointer loads, 128-wide vocabulary tiles): BENCHMARKS.md. The target's
logit computed apart (a gather-dot per row) and tl.range(flatten=True) over the vocabulary tiles were within
noise of the default: the first was not kept, the second is a tunable.

Targets equal to ignore_index (HF's padding and shifted-off positions) add no loss and are not counted; a
call with none counted returns NaN (0/0), as F.cross_entropy does. fp32 inputs use input_precision="ieee"
(TF32 would miss the 1e-4 tolerance). The loss is returned in fp32 whatever the inputs' dtype.
"""

import functools

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors arrived in triton 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the "tma" variant falls back to pointers
    TensorDescriptor = None

KERNEL_TYPE = "linear_cross_entropy"

VARIANT = "tma"  # "tma": tiles loaded through TMA descriptors where that applies (see _tma_ok) | "pointers"
FLATTEN = False  # TMA variant: let the compiler pipeline the K loop across vocabulary tiles (tl.range flatten)
DESCRIPTORS = "host"  # TMA variant: "host" | "device" (made by each program; see the docstring)

BLOCK_M = 128  # rows per program (the A tile of the logits GEMM)
BLOCK_N = 256  # vocabulary columns per logit tile (128-wide tiles are slower: BENCHMARKS.md, the starter defaults)
BLOCK_K = 64  # hidden-dim depth per tl.dot step
NUM_WARPS = 8  # warps per program of the fused kernel
NUM_STAGES = 3  # software-pipeline depth of the K loop (shared memory: (BLOCK_M + BLOCK_N) * BLOCK_K per stage)
PROGRAMS_PER_SM = 4  # the vocabulary is split until the grid has about SMs x this many programs
MAX_SPLIT = 32  # at most this many vocabulary slices (the partials buffer grows with it)
COMBINE_BLOCK = 1024  # rows per program of the merge kernel
LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)
CPU_BLOCKS = (16, 64, 32)  # (BLOCK_M, BLOCK_N, BLOCK_K) in Triton's interpreter: small shapes still span several tiles
CPU_PROGRAMS = 4  # the grid the split aims for in the interpreter (no SMs to count)

TUNABLES = {
    "VARIANT": ["tma", "pointers"],
    "FLATTEN": [False, True],
    "DESCRIPTORS": ["host", "device"],
    "BLOCK_M": [64, 128, 256],
    "BLOCK_N": [64, 128, 256],
    "BLOCK_K": [32, 64, 128],
    "NUM_WARPS": [4, 8],
    "NUM_STAGES": [2, 3, 4, 5],
    "PROGRAMS_PER_SM": [1, 2, 4, 8],
    "MAX_SPLIT": [1, 8, 32, 64],
}


@triton.jit
def _linear_cross_entropy_kernel(h_ptr, w_ptr, t_ptr, part_ptr, N, V, H, stride_hn, stride_hk, stride_wv,
                                 stride_wk, tiles_per_split, split,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 DOT_PRECISION: tl.constexpr):
    """Rows of block program_id(0), vocabulary tiles of slice program_id(1): per row, the running max of the
    logits, the sum of exp(logit - max), and the target's logit (0 when the target is not in this slice)."""
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_mask = rows < N
    target = tl.load(t_ptr + rows, mask=row_mask, other=-1)
    ks = tl.arange(0, BLOCK_K)
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    target_logit = tl.zeros([BLOCK_M], dtype=tl.float32)
    first_col = pid_s * tiles_per_split * BLOCK_N
    for tile in range(0, tiles_per_split):
        cols = (first_col + tile * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        col_mask = cols < V
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, H, BLOCK_K):
            k_mask = (k + ks) < H
            a = tl.load(h_ptr + rows[:, None] * stride_hn + (k + ks)[None, :] * stride_hk,
                        mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(w_ptr + cols[None, :] * stride_wv + (k + ks)[:, None] * stride_wk,
                        mask=col_mask[None, :] & k_mask[:, None], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        row_max, row_sum, target_logit = _fold_tile(acc, cols, col_mask, target, row_max, row_sum, target_logit)
    _store_partials(part_ptr, rows, row_mask, pid_s, N, split, row_max, row_sum, target_logit)


@triton.jit
def _lce_tma_kernel(h_desc, w_desc, t_ptr, part_ptr, N, V, H, stride_h, stride_w, tiles_per_split, split, k_steps,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FLATTEN: tl.constexpr,
                    ON_DEVICE: tl.constexpr):
    """_linear_cross_entropy_kernel with its tiles loaded by the TMA engine: hidden [N, H] and weight [V, H]
    through tensor descriptors (rows past N or V and depth past H read as zeros), the weight tile fed to the
    tensor cores K-major as it lies in memory. ON_DEVICE: h_desc and w_desc are pointers, the descriptors are
    made here (H and the row strides serve only then)."""
    if ON_DEVICE:  # a compile-time branch: with host descriptors none of this is generated
        h_desc = tl.make_tensor_descriptor(h_desc, [N, H], [stride_h, 1], [BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_desc, [V, H], [stride_w, 1], [BLOCK_N, BLOCK_K])
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    off_m = pid_m * BLOCK_M
    rows = (off_m + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_mask = rows < N
    target = tl.load(t_ptr + rows, mask=row_mask, other=-1).to(tl.int32)  # out-of-range targets match no column
    row_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    target_logit = tl.zeros([BLOCK_M], dtype=tl.float32)
    first_tile = pid_s * tiles_per_split
    last_tile = tl.minimum(first_tile + tiles_per_split, tl.cdiv(V, BLOCK_N))
    for tile in tl.range(first_tile, last_tile, flatten=FLATTEN):
        off_n = tile * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, k_steps):
            a = h_desc.load([off_m, k * BLOCK_K])
            b = w_desc.load([off_n, k * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        cols = off_n + tl.arange(0, BLOCK_N)
        row_max, row_sum, target_logit = _fold_tile(acc, cols, cols < V, target, row_max, row_sum, target_logit)
    _store_partials(part_ptr, rows, row_mask, pid_s, N, split, row_max, row_sum, target_logit)


@triton.jit
def _fold_tile(acc, cols, col_mask, target, row_max, row_sum, target_logit):
    """Fold a [rows, cols] logit tile into each row's running max, sum of exp and target logit. The TMA kernel
    passes cols and target as int32: the vocabulary fits, and a 64-bit compare costs two per logit."""
    logits = tl.where(col_mask[None, :], acc, float("-inf"))
    # every slice starts with a tile holding at least one column, so row_max is finite from then on
    new_max = tl.maximum(row_max, tl.max(logits, axis=1))
    # exp(x - m) as exp2(x * log2(e) - m * log2(e)): one fused multiply-add and the hardware's exp2 per logit
    scaled_max = new_max * LOG2E
    row_sum = (row_sum * tl.math.exp2(row_max * LOG2E - scaled_max)
               + tl.sum(tl.math.exp2(tl.fma(logits, LOG2E, -scaled_max[:, None])), axis=1))
    target_logit += tl.sum(tl.where(cols[None, :] == target[:, None], acc, 0.0), axis=1)
    return new_max, row_sum, target_logit


@triton.jit
def _store_partials(part_ptr, rows, row_mask, pid_s, N, split, row_max, row_sum, target_logit):
    at = pid_s * N + rows
    tl.store(part_ptr + at, row_max, mask=row_mask)
    tl.store(part_ptr + split * N + at, row_sum, mask=row_mask)
    tl.store(part_ptr + 2 * split * N + at, target_logit, mask=row_mask)


@triton.jit
def _merge_kernel(part_ptr, t_ptr, sums_ptr, N, V, split, ignore_index, BLOCK: tl.constexpr):
    """Each row's loss from its slices' partials; this program's loss sum and count of counted rows."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row_mask = rows < N
    row_max = tl.full([BLOCK], float("-inf"), tl.float32)
    row_sum = tl.zeros([BLOCK], dtype=tl.float32)
    target_logit = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, split):
        m = tl.load(part_ptr + s * N + rows, mask=row_mask, other=0.0)
        new_max = tl.maximum(row_max, m)
        row_sum = (row_sum * tl.exp(row_max - new_max)
                   + tl.load(part_ptr + (split + s) * N + rows, mask=row_mask, other=0.0) * tl.exp(m - new_max))
        row_max = new_max
        target_logit += tl.load(part_ptr + (2 * split + s) * N + rows, mask=row_mask, other=0.0)
    target = tl.load(t_ptr + rows, mask=row_mask, other=ignore_index)
    counted = row_mask & (target != ignore_index) & (target >= 0) & (target < V)
    loss = tl.where(counted, (row_max - target_logit) + tl.log(tl.where(counted, row_sum, 1.0)), 0.0)
    tl.store(sums_ptr + tl.program_id(0), tl.sum(loss, axis=0))
    tl.store(sums_ptr + tl.num_programs(0) + tl.program_id(0), tl.sum(counted.to(tl.float32), axis=0))


@triton.jit
def _mean_kernel(sums_ptr, out_ptr, P, BLOCK: tl.constexpr):
    """out = sum(loss sums) / sum(counts) over the P merge programs, in a fixed order."""
    idx = tl.arange(0, BLOCK)
    total = tl.sum(tl.load(sums_ptr + idx, mask=idx < P, other=0.0), axis=0)
    count = tl.sum(tl.load(sums_ptr + P + idx, mask=idx < P, other=0.0), axis=0)
    tl.store(out_ptr, total / count)


# Host-side integer helpers in plain Python (triton.cdiv is a ConstexprFunction: microseconds per host call).
def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _capability_major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]


def _tma_ok(hidden, weight) -> bool:
    """TMA: a Hopper+ GPU, 16-bit inputs (fp32 keeps the pointer kernel's ieee dot), unit inner strides and
    16-byte aligned bases and rows."""
    if TensorDescriptor is None or not hidden.is_cuda or hidden.dtype == torch.float32:
        return False
    if _capability_major(hidden.device.index) < 9:
        return False
    return all(t.stride(1) == 1 and _address(t) % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
               for t in (hidden, weight))


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


def _blocks(hidden) -> tuple[int, int, int]:
    return (BLOCK_M, BLOCK_N, BLOCK_K) if hidden.is_cuda else CPU_BLOCKS


def _split(n: int, v: int, hidden, block_m: int, block_n: int) -> tuple[int, int]:
    """(vocabulary slices, tiles per slice): enough slices to fill the device, each starting inside V."""
    programs = _sm_count(hidden.device.index) * PROGRAMS_PER_SM if hidden.is_cuda else CPU_PROGRAMS
    tiles = _cdiv(v, block_n)
    split = max(1, min(MAX_SPLIT, tiles, _cdiv(programs, _cdiv(n, block_m))))
    per_split = _cdiv(tiles, split)
    return _cdiv(tiles, per_split), per_split


def kernel_fn(hidden, weight, target, ignore_index=-100):
    n, h = hidden.shape
    v = weight.shape[0]
    target = target.contiguous()
    out = torch.empty((), dtype=torch.float32, device=hidden.device)
    block_m, block_n, block_k = _blocks(hidden)
    split, per_split = _split(n, v, hidden, block_m, block_n)
    part = torch.empty((3, split, n), dtype=torch.float32, device=hidden.device)
    grid = (_cdiv(n, block_m), split)
    if n > 0 and VARIANT == "tma" and _tma_ok(hidden, weight):
        on_device = DESCRIPTORS == "device"
        if on_device:
            triton.set_allocator(_scratch)
            descs = (hidden, weight)
        else:
            descs = (TensorDescriptor.from_tensor(hidden, [block_m, block_k]),
                     TensorDescriptor.from_tensor(weight, [block_n, block_k]))
        _lce_tma_kernel[grid](
            *descs, target, part, n, v, h, hidden.stride(0), weight.stride(0), per_split, split, _cdiv(h, block_k),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, FLATTEN=FLATTEN, ON_DEVICE=on_device,
            num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    elif n > 0:
        _linear_cross_entropy_kernel[grid](
            hidden, weight, target, part, n, v, h, hidden.stride(0), hidden.stride(1), weight.stride(0),
            weight.stride(1), per_split, split, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            DOT_PRECISION="ieee" if hidden.dtype == torch.float32 else "tf32",  # tf32 is ignored for 16-bit
            num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    programs = max(1, _cdiv(n, COMBINE_BLOCK))
    sums = torch.empty((2, programs), dtype=torch.float32, device=hidden.device)
    _merge_kernel[(programs,)](part, target, sums, n, v, split, ignore_index, BLOCK=COMBINE_BLOCK, num_warps=4)
    block = _next_pow2(programs)
    _mean_kernel[(1,)](sums, out, programs, BLOCK=block, num_warps=min(8, max(1, block // 128)))
    return out
