"""Softmax over the last dimension, CUDA C++ starter.

Memory-bound: one call reads x once and writes y once, 2 * M * N * element_size bytes. At 8192x8192
fp16 that is 268 MB: ~90 us at an H100's ~3 TB/s copy rate.

One block per row, 16-byte packs (VEC_BYTES) where the row length, stride and pointers allow, else single
elements. A row of up to threads x CACHED_PACKS packs is read once into registers: row max (warp
shuffles, then shared memory), sum of exp(x - max), then y = exp(x - max) / sum from the registers.
Longer rows are streamed three times (max, sum, write; the re-reads mostly hit L2). Subtracting the max
keeps huge equal logits finite; -inf entries give exp() = 0. Everything in fp32, exp as exp2((x - max) *
log2(e)) with one ex2.approx (~1e-6 relative, inside the 1e-4 fp32 tolerance), in a fixed order: bitwise
reproducible. x - max comes first: the FMA form x * log2(e) - max * log2(e) left a residual of ~ulp(max)
that turned every output of a row of equal 1e30 logits into NaN.

Register budget (a cache of 8 packs of 8 floats at 1024 threads needs 89 registers, 64 is the most at 1024,
and such a launch fails with 'too many resources requested for launch'): the cache is a template parameter P
(1, 2, 4, ... CACHED_PACKS packs per thread), each kernel compiled with __launch_bounds__ for the block
size its cache fits (ak::cached_threads: 1024 threads for <= ~32 cached floats, 512 for <= ~96, else 256),
and the launcher (ak::launch_cached) takes the smallest P whose kernel covers the row at no more threads than
asked and than it can launch with (cudaFuncGetAttributes); no P does: the streaming kernel. Any row length
launches, and a short row does not pay a big cache's registers. fp16 at 8 packs: 108 registers x 512.

Tunables: THREADS and PACKS_PER_THREAD are launch parameters; VEC_BYTES and CACHED_PACKS are compiled in.
"""

import functools

import torch

from autokernel.cuda import cuda_build

KERNEL_TYPE = "softmax"
BACKEND = "cuda"

THREADS = 0  # threads per block (multiple of 32, <= 1024); 0 = auto: PACKS_PER_THREAD packs per thread
PACKS_PER_THREAD = 2  # packs per thread in the auto block size (runtime)
VEC_BYTES = 16  # bytes per vectorized load/store (compile-time): 16 = 8 fp16 or 4 fp32
CACHED_PACKS = 8  # packs per thread held in registers at most (compile-time): longer rows are read three times

TUNABLES = {
    "THREADS": [0, 128, 256, 512, 1024],
    "PACKS_PER_THREAD": [1, 2, 4, 8],
    "VEC_BYTES": [4, 8, 16],
    "CACHED_PACKS": [4, 8, 16],
}

