"""LayerNorm, CUDA C++ starter: y = (x - mean) / sqrt(var + eps) * weight + bias over the last dimension.

Memory-bound: one call reads x once and writes y once, 2 * M * N * element_size bytes (plus 2N for the
weight and bias, which stay in L2). At 8192x8192 fp16 that is 268 MB: ~90 us at an H100's ~3 TB/s.

One block per row, 16-byte packs (VEC_BYTES) where alignment allows, else single elements. The row is
held in registers (up to threads x CACHED_PACKS packs). The one-pass E[x^2] - E[x]^2 cancels
catastrophically around a large mean (the harness's "large_mean" input), so the variance is a sum of squared
deviations from the registers: the mean is reduced over the block first, then the squared deviations from it
(two block reductions). ONE_REDUCTION = 1 merges the threads' own (count, mean, M2) pairwise in a single
block reduction instead (Chan et al.): one set of barriers fewer, but ten merges with a division each on the
critical path, and it is the slower of the two (BENCHMARKS.md, the starter defaults).
Longer rows are re-read from global memory (mostly L2) for each pass. Sums in fp32, fixed order (warp
shuffles then shared memory): bitwise reproducible.

Register budget (a cache of 8 packs of 8 floats at 1024 threads needs 89 registers, 64 is the most at 1024,
and such a launch fails with 'too many resources requested for launch'): the cache is a template parameter P
(1, 2, 4, ... CACHED_PACKS packs per thread), each kernel compiled with __launch_bounds__ for the block
size its cache fits (ak::cached_threads: 1024 threads for <= ~32 cached floats, 512 for <= ~96, else 256),
and the launcher (ak::launch_cached) takes the smallest P whose kernel covers the row at no more threads than
asked and than it can launch with (cudaFuncGetAttributes); no P does: the streaming kernel. Any row length
launches, and a short row does not pay a big cache's registers. fp16 at 8 packs: 108 registers x 512.

Tunables: THREADS and PACKS_PER_THREAD are launch parameters; VEC_BYTES, CACHED_PACKS and ONE_REDUCTION
are compiled in.
"""

import functools

import torch

from autokernel.cuda import cuda_build

KERNEL_TYPE = "layernorm"
BACKEND = "cuda"

THREADS = 0  # threads per block (multiple of 32, <= 1024); 0 = auto: PACKS_PER_THREAD packs per thread
PACKS_PER_THREAD = 4  # packs per thread in the auto block size (runtime)
VEC_BYTES = 16  # bytes per vectorized load/store (compile-time): 16 = 8 fp16 or 4 fp32
CACHED_PACKS = 8  # packs per thread held in registers at most (compile-time): longer rows are read twice
ONE_REDUCTION = 0  # cached rows: 0 = the mean, then the variance; 1 = one reduction of (count, mean, M2)

TUNABLES = {
    "THREADS": [0, 128, 256, 512, 1024],
    "PACKS_PER_THREAD": [1, 2, 4, 8],
    "VEC_BYTES": [4, 8, 16],
    "CACHED_PACKS": [4, 8, 16],
    "ONE_REDUCTION": [0, 1],
}

