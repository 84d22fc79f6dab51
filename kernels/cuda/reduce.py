"""Sum over one dimension (the last by default), CUDA C++ starter.

Memory-bound: one call reads x once and writes one value per row, (M * N + M) * element_size bytes.
At the bench shape 16384x4096 fp16 that is 134 MB: ~45 us at an H100's ~3 TB/s copy rate.

Many rows (WARP_ROWS_FROM or more): one warp per row, WARP_BLOCK_THREADS / 32 rows per block, combined
with warp shuffles only. A row of up to 32 x LANE_PACKS packs is loaded whole before any addition: each
lane issues all its P 16-byte loads at once (kept raw, 4 registers per pack; P the smallest power of two
that covers the row, a template parameter), so a warp has the whole row (8 KB at the bench shape) in
flight (streaming 2 KB per warp at a time leaves too little in flight to reach the copy rate). Longer rows
and few rows (one block per row, warp shuffles and one shared-memory step): each thread issues UNROLL pack
loads (single elements where the row length, stride or pointer do not allow packs) before adding them.
x is read with ld.global.cs (STREAM_LOADS): its lines enter the L2 evict-first, so they replace each other
rather than the lines already there, whose write-back, when they are dirty, a read-only kernel would pay for.
Fixed order (bitwise reproducible, no atomics). fp16/bf16 rows are summed in fp32; fp32 rows in fp64,
because the harness's cancellation input (pairs of +-100 around small noise) leaves an exact sum that fp32
accumulation over thousands of terms misses by more than 1e-4.
A reduction over another dimension is moved to the last one (a copy when it is not contiguous there).

Tunables: THREADS, PACKS_PER_THREAD (block per row), WARP_ROWS_FROM and WARP_BLOCK_THREADS are launch
parameters; VEC_BYTES, UNROLL, LANE_PACKS and STREAM_LOADS are compiled in.
"""

import functools

import torch

from autokernel.cuda import cuda_build

KERNEL_TYPE = "reduce"
BACKEND = "cuda"

THREADS = 0  # threads per block (multiple of 32, <= 1024); 0 = auto: PACKS_PER_THREAD packs per thread
PACKS_PER_THREAD = 2  # packs per thread in the auto block size (runtime)
VEC_BYTES = 16  # bytes per vectorized load (compile-time): 16 = 8 fp16 or 4 fp32
UNROLL = 4  # pack loads each thread issues before adding them (compile-time): bytes in flight per thread
WARP_ROWS_FROM = 4096  # rows from which each warp sums one row (runtime): enough warps to fill the GPU
WARP_BLOCK_THREADS = 256  # threads per block in the one-row-per-warp mode (runtime): 8 rows per block
LANE_PACKS = 16  # packs per lane of a warp's whole-row load (compile-time, power of two): rows <= 32x longer
STREAM_LOADS = 1  # 1: x read with ld.global.cs (evict-first in L2: read once), 0: plain loads (compile-time)

TUNABLES = {
    "THREADS": [0, 64, 128, 256, 512, 1024],
    "PACKS_PER_THREAD": [1, 2, 4, 8],
    "VEC_BYTES": [4, 8, 16],
    "UNROLL": [1, 2, 4, 8],
    "WARP_ROWS_FROM": [1024, 4096, 16384, 1_000_000_000],
    "WARP_BLOCK_THREADS": [128, 256, 512],
    "LANE_PACKS": [4, 8, 16],
    "STREAM_LOADS": [0, 1],
}

