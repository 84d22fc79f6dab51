"""The device helpers every CUDA kernel source of kernels/cuda/ starts with (autokernel.cuda.cuda_build
prepends them, so they are part of each source and of its hash). Plain CUDA C++, no torch headers.
"""

PRELUDE = r"""
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>

namespace ak {
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// V elements moved as one aligned load/store (16 bytes: ld.global.v4) when the caller checked alignment.
template <typename T, int V> struct alignas(sizeof(T) * V) Pack { T v[V]; };
template <typename T> constexpr int pack_width(int bytes) {
  return bytes / (int)sizeof(T) > 0 ? bytes / (int)sizeof(T) : 1;
}

// load_raw: the pack unconverted. A row cache of raw packs costs 4 registers per 16 bytes whatever the dtype
// (a converted fp16 pack would cost 8), so twice the bytes can be in flight per thread.
// STREAM: ld.global.cs, "cache streaming": the line is allocated evict-first in L1 and L2, for data read once.
// New lines then replace each other rather than what the L2 held before (dirty lines of earlier kernels
// included, whose write-back a plain read-only stream would pay for).
template <typename T, int V, bool STREAM = false> __device__ __forceinline__ Pack<T, V> load_raw(const T* p) {
  using P = Pack<T, V>;
  if constexpr (STREAM) {  // __ldcs takes the built-in type of the pack's size (16, 8, 4 or 2 bytes)
    using W = std::conditional_t<sizeof(P) == 16, int4, std::conditional_t<sizeof(P) == 8, int2,
              std::conditional_t<sizeof(P) == 4, int, unsigned short>>>;
    static_assert(sizeof(W) == sizeof(P), "no streaming load of this pack size");
    const W r = __ldcs(reinterpret_cast<const W*>(p));
    return *reinterpret_cast<const P*>(&r);
  } else {
    return *reinterpret_cast<const P*>(p);
  }
}

template <typename T, int V, bool STREAM = false> __device__ __forceinline__ void load_pack(const T* p,
                                                                                          float (&out)[V]) {
  const Pack<T, V> pk = load_raw<T, V, STREAM>(p);
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = to_f(pk.v[i]);
}
template <typename T, int V> __device__ __forceinline__ void store_pack(T* p, const float (&in)[V]) {
  Pack<T, V> pk;
#pragma unroll
  for (int i = 0; i < V; ++i) pk.v[i] = from_f<T>(in[i]);
  *reinterpret_cast<Pack<T, V>*>(p) = pk;
}

struct Sum { template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return a + b; } };
struct Max { template <typename A> __device__ __forceinline__ A operator()(A a, A b) const { return fmax(a, b); } };

// Summaries that one block_reduce combines in a single pass where two reductions would otherwise follow each
// other, each with its barriers: a row's (count, mean, M2) for its variance (ChanMerge) and its (max, sum of
// exp(x - max)) for a softmax (SoftmaxMerge). Shuffled field by field.
struct MeanM2 { float n, mean, m2; };
struct MaxSumExp { float m, s; };

template <typename A> __device__ __forceinline__ A shfl_xor(A v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ MeanM2 shfl_xor(MeanM2 v, int o) {
  return {shfl_xor(v.n, o), shfl_xor(v.mean, o), shfl_xor(v.m2, o)};
}
__device__ __forceinline__ MaxSumExp shfl_xor(MaxSumExp v, int o) { return {shfl_xor(v.m, o), shfl_xor(v.s, o)}; }

// A butterfly: every lane ends with the reduction. The merges above are not bitwise commutative, so their lanes
// may differ in the last bits; block_reduce uses lane 0's alone, which keeps the result reproducible.
template <typename A, typename Op> __device__ __forceinline__ A warp_reduce(A v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
  return v;
}

// Every thread of the block calls it (blockDim.x a multiple of 32, <= 1024); the order is fixed, so the
// result is bitwise reproducible (no atomics). Returns the reduction to every thread.
template <typename A, typename Op> __device__ A block_reduce(A v, Op op, A identity) {
  __shared__ A partial[33];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // a previous call may still be reading partial[32]
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (int)(blockDim.x >> 5) ? partial[lane] : identity;
    v = warp_reduce(v, op);
    if (lane == 0) partial[32] = v;
  }
  __syncthreads();
  return partial[32];
}

// 2^x in one MUFU instruction (ex2.approx, ~2 ulp; -inf -> +0): exp(x - m) = exp2_approx((x - m) * LOG2E).
// Subtract first: x * LOG2E - m * LOG2E as one FMA leaves a residual of ~ulp(m), which overflows for huge m.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float LOG2E = 1.4426950408889634f;

// Chan, Golub and LeVeque's pairwise update of (count, mean, sum of squared deviations): stable where
// E[x^2] - E[x]^2 cancels; an empty side (n = 0) leaves the other unchanged. The division is the fast one
// (__fdividef, 2 ulp): ten merges in a row sit on every block's critical path, where IEEE divisions made
// LayerNorm far slower than two plain sum reductions.
struct ChanMerge {
  __device__ __forceinline__ MeanM2 operator()(MeanM2 a, MeanM2 b) const {
    const float n = a.n + b.n;
    if (n == 0.f) return a;
    const float d = b.mean - a.mean, f = __fdividef(b.n, n);
    return {n, a.mean + d * f, a.m2 + b.m2 + d * d * a.n * f};
  }
};
// Two (max, sum of exp(x - max)) into one, each sum rescaled to the common max; all -inf stays (-inf, 0).
struct SoftmaxMerge {
  __device__ __forceinline__ MaxSumExp operator()(MaxSumExp a, MaxSumExp b) const {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.f};
    return {m, a.s * exp2_approx((a.m - m) * LOG2E) + b.s * exp2_approx((b.m - m) * LOG2E)};
  }
};

// The block size a kernel that keeps `floats` fp32 values per thread in registers is compiled for
// (its __launch_bounds__): an SM has 65536 registers, so 1024 threads may use 64 registers each, 512 may
// use 128 and 256 may use 255; ~40 registers go to addresses, loop state and the reduction besides the cache.
constexpr int cached_threads(int floats, int others = 32) {
  return floats + others <= 64 ? 1024 : floats + others <= 128 ? 512 : 256;
}

// At most `want` threads, and no more than `kernel` can launch with (cudaFuncGetAttributes: its registers and
// __launch_bounds__), a multiple of 32. Asked once per kernel; the answer is the same on every GPU of one arch.
template <typename K> inline int fit_threads(K* kernel, int want) {
  static std::mutex mu;
  static std::unordered_map<const void*, int> most;
  std::lock_guard<std::mutex> lock(mu);
  auto it = most.find(reinterpret_cast<const void*>(kernel));
  if (it == most.end()) {
    cudaFuncAttributes a;
    if (cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(kernel)) != cudaSuccess)
      throw std::runtime_error(std::string("cudaFuncGetAttributes failed: ") + cudaGetErrorString(cudaGetLastError()));
    it = most.emplace(reinterpret_cast<const void*>(kernel), a.maxThreadsPerBlock & ~31).first;
  }
  return want < it->second ? want : it->second;
}

// Launches a row kernel with the smallest register cache that holds a row: pick(std::integral_constant<int, P>)
// gives the kernel caching P packs per thread (P = 0: the streaming kernel, which reads the row again instead).
// P runs over 1, 2, 4, ... MAXP; the first whose kernel, at no more than `threads` threads and no more than it
// can launch with, covers all `packs` is launched; none does: the streaming kernel. So any row length launches,
// and a short row does not pay the registers (and the lost occupancy) of a big cache.
template <int P, int MAXP, typename Pick, typename... Args>
void launch_cached(Pick pick, int64_t packs, int threads, dim3 grid, cudaStream_t s, Args... args) {
  if constexpr (P == 0 || P > MAXP) {
    auto k = pick(std::integral_constant<int, 0>());
    k<<<grid, fit_threads(k, threads), 0, s>>>(args...);
  } else {
    auto k = pick(std::integral_constant<int, P>());
    const int t = fit_threads(k, threads);
    if (packs <= (int64_t)t * P)
      k<<<grid, t, 0, s>>>(args...);
    else
      launch_cached<P * 2, MAXP>(pick, packs, threads, grid, s, args...);
  }
}

// ---- the GEMM pipeline's plumbing (kernels/cuda/matmul.py, fused_mlp.py); templates, so that a kernel that
// does not use them does not compile them (cp.async needs sm_80) ----
// One 16-byte global -> shared copy that bypasses L1 (cp.async.cg); in_bounds false writes 16 zero bytes and
// reads nothing (src must still be a valid address: pass the matrix base).
template <typename T> __device__ __forceinline__ void cp_async16(T* dst, const T* src, bool in_bounds) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(in_bounds ? 16 : 0));
}
template <int UNUSED = 0> __device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// 8 values to p[0..8) of a row of `n` elements from `col`: one st.global.v4 when `vec` (p 16-byte aligned) and
// all 8 are inside the row, else bounds-checked element stores (ptxas split a Pack assignment into element
// stores in the GEMM epilogues, hence the explicit instruction).
template <typename T> __device__ __forceinline__ void store8(T* p, int64_t col, int64_t n, bool vec,
                                                             const float (&v)[8]) {
  Pack<T, 8> pk;
#pragma unroll
  for (int k = 0; k < 8; ++k) pk.v[k] = from_f<T>(v[k]);
  if (vec && col + 8 <= n) {
    const uint4 bits = *reinterpret_cast<const uint4*>(&pk);
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(bits.x), "r"(bits.y), "r"(bits.z),
                 "r"(bits.w) : "memory");
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (col + k < n) p[k] = pk.v[k];
  }
}

// Output tile (bm, bn) of a 1-D grid of BM x BN tiles: GROUP block rows at a time, down each column of blocks,
// so that the blocks running together share their B tiles (and A tiles across groups) in L2.
template <int BM, int BN, int GROUP> __device__ __forceinline__ void tile_of_block(int64_t M, int64_t N, int& bm,
                                                                                    int& bn) {
  const int num_m = (int)((M + BM - 1) / BM), num_n = (int)((N + BN - 1) / BN);
  const int per_group = GROUP * num_n, group = (int)blockIdx.x / per_group;
  const int first_m = group * GROUP, size = num_m - first_m < GROUP ? num_m - first_m : GROUP;
  const int within = (int)blockIdx.x - group * per_group;
  bm = first_m + within % size;
  bn = within / size;
}

// This thread's share (of THREADS) of one operand's ROWS x COLS tile, copied by cp.async 8 elements at a time
// into a stage with rows of `ld_tile` elements. Its chunks lie in one column of chunks, ROW_STEP rows apart,
// so one pointer and a few integers describe them all (per-chunk 64-bit addresses cost the pipelined GEMM
// its register budget). K_ROWS: the tile's rows run along K (a row-major B), else its columns do (A, an
// nn.Linear weight). Chunks past K or past the other dimension's `extent` are zero-filled (ld, the base
// pointer and the extent of the contiguous dimension: multiples of 8 elements).
template <typename T, int ROWS, int COLS, bool K_ROWS, int THREADS>
struct AsyncTile {
  static constexpr int PER_ROW = COLS / 8, CHUNKS = ROWS * PER_ROW, ROW_STEP = THREADS / PER_ROW;
  static constexpr int PER_THREAD = (CHUNKS + THREADS - 1) / THREADS;
  static_assert(THREADS % PER_ROW == 0, "a tile row must split evenly over the threads");
  const T* base;    // the matrix (a valid address for the zero-filling copies)
  const T* src;     // this thread's first chunk at k0 = 0
  int64_t step;     // elements between this thread's consecutive chunks
  int64_t k_step;   // elements between consecutive k
  int64_t room;     // rows (K_ROWS: columns) left inside the matrix from this thread's first chunk
  int dst, r, c;    // first chunk's offset in a stage, its row and column within the tile
  int ldd;

  __device__ __forceinline__ AsyncTile(const T* m, int64_t ld, int ld_tile, int64_t start, int64_t extent)
      : base(m), step(ROW_STEP * ld), k_step(K_ROWS ? ld : 1), ldd(ld_tile) {
    r = threadIdx.x / PER_ROW;
    c = (threadIdx.x % PER_ROW) * 8;
    dst = r * ld_tile + c;
    room = K_ROWS ? extent - start - c : extent - start - r;
    src = K_ROWS ? m + (int64_t)r * ld + start + c : m + (start + r) * ld + c;
  }
  __device__ __forceinline__ void copy(T* stage, int64_t k0, int64_t K) const {
#pragma unroll
    for (int it = 0; it < PER_THREAD; ++it) {
      if (CHUNKS % THREADS != 0 && (int)threadIdx.x + it * THREADS >= CHUNKS) break;  // more threads than chunks
      const int row = it * ROW_STEP;  // this chunk's row, relative to the first
      const bool ok = K_ROWS ? room > 0 && k0 + r + row < K : row < room && k0 + c < K;
      cp_async16(stage + dst + row * ldd, ok ? src + it * step + k0 * k_step : base, ok);
    }
  }
};

// Lets `kernel` launch with `bytes` of dynamic shared memory (above 48 KB it must ask), once per kernel and
// device: the attribute is per device, and a process may drive several GPUs.
template <typename K> inline void allow_shared_memory(K* kernel, int bytes) {
  static std::mutex mu;
  static std::unordered_map<const void*, uint64_t> done;  // kernel -> bit mask of the devices done
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) throw std::runtime_error("cudaGetDevice failed");
  std::lock_guard<std::mutex> lock(mu);
  uint64_t& mask = done[reinterpret_cast<const void*>(kernel)];
  const uint64_t bit = uint64_t(1) << (device & 63);
  if (mask & bit) return;
  const cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed: ") +
                             cudaGetErrorString(e));
  mask |= bit;
}

inline cudaStream_t as_stream(int64_t s) { return reinterpret_cast<cudaStream_t>(s); }
template <typename T> inline T* ptr(int64_t p) { return reinterpret_cast<T*>(p); }
inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + " launch failed: " + cudaGetErrorString(e));
}
}  // namespace ak

// Runs the block with scalar_t bound to the element type of a launcher's dtype code.
#define AK_DISPATCH(code, ...)                                                    \
  switch (code) {                                                                 \
    case 0: { using scalar_t = float; __VA_ARGS__; } break;                       \
    case 1: { using scalar_t = __half; __VA_ARGS__; } break;                      \
    case 2: { using scalar_t = __nv_bfloat16; __VA_ARGS__; } break;               \
    default: throw std::invalid_argument("dtype code must be 0 (fp32), 1 (fp16) or 2 (bf16)"); \
  }
"""
