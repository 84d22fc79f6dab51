"""Scaled dot-product attention (FlashAttention-2 style), CUDA C++ starter, causal or not.

Q, K, V are [batch, heads, seq, head_dim] (K and V may have heads / group: grouped-query attention, query head h
reads K/V head h / group). 4 * B * H * S^2 * D FLOPs (half of it when causal), and at
least 4 * B * H * S * D * element_size bytes: the S x S scores never leave the chip.

One block per tile of WARPS x ROWS query rows of one (batch, head); every warp owns ROWS rows. Keys and
values stream through shared memory 32 at a time (fp32, K rows padded against bank conflicts). For each
tile a lane scores one key against each of its warp's rows (the query rows, pre-multiplied by sm_scale,
are broadcast from shared memory), the warp takes the tile's row max and sum with shuffles, and the
online softmax rescales the running output, of which each lane holds head_dim/32 columns: no S x S
matrix, one pass over K and V per query tile. Causal blocks stop at their last row's diagonal and mask
keys beyond each row. All math is scalar fp32 (expf, fmaf) in a fixed order: bitwise reproducible and
within the fp32 tolerance. This kernel serves fp32, head dims other than 64 and 128, unaligned views, and a
causal sliding window (window: keys i - window < j <= i), a logit soft cap (softcap * tanh(score / softcap)) and
ALiBi slopes (alibi: slope[h] * (j - i) added to each score).
Q, K and V may be strided views (a packed QKV projection): their strides are kernel arguments.

fp16/bf16 with head_dim 64 or 128 and 16-byte aligned rows (TENSOR_CORES = 1): a tensor-core kernel
(nvcuda::wmma 16x16x16, fp32 accumulate). A block takes 64 query rows of one (batch, head), 4 warps of 16
rows each; the warp keeps its Q fragments in registers. Per tile of 64 keys (K and V staged in shared
memory by 16-byte loads, zero past the end): S = Q K^T into the warp's fp32 scratch; the online softmax
there (two lanes per row: masks, row max, exp2 of the scaled scores, row sum, P written in the input dtype,
the running output's row rescaled); then O += P V on tensor cores with O kept as fp32 in shared memory
(loaded into and stored from accumulator fragments, whose register layout WMMA leaves unspecified, so
every per-row operation goes through shared memory). 110 KB of shared memory at head_dim 128: two blocks
per SM. Causal blocks stop at their diagonal and run heaviest first. A scalar kernel (no tensor cores) is
far slower, which is why the tensor-core path is the default.

Tunables: WARPS, ROWS and MAX_HEAD_DIM are compiled in (register and shared-memory sizes of the scalar
kernel); TENSOR_CORES (compiled in) switches the tensor-core kernel on.
"""

import functools
import math

import torch

from autokernel.cuda import cuda_build

KERNEL_TYPE = "flash_attention"
BACKEND = "cuda"

WARPS = 4  # warps per block (compile-time)
ROWS = 4  # query rows per warp (compile-time): a block covers WARPS * ROWS rows
MAX_HEAD_DIM = 128  # largest head_dim served (compile-time; a multiple of 32): sizes registers and shared memory
TENSOR_CORES = 1  # 1: the WMMA kernel for fp16/bf16 at head_dim 64 or 128 (compile-time); 0: scalar everywhere

TUNABLES = {
    "WARPS": [2, 4, 8],
    "ROWS": [1, 2, 4, 8],
    "MAX_HEAD_DIM": [128, 256],
    "TENSOR_CORES": [0, 1],
}

