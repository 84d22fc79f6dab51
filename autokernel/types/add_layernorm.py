"""add_layernorm: a decoder layer's residual add and the LayerNorm after it as one kernel, (sum, normed), and where
a model runs them (a pre-norm decoder layer, GPT-2's block, whose post-attention norm is an nn.LayerNorm: its
forward rewritten, autokernel/ops/addnorm_sites.py)."""

import torch
import torch.nn as nn

from autokernel.kerneltype import Deployment, KernelSpec
from autokernel.ops import addnorm_sites
from autokernel.types import _addnorm
from autokernel.types._common import randn, rows
from autokernel.types.layernorm import layernorm_ref

NAME = "add_layernorm"


def add_layernorm_ref(x, residual, weight, bias, eps: float = 1e-5):
    """The residual add and the LayerNorm after it (GPT-2's `attn_out + residual`, then ln_2): (sum, normed)."""
    total = x + residual
    return total, layernorm_ref(total, weight, bias, eps)


def _exact_sum(binade: float, scale: float):
    """(x, residual, weight, bias) whose sums lie in [binade, 2 binade) (binade a power of two), x and residual on
    the dtype's grid there: the sum is exact, so its rounding (eager's too, which the float64 oracle does not
    do) stays out of a test of the statistics around a large mean."""
    def make(shape, dtype, device, gen):
        step = binade * torch.finfo(dtype).eps  # the spacing of [binade, 2 binade)
        x = (randn(rows(shape), torch.float32, device, gen, scale) / step).round() * step
        r = (randn(rows(shape), torch.float32, device, gen, scale) / step).round() * step + 1.5 * binade
        x, r = x.clamp(-binade / 8, binade / 8), r.clamp(1.125 * binade, 1.875 * binade - step)
        weight = randn((shape["N"],), dtype, device, gen, 0.5) + 1
        return x.to(dtype), r.to(dtype), weight, randn((shape["N"],), dtype, device, gen, 0.5)
    return make


def add_layernorm_layer_site(name, m):
    """A pre-norm decoder layer whose post-attention norm is an nn.LayerNorm."""
    layout = addnorm_sites.layout_of(m)
    if layout is None or not isinstance(getattr(m, layout[2]), nn.LayerNorm):
        return None
    norm = getattr(m, layout[2])
    reason = None
    if type(norm) is not nn.LayerNorm:
        reason = "a LayerNorm subclass: its forward may differ"
    elif len(norm.normalized_shape) != 1:
        reason = "normalizes over more than the last dimension"
    return addnorm_sites.fuse(name, m, layout[2], NAME, reason, norm.eps, with_bias=True)


SPEC = KernelSpec(
    name=NAME,
    reference=add_layernorm_ref,
    **_addnorm.spec_fields(with_bias=True, flops_per_element=9),
    adversarial={
        # var = E[s^2] - E[s]^2 cancels catastrophically around a large mean of the sum
        "large_mean": _exact_sum(binade=512.0, scale=8.0),
        "near_zero_variance": _exact_sum(binade=1.0, scale=1e-3),
    },
    description="residual add + LayerNorm: (x + residual, layernorm(x + residual)), the sum rounded first",
    default_speedup=1.3,  # eager: the add and the norm as two kernels, the sum written and read back
    deployment=Deployment("(Tensor x, Tensor residual, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor)",
                          _addnorm.output_shapes, module_site=add_layernorm_layer_site),
)
