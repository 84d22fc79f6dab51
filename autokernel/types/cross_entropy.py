"""cross_entropy: mean cross-entropy of [..., V] logits against integer targets, and where a model computes it
(F.cross_entropy calls)."""

import math

import torch
import torch.nn.functional as F

from autokernel.kerneltype import Deployment, KernelSpec, Profiling
from autokernel.ops import customops
from autokernel.ops.customops import KERNEL_DTYPES, CallSites, grad_reason, in_eager
from autokernel.types._common import esize, first_padded, numel, randn

NAME = "cross_entropy"
IGNORE_INDEX = -100  # F.cross_entropy's default: padding targets it skips


def cross_entropy_ref(logits, targets):
    """Mean cross-entropy of logits [..., V] against integer targets [...]."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _inputs(logit_scale: float = 2.0, confident: bool = False, extreme_targets: bool = False,
            ignored: bool = False):
    def make(shape, dtype, device, gen):
        lead = ((shape["B"],) if "B" in shape else ()) + (shape["N"],)
        logits = randn(lead + (shape["V"],), torch.float32, device, gen, logit_scale)
        targets = torch.randint(0, shape["V"], lead, device=device, generator=gen)
        if extreme_targets:
            targets = torch.where(torch.rand(lead, device=device, generator=gen) < 0.5, 0, shape["V"] - 1)
        if confident:  # the target logit towers over the rest: loss near 0, exp() of the rest underflows
            logits.scatter_(-1, targets.unsqueeze(-1), 60.0)
        if ignored:  # padding tokens: F.cross_entropy skips target -100 and averages over the rest
            pad = torch.rand(lead, device=device, generator=gen) < 0.3
            pad.view(-1)[0] = False
            targets = targets.masked_fill(pad, IGNORE_INDEX)
        return logits.to(dtype), targets
    return make


# ---------------------------------------------------------------------------- the drop-in F.cross_entropy
_F_CROSS_ENTROPY = customops.original(F, "cross_entropy")


def _unfit(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing) -> str | None:
    if weight is not None or size_average is not None or reduce is not None or label_smoothing:
        return "class weights, label smoothing or legacy reduction arguments"
    if reduction != "mean" or ignore_index != IGNORE_INDEX:  # -100 targets: the kernel must skip them too
        return f"reduction={reduction!r}, ignore_index={ignore_index} (the kernel: mean, -100)"
    if input.dim() != 2 or target.dim() != 1 or target.dtype != torch.long or input.dtype not in KERNEL_DTYPES:
        return "not [N, V] logits with [N] integer targets"
    return grad_reason(input)


def replace_cross_entropy(sites: CallSites) -> dict:
    """F.cross_entropy -> cross_entropy where the call is a plain mean over [N, V] logits."""
    kernel = customops.op(NAME)

    def cross_entropy(input, target, weight=None, size_average=None, ignore_index=IGNORE_INDEX, reduce=None,
                      reduction="mean", label_smoothing=0.0):
        reason = _unfit(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
        if in_eager():
            sites.hit("F.cross_entropy", NAME, reason)
        if reason:
            return _F_CROSS_ENTROPY(input, target, weight, size_average, ignore_index, reduce, reduction,
                                    label_smoothing)
        return kernel(input, target)

    return {_F_CROSS_ENTROPY: cross_entropy}


SPEC = KernelSpec(
    name=NAME,
    reference=cross_entropy_ref,
    make_inputs=_inputs(),
    shapes=[{"N": 8192, "V": 32000}, {"N": 4096, "V": 32000}, {"N": 1024, "V": 50257},
            {"N": 2048, "V": 128256}, {"N": 4096, "V": 4096}, {"N": 512, "V": 1000},
            {"N": 16384, "V": 8192}, {"B": 4, "N": 512, "V": 32000}],
    small_shapes=[{"N": 4, "V": 16}, {"N": 8, "V": 100}, {"N": 16, "V": 1000}, {"N": 3, "V": 257},
                  {"N": 32, "V": 512}, {"B": 2, "N": 5, "V": 64}],
    edge_shapes=[{"N": 1023, "V": 1023}, {"N": 1537, "V": 4097}, {"N": 4097, "V": 1537},
                 {"N": 7, "V": 50257}],
    small_edge_shapes=[{"N": 7, "V": 1023}, {"N": 3, "V": 1537}, {"N": 5, "V": 4097}],
    bench_shape={"N": 8192, "V": 32000}, small_bench_shape={"N": 16, "V": 1024},
    # logits read once, int64 targets read once, the scalar loss written
    bytes_moved=lambda s, dt: numel(s, "B", "N", "V") * esize(dt) + numel(s, "B", "N") * 8 + 4,
    flops=lambda s: 4 * numel(s, "B", "N", "V"),
    adversarial={
        "huge_logits": _inputs(logit_scale=3000.0),
        "confident": _inputs(confident=True),
        "first_and_last_class": _inputs(extreme_targets=True),
        "ignored_padding": _inputs(ignored=True),
    },
    noncontiguous=first_padded,
    description="mean cross-entropy over [..., V] logits and integer targets",
    profiling=Profiling(ops=frozenset({"aten::cross_entropy_loss", "aten::nll_loss", "aten::nll_loss_nd"}),
                        op_shape=lambda op: {"N": math.prod(op.shapes[0][:-1]), "V": op.shapes[0][-1]}),
    default_speedup=1.5,  # eager materialises log_softmax over the whole vocabulary
    extra_baselines=lambda liger: {"liger": lambda logits, t: liger.liger_cross_entropy(logits, t)} if liger else {},
    deployment=Deployment("(Tensor logits, Tensor targets) -> Tensor", lambda logits, targets: (),
                          functions=replace_cross_entropy),
)
