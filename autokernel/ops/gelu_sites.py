"""linear_gelu's model sites: GELU MLPs whose up-projection, bias and GELU run as one `autokernel::linear_gelu` call.

A candidate is a module whose children are, by kind, one up-projection H -> I (nn.Linear, or transformers' Conv1D,
x @ W + b with W [H, I]), one activation without parameters, at most one down-projection I -> H, dropouts, and
nothing else: transformers' GPT2MLP (c_fc, act, c_proj, dropout), GPTNeoXMLP (dense_h_to_4h, act, dense_4h_to_h),
PhiMLP (fc1, activation_fn, fc2), BertIntermediate (dense, intermediate_act_fn), an nn.Sequential(Linear, GELU).
Which GELU the activation computes is found by probing it alone on [-8, 8] against both references: the exact one
(GELUActivation, nn.GELU()), the tanh one (NewGELUActivation, GELUTanh, FastGELU, nn.GELU("tanh")), or neither: an
activation whose class is named *GELU* but is something else (QuickGELU, a clipped GELU) is left alone with the
reason, any other activation is no candidate at all. Then the module is probed whole: its forward on a random input
must give down(linear_gelu_ref(x, W, b)) computed in float64 from its own weights (a forward that applies the
activation elsewhere, scales or adds a residual fails, and the module is left alone with the reason).

The module's forward is replaced in place by down(linear_gelu(x, W, b)): the down-projection stays the model's own
module call (cuBLAS), and stays a site of matmul where matmul is asked for; the up-projection and the activation are
the fused call's, and no other type claims them (swap.OWNS). Conv1D's weight is handed over as its transposed view,
never copied. A call the kernel does not fit (a module in training mode, with its dropouts; mixed dtypes; a gradient
wanted) runs the original forward.
"""

from __future__ import annotations

import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from autokernel.ops import customops, swap
from autokernel.ops.customops import KERNEL_DTYPES, Site, grad_reason, in_eager
from autokernel.ops.swap import _f64, _probe, reference

APPROXIMATIONS = ("none", "tanh")  # F.gelu's: the exact (erf) GELU and the tanh one
# The activation probe: fp32 on [-8, 8], where the two GELUs differ by up to 4.7e-4 and fp32 rounding is ~1e-6
ACT_PROBE = torch.linspace(-8.0, 8.0, 1601)
ACT_TOLERANCE = 2e-5


def gelu_mlp_module_site(name, m):
    """linear_gelu's module site: a module holding an up-projection, a GELU and at most a down-projection (see the
    module docstring); (Site, m with its forward replaced) or (Site with the reason, None); None for any other."""
    parts = _parts(m)
    if parts is None:
        return None
    up, act, down = parts
    approximate, why = _which_gelu(getattr(m, act))
    if approximate is None and "gelu" not in type(getattr(m, act)).__name__.lower():
        return None
    label = f"{type(m).__name__}({up}, {act}" + (f", {down})" if down else ")")
    site = Site(name, label, "linear_gelu", False)
    if approximate is None:
        site.reason = f"{act}: {why}"
        return site, None
    for first, second in ((up, down), (down, up)) if down else ((up, None),):  # which is up: the probe says
        weight, bias = _weight_bias(getattr(m, first))
        down_module = getattr(m, second) if second else None
        reason = _probe(m, weight.shape[1], _expected(weight, bias, approximate, down_module))
        if reason is None:
            m.forward = types.MethodType(_fused_forward(site, first, second, approximate), m)
            setattr(m, swap.OWNS, (first, act))
            site.what, site.swapped = f"{label[:-1]}: gelu approximate={approximate!r})", True
            return site, m
    site.reason = reason
    return site, None


def _parts(m) -> tuple[str, str, str | None] | None:
    """(up or one of the two projections, the activation, the other projection or None) by the children's kinds."""
    projections, activations = [], []
    for child_name, child in m.named_children():
        if _features(child) is not None:
            projections.append(child_name)
        elif isinstance(child, nn.Dropout):
            continue
        elif next(child.parameters(), None) is None and not list(child.children()):
            activations.append(child_name)
        else:
            return None
    if len(activations) != 1 or not 1 <= len(projections) <= 2:
        return None
    if len(projections) == 2:
        a, b = (_features(getattr(m, p)) for p in projections)
        if a != b[::-1] or a[0] == a[1]:  # H -> I and I -> H, H != I
            return None
        return projections[0], activations[0], projections[1]
    return projections[0], activations[0], None


def _features(module) -> tuple[int, int] | None:
    """(in, out) of a projection the kernel takes: nn.Linear itself or transformers' Conv1D; None otherwise."""
    if type(module) is nn.Linear:
        return module.in_features, module.out_features
    w = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(w, torch.Tensor) and w.dim() == 2:
        return w.shape[0], w.shape[1]
    return None


def _weight_bias(module):
    """The projection's weight as the kernel takes it, [out, in] (a Conv1D's [in, out] transposed: a view), its bias."""
    w = module.weight
    return (w if type(module) is nn.Linear else w.t()), getattr(module, "bias", None)


def _which_gelu(act) -> tuple[str | None, str]:
    """("none" | "tanh", "") for the GELU the activation computes, or (None, why not)."""
    try:
        with torch.no_grad():
            got = act(ACT_PROBE).double()
    except Exception as e:
        return None, f"probe raised {type(e).__name__}"
    for approximate in APPROXIMATIONS:
        if got.shape == ACT_PROBE.shape and (got - F.gelu(ACT_PROBE.double(), approximate=approximate)).abs().max() \
                <= ACT_TOLERANCE:
            return approximate, ""
    return None, "computes neither the exact nor the tanh GELU (probe)"


def _expected(weight, bias, approximate, down):
    """x (float64) -> what the module should compute, from its own weights in float64."""
    def expected(x):
        h = reference.linear_gelu_ref(x, _f64(weight), _f64(bias), approximate)
        if down is None:
            return h
        w, b = _weight_bias(down)
        return F.linear(h, _f64(w), _f64(b))
    return expected


def _fused_forward(site: Site, up: str, down: str | None, approximate: str):
    """forward(self, x): down(linear_gelu(x, up's weight and bias)), or the original forward where the kernel does
    not fit the call."""
    op = customops.op("linear_gelu")

    def forward(self, *args, **kwargs):
        given = [*args, *kwargs.values()]
        x = given[0] if len(given) == 1 else None
        weight, bias = _weight_bias(getattr(self, up))
        reason = _unfit(self, x, weight, bias) or grad_reason(x, weight, bias)
        if in_eager():
            site.calls += not reason
            site.fallbacks += bool(reason)
            site.reason = reason or site.reason
        if reason:
            return type(self).forward(self, *args, **kwargs)
        h = op(x, weight, bias, approximate)
        return getattr(self, down)(h) if down else h
    return forward


def _unfit(module, x, weight, bias) -> str | None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != weight.shape[1] or x.numel() == 0:
        return "not one input tensor of the up-projection's width"
    if module.training:
        return "training mode (its dropouts)"
    if x.dtype not in KERNEL_DTYPES or any(t is not None and t.dtype != x.dtype for t in (weight, bias)):
        return "mixed or unsupported dtypes"
    return None
