"""linear_cross_entropy: an LM head and its loss in one kernel, mean cross-entropy of hidden [N, H] @ weight
[V, H].T without the [N, V] logits ever leaving the chip, and where a model runs it (a causal LM's output
embedding, when the model's next-token loss is evaluated: KernelLMHead.next_token_loss)."""

import math
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

from autokernel.kerneltype import Deployment, KernelSpec, Profiling, SuiteTarget
from autokernel.models import output_embedding
from autokernel.ops.customops import Site, in_eager
from autokernel.ops.swap import KernelModule, f64, probe
from autokernel.types._common import compute_dtype, esize, first_padded, randn, uniform
from autokernel.types.matmul import matmul_taking

NAME = "linear_cross_entropy"
IGNORE_INDEX = -100  # F.cross_entropy's default, and the label transformers pads shifted targets with
MAX_MARGIN = 12.0  # the target's logit is raised by up to this: per-row losses from ~0 to ~log V, as a model's
# config entries that put a transformation between the output embedding and the loss (Gemma 2's soft-capping,
# Cohere's logit_scale, Granite's logits_scaling): the fused kernel computes the loss of x @ W.T itself
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def linear_cross_entropy_ref(hidden, weight, target, ignore_index: int = -100):
    """An LM head and its loss: mean cross-entropy of the logits hidden [N, H] @ weight [V, H].T against
    integer targets [N], targets equal to ignore_index left out. The logits are upcast before the loss, as
    transformers' loss does (fp16/bf16 logits -> fp32), so the loss is fp32 (fp64 for fp64 inputs)."""
    logits = hidden @ weight.T
    return F.cross_entropy(logits.to(compute_dtype(logits)), target, ignore_index=ignore_index)


def _inputs(logit_scale: float = 1.0, ignored: float = 0.0, ignored_half: bool = False):
    """hidden [N, H], weight [V, H] (logits of std logit_scale), targets whose logit a trained head raises
    (a random margin per row), ignore_index. ignored: the share of targets set to ignore_index; ignored_half:
    the first half of the rows as well (whole row blocks with nothing to count)."""
    def make(shape, dtype, device, gen):
        n, h, v = shape["N"], shape["H"], shape["V"]
        weight = randn((v, h), torch.float32, device, gen, logit_scale / math.sqrt(h))
        target = torch.randint(0, v, (n,), device=device, generator=gen)
        w_t = weight[target]
        margin = uniform((n, 1), device, gen, 0.0, MAX_MARGIN * max(1.0, logit_scale))
        hidden = randn((n, h), torch.float32, device, gen) + margin * w_t / w_t.pow(2).sum(-1, keepdim=True)
        drop = torch.rand(n, device=device, generator=gen) < ignored
        if ignored_half:
            drop[: n // 2] = True
        drop[-1] = False  # at least one target counts: an all-ignored call is 0/0
        target = target.masked_fill(drop, IGNORE_INDEX)
        return hidden.to(dtype), weight.to(dtype), target, IGNORE_INDEX
    return make


def _head_shape(input_shape, members) -> dict | None:
    """The loss-evaluated output embedding's input [..., H] and its matmul [N, H] -> V."""
    found = matmul_taking(input_shape, members)
    return dict(zip(("N", "H", "V"), found)) if found else None


def _baselines(liger) -> dict:
    if liger is None:
        return {}

    def fused(hidden, weight, target, ignore_index=IGNORE_INDEX):
        return liger.liger_fused_linear_cross_entropy(hidden, weight, target, ignore_index=ignore_index)
    return {"liger": fused}


# ------------------------------------------------------------------------------ where a model runs it
class LossReady(Exception):
    """Raised by a KernelLMHead in loss mode with the loss: the model's forward stops at its head, so nothing
    after it (a logits tensor, its upcast) is ever built."""

    def __init__(self, loss: torch.Tensor):
        super().__init__("the loss is computed at the output embedding")
        self.loss = loss


class KernelLMHead(KernelModule):
    """A causal LM's output embedding. A forward returns the logits through what it wraps (the original head,
    or matmul's replacement of it); in loss mode (`next_token_loss`) the head takes the hidden states it is
    given and the targets it was armed with to the kernel, which never holds the [N, V] logits."""

    def __init__(self, original: nn.Module, site: Site):
        super().__init__(original, site, NAME)
        self.targets: torch.Tensor | None = None

    def forward(self, x):
        if self.targets is None:
            return self.original(x)
        if x.shape[:-1] != self.targets.shape:  # the model kept only some positions (logits_to_keep)
            if in_eager():
                self.site.fallbacks += 1
                self.site.reason = "the head saw other positions than the targets"
            raise LossReady(self._unfused_loss(x))
        w = self._original.weight
        if not self._fits(x, w):
            raise LossReady(self._unfused_loss(x))
        hidden = x.reshape(-1, x.shape[-1])
        raise LossReady(self.op(hidden, w, self.targets.reshape(-1), IGNORE_INDEX))

    def _unfused_loss(self, x):
        """The loss as the model computes it: the logits, upcast as transformers does, then F.cross_entropy."""
        logits = self.original(x)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.targets.reshape(-1),
                               ignore_index=IGNORE_INDEX)

    def next_token_loss(self, model: nn.Module, args: tuple, ids: torch.Tensor) -> torch.Tensor:
        """The mean next-token cross-entropy of model(*args) on token ids [B, S] (position t predicts ids[t + 1];
        the last position has no target), computed at this head from the hidden states."""
        self.targets = F.pad(ids[:, 1:], (0, 1), value=IGNORE_INDEX)
        try:
            model(*args)
        except LossReady as ready:
            return ready.loss
        finally:
            self.targets = None
        raise RuntimeError("the model returned without calling its output embedding")


