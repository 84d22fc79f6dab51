"""layernorm: LayerNorm over the last dimension with affine weight and bias, and where a model runs it
(nn.LayerNorm modules, F.layer_norm calls)."""

import re

import torch.nn as nn
import torch.nn.functional as F

from autokernel.kerneltype import Deployment, KernelSpec, Profiling
from autokernel.ops import customops
from autokernel.ops.customops import CallSites, Site, grad_reason, in_eager
from autokernel.ops.swap import KernelModule
from autokernel.types._common import first_rows, module_rows, norm_inputs, norm_unfit, row_flops, row_norm

NAME = "layernorm"


def layernorm_ref(x, weight, bias, eps: float = 1e-5):
    """LayerNorm over the last dimension with affine weight and bias."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


# ------------------------------------------------------------------------------ where a model runs it
class KernelLayerNorm(KernelModule):
    def __init__(self, original: nn.LayerNorm, site):
        super().__init__(original, site, NAME)

    def forward(self, x):
        # no affine weight or bias: ones and zeros compute the same, and the kernel takes tensors
        norm = self._original
        w, b = norm.weight, norm.bias
        w = w if w is not None else x.new_ones(x.shape[-1])
        b = b if b is not None else x.new_zeros(x.shape[-1])
        if not self._fits(x, w) or b.dtype != x.dtype:
            return norm(x)
        return self.op(x, w, b, norm.eps)


def layernorm_module_site(name, m):
    """nn.LayerNorm itself over the last dimension (a subclass's forward may differ)."""
    if not isinstance(m, nn.LayerNorm):
        return None
    if type(m) is not nn.LayerNorm:
        return Site(name, type(m).__name__, NAME, False, "a LayerNorm subclass: its forward may differ"), None
    site = Site(name, f"LayerNorm({', '.join(map(str, m.normalized_shape))})", NAME, False)
    if len(m.normalized_shape) != 1:
        site.reason = "normalizes over more than the last dimension"
        return site, None
    site.swapped = True
    return site, KernelLayerNorm(m, site)


_F_LAYER_NORM = customops.original(F, "layer_norm")


def replace_layer_norm(sites: CallSites) -> dict:
    """F.layer_norm -> layernorm where the call normalizes the last dimension in one dtype."""
    kernel = customops.op(NAME)

    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
        reason = norm_unfit(input, normalized_shape, weight, bias) or grad_reason(input, weight, bias)
        if in_eager():
            sites.hit("F.layer_norm", NAME, reason)
        if reason:
            return _F_LAYER_NORM(input, normalized_shape, weight, bias, eps)
        weight = weight if weight is not None else input.new_ones(input.shape[-1])
        return kernel(input, weight, bias if bias is not None else input.new_zeros(input.shape[-1]), eps)

    return {_F_LAYER_NORM: layer_norm}


SPEC = KernelSpec(
    name=NAME,
    reference=layernorm_ref,
    **row_norm(with_bias=True),
    flops=row_flops(8),
    adversarial={
        # var = E[x^2] - E[x]^2 cancels catastrophically around a large mean
        "large_mean": norm_inputs(with_bias=True, scale=1.0, offset=1000.0),
        "near_zero_variance": norm_inputs(with_bias=True, scale=1e-3, offset=1.0),
    },
    description="LayerNorm over the last dimension, affine",
    profiling=Profiling(modules=re.compile(r"layer_?norm", re.I),
                        ops=frozenset({"aten::layer_norm", "aten::native_layer_norm"}),
                        kernels=re.compile(r"layer_?norm", re.I), op_shape=first_rows, module_shape=module_rows),
    default_speedup=1.2,  # eager's layer_norm is already one fused kernel
    extra_baselines=lambda liger: {"liger": lambda x, w, b, eps=1e-5: liger.liger_layer_norm(x, w, b, eps)}
    if liger else {},
    deployment=Deployment("(Tensor x, Tensor weight, Tensor bias, float eps) -> Tensor",
                          lambda x, weight, bias, eps: x.shape,
                          module_site=layernorm_module_site, functions=replace_layer_norm),
)
