"""Residual add + RMSNorm, CUDA C++ starter: s = x + residual, y = s * rsqrt(mean(s^2) + eps) * weight; (s, y).

Memory-bound: one call reads x and residual and writes s and y, 4 * M * N * element_size bytes (plus N for
the weight, which stays in L2). At 16384x4096 fp16 that is 537 MB: ~110 us at an H200's ~4.8 TB/s.

Built as kernels/cuda/rmsnorm.py is (see its docstring): one block per row, 16-byte packs where the sizes
and pointers allow, a row of up to threads x CACHED_PACKS packs held in registers (the sum, rounded to the
input dtype as eager rounds it before its norm), else streamed: the sum written in the first pass and read
back (from L2) in the second. Sums in fp32 in a fixed order: bitwise reproducible.

Tunables: THREADS and PACKS_PER_THREAD are launch parameters; VEC_BYTES and CACHED_PACKS are compiled in.
"""

import functools

import torch

from autokernel import cuda_build

KERNEL_TYPE = "add_rmsnorm"
BACKEND = "cuda"

THREADS = 0  # threads per block (multiple of 32, <= 1024); 0 = auto: PACKS_PER_THREAD packs per thread
PACKS_PER_THREAD = 2  # packs per thread in the auto block size (runtime)
VEC_BYTES = 16  # bytes per vectorized load/store (compile-time): 16 = 8 fp16 or 4 fp32
CACHED_PACKS = 8  # packs per thread held in registers at most (compile-time): longer rows are streamed

TUNABLES = {
    "THREADS": [0, 128, 256, 512, 1024],
    "PACKS_PER_THREAD": [1, 2, 4, 8],
    "VEC_BYTES": [4, 8, 16],
    "CACHED_PACKS": [4, 8, 16],
}