CUDA_SRC = r"""
constexpr int KV = 32;                  // keys per tile: one per lane
constexpr int QROWS = WARPS * ROWS;     // query rows per block
constexpr int DC = MAX_HEAD_DIM / 32;   // output columns per lane
constexpr int SMEM_FLOATS = QROWS * MAX_HEAD_DIM + KV * (MAX_HEAD_DIM + 1) + KV * MAX_HEAD_DIM;
static_assert(MAX_HEAD_DIM % 32 == 0, "MAX_HEAD_DIM must be a multiple of 32");

#define FA_PARAMS                                                                                                \
  const T *__restrict__ Q, const T *__restrict__ K, const T *__restrict__ V, T *__restrict__ O, int64_t heads,      \
      int64_t group, int64_t S, int D, int64_t qb, int64_t qh, int64_t qs, int64_t kb, int64_t kh, int64_t ks,      \
      int64_t vb, int64_t vh, int64_t vs, float scale, bool causal, int window, float softcap,                     \
      const float *__restrict__ alibi
#define FA_ARGS \
  Q, K, V, O, heads, group, S, D, qb, qh, qs, kb, kh, ks, vb, vh, vs, scale, causal, window, softcap, alibi

template <typename T, bool VARIANT>  // VARIANT: a sliding window, a soft cap or ALiBi slopes
__device__ __forceinline__ void attend(FA_PARAMS) {
  extern __shared__ float smem[];
  float* Qs = smem;                                  // [QROWS][MAX_HEAD_DIM], scaled
  float* Ks = Qs + QROWS * MAX_HEAD_DIM;             // [KV][MAX_HEAD_DIM + 1]
  float* Vs = Ks + KV * (MAX_HEAD_DIM + 1);          // [KV][MAX_HEAD_DIM]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const int64_t q0 = (int64_t)blockIdx.x * QROWS;
  const T* Qp = Q + b * qb + h * qh;
  const T* Kp = K + b * kb + (h / group) * kh;  // grouped-query attention: group query heads per K/V head
  const T* Vp = V + b * vb + (h / group) * vh;
  for (int idx = threadIdx.x; idx < QROWS * MAX_HEAD_DIM; idx += blockDim.x) {
    const int r = idx / MAX_HEAD_DIM, d = idx % MAX_HEAD_DIM;
    Qs[idx] = (q0 + r < S && d < D) ? ak::to_f(Qp[(q0 + r) * qs + d]) * scale : 0.f;
  }
  float m[ROWS], l[ROWS], acc[ROWS][DC];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < DC; ++c) acc[r][c] = 0.f;
  }
  const int64_t kv_end = causal ? (q0 + QROWS < S ? q0 + QROWS : S) : S;
  // a sliding window (causal): the first tile holding a key of the block's first row's window
  const int64_t kv_begin = VARIANT && window > 0 && q0 - window + 1 > 0 ? (q0 - window + 1) / KV * KV : 0;
  for (int64_t j0 = kv_begin; j0 < kv_end; j0 += KV) {
    __syncthreads();  // Qs written; the previous K/V tile fully used
    for (int idx = threadIdx.x; idx < KV * MAX_HEAD_DIM; idx += blockDim.x) {
      const int r = idx / MAX_HEAD_DIM, d = idx % MAX_HEAD_DIM;
      const bool ok = j0 + r < S && d < D;
      Ks[r * (MAX_HEAD_DIM + 1) + d] = ok ? ak::to_f(Kp[(j0 + r) * ks + d]) : 0.f;
      Vs[r * MAX_HEAD_DIM + d] = ok ? ak::to_f(Vp[(j0 + r) * vs + d]) : 0.f;
    }
    __syncthreads();
    const int64_t j = j0 + lane;  // this lane's key
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int qr = warp * ROWS + r;
      const int64_t q = q0 + qr;
      const float* qrow = Qs + qr * MAX_HEAD_DIM;
      const float* krow = Ks + lane * (MAX_HEAD_DIM + 1);
      float sc = 0.f;
      for (int d = 0; d < D; ++d) sc = fmaf(qrow[d], krow[d], sc);
      bool valid = j < S && (!causal || j <= q);
      if constexpr (VARIANT) {
        if (softcap > 0.f) sc = softcap * tanhf(sc / softcap);  // logit soft-capping (Gemma-2)
        if (alibi != nullptr) sc += alibi[h] * (float)(j - q);  // ALiBi: the head's slope times the key's distance
        valid = valid && (window <= 0 || (int)(q - j) < window);
      }
      sc = valid ? sc : -INFINITY;
      const float tile_max = ak::warp_reduce(sc, ak::Max());
      if (tile_max == -INFINITY) continue;  // the same in every lane: the warp skips together
      const float m_new = fmaxf(m[r], tile_max);
      const float alpha = expf(m[r] - m_new);  // first tile: exp(-inf) = 0
      const float p = valid ? expf(sc - m_new) : 0.f;
      l[r] = l[r] * alpha + ak::warp_reduce(p, ak::Sum());
#pragma unroll
      for (int c = 0; c < DC; ++c) acc[r][c] *= alpha;
      for (int jj = 0; jj < KV; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
        for (int c = 0; c < DC; ++c) acc[r][c] = fmaf(pj, Vs[jj * MAX_HEAD_DIM + c * 32 + lane], acc[r][c]);
      }
      m[r] = m_new;
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int64_t q = q0 + warp * ROWS + r;
    if (q >= S) continue;
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = c * 32 + lane;
      if (d < D) O[(bh * S + q) * D + d] = ak::from_f<T>(acc[r][c] / l[r]);
    }
  }
}

// the plain kernel as it was tuned; the variant's own launch bounds give it the registers the window and the cap need
template <typename T>
__global__ void __launch_bounds__(WARPS * 32) flash_attention_kernel(FA_PARAMS) { attend<T, false>(FA_ARGS); }
template <typename T>
__global__ void __launch_bounds__(WARPS * 32, 4) flash_attention_variant_kernel(FA_PARAMS) { attend<T, true>(FA_ARGS); }

// ---- tensor cores (fp16/bf16, head_dim HD = 64 or 128, 16-byte aligned rows) ----
#include <mma.h>
namespace tc {
using namespace nvcuda;
constexpr int BQ = 64, BK = 64, NW = 4;  // query rows per block, keys per tile, warps (16 query rows each)
constexpr int LDP = BK + 8, LDS_ = BK + 4;  // P (16-bit) and S (fp32) scratch row lengths
template <int HD> struct Smem {
  static constexpr int LD = HD + 8, LDO = HD + 4;  // Q/K/V rows (16-bit), O rows (fp32)
  static constexpr int Q = 0, K = Q + BQ * LD * 2, V = K + BK * LD * 2;  // byte offsets, 32-byte aligned
  static constexpr int S = V + BK * LD * 2, P = S + NW * 16 * LDS_ * 4, O = P + NW * 16 * LDP * 2;
  static constexpr int BYTES = O + NW * 16 * LDO * 4;
};

// rows x HD tile (row r at src + r * stride) into dst (row length LD) by 16-byte loads, zero past `valid` rows.
template <typename T, int HD>
__device__ __forceinline__ void load_rows(T* dst, const T* src, int64_t stride, int64_t valid, int rows) {
  constexpr int PER_ROW = HD / 8;
  for (int idx = threadIdx.x; idx < rows * PER_ROW; idx += NW * 32) {
    const int r = idx / PER_ROW, c = (idx % PER_ROW) * 8;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < valid) v = *reinterpret_cast<const uint4*>(src + r * stride + c);
    *reinterpret_cast<uint4*>(dst + r * Smem<HD>::LD + c) = v;
  }
}

template <typename T, int HD>
__global__ void __launch_bounds__(NW * 32, 2) flash_wmma_kernel(
    const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, T* __restrict__ O, int64_t heads,
    int64_t group, int64_t S, int64_t qb, int64_t qh, int64_t qs, int64_t kb, int64_t kh, int64_t ks, int64_t vb, int64_t vh,
    int64_t vs, float scale_log2, bool causal) {
  using L = Smem<HD>;
  constexpr int LD = L::LD, LDO = L::LDO, ND = HD / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem + L::Q);
  T* Ks = reinterpret_cast<T*>(smem + L::K);
  T* Vs = reinterpret_cast<T*>(smem + L::V);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* Sw = reinterpret_cast<float*>(smem + L::S) + warp * 16 * LDS_;
  T* Pw = reinterpret_cast<T*>(smem + L::P) + warp * 16 * LDP;
  float* Ow = reinterpret_cast<float*>(smem + L::O) + warp * 16 * LDO;
  const int64_t bh = blockIdx.y, b = bh / heads, h = bh - b * heads;
  const int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * BQ;  // causal: the longest blocks first
  load_rows<T, HD>(Qs, Q + b * qb + h * qh + q0 * qs, qs, S - q0, BQ);
  const int r = lane >> 1, half = lane & 1;  // softmax and O rows: two lanes per row, half a row each
  const int64_t q = q0 + warp * 16 + r;
  for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c) Ow[r * LDO + c] = 0.f;
  float m = -INFINITY, l = 0.f;
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[ND];
#pragma unroll
  for (int k = 0; k < ND; ++k) wmma::load_matrix_sync(qf[k], Qs + warp * 16 * LD + k * 16, LD);
  const int64_t kv_end = causal ? (q0 + BQ < S ? q0 + BQ : S) : S;
  const T* Kp = K + b * kb + (h / group) * kh;  // grouped-query attention: group query heads per K/V head
  const T* Vp = V + b * vb + (h / group) * vh;
  for (int64_t j0 = 0; j0 < kv_end; j0 += BK) {
    __syncthreads();  // every warp is done with the previous K and V tiles
    load_rows<T, HD>(Ks, Kp + j0 * ks, ks, S - j0, BK);
    load_rows<T, HD>(Vs, Vp + j0 * vs, vs, S - j0, BK);
    __syncthreads();
#pragma unroll
    for (int n = 0; n < BK / 16; ++n) {  // S = Q K^T, 16 keys at a time
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf;
      wmma::fill_fragment(sf, 0.f);
#pragma unroll
      for (int k = 0; k < ND; ++k) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;
        wmma::load_matrix_sync(kf, Ks + n * 16 * LD + k * 16, LD);
        wmma::mma_sync(sf, qf[k], kf, sf);
      }
      wmma::store_matrix_sync(Sw + n * 16, sf, LDS_, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax of row r, columns [half * 32, half * 32 + 32): masked keys are -inf.
    float sv[BK / 2], tmax = -INFINITY;
#pragma unroll
    for (int c = 0; c < BK / 2; ++c) {
      const int64_t j = j0 + half * (BK / 2) + c;
      const bool ok = j < S && (!causal || j <= q);
      sv[c] = ok ? Sw[r * LDS_ + half * (BK / 2) + c] * scale_log2 : -INFINITY;
      tmax = fmaxf(tmax, sv[c]);
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    const float m_new = fmaxf(m, tmax);
    const bool none = m_new == -INFINITY;  // no key yet for this row (a padding row): keep everything at 0
    const float alpha = none ? 1.f : ak::exp2_approx(m - m_new);
    float psum = 0.f;
#pragma unroll
    for (int c = 0; c < BK / 2; ++c) {
      const float pv = none ? 0.f : ak::exp2_approx(sv[c] - m_new);
      Pw[r * LDP + half * (BK / 2) + c] = ak::from_f<T>(pv);
      psum += pv;
    }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    l = l * alpha + psum;
    m = m_new;
    for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); ++c) Ow[r * LDO + c] *= alpha;
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> pf[BK / 16];
#pragma unroll
    for (int k = 0; k < BK / 16; ++k) wmma::load_matrix_sync(pf[k], Pw + k * 16, LDP);
#pragma unroll
    for (int n = 0; n < ND; ++n) {  // O += P V, 16 output columns at a time
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> of;
      wmma::load_matrix_sync(of, Ow + n * 16, LDO, wmma::mem_row_major);
#pragma unroll
      for (int k = 0; k < BK / 16; ++k) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
        wmma::load_matrix_sync(vf, Vs + k * 16 * LD + n * 16, LD);
        wmma::mma_sync(of, pf[k], vf, of);
      }
      wmma::store_matrix_sync(Ow + n * 16, of, LDO, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (q < S) {  // out is contiguous [B, H, S, HD]: 16-byte stores
    const float inv = 1.f / l;
    T* orow = O + (bh * S + q) * HD;
#pragma unroll
    for (int c = half * (HD / 2); c < (half + 1) * (HD / 2); c += 8) {
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = Ow[r * LDO + c + k] * inv;
      ak::store8(orow + c, c, HD, true, v);
    }
  }
}

template <typename T, int HD>
void launch(const T* q, const T* k, const T* v, T* o, int64_t batch, int64_t heads, int64_t group, int64_t S,
            const int64_t* st,
            float scale, bool causal, cudaStream_t s) {
  auto kernel = &flash_wmma_kernel<T, HD>;
  ak::allow_shared_memory(kernel, Smem<HD>::BYTES);
  const dim3 grid((unsigned)((S + BQ - 1) / BQ), (unsigned)(batch * heads));
  kernel<<<grid, NW * 32, Smem<HD>::BYTES, s>>>(q, k, v, o, heads, group, S, st[0], st[1], st[2], st[3], st[4], st[5],
                                                st[6], st[7], st[8], scale * ak::LOG2E, causal);
}
}  // namespace tc

template <typename T>
void launch(const T* q, const T* k, const T* v, T* o, int64_t batch, int64_t heads, int64_t group, int64_t S, int D,
            const int64_t* st, float scale, bool causal, int64_t window, float softcap, const float* alibi,
            cudaStream_t s) {
  constexpr int smem = SMEM_FLOATS * (int)sizeof(float);
  const bool variant = window > 0 || softcap > 0.f || alibi != nullptr;
  auto kernel = variant ? &flash_attention_variant_kernel<T> : &flash_attention_kernel<T>;
  if (smem > 48 * 1024) {  // more than 48 KB of shared memory must be requested (per device, so every call)
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess)
      throw std::runtime_error(std::string("flash_attention shared memory: ") + cudaGetErrorString(e));
  }
  const dim3 grid((unsigned)((S + QROWS - 1) / QROWS), (unsigned)(batch * heads));
  kernel<<<grid, WARPS * 32, smem, s>>>(q, k, v, o, heads, group, S, D, st[0], st[1], st[2], st[3], st[4], st[5], st[6],
                                        st[7], st[8], scale, causal, (int)window, softcap, alibi);
}

void flash_attention_launch(int dtype, int64_t q, int64_t k, int64_t v, int64_t o, int64_t batch, int64_t heads,
                            int64_t group, int64_t seq, int64_t head_dim, int64_t qb, int64_t qh, int64_t qs, int64_t kb, int64_t kh,
                            int64_t ks, int64_t vb, int64_t vh, int64_t vs, double scale, bool causal,
                            int64_t window, double softcap, int64_t alibi, bool aligned, int64_t stream) {
  const int64_t strides[9] = {qb, qh, qs, kb, kh, ks, vb, vh, vs};
  const bool plain = window <= 0 && softcap <= 0 && alibi == 0;  // the tensor-core kernel has none of the variants
  if (TENSOR_CORES && plain && aligned && dtype != 0 && (head_dim == 64 || head_dim == 128)) {
    AK_DISPATCH(dtype, {
      if constexpr (!std::is_same<scalar_t, float>::value) {
        const auto qp = ak::ptr<const scalar_t>(q), kp = ak::ptr<const scalar_t>(k), vp = ak::ptr<const scalar_t>(v);
        const auto op = ak::ptr<scalar_t>(o);
        if (head_dim == 64) tc::launch<scalar_t, 64>(qp, kp, vp, op, batch, heads, group, seq, strides, (float)scale, causal,
                                                     ak::as_stream(stream));
        else tc::launch<scalar_t, 128>(qp, kp, vp, op, batch, heads, group, seq, strides, (float)scale, causal,
                                       ak::as_stream(stream));
      }
    });
    ak::check_launch("flash_wmma_kernel");
    return;
  }
  AK_DISPATCH(dtype, {
    launch<scalar_t>(ak::ptr<const scalar_t>(q), ak::ptr<const scalar_t>(k), ak::ptr<const scalar_t>(v),
                     ak::ptr<scalar_t>(o), batch, heads, group, seq, (int)head_dim, strides, (float)scale, causal,
                     window, (float)softcap, ak::ptr<const float>(alibi), ak::as_stream(stream));
  });
  ak::check_launch("flash_attention_kernel");
}
"""

