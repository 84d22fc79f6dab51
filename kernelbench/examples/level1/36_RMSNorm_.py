"""RMS normalization over dim 1 (features) of a [batch, features, *spatial] tensor, eps from Model.

Each program takes BLOCK spatial positions of one batch item and walks the features twice (sum of
squares, then the scaled write): loads are contiguous along the spatial axis, where the memory is.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 1024  # spatial positions per program


@triton.jit
def _rmsnorm_dim1_kernel(x_ptr, out_ptr, F, S, eps, BLOCK: tl.constexpr):
    b = tl.program_id(1).to(tl.int64)
    pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = pos < S
    base = b * F * S + pos
    acc = tl.zeros([BLOCK], tl.float32)
    for f in range(0, F):
        x = tl.load(x_ptr + base + f * S, mask=mask, other=0.0).to(tl.float32)
        acc += x * x
    inv = 1.0 / tl.sqrt(acc / F + eps)
    for f in range(0, F):
        x = tl.load(x_ptr + base + f * S, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + base + f * S, (x * inv).to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        batch, features = x.shape[0], x.shape[1]
        spatial = x[0, 0].numel()
        grid = (triton.cdiv(spatial, BLOCK), batch)
        _rmsnorm_dim1_kernel[grid](x, out, features, spatial, self.eps, BLOCK=BLOCK, num_warps=4)
        return out