CUDA_SRC = r"""
// P > 0: the row (at most blockDim.x * P packs, the launcher checks) is read once into a register cache of P
// packs per thread, which then holds exp(x - max). P = 0: the row is streamed three times.
// Register budget: see ak::cached_threads. exp(x - max) = exp2((x - max) * log2(e)), one ex2.approx.
template <typename T, int V, int P>
__global__ void __launch_bounds__(ak::cached_threads(P * V), 1)
softmax_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, int64_t stride_x) {
  const T* xr = x + (int64_t)blockIdx.x * stride_x;
  T* yr = y + (int64_t)blockIdx.x * n;
  const int64_t packs = n / V;
  float m = -INFINITY, s = 0.f;
  if constexpr (P > 0) {
    float cache[P][V];
#pragma unroll
    for (int i = 0; i < P; ++i) {  // all P loads are issued before the first use
      const int64_t p = threadIdx.x + (int64_t)i * blockDim.x;
      if (p < packs) ak::load_pack<T, V>(xr + p * V, cache[i]);
    }
#pragma unroll
    for (int i = 0; i < P; ++i) {
      if (threadIdx.x + (int64_t)i * blockDim.x < packs) {
#pragma unroll
        for (int j = 0; j < V; ++j) m = fmaxf(m, cache[i][j]);
      }
    }
    const float row_max = ak::block_reduce(m, ak::Max(), -INFINITY);
    // x - max first, exactly 0 at the max: an FMA x * log2(e) - max * log2(e) leaves a rounding residual of
    // ~ulp(max), which for huge equal logits (1e30) is ~1e22 and overflows exp. An all -inf row gives NaN, as torch.
#pragma unroll
    for (int i = 0; i < P; ++i) {
      if (threadIdx.x + (int64_t)i * blockDim.x < packs) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          cache[i][j] = ak::exp2_approx((cache[i][j] - row_max) * ak::LOG2E);
          s += cache[i][j];
        }
      }
    }
    const float inv = 1.f / ak::block_reduce(s, ak::Sum(), 0.f);
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t p = threadIdx.x + (int64_t)i * blockDim.x;
      if (p < packs) {
        float o[V];
#pragma unroll
        for (int j = 0; j < V; ++j) o[j] = cache[i][j] * inv;
        ak::store_pack<T, V>(yr + p * V, o);
      }
    }
  } else {
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[V];
      ak::load_pack<T, V>(xr + p * V, v);
#pragma unroll
      for (int j = 0; j < V; ++j) m = fmaxf(m, v[j]);
    }
    const float row_max = ak::block_reduce(m, ak::Max(), -INFINITY);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[V];
      ak::load_pack<T, V>(xr + p * V, v);
#pragma unroll
      for (int j = 0; j < V; ++j) s += ak::exp2_approx((v[j] - row_max) * ak::LOG2E);
    }
    const float inv = 1.f / ak::block_reduce(s, ak::Sum(), 0.f);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[V];
      ak::load_pack<T, V>(xr + p * V, v);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = ak::exp2_approx((v[j] - row_max) * ak::LOG2E) * inv;
      ak::store_pack<T, V>(yr + p * V, v);
    }
  }
}

void softmax_launch(int dtype, int64_t x, int64_t y, int64_t rows, int64_t n, int64_t stride_x, int threads,
                    bool vectorized, int64_t stream) {
  AK_DISPATCH(dtype, {
    constexpr int V = ak::pack_width<scalar_t>(VEC_BYTES);
    const dim3 grid((unsigned)rows);
    const auto xp = ak::ptr<const scalar_t>(x);
    const auto yp = ak::ptr<scalar_t>(y);
    if (vectorized)
      ak::launch_cached<1, CACHED_PACKS>([](auto p) { return &softmax_kernel<scalar_t, V, decltype(p)::value>; },
                                         n / V, threads, grid, ak::as_stream(stream), xp, yp, n, stride_x);
    else  // odd sizes: element loads, no cache (not the fast path)
      ak::launch_cached<0, 0>([](auto p) { return &softmax_kernel<scalar_t, 1, decltype(p)::value>; },
                              n, threads, grid, ak::as_stream(stream), xp, yp, n, stride_x);
  });
  ak::check_launch("softmax_kernel");
}
"""

PROTOTYPES = ["void softmax_launch(int dtype, int64_t x, int64_t y, int64_t rows, int64_t n, int64_t stride_x, "
              "int threads, bool vectorized, int64_t stream)"]


def cuda_source() -> str:
    """The whole translation unit: shared helpers, the compile-time tunables, the kernels."""
    return cuda_build.PRELUDE + cuda_build.defines({"VEC_BYTES": VEC_BYTES, "CACHED_PACKS": CACHED_PACKS}) + CUDA_SRC


@functools.cache
def _module():
    return cuda_build.load(KERNEL_TYPE, cuda_source(), PROTOTYPES)


def kernel_fn(x):
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    cuda_build.check_dtypes(x2)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0 or n == 0:
        return out.view(x.shape)
    width = cuda_build.pack_width(VEC_BYTES, x2)
    vec = cuda_build.vectorizable(width, n, x2, out)
    threads = cuda_build.block_threads(n // (width if vec else 1), PACKS_PER_THREAD, THREADS)
    _module().softmax_launch(cuda_build.dtype_code(x2), x2.data_ptr(), out.data_ptr(), rows, n, x2.stride(0),
                             threads, vec, cuda_build.stream_of(x2))
    return out.view(x.shape)
