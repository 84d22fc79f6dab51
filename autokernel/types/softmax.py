"""softmax: softmax over the last dimension, and where a model calls it (F.softmax, torch.softmax)."""

import re

import torch
import torch.nn.functional as F

from autokernel.kerneltype import Deployment, KernelSpec, Profiling
from autokernel.ops import customops
from autokernel.ops.customops import KERNEL_DTYPES, CallSites, grad_reason, in_eager
from autokernel.types._common import ROW_TYPE_SHAPES, first_padded, first_rows, randn, row_bytes, row_flops, rows

NAME = "softmax"


def softmax_ref(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension."""
    return torch.softmax(x, dim=-1)


def _inputs(shape, dtype, device, gen):
    return (randn(rows(shape), dtype, device, gen, scale=3.0),)


def _huge_equal(shape, dtype, device, gen):
    # Every logit the same huge value: exp() without subtracting the row max overflows to inf/inf.
    big = min(torch.finfo(dtype).max / 4, 1e30)
    return (torch.full(rows(shape), big, dtype=dtype, device=device),)


def _large_spread(shape, dtype, device, gen):
    limit = min(torch.finfo(dtype).max / 4, 1e4)
    return ((randn(rows(shape), torch.float32, device, gen, 1e4).clamp(-limit, limit)).to(dtype),)


def _masked(shape, dtype, device, gen):
    # Causal-mask style -inf entries; column 0 stays finite so every row has a valid answer.
    x = randn(rows(shape), dtype, device, gen)
    mask = torch.rand(rows(shape), device=device, generator=gen) < 0.5
    mask[..., 0] = False
    return (x.masked_fill(mask, float("-inf")),)


# ------------------------------------------------------------------ the drop-in F.softmax and torch.softmax
_F_SOFTMAX, _TORCH_SOFTMAX = customops.original(F, "softmax"), customops.original(torch, "softmax")


def _unfit(x, dim) -> str | None:
    if dim is None or x.dim() == 0 or dim % x.dim() != x.dim() - 1:
        return "not over the last dimension"
    if x.dtype not in KERNEL_DTYPES or x.numel() == 0:
        return f"dtype {x.dtype}" if x.numel() else "empty input"
    return None


def replace_softmax(sites: CallSites) -> dict:
    """F.softmax and torch.softmax -> softmax over the last dimension, where the call fits."""
    kernel = customops.op(NAME)

    def run(name, x, dim, dtype, fallback):
        if dtype is not None:  # softmax(x, dtype=float32) is the softmax of x cast first
            x = x.to(dtype)
        reason = _unfit(x, dim) or grad_reason(x)
        if in_eager():
            sites.hit(name, NAME, reason, depth=3)
        return fallback(x) if reason else kernel(x)

    def f_softmax(input, dim=None, _stacklevel=3, dtype=None):
        return run("F.softmax", input, dim, dtype, lambda x: _F_SOFTMAX(x, dim))

    def torch_softmax(input, dim, dtype=None):
        return run("torch.softmax", input, dim, dtype, lambda x: _TORCH_SOFTMAX(x, dim))

    return {_F_SOFTMAX: f_softmax, _TORCH_SOFTMAX: torch_softmax}


SPEC = KernelSpec(
    name=NAME,
    reference=softmax_ref,
    make_inputs=_inputs,
    **ROW_TYPE_SHAPES,
    bytes_moved=row_bytes(1, 1), flops=row_flops(5),
    adversarial={"huge_equal_logits": _huge_equal, "large_spread": _large_spread, "masked_minus_inf": _masked},
    noncontiguous=first_padded,
    description="softmax over the last dimension",
    profiling=Profiling(ops=frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax"}),
                        kernels=re.compile(r"soft_?max", re.I), op_shape=first_rows),
    default_speedup=1.2,  # eager's softmax is already one fused kernel
    extra_baselines=lambda liger: {"liger": liger.liger_softmax} if liger else {},
    deployment=Deployment("(Tensor x) -> Tensor", lambda x: x.shape, functions=replace_softmax),
)
