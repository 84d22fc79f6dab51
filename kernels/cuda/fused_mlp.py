"""Fused SwiGLU MLP, CUDA C++ starter: out = (silu(x @ w_gate^T) * (x @ w_up^T)) @ w_down^T.

Compute-bound: 6 * T * H * I FLOPs (283 GFLOP at T=4096, H=2048, I=5632), moving at least
(2 * T * H + 3 * H * I) * element_size bytes. x is [..., T, H] (leading dims folded into T); w_gate and
w_up are [I, H], w_down [H, I], nn.Linear-shaped, i.e. each "A @ W^T" reads W as a column-major B.

Two kernels on tensor cores (nvcuda::wmma 16x16x16, fp32 accumulate) for fp16/bf16:
  phase 1  h = silu(x @ w_gate^T) * (x @ w_up^T): each x tile feeds two accumulator sets (gate, up),
           SwiGLU is the epilogue, and h [T, I] is written once in the input dtype (as eager rounds it);
  phase 2  out = h @ w_down^T, the same kernel without the second accumulator.
Tiles of depth BLOCK_K are staged through shared memory (rows padded by 8 elements), with 16-byte loads
when the inner sizes, strides and pointers allow, element loads with zero fill otherwise; the epilogue
goes through a per-warp shared scratch so that edge tiles are stored with bounds checks.

Pipelined (STAGES >= 2, whenever 16-byte loads are possible), the core of kernels/cuda/matmul.py: tiles go
global -> shared by cp.async (16 bytes, zero-filled past the edges) into STAGES stages, STAGES - 1 tiles
ahead, one barrier per BLOCK_K step, dynamic shared memory, blocks walked in GROUP_M groups for L2 reuse,
an epilogue of 16-byte stores. Phase 1 covers BLOCK_N / 2 columns per block so that its two accumulator
sets (gate, up) fit the registers of the plain phase's one (64 fp32 per thread at 128x128, 8 warps): two
blocks per SM either way; a single-buffered kernel with element stores leaves the tensor cores waiting on
memory. Without 16-byte alignment, or with STAGES = 0: the kernel above.

fp32 uses a plain FMA tiled kernel of the same two phases: TF32 would miss the harness's fp32 tolerance,
and no input is silently downcast.

Tunables: all compiled in (tile sizes are #define constants); each value is its own build.
"""

import functools

import torch

from autokernel.cuda import cuda_build

KERNEL_TYPE = "fused_mlp"
BACKEND = "cuda"

BLOCK_M = 128  # rows (tokens) per block (compile-time)
BLOCK_N = 128  # output columns per block (compile-time; the gated phase's pipelined kernel takes half)
BLOCK_K = 32  # depth of the shared-memory tiles (compile-time; multiple of 16)
WARPS_M = 2  # warps along M (compile-time): warp tile rows = BLOCK_M / WARPS_M, a multiple of 16
WARPS_N = 4  # warps along N (compile-time): warp tile columns = BLOCK_N / WARPS_N, a multiple of 16
STAGES = 4  # shared-memory stages of the cp.async pipeline (compile-time); 0 = the single-buffered kernel
GROUP_M = 8  # block rows walked together for L2 reuse of the weight tiles (compile-time)

TUNABLES = {  # every combination compiles: BLOCK_N / 2 / WARPS_N stays a multiple of 16
    "BLOCK_M": [64, 128],
    "BLOCK_N": [128],
    "BLOCK_K": [32, 64],
    "WARPS_M": [2, 4],
    "WARPS_N": [2, 4],
    "STAGES": [0, 2, 3, 4],
    "GROUP_M": [1, 4, 8, 16],
}

