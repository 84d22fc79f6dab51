"""What add_rmsnorm and add_layernorm share: a decoder layer's residual add and the norm after it, as one kernel
returning (sum, normed), x the attention output and residual the layer's input. Shapes of HF models: M = batch x
sequence tokens, N = hidden (GPT-2 768/1024, TinyLlama 2048, Llama-2 7B 4096, 13B 5120, 70B 8192)."""

import re

import torch

from autokernel.kerneltype import Profiling
from autokernel.ops import addnorm_sites
from autokernel.types._common import (
    SMALL_ROW_BENCH,
    SMALL_ROW_EDGES,
    SMALL_ROW_SHAPES,
    module_rows,
    padded_rows,
    randn,
    row_bytes,
    row_flops,
    rows,
)

SHAPES = [
    {"M": 2048, "N": 2048}, {"M": 4096, "N": 2048}, {"M": 2048, "N": 4096}, {"M": 8192, "N": 4096},
    {"M": 16384, "N": 4096}, {"M": 4096, "N": 768}, {"M": 16384, "N": 768}, {"M": 8192, "N": 1024},
    {"M": 4096, "N": 5120}, {"M": 2048, "N": 8192},
]
EDGES = [{"M": 2047, "N": 2048}, {"M": 4097, "N": 768}, {"M": 1537, "N": 5120}, {"M": 7, "N": 8191}]


def inputs(with_bias: bool, scale: float = 1.0, residual_scale: float = 4.0, cancel: bool = False):
    """(x, residual, weight[, bias]): the residual stream larger than the attention output, as in a model.
    cancel: residual = -x plus noise of `scale`, so that the sum is small and made of the low bits."""
    def make(shape, dtype, device, gen):
        x = randn(rows(shape), torch.float32, device, gen, residual_scale if cancel else scale)
        noise = randn(rows(shape), torch.float32, device, gen, scale if cancel else residual_scale)
        residual = (-x + noise) if cancel else noise
        weight = randn((shape["N"],), dtype, device, gen, 0.5) + 1
        made = (x.to(dtype), residual.to(dtype), weight)
        return made + ((randn((shape["N"],), dtype, device, gen, 0.5),) if with_bias else ())
    return make


def _noncontiguous(inputs):
    return (padded_rows(inputs[0]), padded_rows(inputs[1])) + tuple(inputs[2:])


def _profiling(norm_class: str) -> Profiling:
    """The post-attention norm module of a decoder layer (addnorm_sites.POST_ATTENTION_NORMS names it), with the
    residual add run right before it in the layer: the pair is one call."""
    names = "|".join(addnorm_sites.POST_ATTENTION_NORMS)
    return Profiling(modules=re.compile(norm_class, re.I), residual_add=re.compile(rf"(^|\.)({names})$"),
                     module_shape=module_rows)


def spec_fields(with_bias: bool, flops_per_element: int) -> dict:
    """The KernelSpec fields the two add-norm types share."""
    return dict(
        make_inputs=inputs(with_bias=with_bias),
        shapes=SHAPES, small_shapes=SMALL_ROW_SHAPES, edge_shapes=EDGES, small_edge_shapes=SMALL_ROW_EDGES,
        bench_shape={"M": 16384, "N": 4096}, small_bench_shape=SMALL_ROW_BENCH,
        # x and residual read, the sum and the normed output written, the weight (and bias) read once
        bytes_moved=row_bytes(2, 2, params=2 if with_bias else 1), flops=row_flops(flops_per_element),
        noncontiguous=_noncontiguous,
        profiling=_profiling(r"layer_?norm" if with_bias else r"rms_?norm"),
    )


def output_shapes(x, residual, *params):
    return [x.shape, x.shape]
