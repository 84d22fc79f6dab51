"""What several kernel types share: random inputs scaled so that outputs are O(1), the row-wise shapes of the
softmax, norm and reduce types, byte counts, and the dtype every reference computes in.

Inputs are scaled as a model initialises its weights (by 1/sqrt(fan_in)): an absolute tolerance of 1e-2 then
means what it says. Adversarial inputs, each type's own, are the ones a careless kernel gets wrong.
"""

from __future__ import annotations

import math

import torch


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp16/bf16 -> fp32 (what eager code does by hand); fp32 and fp64 are kept as they are."""
    return torch.promote_types(x.dtype, torch.float32)


def randn(shape, dtype, device, gen, scale=1.0):
    return (torch.randn(shape, device=device, generator=gen, dtype=torch.float32) * scale).to(dtype)


def uniform(shape, device, gen, lo, hi):
    return torch.rand(shape, device=device, generator=gen) * (hi - lo) + lo


def rows(shape):
    """[B, M, N] when the shape names a batch B, else [M, N]."""
    return ((shape["B"],) if "B" in shape else ()) + (shape["M"], shape["N"])


def padded_rows(t: torch.Tensor) -> torch.Tensor:
    """The same values in a buffer whose rows are 16 elements longer: a non-contiguous view."""
    wide = torch.empty(*t.shape[:-1], t.shape[-1] + 16, dtype=t.dtype, device=t.device)
    wide[..., : t.shape[-1]] = t
    return wide[..., : t.shape[-1]]


def first_padded(inputs):
    """The first input with padded rows, the others as they are."""
    return (padded_rows(inputs[0]),) + tuple(inputs[1:])


def sequence_major(t: torch.Tensor) -> torch.Tensor:
    """t [B, H, S, D] with the same values as a view of a [B, S, H, D] tensor: a model's projection, transposed."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def numel(shape, *keys):
    return math.prod(shape.get(k, 1) for k in keys)


def esize(dtype):
    return torch.empty((), dtype=dtype).element_size()


# Row-wise ops over [M, N] (softmax, norms, reduce) share their shapes.
ROW_SHAPES = [
    {"M": 1024, "N": 1024}, {"M": 4096, "N": 4096}, {"M": 8192, "N": 8192}, {"M": 2048, "N": 32000},
    {"M": 16384, "N": 512}, {"M": 4096, "N": 128}, {"M": 32, "N": 65536}, {"M": 4096, "N": 2048},
    {"B": 4, "M": 1024, "N": 4096},
]
# The timing shape in CPU mode (Triton's interpreter runs one program per row): its figures are not performance
# figures, the shape only has to run the timing path and, as the determinism stage's shape, be wide enough that
# another summation order rounds differently (N > 256); 16 rows take a quarter of 64's time.
SMALL_ROW_BENCH = {"M": 16, "N": 1024}
SMALL_ROW_SHAPES = [
    {"M": 4, "N": 64}, {"M": 1, "N": 8}, {"M": 16, "N": 128}, {"M": 8, "N": 1000},
    {"M": 32, "N": 256}, {"M": 3, "N": 2048}, {"B": 2, "M": 3, "N": 256},
]
ROW_EDGES = [{"M": 1023, "N": 1023}, {"M": 1537, "N": 4097}, {"M": 4097, "N": 1537}, {"M": 7, "N": 50257}]
SMALL_ROW_EDGES = [{"M": 7, "N": 1023}, {"M": 3, "N": 1537}, {"M": 5, "N": 4097}, {"M": 33, "N": 97}]
# softmax, layernorm and rmsnorm: one [M, N] tensor normalized row by row
ROW_TYPE_SHAPES = dict(shapes=ROW_SHAPES, small_shapes=SMALL_ROW_SHAPES, edge_shapes=ROW_EDGES,
                       small_edge_shapes=SMALL_ROW_EDGES, bench_shape={"M": 8192, "N": 8192},
                       small_bench_shape=SMALL_ROW_BENCH)


def row_bytes(reads: int, writes: int, params: int = 0):
    """Bytes of a row-wise op: `reads` and `writes` full [M, N] tensors plus `params` N-vectors."""
    def bytes_moved(shape, dtype):
        n_rows, n = numel(shape, "B", "M"), shape["N"]
        return ((reads + writes) * n_rows * n + params * n) * esize(dtype)
    return bytes_moved


def row_flops(per_element: int):
    return lambda shape: per_element * numel(shape, "B", "M", "N")


# --------------------------------------------------------------- what the profiler reads (attribution.Op)
def rows_of(shape) -> dict:
    """[..., N] as the row-wise types name it: M rows of N."""
    return {"M": math.prod(shape[:-1]), "N": shape[-1]}


def first_rows(op) -> dict:
    return rows_of(op.shapes[0])


def module_rows(input_shape, members) -> dict:
    return rows_of(input_shape)


def norm_inputs(with_bias: bool, scale: float = 1.0, offset: float = 0.0):
    """(x [M, N], weight[, bias]) of a row norm: x of the given scale around offset, weight around 1."""
    def make(shape, dtype, device, gen):
        x = (randn(rows(shape), torch.float32, device, gen, scale) + offset).to(dtype)
        weight = randn((shape["N"],), dtype, device, gen, 0.5) + 1
        if not with_bias:
            return x, weight
        return x, weight, randn((shape["N"],), dtype, device, gen, 0.5)
    return make


def row_norm(with_bias: bool) -> dict:
    """What layernorm and rmsnorm share: x [M, N] and the per-column weight (and bias), read once."""
    return dict(make_inputs=norm_inputs(with_bias=with_bias), **ROW_TYPE_SHAPES,
                bytes_moved=row_bytes(1, 1, params=2 if with_bias else 1), noncontiguous=first_padded)


def norm_unfit(input, normalized_shape, *params) -> str | None:
    """Why an F.layer_norm / F.rms_norm call does not fit a row-norm kernel, or None."""
    from autokernel.ops.customops import KERNEL_DTYPES

    shape = tuple(normalized_shape)
    if len(shape) != 1 or input.dim() == 0 or shape[0] != input.shape[-1]:
        return "normalizes over more than the last dimension"
    if input.dtype not in KERNEL_DTYPES or any(t is not None and t.dtype != input.dtype for t in params):
        return "mixed or unsupported dtypes"
    return None


def sdpa_operands_unfit(q, k, v, enable_gqa: bool) -> str | None:
    """Why F.scaled_dot_product_attention's q, k, v do not fit an attention kernel by dtype or head count, or None."""
    from autokernel.ops.customops import KERNEL_DTYPES

    if q.dtype not in KERNEL_DTYPES or not q.dtype == k.dtype == v.dtype:
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype}"
    if q.shape[1] != k.shape[1] and not (enable_gqa and q.shape[1] % k.shape[1] == 0):
        return "different head counts for queries and keys"
    return None
