"""Mean cross-entropy of logits [..., V] against integer targets [...], CUDA C++ starter.

Memory-bound: one call reads the logits once (plus 8 bytes of target per row) and writes one scalar,
about N * V * element_size bytes. At 8192 x 32000 fp16 that is 524 MB: ~175 us at an H100's ~3 TB/s.

One block per row, one pass over HBM. A row of up to threads x CACHED_PACKS 16-byte packs (VEC_BYTES,
where alignment allows) is loaded whole into registers, every load issued before the first use, as raw
packs (4 registers per 16 bytes whatever the dtype): the bench's 32000-class fp16 row (64 KB) is 8 packs
per thread at 512 threads, <= 64 registers, so two rows (128 KB) are in flight per SM and one block's
reductions overlap the other's loads. From the registers each thread takes its own max m and sum of
exp(x - m), one exp per logit, and one block reduction merges the (m, sum) pairs (ONE_REDUCTION; reducing
the row max first, then the sums rescaled to it, costs two reductions with their barriers).
Thread 0 fetches the row's target and its logit while the row's loads are in flight. The cache size P is
a template parameter (1, 2, 4, ... CACHED_PACKS), picked per launch as in rmsnorm (ak::launch_cached);
longer rows and rows that cannot be vectorized take the streaming kernel: an online softmax where each
thread issues UNROLL pack loads before folding them into a running max m and sum s of exp(x - m),
rescaling s once per UNROLL packs when m grows; it is the slower path, kept for what the cache cannot hold.
loss = log(sum) + max - x[target]. Rows whose target is IGNORE_INDEX (-100, as in F.cross_entropy) count
for nothing. Per-row losses go to an fp32 buffer and a second one-block kernel takes the mean in fp64 in a
fixed order: bitwise reproducible, no atomics. exp is exp2((x - m) * log2(e)) with one ex2.approx (~1e-6
relative, far inside the 1e-4 fp32 tolerance); log is logf.

Tunables: THREADS, PACKS_PER_THREAD and MEAN_THREADS are launch parameters; VEC_BYTES, UNROLL,
CACHED_PACKS and ONE_REDUCTION are compiled in.
"""

import functools

import torch

from autokernel.cuda import cuda_build

KERNEL_TYPE = "cross_entropy"
BACKEND = "cuda"

IGNORE_INDEX = -100  # F.cross_entropy's default: padding targets are skipped
THREADS = 0  # threads per block (multiple of 32, <= 1024); 0 = auto: PACKS_PER_THREAD packs per thread
PACKS_PER_THREAD = 8  # packs per thread in the auto block size (runtime)
MEAN_THREADS = 1024  # threads of the one-block mean kernel (runtime)
VEC_BYTES = 16  # bytes per vectorized load (compile-time): 16 = 8 fp16 or 4 fp32
UNROLL = 4  # streaming kernel: pack loads issued before folding them in (compile-time): bytes in flight
CACHED_PACKS = 16  # packs per thread held in registers at most (compile-time): longer rows are streamed
ONE_REDUCTION = 1  # 1 = one block reduction of per-thread (max, sum of exp); 0 = the max, then the sum

