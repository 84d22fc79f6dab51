"""Mean cross-entropy of logits [..., V] against integer targets [...], CUDA C++ starter.

Memory-bound: one call reads the logits once (plus 8 bytes of target per row) and writes one scalar,
about N * V * element_size bytes. At 8192 x 32000 fp16 that is 524 MB: ~175 us at an H100's ~3 TB/s.

One block per row, one pass over the vocabulary with an online softmax: each thread issues UNROLL
16-byte pack loads (VEC_BYTES, where alignment allows; else single elements) before using any, then folds
them into a running max m and a running sum s of exp(x - m), rescaling s once per UNROLL packs when m
grows; the block then combines (max, then rescaled sums) with warp shuffles and shared memory.
loss = log(sum) + max - x[target]. Rows whose target is IGNORE_INDEX (-100, as in F.cross_entropy) count
for nothing. Per-row losses go to an fp32 buffer and a second one-block kernel takes the mean in fp64 in a
fixed order: bitwise reproducible, no atomics. exp is exp2((x - m) * log2(e)) with one ex2.approx (~1e-6
relative, far inside the 1e-4 fp32 tolerance); log is logf.

Tunables: THREADS, PACKS_PER_THREAD and MEAN_THREADS are launch parameters; VEC_BYTES and UNROLL are
compiled in.
"""

import functools

import torch

from autokernel import cuda_build

KERNEL_TYPE = "cross_entropy"
BACKEND = "cuda"

IGNORE_INDEX = -100  # F.cross_entropy's default: padding targets are skipped
THREADS = 0  # threads per block (multiple of 32, <= 1024); 0 = auto: PACKS_PER_THREAD packs per thread
PACKS_PER_THREAD = 8  # packs per thread in the auto block size (runtime)
MEAN_THREADS = 1024  # threads of the one-block mean kernel (runtime)
VEC_BYTES = 16  # bytes per vectorized load (compile-time): 16 = 8 fp16 or 4 fp32
UNROLL = 4  # pack loads each thread issues before folding them in (compile-time): bytes in flight per thread

TUNABLES = {
    "THREADS": [0, 128, 256, 512, 1024],
    "PACKS_PER_THREAD": [2, 4, 8, 16],
    "MEAN_THREADS": [256, 512, 1024],
    "VEC_BYTES": [4, 8, 16],
    "UNROLL": [1, 2, 4, 8],
}

