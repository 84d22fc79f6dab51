"""matmul: A [..., M, K] @ B [K, N], and where a model runs it (nn.Linear, transformers' Conv1D, F.linear).
The GEMM rules of the profiler (MATMUL_OPS, matmul_shape) are here too: the fused types built on a GEMM
(fused_mlp, linear_gelu, linear_cross_entropy) read their shapes through them."""

import math
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

from autokernel.kerneltype import Deployment, KernelSpec, Profiling, SuiteTarget
from autokernel.ops import customops
from autokernel.ops.customops import KERNEL_DTYPES, CallSites, Site, grad_reason, in_eager
from autokernel.ops.swap import KernelModule, f64, probe
from autokernel.types._common import esize, numel, randn, uniform

NAME = "matmul"


def matmul_ref(A, B):
    """A [..., M, K] @ B [K, N] -> [..., M, N]."""
    return A @ B


def _inputs(wide_range: bool = False):
    def make(shape, dtype, device, gen):
        lead = (shape["B"],) if "B" in shape else ()
        a = randn(lead + (shape["M"], shape["K"]), torch.float32, device, gen)
        b = randn((shape["K"], shape["N"]), torch.float32, device, gen, 1 / math.sqrt(shape["K"]))
        if wide_range:  # rows and columns spread over 10^-2 .. 10^1.5: outputs up to ~10^3 still fit fp16
            a = a * 10 ** uniform(lead + (shape["M"], 1), device, gen, -2, 1.5)
            b = b * 10 ** uniform((1, shape["N"]), device, gen, -2, 1.5)
        return a.to(dtype), b.to(dtype)
    return make


def _noncontiguous(inputs):
    # B as the transpose of an nn.Linear weight: x @ W.T
    a, b = inputs
    return a, b.t().contiguous().t()


# ------------------------------------------------------------------------------ what the profiler reads
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                        "aten::_addmm_activation"})


def matmul_shape(op) -> dict:
    """{M, N, K} (and B when batched on both sides) of a recorded GEMM op."""
    a, b = op.shapes[0], op.shapes[1]
    if op.name in ("aten::addmm", "aten::baddbmm", "aten::_addmm_activation"):
        a, b = op.shapes[1], op.shapes[2]
    if op.name == "aten::linear":  # weight is [N, K]
        return {"M": math.prod(a[:-1]), "N": b[0], "K": a[-1]}
    if len(b) >= 3:  # batched on both sides (bmm, attention scores): one matmul per batch
        return {"B": math.prod(b[:-2]), "M": a[-2], "N": b[-1], "K": a[-1]}
    return {"M": math.prod(a[:-1]), "N": b[-1], "K": a[-1]}


def matmul_taking(input_shape, members) -> tuple[int, int, int] | None:
    """(rows, K, N) of the first matmul of `members` whose K is input_shape's last dim; rows: the product of
    input_shape's other dims."""
    for op in members:
        if op.name in MATMUL_OPS and op.shapes:
            mm = matmul_shape(op)
            if input_shape and mm["K"] == input_shape[-1]:
                return math.prod(input_shape[:-1]), input_shape[-1], mm["N"]
    return None


# ------------------------------------------------------------------------------ where a model runs it
class KernelLinear(KernelModule):
    def forward(self, x):
        linear = self._original
        w = linear.weight
        if not self._fits(x, w):
            return linear(x)
        y = self.op(x, w.t())  # B = W.T is a [K, N] view with unit stride along K: no copy
        bias = linear.bias
        return y if bias is None else y + bias


class KernelConv1D(KernelModule):
    """transformers' GPT-2 Conv1D: x @ W + b with W [in, out], already the kernel's [K, N] layout."""

    def forward(self, x):
        conv = self._original
        w = conv.weight
        if not self._fits(x, w):
            return conv(x)
        y = self.op(x, w)
        bias = conv.bias
        return y if bias is None else y + bias


def _conv1d_site(name, m):
    w, b = m.weight, getattr(m, "bias", None)
    site = Site(name, f"Conv1D {w.shape[0]}->{w.shape[-1]}", NAME, False)
    if w.dim() != 2:
        site.reason = "weight is not 2-D"
        return site, None
    site.reason = probe(m, w.shape[0], lambda x: x @ f64(w) + (0 if b is None else f64(b))) or ""
    site.swapped = not site.reason
    return site, KernelConv1D(m, site, NAME) if site.swapped else None