CUDA_SRC = r"""
// x + r in fp32, rounded to T: the sum eager stores and then normalizes
template <typename T, int V> __device__ __forceinline__ void add_rounded(const float (&x)[V], const float (&r)[V],
                                                                         float (&s)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) s[j] = ak::to_f(ak::from_f<T>(x[j] + r[j]));
}

template <typename T, int V, int P>
__global__ void __launch_bounds__(ak::cached_threads(P * V, 48), 1)  // + x and residual packs in flight
add_rmsnorm_kernel(const T* __restrict__ x, const T* __restrict__ r, const T* __restrict__ w, T* __restrict__ s,
                   T* __restrict__ y, int64_t n, int64_t stride_x, int64_t stride_r, float eps) {
  const T* xr = x + (int64_t)blockIdx.x * stride_x;
  const T* rr = r + (int64_t)blockIdx.x * stride_r;
  T* sr = s + (int64_t)blockIdx.x * n;
  T* yr = y + (int64_t)blockIdx.x * n;
  const int64_t packs = n / V;
  float ss = 0.f;
  if constexpr (P > 0) {
    float cache[P][V];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t p = threadIdx.x + (int64_t)i * blockDim.x;
      if (p < packs) {
        float xv[V], rv[V];
        ak::load_pack<T, V>(xr + p * V, xv);
        ak::load_pack<T, V>(rr + p * V, rv);
        add_rounded<T, V>(xv, rv, cache[i]);
        ak::store_pack<T, V>(sr + p * V, cache[i]);
#pragma unroll
        for (int j = 0; j < V; ++j) ss += cache[i][j] * cache[i][j];
      }
    }
    const float rstd = rsqrtf(ak::block_reduce(ss, ak::Sum(), 0.f) / (float)n + eps);
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t p = threadIdx.x + (int64_t)i * blockDim.x;
      if (p < packs) {
        float wv[V], o[V];
        ak::load_pack<T, V>(w + p * V, wv);
#pragma unroll
        for (int j = 0; j < V; ++j) o[j] = cache[i][j] * rstd * wv[j];
        ak::store_pack<T, V>(yr + p * V, o);
      }
    }
  } else {
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float xv[V], rv[V], sv[V];
      ak::load_pack<T, V>(xr + p * V, xv);
      ak::load_pack<T, V>(rr + p * V, rv);
      add_rounded<T, V>(xv, rv, sv);
      ak::store_pack<T, V>(sr + p * V, sv);
#pragma unroll
      for (int j = 0; j < V; ++j) ss += sv[j] * sv[j];
    }
    // each thread reads back the packs it wrote itself (the same p): no other thread's write to wait for
    const float rstd = rsqrtf(ak::block_reduce(ss, ak::Sum(), 0.f) / (float)n + eps);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      float sv[V], wv[V], o[V];
      ak::load_pack<T, V>(sr + p * V, sv);
      ak::load_pack<T, V>(w + p * V, wv);
#pragma unroll
      for (int j = 0; j < V; ++j) o[j] = sv[j] * rstd * wv[j];
      ak::store_pack<T, V>(yr + p * V, o);
    }
  }
}

void add_rmsnorm_launch(int dtype, int64_t x, int64_t r, int64_t w, int64_t s, int64_t y, int64_t rows, int64_t n,
                        int64_t stride_x, int64_t stride_r, double eps, int threads, bool vectorized,
                        int64_t stream) {
  AK_DISPATCH(dtype, {
    constexpr int V = ak::pack_width<scalar_t>(VEC_BYTES);
    const dim3 grid((unsigned)rows);
    const auto xp = ak::ptr<const scalar_t>(x), rp = ak::ptr<const scalar_t>(r), wp = ak::ptr<const scalar_t>(w);
    const auto sp = ak::ptr<scalar_t>(s), yp = ak::ptr<scalar_t>(y);
    if (vectorized)
      ak::launch_cached<1, CACHED_PACKS>(
          [](auto p) { return &add_rmsnorm_kernel<scalar_t, V, decltype(p)::value>; }, n / V, threads, grid,
          ak::as_stream(stream), xp, rp, wp, sp, yp, n, stride_x, stride_r, (float)eps);
    else  // odd sizes: element loads, no cache (not the fast path)
      ak::launch_cached<0, 0>([](auto p) { return &add_rmsnorm_kernel<scalar_t, 1, decltype(p)::value>; }, n,
                              threads, grid, ak::as_stream(stream), xp, rp, wp, sp, yp, n, stride_x, stride_r,
                              (float)eps);
  });
  ak::check_launch("add_rmsnorm_kernel");
}
"""

PROTOTYPES = ["void add_rmsnorm_launch(int dtype, int64_t x, int64_t r, int64_t w, int64_t s, int64_t y, int64_t rows, "
              "int64_t n, int64_t stride_x, int64_t stride_r, double eps, int threads, bool vectorized, int64_t stream)"]


def cuda_source() -> str:
    """The whole translation unit: shared helpers, the compile-time tunables, the kernels."""
    return cuda_build.PRELUDE + cuda_build.defines({"VEC_BYTES": VEC_BYTES, "CACHED_PACKS": CACHED_PACKS}) + CUDA_SRC


@functools.cache
def _module():
    return cuda_build.load(KERNEL_TYPE, cuda_source(), PROTOTYPES)


def _rows(t, n: int):
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def kernel_fn(x, residual, weight, eps=1e-6):
    n = x.shape[-1]
    x2, r2 = _rows(x, n), _rows(residual, n)
    weight = weight.contiguous()
    cuda_build.check_dtypes(x2, r2, weight)
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = x2.shape[0]
    if rows == 0 or n == 0:
        return total, out
    width = cuda_build.pack_width(VEC_BYTES, x2)
    vec = cuda_build.vectorizable(width, n, x2, r2, weight, total, out)
    threads = cuda_build.block_threads(n // (width if vec else 1), PACKS_PER_THREAD, THREADS)
    _module().add_rmsnorm_launch(cuda_build.dtype_code(x2), x2.data_ptr(), r2.data_ptr(), weight.data_ptr(),
                                 total.data_ptr(), out.data_ptr(), rows, n, x2.stride(0), r2.stride(0), float(eps),
                                 threads, vec, cuda_build.stream_of(x2))
    return total, out