def lm_head_site(model: nn.Module):
    """The model's output embedding (model.get_output_embeddings()) when it computes x @ W.T with no bias and
    nothing transforms the logits before the loss. Tied weights are fine: the kernel reads W wherever it lives.
    (path, Site, KernelLMHead or None), or None for a model without one."""
    found = output_embedding(model)
    if found is None:
        return None
    path, head = found
    base = head.original if isinstance(head, KernelModule) else head  # the probe runs the reference, never a kernel
    w, bias = getattr(base, "weight", None), getattr(base, "bias", None)
    site = Site(path, f"{type(base).__name__} output embedding", NAME, False)
    config = getattr(model, "config", None)
    transforms = [k for k in LOGIT_TRANSFORMS if getattr(config, k, None) not in (None, 1, 1.0)]
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        site.reason = "no 2-D weight"
    elif bias is not None:
        site.reason = "the output embedding has a bias (the kernel computes x @ W.T)"
    elif transforms:
        site.reason = f"the logits are transformed before the loss ({', '.join(transforms)})"
    else:
        site.reason = probe(base, w.shape[1], lambda x: x @ f64(w).T) or ""
    site.swapped = not site.reason
    return path, site, KernelLMHead(head, site) if site.swapped else None


SPEC = KernelSpec(
    name=NAME,
    reference=linear_cross_entropy_ref,
    make_inputs=_inputs(),
    # loss evaluations: TinyLlama (H 2048, V 32000) at batch 1 and 4 x 2048 tokens, Qwen2-1.5B (H 1536,
    # V 151936), GPT-2 (H 768, V 50257), Llama-2/3 7-8B (H 4096, V 32000 / 128256)
    shapes=[{"N": 2048, "H": 2048, "V": 32000}, {"N": 8192, "H": 2048, "V": 32000},
            {"N": 2048, "H": 1536, "V": 151936}, {"N": 8192, "H": 1536, "V": 151936},
            {"N": 4096, "H": 768, "V": 50257}, {"N": 16384, "H": 768, "V": 50257},
            {"N": 4096, "H": 4096, "V": 32000}, {"N": 4096, "H": 4096, "V": 128256}],
    small_shapes=[{"N": 8, "H": 32, "V": 64}, {"N": 16, "H": 64, "V": 500}, {"N": 40, "H": 48, "V": 257},
                  {"N": 64, "H": 32, "V": 1000}, {"N": 3, "H": 16, "V": 17}],
    edge_shapes=[{"N": 2047, "H": 2048, "V": 32001}, {"N": 1023, "H": 768, "V": 50257},
                 {"N": 4097, "H": 1000, "V": 151936}, {"N": 7, "H": 4096, "V": 128256}],
    small_edge_shapes=[{"N": 37, "H": 40, "V": 1023}, {"N": 5, "H": 24, "V": 4097}, {"N": 129, "H": 16, "V": 97}],
    bench_shape={"N": 8192, "H": 2048, "V": 32000}, small_bench_shape={"N": 16, "H": 64, "V": 1024},
    # hidden and weight read once, int64 targets read once, the fp32 loss written; the logits never leave chip
    bytes_moved=lambda s, dt: (s["N"] * s["H"] + s["V"] * s["H"]) * esize(dt) + s["N"] * 8 + 4,
    flops=lambda s: 2 * s["N"] * s["H"] * s["V"] + 4 * s["N"] * s["V"],
    adversarial={
        "large_logits": _inputs(logit_scale=60.0),  # exp() without the running max overflows even in fp32
        "ignored_padding": _inputs(ignored=0.3),  # counted in the mean, they would move it by ~log V each
        "ignored_row_blocks": _inputs(ignored_half=True),  # whole row blocks with nothing to count
    },
    noncontiguous=first_padded,
    description="LM head + mean cross-entropy: hidden [N, H] @ weight [V, H].T, fp32 loss over non-ignored targets",
    output_dtype=torch.float32,
    # profile.py --with-loss wraps the output embedding in LMHeadWithLoss, so the head's GEMM and the loss's
    # ops are one module call of this type
    profiling=Profiling(modules=re.compile(r"^LMHeadWithLoss$"), module_shape=_head_shape),
    default_speedup=1.5,  # eager writes the 16-bit logits, an fp32 copy and log_softmax's output
    suite_target=SuiteTarget("1.0x torch.compile", lambda r, b: r["speedup_vs_compile"] or 0.0),
    extra_baselines=_baselines,
    deployment=Deployment("(Tensor hidden, Tensor weight, Tensor target, int ignore_index) -> Tensor",
                          lambda hidden, weight, target, ignore_index: (), output_dtype=torch.float32,
                          model_site=lm_head_site),
)