PROTOTYPES = ["void flash_attention_launch(int dtype, int64_t q, int64_t k, int64_t v, int64_t o, int64_t batch, "
              "int64_t heads, int64_t group, int64_t seq, int64_t head_dim, int64_t qb, int64_t qh, int64_t qs, int64_t kb, "
              "int64_t kh, int64_t ks, int64_t vb, int64_t vh, int64_t vs, double scale, bool causal, "
              "int64_t window, double softcap, int64_t alibi, bool aligned, int64_t stream)"]


def cuda_source() -> str:
    """The whole translation unit: shared helpers, the compile-time tunables, the kernel."""
    sizes = {"WARPS": WARPS, "ROWS": ROWS, "MAX_HEAD_DIM": MAX_HEAD_DIM, "TENSOR_CORES": TENSOR_CORES}
    return cuda_build.PRELUDE + cuda_build.defines(sizes) + CUDA_SRC


@functools.cache
def _module():
    return cuda_build.load(KERNEL_TYPE, cuda_source(), PROTOTYPES)


def kernel_fn(Q, K, V, causal=True, sm_scale=None, window=0, softcap=0.0, alibi=None):
    batch, heads, seq, head_dim = Q.shape
    if window < 0 or (window and not causal) or softcap < 0:
        raise ValueError(f"window {window} (a causal attention's, 0: none), softcap {softcap} (0: none)")
    if K.shape != V.shape or (K.shape[0], *K.shape[2:]) != (batch, seq, head_dim) or heads % K.shape[1]:
        raise ValueError(f"Q {tuple(Q.shape)}, K {tuple(K.shape)}, V {tuple(V.shape)}: K and V of one shape, with "
                         "Q's batch, length and head dim, and heads dividing Q's (grouped-query attention)")
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim} > MAX_HEAD_DIM = {MAX_HEAD_DIM}: raise MAX_HEAD_DIM in this file")
    if batch * heads > 65535:
        raise ValueError(f"batch * heads = {batch * heads} exceeds the grid's y limit of 65535")
    if alibi is not None:  # one fp32 slope per query head
        if alibi.numel() != heads:
            raise ValueError(f"alibi: {alibi.numel()} slopes for {heads} query heads")
        alibi = alibi.to(device=Q.device, dtype=torch.float32).contiguous()
    Q, K, V = (t if t.stride(-1) == 1 else t.contiguous() for t in (Q, K, V))
    cuda_build.check_dtypes(Q, K, V)
    out = torch.empty((batch, heads, seq, head_dim), dtype=Q.dtype, device=Q.device)
    if out.numel() == 0:
        return out
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    strides = [s for t in (Q, K, V) for s in t.stride()[:3]]
    aligned = all(s % 8 == 0 for s in strides) and all(t.data_ptr() % 16 == 0 for t in (Q, K, V))  # 16-byte rows
    _module().flash_attention_launch(cuda_build.dtype_code(Q), Q.data_ptr(), K.data_ptr(), V.data_ptr(),
                                     out.data_ptr(), batch, heads, heads // K.shape[1], seq, head_dim, *strides, float(scale),
                                     bool(causal), int(window), float(softcap),
                                     0 if alibi is None else alibi.data_ptr(), aligned, cuda_build.stream_of(Q))
    return out