CUDA_SRC = r"""
constexpr bool STREAM = STREAM_LOADS != 0;  // x read with ld.global.cs (see ak::load_raw)
template <typename T> struct Accum { using type = float; };
template <> struct Accum<float> { using type = double; };

// One row per warp (WARP: many rows, shuffles only, no block barrier) or per block (few long rows). Each
// thread issues UNROLL pack loads before adding any of them (UNROLL x 16 bytes in flight per thread), then
// a remainder loop. The order of the additions depends only on the launch configuration: reproducible.
// Registers: ~40 with UNROLL 4 (the raw packs, 4 per 16-byte load, are what is live across the latency);
// __launch_bounds__(1024) caps it at 64, so every block size up to 1024 launches.
template <typename T, int V, bool WARP>
__global__ void __launch_bounds__(1024) reduce_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                                      int64_t n, int64_t stride_x) {
  using A = typename Accum<T>::type;
  const int lane = WARP ? (threadIdx.x & 31) : threadIdx.x;
  const int group = WARP ? 32 : blockDim.x;  // threads per row
  const int64_t row = WARP ? (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5) : blockIdx.x;
  if (WARP && row >= rows) return;  // a whole warp: no barrier below in the WARP case
  const T* xr = x + row * stride_x;
  const int64_t packs = n / V;
  A s = 0;
  int64_t p = lane;
  for (; p + (int64_t)(UNROLL - 1) * group < packs; p += (int64_t)UNROLL * group) {
    float v[UNROLL][V];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) ak::load_pack<T, V, STREAM>(xr + (p + (int64_t)u * group) * V, v[u]);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int j = 0; j < V; ++j) s += (A)v[u][j];
    }
  }
  for (; p < packs; p += group) {
    float v[V];
    ak::load_pack<T, V, STREAM>(xr + p * V, v);
#pragma unroll
    for (int j = 0; j < V; ++j) s += (A)v[j];
  }
  const A total = WARP ? ak::warp_reduce(s, ak::Sum()) : ak::block_reduce(s, ak::Sum(), (A)0);
  if (lane == 0) y[row] = ak::from_f<T>((float)total);
}

// One row per warp, the whole row in flight at once: lane l loads packs l, l + 32, ..., l + 32 (P - 1) as raw
// 16-byte packs (P x 4 registers) before adding any. The launcher picks the smallest P with 32 P >= packs.
// Registers at P = 16: ~88 for fp16 (2 blocks of 256 threads, 16 rows = 128 KB in flight per SM), ~130 for fp32
// (its double sums), which __launch_bounds__(512) would spill: hence 256 (fit_threads clamps a larger ask).
template <typename T, int V, int P>
__global__ void __launch_bounds__(256) reduce_warp_row_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                              int64_t rows, int64_t n, int64_t stride_x) {
  using A = typename Accum<T>::type;
  const int lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;  // a whole warp: no barrier below
  const T* xr = x + row * stride_x;
  const int packs = (int)(n / V);  // <= 32 * P (the launcher checks)
  ak::Pack<T, V> raw[P];
#pragma unroll
  for (int i = 0; i < P; ++i) {
    if (lane + 32 * i < packs) raw[i] = ak::load_raw<T, V, STREAM>(xr + (int64_t)(lane + 32 * i) * V);
  }
  A s = 0;
#pragma unroll
  for (int i = 0; i < P; ++i) {
    if (lane + 32 * i < packs) {
#pragma unroll
      for (int j = 0; j < V; ++j) s += (A)ak::to_f(raw[i].v[j]);
    }
  }
  s = ak::warp_reduce(s, ak::Sum());
  if (lane == 0) y[row] = ak::from_f<T>((float)s);
}

static_assert(LANE_PACKS >= 1 && (LANE_PACKS & (LANE_PACKS - 1)) == 0, "LANE_PACKS must be a power of two");

// The smallest P (1, 2, 4, ... LANE_PACKS) whose warp covers a row of n / V packs (the caller checked that
// LANE_PACKS does).
template <typename T, int V, int P>
void launch_warp_rows(const T* x, T* y, int64_t rows, int64_t n, int64_t stride_x, int threads, cudaStream_t s) {
  if constexpr (P < LANE_PACKS) {
    if (n / V > 32 * P) return launch_warp_rows<T, V, P * 2>(x, y, rows, n, stride_x, threads, s);
  }
  auto kernel = &reduce_warp_row_kernel<T, V, P>;
  const int t = ak::fit_threads(kernel, threads);
  kernel<<<dim3((unsigned)((rows + (t >> 5) - 1) / (t >> 5))), t, 0, s>>>(x, y, rows, n, stride_x);
}

void reduce_launch(int dtype, int64_t x, int64_t y, int64_t rows, int64_t n, int64_t stride_x, int threads,
                   bool warp_rows, bool vectorized, int64_t stream) {
  AK_DISPATCH(dtype, {
    constexpr int V = ak::pack_width<scalar_t>(VEC_BYTES);
    const cudaStream_t s = ak::as_stream(stream);
    const auto xp = ak::ptr<const scalar_t>(x);
    const auto yp = ak::ptr<scalar_t>(y);
    auto go = [&](auto kernel) {
      const int t = ak::fit_threads(kernel, threads);
      const int64_t blocks = warp_rows ? (rows + (t >> 5) - 1) / (t >> 5) : rows;
      kernel<<<dim3((unsigned)blocks), t, 0, s>>>(xp, yp, rows, n, stride_x);
    };
    if (vectorized && warp_rows && n / V <= 32 * LANE_PACKS)
      launch_warp_rows<scalar_t, V, 1>(xp, yp, rows, n, stride_x, threads, s);
    else if (vectorized && warp_rows) go(&reduce_kernel<scalar_t, V, true>);
    else if (vectorized) go(&reduce_kernel<scalar_t, V, false>);
    else if (warp_rows) go(&reduce_kernel<scalar_t, 1, true>);
    else go(&reduce_kernel<scalar_t, 1, false>);
  });
  ak::check_launch("reduce_kernel");
}
"""

PROTOTYPES = ["void reduce_launch(int dtype, int64_t x, int64_t y, int64_t rows, int64_t n, int64_t stride_x, "
              "int threads, bool warp_rows, bool vectorized, int64_t stream)"]


def cuda_source() -> str:
    """The whole translation unit: shared helpers, the compile-time tunables, the kernel."""
    tunables = {"VEC_BYTES": VEC_BYTES, "UNROLL": UNROLL, "LANE_PACKS": LANE_PACKS, "STREAM_LOADS": STREAM_LOADS}
    return cuda_build.PRELUDE + cuda_build.defines(tunables) + CUDA_SRC


@functools.cache
def _module():
    return cuda_build.load(KERNEL_TYPE, cuda_source(), PROTOTYPES)


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
    cuda_build.check_dtypes(x2)
    out = torch.empty(x.shape[:-1], dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0:
        return out
    if n == 0:
        return out.fill_(0)
    width = cuda_build.pack_width(VEC_BYTES, x2)
    vec = cuda_build.vectorizable(width, n, x2)
    warp_rows = rows >= WARP_ROWS_FROM
    if warp_rows:
        threads = cuda_build.block_threads(1, 1, WARP_BLOCK_THREADS)
    else:
        threads = cuda_build.block_threads(n // (width if vec else 1), PACKS_PER_THREAD, THREADS)
    _module().reduce_launch(cuda_build.dtype_code(x2), x2.data_ptr(), out.data_ptr(), rows, n, x2.stride(0),
                            threads, warp_rows, vec, cuda_build.stream_of(x2))
    return out