CUDA_SRC = r"""
// Folds `count` values into the running (max m, sum s of exp(x - m)): one rescale for all of them.
// exp(x - m) = exp2((x - m) * log2(e)) with one ex2.approx: x - m first, exactly 0 at the max (an FMA
// x * log2(e) - m * log2(e) leaves a residual of ~ulp(m), which overflows exp for huge logits).
template <int U, int V>
__device__ __forceinline__ void online_add(const float (&v)[U][V], float& m, float& s) {
  float pm = v[0][0];
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int j = 0; j < V; ++j) pm = fmaxf(pm, v[u][j]);
  }
  if (pm > m) {
    s *= ak::exp2_approx((m - pm) * ak::LOG2E);  // m = -inf: s is 0 and stays 0
    m = pm;
  }
  if (m != -INFINITY) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < V; ++j) s += ak::exp2_approx((v[u][j] - m) * ak::LOG2E);
    }
  }
}

// One block per row. Each thread issues UNROLL pack loads before folding them in (UNROLL x 16 bytes in
// flight per thread). Registers: ~40 at UNROLL 4; __launch_bounds__(1024) caps them at 64.
template <typename T, int V>
__global__ void __launch_bounds__(1024) cross_entropy_kernel(const T* __restrict__ x,
                                                             const int64_t* __restrict__ targets,
                                                             float* __restrict__ loss, float* __restrict__ valid,
                                                             int64_t n_classes, int64_t stride_x,
                                                             int64_t ignore_index) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * stride_x;
  const int64_t packs = n_classes / V;
  const int64_t step = blockDim.x;
  float m = -INFINITY, s = 0.f;
  int64_t p = threadIdx.x;
  for (; p + (UNROLL - 1) * step < packs; p += UNROLL * step) {
    float v[UNROLL][V];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) ak::load_pack<T, V>(xr + (p + u * step) * V, v[u]);
    online_add(v, m, s);
  }
  for (; p < packs; p += step) {
    float v[1][V];
    ak::load_pack<T, V>(xr + p * V, v[0]);
    online_add(v, m, s);
  }
  const float row_max = ak::block_reduce(m, ak::Max(), -INFINITY);
  const float mine = m == -INFINITY ? 0.f : s * ak::exp2_approx((m - row_max) * ak::LOG2E);
  const float total = ak::block_reduce(mine, ak::Sum(), 0.f);
  if (threadIdx.x == 0) {
    const int64_t t = targets[row];
    const bool counted = t != ignore_index && t >= 0 && t < n_classes;
    loss[row] = counted ? logf(total) + row_max - ak::to_f(xr[t]) : 0.f;
    valid[row] = counted ? 1.f : 0.f;
  }
}

template <typename T>
__global__ void __launch_bounds__(1024) cross_entropy_mean_kernel(const float* __restrict__ loss,
                                                                  const float* __restrict__ valid,
                                                                  T* __restrict__ out, int64_t rows) {
  double s = 0.0, c = 0.0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    s += (double)loss[i];
    c += (double)valid[i];
  }
  const double total = ak::block_reduce(s, ak::Sum(), 0.0);
  const double count = ak::block_reduce(c, ak::Sum(), 0.0);
  if (threadIdx.x == 0) out[0] = ak::from_f<T>((float)(total / count));  // no counted row: 0/0 = NaN, as torch
}

void cross_entropy_launch(int dtype, int64_t x, int64_t targets, int64_t loss, int64_t valid, int64_t out,
                          int64_t rows, int64_t n_classes, int64_t stride_x, int64_t ignore_index, int threads,
                          int mean_threads, bool vectorized, int64_t stream) {
  AK_DISPATCH(dtype, {
    constexpr int V = ak::pack_width<scalar_t>(VEC_BYTES);
    const cudaStream_t s = ak::as_stream(stream);
    if (rows > 0) {
      auto go = [&](auto kernel) {
        kernel<<<dim3((unsigned)rows), ak::fit_threads(kernel, threads), 0, s>>>(
            ak::ptr<const scalar_t>(x), ak::ptr<const int64_t>(targets), ak::ptr<float>(loss), ak::ptr<float>(valid),
            n_classes, stride_x, ignore_index);
      };
      if (vectorized) go(&cross_entropy_kernel<scalar_t, V>);
      else go(&cross_entropy_kernel<scalar_t, 1>);
      ak::check_launch("cross_entropy_kernel");
    }
    auto mean = &cross_entropy_mean_kernel<scalar_t>;
    mean<<<1, ak::fit_threads(mean, mean_threads), 0, s>>>(
        ak::ptr<const float>(loss), ak::ptr<const float>(valid), ak::ptr<scalar_t>(out), rows);
  });
  ak::check_launch("cross_entropy_mean_kernel");
}
"""

PROTOTYPES = ["void cross_entropy_launch(int dtype, int64_t x, int64_t targets, int64_t loss, int64_t valid, "
              "int64_t out, int64_t rows, int64_t n_classes, int64_t stride_x, int64_t ignore_index, int threads, "
              "int mean_threads, bool vectorized, int64_t stream)"]


def cuda_source() -> str:
    """The whole translation unit: shared helpers, the compile-time tunables, the kernels."""
    return cuda_build.PRELUDE + cuda_build.defines({"VEC_BYTES": VEC_BYTES, "UNROLL": UNROLL}) + CUDA_SRC


@functools.cache
def _module():
    return cuda_build.load(KERNEL_TYPE, cuda_source(), PROTOTYPES)


def kernel_fn(logits, targets):
    v = logits.shape[-1]
    logits2 = logits.reshape(-1, v)
    if logits2.stride(-1) != 1:
        logits2 = logits2.contiguous()
    cuda_build.check_dtypes(logits2)
    targets1 = targets.reshape(-1).to(torch.int64).contiguous()
    rows = logits2.shape[0]
    out = torch.empty((), dtype=logits.dtype, device=logits.device)
    losses = torch.empty((max(rows, 1),), dtype=torch.float32, device=logits.device)
    valid = torch.empty((max(rows, 1),), dtype=torch.float32, device=logits.device)
    width = cuda_build.pack_width(VEC_BYTES, logits2)
    vec = cuda_build.vectorizable(width, v, logits2)
    threads = cuda_build.block_threads(v // (width if vec else 1), PACKS_PER_THREAD, THREADS)
    mean_threads = cuda_build.block_threads(1, 1, MEAN_THREADS)
    _module().cross_entropy_launch(cuda_build.dtype_code(logits2), logits2.data_ptr(), targets1.data_ptr(),
                                   losses.data_ptr(), valid.data_ptr(), out.data_ptr(), rows, v, logits2.stride(0),
                                   IGNORE_INDEX, threads, mean_threads, vec, cuda_build.stream_of(logits2))
    return out
