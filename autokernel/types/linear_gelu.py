"""linear_gelu: gelu(x @ weight.T + bias), the exact or the tanh GELU, a GELU MLP's up-projection with its epilogue,
and where a model runs it: GELU MLPs whose up-projection, bias and GELU run as one call of the kernel.

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

import math
import re
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from autokernel.kerneltype import Deployment, KernelSpec, Profiling, SuiteTarget
from autokernel.ops import customops, swap
from autokernel.ops.customops import KERNEL_DTYPES, Site, grad_reason, in_eager
from autokernel.ops.swap import f64, probe
from autokernel.types._common import esize, numel, padded_rows, randn, uniform
from autokernel.types.matmul import MATMUL_OPS, matmul_shape

NAME = "linear_gelu"


def linear_gelu_ref(x, weight, bias=None, approximate: str = "none"):
    """The first GEMM of a GELU MLP with its bias and activation: gelu(x @ weight.T + bias). x is [..., H], weight
    [I, H] as nn.Linear holds it, bias [I] or None; approximate "none" is the exact erf GELU (BERT, GPT-NeoX, Phi),
    "tanh" the tanh approximation (GPT-2's gelu_new)."""
    return F.gelu(F.linear(x, weight, bias), approximate=approximate)


# The up-projection of a GELU MLP with its bias and GELU as the GEMM's epilogue. T = batch x sequence tokens;
# GPT-2 small/medium/large/xl H 768/1024/1280/1600 with the tanh GELU (gelu_new), BERT-base/large, Pythia-1b
# (GPT-NeoX) H 2048 and Phi-2 H 2560 with the exact one; I = 4H throughout.
_GPT2 = {"small": (768, 3072), "medium": (1024, 4096), "large": (1280, 5120), "xl": (1600, 6400)}


def _gelu_shape(t, h_i, approximate, **extra):
    return {**extra, "T": t, "H": h_i[0], "I": h_i[1], "approximate": approximate}


def _linear_gelu_inputs(row_decades: tuple = (0.0, 0.0), bias_shift: float = 0.0, x_scale: float = 1.0):
    """(x [..., T, H], weight [I, H], bias [I] or None, approximate): pre-activations of unit scale, or, with
    row_decades, rows of x scaled by 10^U(lo, hi) (pre-activations far out where erf and tanh saturate); bias_shift
    moves every pre-activation (a large negative one: the outputs are GELU's tail, -0 and tiny negatives)."""
    def make(shape, dtype, device, gen):
        t, h, i = shape["T"], shape["H"], shape["I"]
        lead = (shape["B"],) if "B" in shape else ()
        x = randn(lead + (t, h), torch.float32, device, gen, x_scale)
        if row_decades != (0.0, 0.0):
            x = x * 10 ** uniform(lead + (t, 1), device, gen, *row_decades)
        weight = randn((i, h), dtype, device, gen, 1 / math.sqrt(h))
        bias = (randn((i,), torch.float32, device, gen, 0.5) + bias_shift).to(dtype) if shape.get("bias", True) \
            else None
        return x.to(dtype), weight, bias, shape.get("approximate", "none")
    return make


def _linear_gelu_cancelling(shape, dtype, device, gen):
    """Every product x_k w_k large (~2.5e5 / H), the first half of each row's products positive and the second half
    negative: the exact sum is of moderate size (~700), a partial sum halfway through ~1.2e5. An fp16 accumulator
    overflows to inf there (inf - inf = NaN); an fp32 one holds it."""
    t, h, i = shape["T"], shape["H"], shape["I"]
    lead = (shape["B"],) if "B" in shape else ()
    big = math.sqrt(2.5e5 / h)
    sign = torch.ones(h, device=device)
    sign[h // 2:] = -1
    if h % 2:
        sign[h // 2] = 0  # as many negative products as positive ones
    x = big * sign + randn(lead + (t, h), torch.float32, device, gen)
    weight = big + randn((i, h), torch.float32, device, gen)
    return x.to(dtype), weight.to(dtype), randn((i,), dtype, device, gen), shape.get("approximate", "none")


def _linear_gelu_noncontiguous(inputs):
    # x with padded rows; the weight as GPT-2's Conv1D holds it, [H, I], passed transposed: a [I, H] view whose
    # rows are strided
    x, weight, *rest = inputs
    return (padded_rows(x), weight.t().contiguous().t(), *rest)


def _linear_gelu_error_scale(inputs):
    # where large products cancel (the cancelling adversarial), a correct fp32 sum is off by ~eps * sum |x w|; a
    # sixteenth of it, so that on ordinary inputs fp32's tolerance still tells the tanh GELU from the exact one
    # (they differ by up to 4.7e-4 around |y| ~ 2.7)
    x, weight, bias = inputs[:3]
    terms = x.abs() @ weight.abs().T + (0 if bias is None else bias.abs())
    return terms / 16


def _linear_gelu_shape(input_shape, members) -> dict | None:
    """[T, H] -> I from the GEMM whose reduction is the input's last dim, and which GELU: the tanh one where the
    epilogue's ops include a tanh (transformers' NewGELUActivation writes it out), else the exact one (aten::gelu's
    approximate argument is not recorded by the profiler)."""
    for op in members:
        if op.name in MATMUL_OPS and op.shapes:
            mm = matmul_shape(op)
            if input_shape and mm["K"] == input_shape[-1]:
                tanh = any(o.name == "aten::tanh" for o in members)
                return {"T": math.prod(input_shape[:-1]), "H": input_shape[-1], "I": mm["N"],
                        "approximate": "tanh" if tanh else "none"}
    return None



# ------------------------------------------------------------------------------ where a model runs it
APPROXIMATIONS = ("none", "tanh")  # F.gelu's: the exact (erf) GELU and the tanh one
# The activation probe: fp32 on [-8, 8], where the two GELUs differ by up to 4.7e-4 and fp32 rounding is ~1e-6
ACT_PROBE = torch.linspace(-8.0, 8.0, 1601)
ACT_TOLERANCE = 2e-5


def gelu_mlp_module_site(name, m):
    """A module holding an up-projection, a GELU and at most a down-projection (see the
    module docstring); (Site, m with its forward replaced) or (Site with the reason, None); None for any other."""
    parts = _parts(m)
    if parts is None:
        return None
    up, act, down = parts
    approximate, why = _which_gelu(getattr(m, act))
    if approximate is None and "gelu" not in type(getattr(m, act)).__name__.lower():
        return None
    label = f"{type(m).__name__}({up}, {act}" + (f", {down})" if down else ")")
    site = Site(name, label, NAME, False)
    if approximate is None:
        site.reason = f"{act}: {why}"
        return site, None
    for first, second in ((up, down), (down, up)) if down else ((up, None),):  # which is up: the probe says
        weight, bias = _weight_bias(getattr(m, first))
        down_module = getattr(m, second) if second else None
        reason = probe(m, weight.shape[1], _expected(weight, bias, approximate, down_module))
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
        h = linear_gelu_ref(x, f64(weight), f64(bias), approximate)
        if down is None:
            return h
        w, b = _weight_bias(down)
        return F.linear(h, f64(w), f64(b))
    return expected


def _fused_forward(site: Site, up: str, down: str | None, approximate: str):
    """forward(self, x): down(linear_gelu(x, up's weight and bias)), or the original forward where the kernel does
    not fit the call."""
    op = customops.op(NAME)

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


SPEC = KernelSpec(
    name=NAME,
    reference=linear_gelu_ref,
    make_inputs=_linear_gelu_inputs(),
    shapes=[_gelu_shape(1024, _GPT2["medium"], "tanh"), _gelu_shape(4096, _GPT2["medium"], "tanh"),
            _gelu_shape(8192, _GPT2["small"], "tanh"), _gelu_shape(4096, _GPT2["large"], "tanh"),
            _gelu_shape(2048, _GPT2["xl"], "tanh"), _gelu_shape(4096, (768, 3072), "none"),  # BERT-base, 8x512
            _gelu_shape(512, (1024, 4096), "none", B=8),  # BERT-large, 8x512
            _gelu_shape(2048, (2048, 8192), "none"), _gelu_shape(2048, (2560, 10240), "none")],  # Pythia-1b, Phi-2
    small_shapes=[_gelu_shape(16, (32, 64), "tanh"), _gelu_shape(8, (64, 96), "none"),
                  _gelu_shape(32, (48, 80), "tanh"), _gelu_shape(8, (32, 64), "none", B=2),
                  {**_gelu_shape(24, (40, 72), "none"), "bias": False}],
    edge_shapes=[_gelu_shape(1023, _GPT2["medium"], "tanh"), _gelu_shape(1537, (768, 3072), "none"),
                 _gelu_shape(4097, (1000, 4001), "tanh"), {**_gelu_shape(7, _GPT2["xl"], "tanh"), "bias": False}],
    small_edge_shapes=[_gelu_shape(1023, (16, 40), "tanh"), _gelu_shape(37, (24, 1537), "none"),
                       {**_gelu_shape(5, (33, 97), "tanh"), "bias": False}],
    bench_shape=_gelu_shape(4096, _GPT2["medium"], "tanh"), small_bench_shape=_gelu_shape(64, (64, 256), "tanh"),
    # x, the weight and the bias read once, the activation written once; the pre-activation never leaves chip
    bytes_moved=lambda s, dt: (numel(s, "B", "T", "H") + s["I"] * s["H"] + numel(s, "B", "T", "I") + s["I"])
    * esize(dt),
    flops=lambda s: 2 * numel(s, "B", "T", "H", "I") + 10 * numel(s, "B", "T", "I"),  # the GEMM, bias + GELU
    adversarial={
        # pre-activations up to ~1e3 either way: erf and tanh saturate, exp() overflows (inf / inf in a tanh
        # written as (e^2u - 1) / (e^2u + 1)), y^3 is ~1e9
        "large_preactivations": _linear_gelu_inputs(row_decades=(-1.0, 2.5)),
        # most pre-activations around -100: the output is GELU's negative tail (-0 and tiny negatives)
        "large_negative": _linear_gelu_inputs(bias_shift=-100.0, x_scale=30.0),
        "cancelling_products": _linear_gelu_cancelling,
    },
    noncontiguous=_linear_gelu_noncontiguous,
    error_scale=_linear_gelu_error_scale,
    description="gelu(x @ weight.T + bias), exact or tanh GELU: a GELU MLP's up-projection with its epilogue",
    # a GEMM (a Linear or Conv1D module, or F.linear) and the GELU right after it (transformers' GELU activation
    # classes, nn.GELU or F.gelu) are one call; the MLP's down-projection stays matmul
    profiling=Profiling(modules=re.compile(r"gelu", re.I), ops=frozenset({"aten::gelu"}), epilogue_of=MATMUL_OPS,
                        module_shape=_linear_gelu_shape),
    # eager: cuBLAS (the bias in its epilogue), then GELU reading and writing [T, I] again; compile fuses only the
    # pointwise part. At cuBLAS speed the kernel saves that round trip
    default_speedup=1.2,
    suite_target=SuiteTarget("1.0x torch.compile", lambda r, b: r["speedup_vs_compile"] or 0.0),
    # no Liger baseline: Liger-Kernel has GEGLU (gelu(gate) * up, after the GEMMs), not a GEMM with a GELU epilogue
    deployment=Deployment("(Tensor x, Tensor weight, Tensor? bias, str approximate) -> Tensor",
                          lambda x, weight, bias, approximate: (*x.shape[:-1], weight.shape[0]),
                          module_site=gelu_mlp_module_site),
)