CUDA_SRC = r"""
#include <mma.h>
using namespace nvcuda;

constexpr int NWARPS = WARPS_M * WARPS_N;
constexpr int NTHREADS = NWARPS * 32;
constexpr int WTM = BLOCK_M / WARPS_M, WTN = BLOCK_N / WARPS_N;  // one warp's tile of the output
constexpr int FM = WTM / 16, FN = WTN / 16;                      // its 16x16 fragments
constexpr int PAD = 8;  // elements per shared row: breaks bank conflicts, keeps rows 16-byte aligned
constexpr int LDS = BLOCK_K + PAD;
constexpr int A_BYTES = BLOCK_M * LDS * 2, B_BYTES = BLOCK_N * LDS * 2;
constexpr int TILE_BYTES = A_BYTES + 2 * B_BYTES, C_BYTES = NWARPS * 512 * 4;
constexpr int SMEM_BYTES = TILE_BYTES > C_BYTES ? TILE_BYTES : C_BYTES;
static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tiles must be multiples of 16");
static_assert(BLOCK_K % 16 == 0, "BLOCK_K must be a multiple of 16");
static_assert(SMEM_BYTES <= 48 * 1024, "tiles exceed 48 KB of static shared memory");

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// ROWS x BLOCK_K tile of a K-contiguous matrix (element (r, k) at src[r * ld + k]) into dst (row LDS),
// zero-filled outside [0, max_r) x [0, K). VEC: 8 elements per load (K, ld, src multiples of 16 bytes).
template <typename T, bool VEC, int ROWS>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t ld, int64_t r0, int64_t k0, int64_t max_r,
                                          int64_t K) {
  if (VEC) {
    for (int idx = threadIdx.x; idx < ROWS * BLOCK_K / 8; idx += NTHREADS) {
      const int r = idx / (BLOCK_K / 8), c = (idx % (BLOCK_K / 8)) * 8;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (r0 + r < max_r && k0 + c < K) v = *reinterpret_cast<const uint4*>(src + (r0 + r) * ld + k0 + c);
      *reinterpret_cast<uint4*>(dst + r * LDS + c) = v;
    }
  } else {
    for (int idx = threadIdx.x; idx < ROWS * BLOCK_K; idx += NTHREADS) {
      const int r = idx / BLOCK_K, c = idx % BLOCK_K;
      dst[r * LDS + c] = (r0 + r < max_r && k0 + c < K) ? src[(r0 + r) * ld + k0 + c] : ak::from_f<T>(0.f);
    }
  }
}

// out[M, N] = A[M, K] @ W1[N, K]^T, or with GATED silu(A @ W1^T) * (A @ W2^T). 16-bit T, fp32 accumulate.
template <typename T, bool VEC, bool GATED>
__global__ void __launch_bounds__(NTHREADS) mlp_wmma_kernel(const T* __restrict__ A, const T* __restrict__ W1,
    const T* __restrict__ W2, T* __restrict__ out, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldw,
    int64_t ldo) {
  __shared__ __align__(128) unsigned char smem[SMEM_BYTES];
  T* As = reinterpret_cast<T*>(smem);
  T* B1 = reinterpret_cast<T*>(smem + A_BYTES);
  T* B2 = reinterpret_cast<T*>(smem + A_BYTES + B_BYTES);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int64_t m0 = (int64_t)blockIdx.y * BLOCK_M, n0 = (int64_t)blockIdx.x * BLOCK_N;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc1[FM][FN], acc2[GATED ? FM : 1][GATED ? FN : 1];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::fill_fragment(acc1[i][j], 0.f);
      if (GATED) wmma::fill_fragment(acc2[GATED ? i : 0][GATED ? j : 0], 0.f);
    }
  for (int64_t k0 = 0; k0 < K; k0 += BLOCK_K) {
    load_tile<T, VEC, BLOCK_M>(As, A, lda, m0, k0, M, K);
    load_tile<T, VEC, BLOCK_N>(B1, W1, ldw, n0, k0, N, K);
    if (GATED) load_tile<T, VEC, BLOCK_N>(B2, W2, ldw, n0, k0, N, K);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BLOCK_K; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a[FM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
#pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(a[i], As + (wm * WTM + i * 16) * LDS + kk, LDS);
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        wmma::load_matrix_sync(b, B1 + (wn * WTN + j * 16) * LDS + kk, LDS);
#pragma unroll
        for (int i = 0; i < FM; ++i) wmma::mma_sync(acc1[i][j], a[i], b, acc1[i][j]);
        if (GATED) {
          wmma::load_matrix_sync(b, B2 + (wn * WTN + j * 16) * LDS + kk, LDS);
#pragma unroll
          for (int i = 0; i < FM; ++i)
            wmma::mma_sync(acc2[GATED ? i : 0][GATED ? j : 0], a[i], b, acc2[GATED ? i : 0][GATED ? j : 0]);
        }
      }
    }
    __syncthreads();
  }
  float* s1 = reinterpret_cast<float*>(smem) + warp * 512;  // the tiles are no longer needed
  float* s2 = s1 + 256;
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(s1, acc1[i][j], 16, wmma::mem_row_major);
      if (GATED) wmma::store_matrix_sync(s2, acc2[GATED ? i : 0][GATED ? j : 0], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int64_t gm = m0 + wm * WTM + i * 16 + e / 16, gn = n0 + wn * WTN + j * 16 + e % 16;
        if (gm < M && gn < N) out[gm * ldo + gn] = ak::from_f<T>(GATED ? silu(s1[e]) * s2[e] : s1[e]);
      }
      __syncwarp();
    }
}

// ---- the cp.async pipeline (16-bit types, 16-byte aligned operands), as in kernels/cuda/matmul.py ----
// Per phase: the gated one covers BLOCK_N / 2 columns (two accumulator sets), the plain one BLOCK_N.
template <bool GATED> struct Pipe {
  static constexpr int BN = GATED ? BLOCK_N / 2 : BLOCK_N;
  static constexpr int WTN = BN / WARPS_N, FN = WTN / 16;
  static constexpr int A_STAGE = BLOCK_M * LDS, B_STAGE = BN * LDS;
  static constexpr int STAGE = A_STAGE + (GATED ? 2 : 1) * B_STAGE;  // elements
  static constexpr int EPI_LD = WTN + 4;  // floats per row of a warp's epilogue scratch (16-byte aligned rows)
  static constexpr int EPI_BYTES = NWARPS * 16 * EPI_LD * 4 * (GATED ? 2 : 1);
  static constexpr int TILE_BYTES = (STAGES > 1 ? STAGES : 1) * STAGE * 2;
  static constexpr int BYTES = TILE_BYTES > EPI_BYTES ? TILE_BYTES : EPI_BYTES;
  static constexpr int MIN_BLOCKS = 2 * BYTES <= 227 * 1024 && NTHREADS <= 256 ? 2 : 1;  // <= 128 registers
  static_assert(WTN % 16 == 0, "BLOCK_N / WARPS_N (and half of it, for the gated phase) must be a multiple of 16");
  static_assert(BYTES <= 227 * 1024, "pipeline stages exceed an H100/H200 SM's 227 KB of shared memory");
};
static_assert(STAGES == 0 || STAGES >= 2, "STAGES is 0 (no pipeline) or at least 2");

// Blocks per SM the pipelined kernel is compiled for; bf16 needs more than 128 registers (its gated phase
// spilled 16 bytes at 128), so one.
template <typename T, bool GATED> constexpr int pipe_min_blocks() {
  return std::is_same<T, __nv_bfloat16>::value ? 1 : Pipe<GATED>::MIN_BLOCKS;
}

// out = A @ W1^T (or silu(A @ W1^T) * (A @ W2^T) with GATED), pipelined. 1-D grid (ak::tile_of_block).
template <typename T, bool GATED>
__global__ void __launch_bounds__(NTHREADS, (pipe_min_blocks<T, GATED>())) mlp_pipe_kernel(const T* __restrict__ A,
    const T* __restrict__ W1, const T* __restrict__ W2, T* __restrict__ out, int64_t M, int64_t N, int64_t K,
    int64_t lda, int64_t ldw, int64_t ldo) {
  using P = Pipe<GATED>;
  constexpr int FN = P::FN;
  extern __shared__ __align__(128) unsigned char dyn_smem[];
  T* tiles = reinterpret_cast<T*>(dyn_smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wm = warp / WARPS_N, wn = warp % WARPS_N;
  int bm, bn;
  ak::tile_of_block<BLOCK_M, P::BN, GROUP_M>(M, N, bm, bn);
  const int64_t m0 = (int64_t)bm * BLOCK_M, n0 = (int64_t)bn * P::BN;
  const ak::AsyncTile<T, BLOCK_M, BLOCK_K, false, NTHREADS> a_tile(A, lda, LDS, m0, M);
  using WTile = ak::AsyncTile<T, P::BN, BLOCK_K, false, NTHREADS>;
  const WTile w1_tile(W1, ldw, LDS, n0, N), w2_tile(W2, ldw, LDS, n0, N);
  const int KT = (int)((K + BLOCK_K - 1) / BLOCK_K);
  auto load_stage = [&](int stage, int kt) {
    T* st = tiles + stage * P::STAGE;
    a_tile.copy(st, (int64_t)kt * BLOCK_K, K);
    w1_tile.copy(st + P::A_STAGE, (int64_t)kt * BLOCK_K, K);
    if (GATED) w2_tile.copy(st + P::A_STAGE + P::B_STAGE, (int64_t)kt * BLOCK_K, K);
  };
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {  // one commit per stage, even empty: wait_group counts them
    if (st < KT) load_stage(st, st);
    ak::cp_async_commit();
  }
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc1[FM][FN], acc2[GATED ? FM : 1][GATED ? FN : 1];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::fill_fragment(acc1[i][j], 0.f);
      if (GATED) wmma::fill_fragment(acc2[GATED ? i : 0][GATED ? j : 0], 0.f);
    }
  for (int kt = 0; kt < KT; ++kt) {
    ak::cp_async_wait<STAGES - 2>();  // this thread's copies of tile kt have landed...
    __syncthreads();              // ...everyone's have, and everyone is done with tile kt - 1's stage
    if (kt + STAGES - 1 < KT) load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    ak::cp_async_commit();
    const T* as = tiles + (kt % STAGES) * P::STAGE;
    const T* b1s = as + P::A_STAGE;
    const T* b2s = b1s + P::B_STAGE;
#pragma unroll
    for (int kk = 0; kk < BLOCK_K; kk += 16) {  // the b fragments, then one a fragment at a time (registers)
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b1[FN], b2[GATED ? FN : 1];
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        wmma::load_matrix_sync(b1[j], b1s + (wn * P::WTN + j * 16) * LDS + kk, LDS);
        if (GATED) wmma::load_matrix_sync(b2[GATED ? j : 0], b2s + (wn * P::WTN + j * 16) * LDS + kk, LDS);
      }
#pragma unroll
      for (int i = 0; i < FM; ++i) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
        wmma::load_matrix_sync(a, as + (wm * WTM + i * 16) * LDS + kk, LDS);
#pragma unroll
        for (int j = 0; j < FN; ++j) {
          wmma::mma_sync(acc1[i][j], a, b1[j], acc1[i][j]);
          if (GATED) wmma::mma_sync(acc2[GATED ? i : 0][GATED ? j : 0], a, b2[GATED ? j : 0],
                                    acc2[GATED ? i : 0][GATED ? j : 0]);
        }
      }
    }
  }
  ak::cp_async_wait<0>();
  __syncthreads();  // the stages become the epilogue's scratch
  float* s1 = reinterpret_cast<float*>(dyn_smem) + warp * 16 * P::EPI_LD * (GATED ? 2 : 1);
  float* s2 = s1 + 16 * P::EPI_LD;
  const bool vec = ldo % 8 == 0 && (reinterpret_cast<uintptr_t>(out) & 15) == 0;
  const int64_t row0 = m0 + wm * WTM, col0 = n0 + wn * P::WTN;
#pragma unroll
  for (int i = 0; i < FM; ++i) {  // 16 rows at a time through the scratch, 8 values per lane per store
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(s1 + j * 16, acc1[i][j], P::EPI_LD, wmma::mem_row_major);
      if (GATED) wmma::store_matrix_sync(s2 + j * 16, acc2[GATED ? i : 0][GATED ? j : 0], P::EPI_LD,
                                         wmma::mem_row_major);
    }
    __syncwarp();
    for (int e = lane; e < 16 * P::WTN / 8; e += 32) {
      const int r = e / (P::WTN / 8), cc = (e % (P::WTN / 8)) * 8;
      const int64_t gm = row0 + i * 16 + r;
      if (gm >= M) continue;
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float g = s1[r * P::EPI_LD + cc + k];
        v[k] = GATED ? silu(g) * s2[r * P::EPI_LD + cc + k] : g;
      }
      ak::store8(out + gm * ldo + col0 + cc, col0 + cc, N, vec, v);
    }
    __syncwarp();
  }
}

// Launches a pipelined phase, lifting its dynamic shared memory limit.
template <typename T, bool GATED>
void launch_pipe(const T* a, const T* w1, const T* w2, T* o, int64_t M, int64_t N, int64_t K, int64_t lda,
                 int64_t ldw, int64_t ldo, cudaStream_t s) {
  auto kernel = &mlp_pipe_kernel<T, GATED>;
  ak::allow_shared_memory(kernel, Pipe<GATED>::BYTES);
  const int64_t blocks = ((M + BLOCK_M - 1) / BLOCK_M) * ((N + Pipe<GATED>::BN - 1) / Pipe<GATED>::BN);
  if (blocks >= (int64_t(1) << 31)) throw std::invalid_argument("fused_mlp: too many output tiles");
  kernel<<<dim3((unsigned)blocks), NTHREADS, Pipe<GATED>::BYTES, s>>>(a, w1, w2, o, M, N, K, lda, ldw, ldo);
}

// fp32: the same two phases with FMA, 64x64 tile per 256 threads, 4x4 outputs per thread strided by 16.
constexpr int SG_TILE = 64, SG_K = 16;
template <bool GATED>
__global__ void __launch_bounds__(256) mlp_fp32_kernel(const float* __restrict__ A, const float* __restrict__ W1,
    const float* __restrict__ W2, float* __restrict__ out, int64_t M, int64_t N, int64_t K, int64_t lda,
    int64_t ldw, int64_t ldo) {
  __shared__ float As[SG_K][SG_TILE + 4];
  __shared__ float Bs1[SG_K][SG_TILE + 4];
  __shared__ float Bs2[GATED ? SG_K : 1][SG_TILE + 4];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t m0 = (int64_t)blockIdx.y * SG_TILE, n0 = (int64_t)blockIdx.x * SG_TILE;
  float acc1[4][4] = {}, acc2[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += SG_K) {
    for (int idx = threadIdx.x; idx < SG_TILE * SG_K; idx += 256) {
      const int r = idx / SG_K, k = idx % SG_K;
      const bool in_k = k0 + k < K;
      As[k][r] = (m0 + r < M && in_k) ? A[(m0 + r) * lda + k0 + k] : 0.f;
      Bs1[k][r] = (n0 + r < N && in_k) ? W1[(n0 + r) * ldw + k0 + k] : 0.f;
      if (GATED) Bs2[GATED ? k : 0][r] = (n0 + r < N && in_k) ? W2[(n0 + r) * ldw + k0 + k] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < SG_K; ++k)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc1[i][j] = fmaf(As[k][ty + 16 * i], Bs1[k][tx + 16 * j], acc1[i][j]);
          if (GATED) acc2[i][j] = fmaf(As[k][ty + 16 * i], Bs2[GATED ? k : 0][tx + 16 * j], acc2[i][j]);
        }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t gm = m0 + ty + 16 * i, gn = n0 + tx + 16 * j;
      if (gm < M && gn < N) out[gm * ldo + gn] = GATED ? silu(acc1[i][j]) * acc2[i][j] : acc1[i][j];
    }
}

template <typename T, bool GATED>
void launch_phase(const T* a, const T* w1, const T* w2, T* o, int64_t M, int64_t N, int64_t K, int64_t lda,
                  int64_t ldw, int64_t ldo, bool vec, cudaStream_t s) {
  if constexpr (STAGES >= 2) {
    if (vec) return launch_pipe<T, GATED>(a, w1, w2, o, M, N, K, lda, ldw, ldo, s);
  }
  const dim3 grid((unsigned)((N + BLOCK_N - 1) / BLOCK_N), (unsigned)((M + BLOCK_M - 1) / BLOCK_M));
  if (vec) mlp_wmma_kernel<T, true, GATED><<<grid, NTHREADS, 0, s>>>(a, w1, w2, o, M, N, K, lda, ldw, ldo);
  else mlp_wmma_kernel<T, false, GATED><<<grid, NTHREADS, 0, s>>>(a, w1, w2, o, M, N, K, lda, ldw, ldo);
}

template <typename T>
void launch_gated(bool gated, int64_t a, int64_t w1, int64_t w2, int64_t o, int64_t M, int64_t N, int64_t K,
                  int64_t lda, int64_t ldw, int64_t ldo, bool vec, cudaStream_t s) {
  if (gated)
    launch_phase<T, true>(ak::ptr<const T>(a), ak::ptr<const T>(w1), ak::ptr<const T>(w2), ak::ptr<T>(o), M, N, K,
                          lda, ldw, ldo, vec, s);
  else
    launch_phase<T, false>(ak::ptr<const T>(a), ak::ptr<const T>(w1), ak::ptr<const T>(w2), ak::ptr<T>(o), M, N, K,
                           lda, ldw, ldo, vec, s);
}

// One phase: gated (h = SwiGLU) or plain (out = h @ w_down^T).
void mlp_phase_launch(int dtype, bool gated, int64_t a, int64_t w1, int64_t w2, int64_t o, int64_t M, int64_t N,
                      int64_t K, int64_t lda, int64_t ldw, int64_t ldo, bool vectorized, int64_t stream) {
  const cudaStream_t s = ak::as_stream(stream);
  if (dtype == 0) {
    const dim3 grid((unsigned)((N + SG_TILE - 1) / SG_TILE), (unsigned)((M + SG_TILE - 1) / SG_TILE));
    auto args = [&](auto kernel) {
      kernel<<<grid, 256, 0, s>>>(ak::ptr<const float>(a), ak::ptr<const float>(w1), ak::ptr<const float>(w2),
                                  ak::ptr<float>(o), M, N, K, lda, ldw, ldo);
    };
    if (gated) args(mlp_fp32_kernel<true>); else args(mlp_fp32_kernel<false>);
  } else if (dtype == 1) {
    launch_gated<__half>(gated, a, w1, w2, o, M, N, K, lda, ldw, ldo, vectorized, s);
  } else if (dtype == 2) {
    launch_gated<__nv_bfloat16>(gated, a, w1, w2, o, M, N, K, lda, ldw, ldo, vectorized, s);
  } else {
    throw std::invalid_argument("dtype code must be 0 (fp32), 1 (fp16) or 2 (bf16)");
  }
  ak::check_launch(gated ? "fused_mlp gate/up kernel" : "fused_mlp down kernel");
}
"""

