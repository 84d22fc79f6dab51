"""Rotary embedding (rotate-half, LLaMA / GPT-NeoX), CUDA C++ starter.

x is [..., S, D]; cos and sin are [S, D/2]; out = cat(x1*cos - x2*sin, x2*cos + x1*sin) with x1, x2 the
two halves of each head. Memory-bound: x read once and written once, plus the tables once (they stay in
L2): (2 * B*H*S*D + S*D) * element_size bytes. At 2x32x4096x128 fp16 that is 134 MB: ~45 us at ~3 TB/s.

One thread per pack of a half-row position (s, column): it loads a 16-byte pack (VEC_BYTES) of cos and
sin once, then for each of ~PLANES_PER_BLOCK (batch, head) planes the matching packs of x1 and x2 and
writes both output packs, so every byte of x is touched once, all loads are coalesced 16-byte loads and
the tables are read from L2 once per PLANES_PER_BLOCK planes. The grid is 2-D (positions x planes), so
the index math is one 32-bit division per thread instead of three 64-bit ones. x may be strided over
batch, heads and sequence (q transposed from [B, S, H, D] is a view): its strides are kernel arguments,
only the last dimension must be contiguous (else it is copied). Packs are used when D/2, the strides and
the pointers allow; otherwise single elements. fp32 math.

Tunables: THREADS and PLANES_PER_BLOCK are launch parameters; VEC_BYTES is compiled in.
"""

import functools

import torch

from autokernel import cuda_build

KERNEL_TYPE = "rotary_embedding"
BACKEND = "cuda"

THREADS = 256  # threads per block (multiple of 32, <= 1024; runtime)
PLANES_PER_BLOCK = 4  # (batch, head) planes each block rotates with one load of cos/sin (runtime)
VEC_BYTES = 16  # bytes per vectorized load/store (compile-time): 16 = 8 fp16 or 4 fp32

TUNABLES = {
    "THREADS": [64, 128, 256, 512, 1024],
    "PLANES_PER_BLOCK": [1, 2, 4, 8, 16],
    "VEC_BYTES": [4, 8, 16],
}

CUDA_SRC = r"""
// grid.x covers one (batch, head) plane of seq x half/V packs, grid.y the planes, each block looping over
// ~planes_per_block of them (cos and sin are loaded once per thread and kept in registers), so a thread finds its row and column with one 32-bit division (64-bit divisions are software routines,
// dozens of instructions each, which is what the first version spent its time on). 32 registers.
template <typename T, int V>
__global__ void __launch_bounds__(1024) rotary_kernel(const T* __restrict__ x, const T* __restrict__ cos_t,
                                                      const T* __restrict__ sin_t, T* __restrict__ out,
                                                      int64_t planes, int heads, int seq, int half,
                                                      int64_t stride_b, int64_t stride_h, int64_t stride_s) {
  const unsigned per_row = (unsigned)(half / V);
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;  // < seq * per_row < 2^31 (the launcher checks)
  if (t >= (unsigned)seq * per_row) return;
  const unsigned s = t / per_row;
  const int c = (int)(t - s * per_row) * V;  // first column of this pack within the half
  float cs[V], sn[V];
  ak::load_pack<T, V>(cos_t + (int64_t)s * half + c, cs);
  ak::load_pack<T, V>(sin_t + (int64_t)s * half + c, sn);
  for (int64_t bh = blockIdx.y; bh < planes; bh += gridDim.y) {
    const int64_t b = bh / heads, h = bh - b * heads;  // uniform per block: one division per plane
    const T* xr = x + b * stride_b + h * stride_h + (int64_t)s * stride_s;
    float x1[V], x2[V], o1[V], o2[V];
    ak::load_pack<T, V>(xr + c, x1);
    ak::load_pack<T, V>(xr + half + c, x2);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      o1[j] = x1[j] * cs[j] - x2[j] * sn[j];
      o2[j] = x2[j] * cs[j] + x1[j] * sn[j];
    }
    T* orow = out + (bh * seq + s) * 2 * (int64_t)half;
    ak::store_pack<T, V>(orow + c, o1);
    ak::store_pack<T, V>(orow + half + c, o2);
  }
}

void rotary_launch(int dtype, int64_t x, int64_t cos_t, int64_t sin_t, int64_t out, int64_t batch, int64_t heads,
                   int64_t seq, int64_t half, int64_t stride_b, int64_t stride_h, int64_t stride_s, int threads,
                   int planes_per_block, bool vectorized, int64_t stream) {
  if (planes_per_block < 1) throw std::invalid_argument("rotary_kernel: planes_per_block must be >= 1");
  if (seq * half >= (int64_t(1) << 31) || heads >= (int64_t(1) << 31))
    throw std::invalid_argument("rotary_kernel: seq * head_dim / 2 and heads must be below 2^31");
  AK_DISPATCH(dtype, {
    constexpr int V = ak::pack_width<scalar_t>(VEC_BYTES);
    const int64_t planes = batch * heads;
    auto go = [&](auto kernel, int width) {
      const int t = ak::fit_threads(kernel, threads);
      const int64_t per_plane = seq * (half / width);
      const int64_t ys = (planes + planes_per_block - 1) / planes_per_block;
      const dim3 grid((unsigned)((per_plane + t - 1) / t), (unsigned)(ys < 65535 ? ys : 65535));
      kernel<<<grid, t, 0, ak::as_stream(stream)>>>(
          ak::ptr<const scalar_t>(x), ak::ptr<const scalar_t>(cos_t), ak::ptr<const scalar_t>(sin_t),
          ak::ptr<scalar_t>(out), planes, (int)heads, (int)seq, (int)half, stride_b, stride_h, stride_s);
    };
    if (vectorized) go(&rotary_kernel<scalar_t, V>, V);
    else go(&rotary_kernel<scalar_t, 1>, 1);
  });
  ak::check_launch("rotary_kernel");
}
"""

