"""reduce: a sum over the last dimension (no model site: the loop and the harness only)."""

import torch

from autokernel.kerneltype import Deployment, KernelSpec, Profiling
from autokernel.types._common import (
    ROW_EDGES,
    ROW_SHAPES,
    SMALL_ROW_BENCH,
    SMALL_ROW_EDGES,
    SMALL_ROW_SHAPES,
    esize,
    first_padded,
    first_rows,
    numel,
    randn,
    row_flops,
    rows,
    uniform,
)

NAME = "reduce"


def reduce_ref(x, dim: int = -1):
    """Sum over one dimension (the last by default)."""
    return x.sum(dim=dim)


def _inputs(shape, dtype, device, gen):
    return (randn(rows(shape), dtype, device, gen),)


def _cancellation(shape, dtype, device, gen):
    # Pairs of +-100 around small noise: the exact sum is small, an fp16 accumulator loses it.
    x = randn(rows(shape), torch.float32, device, gen, 0.1)
    sign = torch.ones(shape["N"], device=device)
    sign[1::2] = -1
    return ((x + 100.0 * sign).to(dtype),)


def _positive(shape, dtype, device, gen):
    return (uniform(rows(shape), device, gen, 0.0, 2.0).to(dtype),)


SPEC = KernelSpec(
    name=NAME,
    reference=reduce_ref,
    make_inputs=_inputs,
    shapes=ROW_SHAPES[:8] + [{"M": 16384, "N": 4096}], small_shapes=SMALL_ROW_SHAPES,
    edge_shapes=ROW_EDGES, small_edge_shapes=SMALL_ROW_EDGES,
    bench_shape={"M": 16384, "N": 4096}, small_bench_shape=SMALL_ROW_BENCH,
    bytes_moved=lambda s, dt: (numel(s, "B", "M", "N") + numel(s, "B", "M")) * esize(dt),
    flops=row_flops(1),
    adversarial={"cancellation": _cancellation, "all_positive": _positive},
    noncontiguous=first_padded,
    description="sum over the last dimension",
    profiling=Profiling(ops=frozenset({"aten::sum"}), op_shape=first_rows),
    default_speedup=1.1,
    deployment=Deployment("(Tensor x, int dim) -> Tensor",
                          lambda x, dim: tuple(s for i, s in enumerate(x.shape) if i != dim % x.dim())),
)
