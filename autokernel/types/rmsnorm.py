"""rmsnorm: LLaMA's RMSNorm over the last dimension, and where a model runs it (*RMSNorm* modules that pass the
probe, F.rms_norm calls)."""

import re

import torch
import torch.nn.functional as F

from autokernel.kerneltype import Deployment, KernelSpec, Profiling
from autokernel.ops import customops
from autokernel.ops.customops import CallSites, Site, grad_reason, in_eager
from autokernel.ops.swap import KernelModule, f64, probe
from autokernel.types._common import (
    compute_dtype,
    first_rows,
    module_rows,
    norm_inputs,
    norm_unfit,
    row_flops,
    row_norm,
)

NAME = "rmsnorm"


def rmsnorm_ref(x, weight, eps: float = 1e-6):
    """LLaMA's RMSNorm, written out as users write it: x * rsqrt(mean(x^2) + eps) * weight."""
    xf = x.to(compute_dtype(x))
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


# -------------------------------------------------------------------------------- what the profiler reads
CASTS = {"aten::to", "aten::_to_copy", "aten::type_as"}


def _span(names: list[str], pos: int) -> tuple[int, int] | None:
    """RMSNorm written as plain ops, [to] pow|mul -> mean -> [add] -> rsqrt -> mul [to] [mul]: the (first, last)
    positions of the one around the rsqrt at pos, or None if there is none there."""
    if names[pos] != "aten::rsqrt":
        return None
    k = pos - 1
    if k >= 0 and names[k] in ("aten::add", "aten::add_"):
        k -= 1  # + eps
    if k < 1 or names[k] != "aten::mean" or names[k - 1] not in ("aten::pow", "aten::mul", "aten::square"):
        return None
    first = k - 1
    if first > 0 and names[first - 1] in CASTS:
        first -= 1  # x.float()
    last = pos + 1
    if last >= len(names) or names[last] != "aten::mul":
        return None  # x * rstd
    if last + 1 < len(names) and names[last + 1] in CASTS:
        last += 1  # .to(x.dtype)
    if last + 1 < len(names) and names[last + 1] == "aten::mul":
        last += 1  # * weight
    return first, last


def _baselines(liger) -> dict:
    extra = {"F.rms_norm": lambda x, w, eps=1e-6: F.rms_norm(x, (x.shape[-1],), w, eps)}
    if liger is not None:
        extra["liger"] = lambda x, w, eps=1e-6: liger.liger_rms_norm(x, w, eps, in_place=False)
    return extra


# ------------------------------------------------------------------------------ where a model runs it
class KernelRMSNorm(KernelModule):
    """An RMSNorm module's replacement; unit_offset: the module scales by 1 + weight (Gemma's), the kernel by a copy
    of 1 + weight in the weight's dtype, made again when the weight changes."""

    def __init__(self, original, site, eps: float, unit_offset: bool = False):
        super().__init__(original, site, NAME)
        self.eps, self.unit_offset = eps, unit_offset
        self._scale, self._scale_of = None, None

    def forward(self, x):
        w = self._original.weight
        if not self._fits(x, w):
            return self._original(x)
        return self.op(x, self._scale_from(w) if self.unit_offset else w, self.eps)

    def _scale_from(self, w):
        if torch.compiler.is_compiling():  # traced: one small op the graph keeps
            return (1.0 + w.float()).to(w.dtype)
        if self._scale_of != (w.data_ptr(), w._version):
            self._scale, self._scale_of = (1.0 + w.detach().float()).to(w.dtype), (w.data_ptr(), w._version)
        return self._scale


def rmsnorm_probed(name, m) -> tuple[Site, float | None]:
    """The Site of an RMSNorm module and its eps; site.swapped only where it computes the reference."""
    eps = getattr(m, "eps", getattr(m, "variance_epsilon", None))
    weight = getattr(m, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return Site(name, type(m).__name__, NAME, False, "no 1-D weight"), None
    if eps is None and hasattr(m, "eps"):  # nn.RMSNorm(eps=None) uses the dtype's machine epsilon
        eps = torch.finfo(weight.dtype).eps
    if not isinstance(eps, float):
        return Site(name, type(m).__name__, NAME, False, "no float eps / variance_epsilon attribute"), None
    site = Site(name, f"{type(m).__name__}({weight.shape[0]})", NAME, True)
    reason = probe(m, weight.shape[0], lambda x: rmsnorm_ref(x, f64(weight), eps))
    if reason:
        site.swapped, site.reason = False, reason
    return site, eps


def rmsnorm_module_site(name, m):
    """A module whose class is named *RMSNorm* and passes the probe, as LLaMA's or with a unit offset: x * rsqrt(
    mean(x^2) + eps) * (1 + weight), Gemma's (whose weights start at zero)."""
    if "RMSNorm" not in type(m).__name__:
        return None
    site, eps = rmsnorm_probed(name, m)
    offset = not site.swapped and eps is not None and probe(  # an eps: a 1-D weight too (rmsnorm_probed)
        m, m.weight.shape[0], lambda x: rmsnorm_ref(x, 1 + f64(m.weight), eps)) is None
    if offset:
        site.swapped, site.reason, site.what = True, "", f"{site.what}, 1 + weight"
    return site, (KernelRMSNorm(m, site, eps, offset) if site.swapped else None)


_F_RMS_NORM = customops.original(F, "rms_norm")  # torch >= 2.4 has it


def replace_rms_norm(sites: CallSites) -> dict:
    """F.rms_norm -> rmsnorm where the call normalizes the last dimension in one dtype."""
    if _F_RMS_NORM is None:
        return {}
    kernel = customops.op(NAME)

    def rms_norm(input, normalized_shape, weight=None, eps=None):
        reason = norm_unfit(input, normalized_shape, weight) or grad_reason(input, weight)
        if in_eager():
            sites.hit("F.rms_norm", NAME, reason)
        if reason:
            return _F_RMS_NORM(input, normalized_shape, weight, eps)
        weight = weight if weight is not None else input.new_ones(input.shape[-1])
        return kernel(input, weight, torch.finfo(input.dtype).eps if eps is None else eps)  # F.rms_norm's default

    return {_F_RMS_NORM: rms_norm}


SPEC = KernelSpec(
    name=NAME,
    reference=rmsnorm_ref,
    **row_norm(with_bias=False),
    flops=row_flops(4),
    adversarial={
        # mean(x^2) ~ 1e-8, below eps: eps must be added inside the rsqrt, in fp32
        "near_zero": norm_inputs(with_bias=False, scale=1e-4),
        # x^2 summed over a row overflows fp16 unless accumulated in fp32
        "large_values": norm_inputs(with_bias=False, scale=200.0),
    },
    description="RMSNorm (LLaMA) over the last dimension",
    profiling=Profiling(modules=re.compile(r"rms_?norm", re.I),
                        ops=frozenset({"aten::rms_norm", "aten::_fused_rms_norm"}),
                        kernels=re.compile(r"rms_?norm", re.I), op_shape=first_rows, module_shape=module_rows,
                        op_pattern=_span, precedence=-1),  # a class named *RMSLayerNorm* is rmsnorm
    default_speedup=2.0,  # eager runs pow/mean/add+rsqrt/mul/mul as ~5 kernels; one pass moves 1/3 the bytes
    extra_baselines=_baselines,
    deployment=Deployment("(Tensor x, Tensor weight, float eps) -> Tensor", lambda x, weight, eps: x.shape,
                          module_site=rmsnorm_module_site, functions=replace_rms_norm),
)