PROTOTYPES = ["void rotary_launch(int dtype, int64_t x, int64_t cos_t, int64_t sin_t, int64_t out, int64_t batch, "
              "int64_t heads, int64_t seq, int64_t half, int64_t stride_b, int64_t stride_h, int64_t stride_s, "
              "int threads, int planes_per_block, bool vectorized, int64_t stream)"]


def cuda_source() -> str:
    """The whole translation unit: shared helpers, the compile-time tunables, the kernel."""
    return cuda_build.PRELUDE + cuda_build.defines({"VEC_BYTES": VEC_BYTES}) + CUDA_SRC


@functools.cache
def _module():
    return cuda_build.load(KERNEL_TYPE, cuda_source(), PROTOTYPES)


def _as_bhsd(x):
    """x as a 4-D [B, H, S, D] view (leading dims added or merged; merging may copy)."""
    if x.dim() < 4:
        return x.reshape((1,) * (4 - x.dim()) + tuple(x.shape))
    if x.dim() > 4:
        return x.reshape(-1, *x.shape[-3:])
    return x


def kernel_fn(x, cos, sin):
    *_, s, d = x.shape
    half = d // 2
    x4 = _as_bhsd(x)
    if x4.stride(-1) != 1:
        x4 = x4.contiguous()
    cos2, sin2 = cos.reshape(s, half).contiguous(), sin.reshape(s, half).contiguous()
    cuda_build.check_dtypes(x4, cos2, sin2)
    out = torch.empty(x4.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out.view(x.shape)
    width = cuda_build.pack_width(VEC_BYTES, x4)
    vec = cuda_build.vectorizable(width, half, x4, cos2, sin2, out)
    threads = cuda_build.block_threads(1, 1, THREADS)
    bsz, heads = x4.shape[0], x4.shape[1]
    _module().rotary_launch(cuda_build.dtype_code(x4), x4.data_ptr(), cos2.data_ptr(), sin2.data_ptr(),
                            out.data_ptr(), bsz, heads, s, half, x4.stride(0), x4.stride(1), x4.stride(2),
                            threads, PLANES_PER_BLOCK, vec, cuda_build.stream_of(x4))
    return out.view(x.shape)