CUDA_SRC = r"""
// P > 0: the row (at most blockDim.x * P packs, the launcher checks) is read once into a register cache of P
// packs per thread. P = 0: the row is streamed three times. Register budget: see ak::cached_threads.
template <typename T, int V, int P>
__global__ void __launch_bounds__(ak::cached_threads(P * V, 40), 1)
layernorm_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                 int64_t n, int64_t stride_x, float eps) {
  const T* xr = x + (int64_t)blockIdx.x * stride_x;
  T* yr = y + (int64_t)blockIdx.x * n;
  const int64_t packs = n / V;
  // Statistics of x - x[0]: around a large mean (1000 + N(0, 1)) an fp32 row sum of ~8e6 is off by ~1,
  // the mean by ~1e-4, and y by as much (beyond fp32's 1e-4 tolerance on "large_mean"); shifted, the
  // sum stays ~sqrt(N) and exact enough. `mean` below is that of the shifted values.
  const float shift = ak::to_f(xr[0]);
  float s = 0.f, sq = 0.f;
  if constexpr (P > 0) {
    float cache[P][V];
#pragma unroll
    for (int i = 0; i < P; ++i) {  // all P loads are issued before the first use
      const int64_t p = threadIdx.x + (int64_t)i * blockDim.x;
      if (p < packs) ak::load_pack<T, V>(xr + p * V, cache[i]);
    }
    int mine = 0;  // packs this thread holds
#pragma unroll
    for (int i = 0; i < P; ++i) {
      if (threadIdx.x + (int64_t)i * blockDim.x < packs) {
        ++mine;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          cache[i][j] -= shift;
          s += cache[i][j];
        }
      }
    }
    float mean, rstd;
    if constexpr (ONE_REDUCTION) {  // this thread's (count, mean, M2) from its registers, one merge per row
      const float count = (float)(mine * V), my_mean = mine > 0 ? s / count : 0.f;
#pragma unroll
      for (int i = 0; i < P; ++i) {
        if (i < mine) {
#pragma unroll
          for (int j = 0; j < V; ++j) sq += (cache[i][j] - my_mean) * (cache[i][j] - my_mean);
        }
      }
      const ak::MeanM2 row =
          ak::block_reduce(ak::MeanM2{count, my_mean, sq}, ak::ChanMerge(), ak::MeanM2{0.f, 0.f, 0.f});
      mean = row.mean;  // of x - shift
      rstd = rsqrtf(row.m2 / (float)n + eps);
    } else {  // the mean, then the variance around it: two block reductions
      mean = ak::block_reduce(s, ak::Sum(), 0.f) / (float)n;  // of x - shift
#pragma unroll
      for (int i = 0; i < P; ++i) {
        if (threadIdx.x + (int64_t)i * blockDim.x < packs) {
#pragma unroll
          for (int j = 0; j < V; ++j) sq += (cache[i][j] - mean) * (cache[i][j] - mean);
        }
      }
      rstd = rsqrtf(ak::block_reduce(sq, ak::Sum(), 0.f) / (float)n + eps);
    }
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t p = threadIdx.x + (int64_t)i * blockDim.x;
      if (p < packs) {
        float wv[V], bv[V], o[V];
        ak::load_pack<T, V>(w + p * V, wv);
        ak::load_pack<T, V>(b + p * V, bv);
#pragma unroll
        for (int j = 0; j < V; ++j) o[j] = (cache[i][j] - mean) * rstd * wv[j] + bv[j];
        ak::store_pack<T, V>(yr + p * V, o);
      }
    }
  } else {
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[V];
      ak::load_pack<T, V>(xr + p * V, v);
#pragma unroll
      for (int j = 0; j < V; ++j) s += v[j] - shift;
    }
    const float mean = ak::block_reduce(s, ak::Sum(), 0.f) / (float)n;  // of x - shift
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[V];
      ak::load_pack<T, V>(xr + p * V, v);
#pragma unroll
      for (int j = 0; j < V; ++j) sq += (v[j] - shift - mean) * (v[j] - shift - mean);
    }
    const float rstd = rsqrtf(ak::block_reduce(sq, ak::Sum(), 0.f) / (float)n + eps);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float v[V], wv[V], bv[V], o[V];
      ak::load_pack<T, V>(xr + p * V, v);
      ak::load_pack<T, V>(w + p * V, wv);
      ak::load_pack<T, V>(b + p * V, bv);
#pragma unroll
      for (int j = 0; j < V; ++j) o[j] = (v[j] - shift - mean) * rstd * wv[j] + bv[j];
      ak::store_pack<T, V>(yr + p * V, o);
    }
  }
}

void layernorm_launch(int dtype, int64_t x, int64_t w, int64_t b, int64_t y, int64_t rows, int64_t n,
                      int64_t stride_x, double eps, int threads, bool vectorized, int64_t stream) {
  AK_DISPATCH(dtype, {
    constexpr int V = ak::pack_width<scalar_t>(VEC_BYTES);
    const dim3 grid((unsigned)rows);
    const auto xp = ak::ptr<const scalar_t>(x), wp = ak::ptr<const scalar_t>(w), bp = ak::ptr<const scalar_t>(b);
    const auto yp = ak::ptr<scalar_t>(y);
    if (vectorized)
      ak::launch_cached<1, CACHED_PACKS>([](auto p) { return &layernorm_kernel<scalar_t, V, decltype(p)::value>; },
                                         n / V, threads, grid, ak::as_stream(stream), xp, wp, bp, yp, n, stride_x,
                                         (float)eps);
    else  // odd sizes: element loads, no cache (not the fast path)
      ak::launch_cached<0, 0>([](auto p) { return &layernorm_kernel<scalar_t, 1, decltype(p)::value>; },
                              n, threads, grid, ak::as_stream(stream), xp, wp, bp, yp, n, stride_x, (float)eps);
  });
  ak::check_launch("layernorm_kernel");
}
"""

PROTOTYPES = ["void layernorm_launch(int dtype, int64_t x, int64_t w, int64_t b, int64_t y, int64_t rows, int64_t n, "
              "int64_t stride_x, double eps, int threads, bool vectorized, int64_t stream)"]


def cuda_source() -> str:
    """The whole translation unit: shared helpers, the compile-time tunables, the kernels."""
    return cuda_build.PRELUDE + cuda_build.defines({"VEC_BYTES": VEC_BYTES, "CACHED_PACKS": CACHED_PACKS,
                                                      "ONE_REDUCTION": ONE_REDUCTION}) + CUDA_SRC


@functools.cache
def _module():
    return cuda_build.load(KERNEL_TYPE, cuda_source(), PROTOTYPES)


def kernel_fn(x, weight, bias, eps=1e-5):
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    weight, bias = weight.contiguous(), bias.contiguous()
    cuda_build.check_dtypes(x2, weight, bias)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0 or n == 0:
        return out.view(x.shape)
    width = cuda_build.pack_width(VEC_BYTES, x2)
    vec = cuda_build.vectorizable(width, n, x2, weight, bias, out)
    threads = cuda_build.block_threads(n // (width if vec else 1), PACKS_PER_THREAD, THREADS)
    _module().layernorm_launch(cuda_build.dtype_code(x2), x2.data_ptr(), weight.data_ptr(), bias.data_ptr(),
                               out.data_ptr(), rows, n, x2.stride(0), float(eps), threads, vec,
                               cuda_build.stream_of(x2))
    return out.view(x.shape)