TUNABLES = {
    "THREADS": [0, 128, 256, 512, 1024],
    "PACKS_PER_THREAD": [2, 4, 8, 16],
    "MEAN_THREADS": [256, 512, 1024],
    "VEC_BYTES": [4, 8, 16],
    "UNROLL": [1, 2, 4, 8],
    "CACHED_PACKS": [4, 8, 16],
    "ONE_REDUCTION": [0, 1],
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

// The block size a kernel caching P raw packs per thread is compiled for, and its blocks per SM: P x 4
// registers of cache plus ~30 others. P <= 4: 1024 threads x 64 registers; P = 8: 512 x 2 blocks (64
// registers, two rows per SM); P = 16: 256 x 2 (128 registers). P = 0 (streaming): 1024.
constexpr int ce_threads(int P) { return P <= 4 ? 1024 : P <= 8 ? 512 : 256; }
constexpr int ce_blocks(int P) { return P <= 4 ? 1 : 2; }

// The max of a raw pack. 16-bit types: packed __hmax2 (exact, no conversion), which also keeps ptxas from
// holding every pack converted to fp32 between the max and the exp pass (bf16 did: 216 bytes of spills).
template <typename T, int V>
__device__ __forceinline__ float pack_max(const ak::Pack<T, V>& pk) {
  if constexpr (std::is_same<T, float>::value || V % 2 != 0) {
    float m = ak::to_f(pk.v[0]);
#pragma unroll
    for (int j = 1; j < V; ++j) m = fmaxf(m, ak::to_f(pk.v[j]));
    return m;
  } else {
    auto pair = [&](int j) {
      if constexpr (std::is_same<T, __half>::value) return __halves2half2(pk.v[2 * j], pk.v[2 * j + 1]);
      else return __halves2bfloat162(pk.v[2 * j], pk.v[2 * j + 1]);
    };
    auto m = pair(0);
#pragma unroll
    for (int j = 1; j < V / 2; ++j) m = __hmax2(m, pair(j));
    return fmaxf(ak::to_f(m.x), ak::to_f(m.y));
  }
}

// An empty asm that "changes" a cached pack's words: the exp pass's conversions cannot move above it. Without it
// ptxas converts every cached bf16 value to fp32 (one shift each) right after its load, doubling the cache's
// registers (P = 8: 168 bytes of spills).
template <typename T, int V>
__device__ __forceinline__ void pin(ak::Pack<T, V>& pk) {
  if constexpr (sizeof(pk) % 4 == 0) {
    unsigned* w = reinterpret_cast<unsigned*>(&pk);
#pragma unroll
    for (int k = 0; k < (int)(sizeof(pk) / 4); ++k) asm volatile("" : "+r"(w[k]));
  }
}

// The row's target and its logit, fetched by thread 0 right after the row's loads are issued: the two
// dependent loads overlap the row's instead of following its reductions. The first round read them at the end.
struct Target {
  float logit;
  bool counted;
};
template <typename T>
__device__ __forceinline__ Target fetch_target(const T* xr, const int64_t* targets, int64_t row, int64_t n_classes,
                                               int64_t ignore_index) {
  if (threadIdx.x != 0) return {0.f, false};
  const int64_t t = targets[row];
  const bool counted = t != ignore_index && t >= 0 && t < n_classes;
  return {counted ? ak::to_f(xr[t]) : 0.f, counted};
}

// One block per row. P > 0: the row (at most blockDim.x * P packs, the launcher checks) is loaded into P raw
// packs per thread, all loads first; max, then sum of exp(x - max), from the registers. P = 0: streamed, each
// thread issuing UNROLL pack loads before folding them into its online (max, sum). Either way every thread
// ends with its own (max m, sum s of exp(x - m)); ONE_REDUCTION merges them in one block reduction
// (ak::SoftmaxMerge), else the row max is reduced first and the sums, rescaled to it, next. Registers: ptxas,
// see ce_threads.
template <typename T, int V, int P>
__global__ void __launch_bounds__(ce_threads(P), ce_blocks(P)) cross_entropy_kernel(
    const T* __restrict__ x, const int64_t* __restrict__ targets, float* __restrict__ loss,
    float* __restrict__ valid, int64_t n_classes, int64_t stride_x, int64_t ignore_index) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * stride_x;
  const int64_t packs = n_classes / V;
  float m = -INFINITY, s = 0.f;  // this thread's max and sum of exp(x - m)
  Target target;
  if constexpr (P > 0) {
    ak::Pack<T, V> raw[P];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t p = threadIdx.x + (int64_t)i * blockDim.x;
      if (p < packs) raw[i] = ak::load_raw<T, V>(xr + p * V);
    }
    target = fetch_target(xr, targets, row, n_classes, ignore_index);
#pragma unroll
    for (int i = 0; i < P; ++i) {
      if (threadIdx.x + (int64_t)i * blockDim.x < packs) {
        m = fmaxf(m, pack_max(raw[i]));
      }
    }
    if constexpr (!ONE_REDUCTION) m = ak::block_reduce(m, ak::Max(), -INFINITY);  // the sums below share it
#pragma unroll
    for (int i = 0; i < P; ++i) pin(raw[i]);
    if (m != -INFINITY) {  // all -inf: the sum is 0 (the loss then NaN, as torch's)
#pragma unroll
      for (int i = 0; i < P; ++i) {
        if (threadIdx.x + (int64_t)i * blockDim.x < packs) {
#pragma unroll
          for (int j = 0; j < V; ++j) s += ak::exp2_approx((ak::to_f(raw[i].v[j]) - m) * ak::LOG2E);
        }
      }
    }
  } else {
    target = fetch_target(xr, targets, row, n_classes, ignore_index);
    const int64_t step = blockDim.x;
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
  }
  float row_max, total;
  if constexpr (ONE_REDUCTION) {
    const ak::MaxSumExp merged =
        ak::block_reduce(ak::MaxSumExp{m, s}, ak::SoftmaxMerge(), ak::MaxSumExp{-INFINITY, 0.f});
    row_max = merged.m;
    total = merged.s;
  } else {
    row_max = P > 0 ? m : ak::block_reduce(m, ak::Max(), -INFINITY);
    const float mine = P > 0 || m == -INFINITY ? s : s * ak::exp2_approx((m - row_max) * ak::LOG2E);
    total = ak::block_reduce(mine, ak::Sum(), 0.f);
  }
  if (threadIdx.x == 0) {  // loss = log(sum) + max - x[target]
    loss[row] = target.counted ? logf(total) + row_max - target.logit : 0.f;
    valid[row] = target.counted ? 1.f : 0.f;
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
      const dim3 grid((unsigned)rows);
      const auto xp = ak::ptr<const scalar_t>(x);
      const auto tp = ak::ptr<const int64_t>(targets);
      const auto lp = ak::ptr<float>(loss), vp = ak::ptr<float>(valid);
      if (vectorized)
        ak::launch_cached<1, CACHED_PACKS>(
            [](auto p) { return &cross_entropy_kernel<scalar_t, V, decltype(p)::value>; }, n_classes / V, threads,
            grid, s, xp, tp, lp, vp, n_classes, stride_x, ignore_index);
      else  // odd vocabularies: element loads, streamed (not the fast path)
        ak::launch_cached<0, 0>([](auto p) { return &cross_entropy_kernel<scalar_t, 1, decltype(p)::value>; },
                                n_classes, threads, grid, s, xp, tp, lp, vp, n_classes, stride_x, ignore_index);
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
    tunables = {"VEC_BYTES": VEC_BYTES, "UNROLL": UNROLL, "CACHED_PACKS": CACHED_PACKS,
                "ONE_REDUCTION": ONE_REDUCTION}
    return cuda_build.PRELUDE + cuda_build.defines(tunables) + CUDA_SRC


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