PROTOTYPES = ["void mlp_phase_launch(int dtype, bool gated, int64_t a, int64_t w1, int64_t w2, int64_t o, int64_t M, "
              "int64_t N, int64_t K, int64_t lda, int64_t ldw, int64_t ldo, bool vectorized, int64_t stream)"]


def cuda_source() -> str:
    """The whole translation unit: shared helpers, the compile-time tunables, the kernels."""
    tiles = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_K": BLOCK_K, "WARPS_M": WARPS_M, "WARPS_N": WARPS_N,
             "STAGES": STAGES, "GROUP_M": GROUP_M}
    return cuda_build.PRELUDE + cuda_build.defines(tiles) + CUDA_SRC


@functools.cache
def _module():
    return cuda_build.load(KERNEL_TYPE, cuda_source(), PROTOTYPES)


def _row_major(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def _phase(gated: bool, a, w1, w2, out) -> None:
    """out = a @ w1^T (or the SwiGLU of a @ w1^T and a @ w2^T); w1 and w2 share their row stride."""
    m, k = a.shape
    n = w1.shape[0]
    width = cuda_build.pack_width(16, a)
    vec = (k % width == 0 and all(t.stride(0) % width == 0 and t.data_ptr() % 16 == 0 for t in (a, w1, w2)))
    _module().mlp_phase_launch(cuda_build.dtype_code(a), gated, a.data_ptr(), w1.data_ptr(), w2.data_ptr(),
                               out.data_ptr(), m, n, k, a.stride(0), w1.stride(0), out.stride(0), vec,
                               cuda_build.stream_of(a))


def kernel_fn(x, w_gate, w_up, w_down):
    hidden = x.shape[-1]
    inter = w_gate.shape[0]
    x2 = _row_major(x.reshape(-1, hidden))  # a view when the leading dims are contiguous, else a copy
    w_gate, w_up, w_down = _row_major(w_gate), _row_major(w_up), _row_major(w_down)
    if w_up.stride(0) != w_gate.stride(0):  # the gated kernel walks both with one row stride
        w_gate, w_up = w_gate.contiguous(), w_up.contiguous()
    cuda_build.check_dtypes(x2, w_gate, w_up, w_down)
    tokens = x2.shape[0]
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    if tokens == 0 or hidden == 0:
        return out.view(*x.shape[:-1], hidden)
    if inter == 0:
        return out.fill_(0).view(*x.shape[:-1], hidden)
    h = torch.empty((tokens, inter), dtype=x.dtype, device=x.device)
    _phase(True, x2, w_gate, w_up, h)
    _phase(False, h, w_down, w_down, out)
    return out.view(*x.shape[:-1], hidden)
