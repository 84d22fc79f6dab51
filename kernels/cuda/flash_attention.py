"""Scaled dot-product attention (FlashAttention-2 style), CUDA C++ starter, causal or not.

Q, K, V are [batch, heads, seq, head_dim]. 4 * B * H * S^2 * D FLOPs (half of it when causal), and at
least 4 * B * H * S * D * element_size bytes: the S x S scores never leave the chip.

One block per tile of WARPS x ROWS query rows of one (batch, head); every warp owns ROWS rows. Keys and
values stream through shared memory 32 at a time (fp32, K rows padded against bank conflicts). For each
tile a lane scores one key against each of its warp's rows (the query rows, pre-multiplied by sm_scale,
are broadcast from shared memory), the warp takes the tile's row max and sum with shuffles, and the
online softmax rescales the running output, of which each lane holds head_dim/32 columns: no S x S
matrix, one pass over K and V per query tile. Causal blocks stop at their last row's diagonal and mask
keys beyond each row. All math is scalar fp32 (expf, fmaf) in a fixed order: bitwise reproducible and
within the fp32 tolerance; tensor cores (WMMA for Q K^T and P V) are the first thing to add for speed.
Q, K and V may be strided views (a packed QKV projection): their strides are kernel arguments.

Tunables: WARPS, ROWS and MAX_HEAD_DIM are compiled in (register and shared-memory sizes).
"""

import functools
import math

import torch

from autokernel import cuda_build

KERNEL_TYPE = "flash_attention"
BACKEND = "cuda"

WARPS = 4  # warps per block (compile-time)
ROWS = 4  # query rows per warp (compile-time): a block covers WARPS * ROWS rows
MAX_HEAD_DIM = 128  # largest head_dim served (compile-time; a multiple of 32): sizes registers and shared memory

TUNABLES = {
    "WARPS": [2, 4, 8],
    "ROWS": [1, 2, 4, 8],
    "MAX_HEAD_DIM": [128, 256],
}

CUDA_SRC = r"""
constexpr int KV = 32;                  // keys per tile: one per lane
constexpr int QROWS = WARPS * ROWS;     // query rows per block
constexpr int DC = MAX_HEAD_DIM / 32;   // output columns per lane
constexpr int SMEM_FLOATS = QROWS * MAX_HEAD_DIM + KV * (MAX_HEAD_DIM + 1) + KV * MAX_HEAD_DIM;
static_assert(MAX_HEAD_DIM % 32 == 0, "MAX_HEAD_DIM must be a multiple of 32");

template <typename T>
__global__ void __launch_bounds__(WARPS * 32) flash_attention_kernel(
    const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, T* __restrict__ O, int64_t heads,
    int64_t S, int D, int64_t qb, int64_t qh, int64_t qs, int64_t kb, int64_t kh, int64_t ks, int64_t vb,
    int64_t vh, int64_t vs, float scale, bool causal) {
  extern __shared__ float smem[];
  float* Qs = smem;                                  // [QROWS][MAX_HEAD_DIM], scaled
  float* Ks = Qs + QROWS * MAX_HEAD_DIM;             // [KV][MAX_HEAD_DIM + 1]
  float* Vs = Ks + KV * (MAX_HEAD_DIM + 1);          // [KV][MAX_HEAD_DIM]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bh = blockIdx.y, b = bh / heads, h = bh % heads;
  const int64_t q0 = (int64_t)blockIdx.x * QROWS;
  const T* Qp = Q + b * qb + h * qh;
  const T* Kp = K + b * kb + h * kh;
  const T* Vp = V + b * vb + h * vh;
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
  for (int64_t j0 = 0; j0 < kv_end; j0 += KV) {
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
      const bool valid = j < S && (!causal || j <= q);
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

template <typename T>
void launch(const T* q, const T* k, const T* v, T* o, int64_t batch, int64_t heads, int64_t S, int D,
            const int64_t* st, float scale, bool causal, cudaStream_t s) {
  constexpr int smem = SMEM_FLOATS * (int)sizeof(float);
  if (smem > 48 * 1024) {  // more than 48 KB of shared memory must be requested (per device, so every call)
    const cudaError_t e = cudaFuncSetAttribute(flash_attention_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) throw std::runtime_error(std::string("flash_attention shared memory: ") + cudaGetErrorString(e));
  }
  const dim3 grid((unsigned)((S + QROWS - 1) / QROWS), (unsigned)(batch * heads));
  flash_attention_kernel<T><<<grid, WARPS * 32, smem, s>>>(q, k, v, o, heads, S, D, st[0], st[1], st[2], st[3],
                                                           st[4], st[5], st[6], st[7], st[8], scale, causal);
}

void flash_attention_launch(int dtype, int64_t q, int64_t k, int64_t v, int64_t o, int64_t batch, int64_t heads,
                            int64_t seq, int64_t head_dim, int64_t qb, int64_t qh, int64_t qs, int64_t kb, int64_t kh,
                            int64_t ks, int64_t vb, int64_t vh, int64_t vs, double scale, bool causal,
                            int64_t stream) {
  const int64_t strides[9] = {qb, qh, qs, kb, kh, ks, vb, vh, vs};
  AK_DISPATCH(dtype, {
    launch<scalar_t>(ak::ptr<const scalar_t>(q), ak::ptr<const scalar_t>(k), ak::ptr<const scalar_t>(v),
                     ak::ptr<scalar_t>(o), batch, heads, seq, (int)head_dim, strides, (float)scale, causal,
                     ak::as_stream(stream));
  });
  ak::check_launch("flash_attention_kernel");
}
"""

