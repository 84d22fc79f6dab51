"""Rotary embedding (rotate-half, LLaMA / GPT-NeoX), CUDA C++ starter.

x is [..., S, D]; cos and sin are [S, D/2]; out = cat(x1*cos - x2*sin, x2*cos + x1*sin) with x1, x2 the
two halves of each head. Memory-bound: x read once and written once, plus the tables once (they stay in
L2): (2 * B*H*S*D + S*D) * element_size bytes. At 2x32x4096x128 fp16 that is 134 MB: ~45 us at ~3 TB/s.

One thread per pack of a half-row position (s, column) and PLANES (batch, head) planes: it loads a 16-byte
pack (VEC_BYTES) of cos and of sin, then the matching packs of x1 and x2 of all PLANES planes, every load
issued before the first use (2 + 2 x PLANES packs: 160 bytes in flight per thread at PLANES 4, kept raw,
4 registers per pack), and only then computes and writes both output packs of each plane: every byte of x
is touched once, all accesses are coalesced 16-byte ones, and the tables are read from L2 once per PLANES
planes. Looping over the planes one at a time (32 bytes in flight per thread) left the memory system idle
between loads. The defaults, 2 planes and 128-thread blocks (96 bytes in flight per thread), are the fastest
of the launch shapes timed (BENCHMARKS.md, the starter defaults).
The grid is 2-D (positions x plane groups), so the index math is one 32-bit division per thread and one per
plane. x may be strided over batch, heads and sequence (q transposed from [B, S, H, D] is a view): its
strides are kernel arguments, only the last dimension must be contiguous (else it is copied). Packs are
used when D/2, the strides and the pointers allow; otherwise single elements. fp32 math.

Tunables: THREADS is a launch parameter; PLANES and VEC_BYTES are compiled in.
"""

import functools

import torch

from autokernel.cuda import cuda_build

KERNEL_TYPE = "rotary_embedding"
BACKEND = "cuda"

THREADS = 128  # threads per block (multiple of 32, <= 256; runtime)
PLANES = 2  # (batch, head) planes each thread rotates, all loads in flight at once (compile-time)
VEC_BYTES = 16  # bytes per vectorized load/store (compile-time): 16 = 8 fp16 or 4 fp32

TUNABLES = {
    "THREADS": [64, 128, 256],
    "PLANES": [1, 2, 4, 8],
    "VEC_BYTES": [4, 8, 16],
}

CUDA_SRC = r"""
// grid.x covers one (batch, head) plane of seq x half/V packs, grid.y groups of PLANES planes (looping when
// there are more than 65535 groups). A thread loads its cos and sin packs and the x1, x2 packs of its PLANES
// planes, all before the first use, then computes and stores. One 32-bit division per thread for (s, column)
// and one per plane for (batch, head). Registers: (2 + 2 PLANES) x 4 for the raw packs, the fp32 cos and sin,
// addresses: over 64 at PLANES 4 (at 1024 threads it spilled), hence blocks of at most 256 threads.
template <typename T, int V>
__global__ void __launch_bounds__(256) rotary_kernel(const T* __restrict__ x, const T* __restrict__ cos_t,
                                                      const T* __restrict__ sin_t, T* __restrict__ out,
                                                      int planes, int heads, int seq, int half,
                                                      int64_t stride_b, int64_t stride_h, int64_t stride_s) {
  const unsigned per_row = (unsigned)(half / V);
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;  // < seq * per_row < 2^31 (the launcher checks)
  if (t >= (unsigned)seq * per_row) return;
  const unsigned s = t / per_row;
  const int c = (int)(t - s * per_row) * V;  // first column of this pack within the half
  const ak::Pack<T, V> cs_raw = ak::load_raw<T, V>(cos_t + (int64_t)s * half + c);
  const ak::Pack<T, V> sn_raw = ak::load_raw<T, V>(sin_t + (int64_t)s * half + c);
  for (int base = blockIdx.y * PLANES; base < planes; base += gridDim.y * PLANES) {
    ak::Pack<T, V> x1[PLANES], x2[PLANES];
#pragma unroll
    for (int u = 0; u < PLANES; ++u) {
      const int bh = base + u;
      if (bh < planes) {
        const int b = bh / heads, h = bh - b * heads;
        const T* xr = x + b * stride_b + h * stride_h + (int64_t)s * stride_s + c;
        x1[u] = ak::load_raw<T, V>(xr);
        x2[u] = ak::load_raw<T, V>(xr + half);
      }
    }
#pragma unroll
    for (int u = 0; u < PLANES; ++u) {
      const int bh = base + u;
      if (bh < planes) {
        float o1[V], o2[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float a = ak::to_f(x1[u].v[j]), b = ak::to_f(x2[u].v[j]);
          const float cs = ak::to_f(cs_raw.v[j]), sn = ak::to_f(sn_raw.v[j]);
          o1[j] = a * cs - b * sn;
          o2[j] = b * cs + a * sn;
        }
        T* orow = out + ((int64_t)bh * seq + s) * 2 * (int64_t)half;
        ak::store_pack<T, V>(orow + c, o1);
        ak::store_pack<T, V>(orow + half + c, o2);
      }
    }
  }
}

void rotary_launch(int dtype, int64_t x, int64_t cos_t, int64_t sin_t, int64_t out, int64_t batch, int64_t heads,
                   int64_t seq, int64_t half, int64_t stride_b, int64_t stride_h, int64_t stride_s, int threads,
                   bool vectorized, int64_t stream) {
  static_assert(PLANES >= 1, "PLANES must be >= 1");
  if (seq * half >= (int64_t(1) << 31) || batch * heads >= (int64_t(1) << 31) - PLANES)
    throw std::invalid_argument("rotary_kernel: seq * head_dim / 2 and batch * heads must be below 2^31");
  AK_DISPATCH(dtype, {
    constexpr int V = ak::pack_width<scalar_t>(VEC_BYTES);
    const int64_t planes = batch * heads;
    auto go = [&](auto kernel, int width) {
      const int t = ak::fit_threads(kernel, threads);
      const int64_t per_plane = seq * (half / width);
      const int64_t ys = (planes + PLANES - 1) / PLANES;
      const dim3 grid((unsigned)((per_plane + t - 1) / t), (unsigned)(ys < 65535 ? ys : 65535));
      kernel<<<grid, t, 0, ak::as_stream(stream)>>>(
          ak::ptr<const scalar_t>(x), ak::ptr<const scalar_t>(cos_t), ak::ptr<const scalar_t>(sin_t),
          ak::ptr<scalar_t>(out), (int)planes, (int)heads, (int)seq, (int)half, stride_b, stride_h, stride_s);
    };
    if (vectorized) go(&rotary_kernel<scalar_t, V>, V);
    else go(&rotary_kernel<scalar_t, 1>, 1);
  });
  ak::check_launch("rotary_kernel");
}
"""

PROTOTYPES = ["void rotary_launch(int dtype, int64_t x, int64_t cos_t, int64_t sin_t, int64_t out, int64_t batch, "
              "int64_t heads, int64_t seq, int64_t half, int64_t stride_b, int64_t stride_h, int64_t stride_s, "
              "int threads, bool vectorized, int64_t stream)"]


def cuda_source() -> str:
    """The whole translation unit: shared helpers, the compile-time tunables, the kernel."""
    return cuda_build.PRELUDE + cuda_build.defines({"VEC_BYTES": VEC_BYTES, "PLANES": PLANES}) + CUDA_SRC


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
                            threads, vec, cuda_build.stream_of(x4))
    return out.view(x.shape)