def matmul_module_site(name, m):
    """nn.Linear itself, and transformers' Conv1D (x @ W + b) where it passes the probe."""
    if type(m).__name__ == "Conv1D" and getattr(m, "weight", None) is not None:
        return _conv1d_site(name, m)
    if isinstance(m, nn.Linear):
        what = f"{type(m).__name__} {m.in_features}->{m.out_features}" + ("" if m.bias is None else " +bias")
        if type(m) is not nn.Linear:
            return Site(name, what, NAME, False, "a Linear subclass: its forward may differ"), None
        site = Site(name, what, NAME, True)
        return site, KernelLinear(m, site, NAME)
    return None


_F_LINEAR = customops.original(F, "linear")


def replace_linear(sites: CallSites) -> dict:
    """F.linear -> matmul on the transposed weight (a view), the bias added after."""
    kernel = customops.op(NAME)

    def linear(input, weight, bias=None):
        fits = weight.dim() == 2 and input.dtype == weight.dtype and input.dtype in KERNEL_DTYPES
        reason = grad_reason(input, weight, bias) if fits else "mixed dtypes or a non-2-D weight"
        if in_eager():
            sites.hit("F.linear", NAME, reason)
        if reason:
            return _F_LINEAR(input, weight, bias)
        y = kernel(input, weight.t())
        return y if bias is None else y + bias

    return {_F_LINEAR: linear}


SPEC = KernelSpec(
    name=NAME,
    reference=matmul_ref,
    make_inputs=_inputs(),
    shapes=[{"M": 4096, "N": 4096, "K": 4096}, {"M": 2048, "N": 2048, "K": 2048},
            {"M": 1024, "N": 1024, "K": 1024}, {"M": 512, "N": 512, "K": 512},
            {"M": 8192, "N": 8192, "K": 1024}, {"M": 2048, "N": 5632, "K": 2048},
            {"M": 2048, "N": 2048, "K": 5632}, {"M": 128, "N": 4096, "K": 4096},
            {"B": 4, "M": 512, "N": 1024, "K": 512}],
    small_shapes=[{"M": 16, "N": 16, "K": 16}, {"M": 64, "N": 64, "K": 64}, {"M": 128, "N": 64, "K": 96},
                  {"M": 32, "N": 128, "K": 64}, {"B": 2, "M": 32, "N": 32, "K": 32}],
    edge_shapes=[{"M": 1023, "N": 1023, "K": 1023}, {"M": 1537, "N": 4097, "K": 1023},
                 {"M": 4097, "N": 1537, "K": 511}, {"M": 1, "N": 4096, "K": 4096}],
    small_edge_shapes=[{"M": 1023, "N": 17, "K": 33}, {"M": 31, "N": 1537, "K": 19},
                       {"M": 9, "N": 13, "K": 4097}],
    bench_shape={"M": 4096, "N": 4096, "K": 4096}, small_bench_shape={"M": 128, "N": 128, "K": 128},
    bytes_moved=lambda s, dt: (numel(s, "B", "M", "K") + s["K"] * s["N"] + numel(s, "B", "M", "N")) * esize(dt),
    flops=lambda s: 2 * numel(s, "B", "M", "N", "K"),
    adversarial={"wide_dynamic_range": _inputs(wide_range=True)},
    noncontiguous=_noncontiguous,
    # where large terms cancel, a correct fp32 sum is off by ~eps * sum|a*b|, not eps * |result|
    error_scale=lambda inputs: inputs[0].abs() @ inputs[1].abs(),
    description="A [..., M, K] @ B [K, N]",
    profiling=Profiling(ops=MATMUL_OPS, kernels=re.compile(r"nvjet|cutlass|gemm|xmma|cublas|wgmma|matmul", re.I),
                        op_shape=matmul_shape, precedence=-2),
    default_speedup=1.0,  # cuBLAS (nvjet on Hopper) is near the roofline; a Triton matmul ties it at best
    suite_target=SuiteTarget("0.9x cuBLAS", lambda r, b: r["speedup_vs_pytorch"] / 0.9, dtypes=("fp16", "bf16")),
    deployment=Deployment("(Tensor A, Tensor B) -> Tensor", lambda A, B: (*A.shape[:-1], B.shape[-1]),
                          module_site=matmul_module_site, functions=replace_linear),
)