PROTOTYPES = ["void flash_attention_launch(int dtype, int64_t q, int64_t k, int64_t v, int64_t o, int64_t batch, "
              "int64_t heads, int64_t seq, int64_t head_dim, int64_t qb, int64_t qh, int64_t qs, int64_t kb, "
              "int64_t kh, int64_t ks, int64_t vb, int64_t vh, int64_t vs, double scale, bool causal, "
              "int64_t stream)"]


def cuda_source() -> str:
    """The whole translation unit: shared helpers, the compile-time tunables, the kernel."""
    sizes = {"WARPS": WARPS, "ROWS": ROWS, "MAX_HEAD_DIM": MAX_HEAD_DIM}
    return cuda_build.PRELUDE + cuda_build.defines(sizes) + CUDA_SRC


@functools.cache
def _module():
    return cuda_build.load(KERNEL_TYPE, cuda_source(), PROTOTYPES)


def kernel_fn(Q, K, V, causal=True, sm_scale=None):
    batch, heads, seq, head_dim = Q.shape
    if K.shape != Q.shape or V.shape != Q.shape:
        raise ValueError(f"this starter needs Q, K and V of one shape, got {tuple(Q.shape)}, {tuple(K.shape)}, "
                         f"{tuple(V.shape)}")
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim} > MAX_HEAD_DIM = {MAX_HEAD_DIM}: raise MAX_HEAD_DIM in this file")
    if batch * heads > 65535:
        raise ValueError(f"batch * heads = {batch * heads} exceeds the grid's y limit of 65535")
    Q, K, V = (t if t.stride(-1) == 1 else t.contiguous() for t in (Q, K, V))
    cuda_build.check_dtypes(Q, K, V)
    out = torch.empty((batch, heads, seq, head_dim), dtype=Q.dtype, device=Q.device)
    if out.numel() == 0:
        return out
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    strides = [s for t in (Q, K, V) for s in t.stride()[:3]]
    _module().flash_attention_launch(cuda_build.dtype_code(Q), Q.data_ptr(), K.data_ptr(), V.data_ptr(),
                                     out.data_ptr(), batch, heads, seq, head_dim, *strides, float(scale),
                                     bool(causal), cuda_build.stream_of(Q))
    return out
