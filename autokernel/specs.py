"""The nine built-in kernel types, one registry entry each (`BUILTIN`; autokernel/registry.py holds them).

Inputs are scaled so that outputs are O(1) (weights by 1/sqrt(fan_in), as a model initialises
them): an absolute tolerance of 1e-2 then means what it says. Adversarial inputs are the ones a
careless kernel gets wrong: overflow without max-subtraction, catastrophic cancellation in
E[x^2] - E[x]^2, fp16 accumulation, naive exp in attention.
"""

import math
import re

import torch
import torch.nn.functional as F

import reference
from autokernel.kerneltype import Deployment, KernelSpec, Profiling, SuiteTarget
from autokernel.ops import addnorm_sites, customops, gelu_sites, swap
from autokernel.ops.attention_sites import causal_mask_patches, rope_attention_module_site

BUILTIN: list[KernelSpec] = []  # in the order kernel_types() lists them


def _randn(shape, dtype, device, gen, scale=1.0):
    return (torch.randn(shape, device=device, generator=gen, dtype=torch.float32) * scale).to(dtype)


def _uniform(shape, device, gen, lo, hi):
    return torch.rand(shape, device=device, generator=gen) * (hi - lo) + lo


def _rows(shape):
    """[B, M, N] when the shape names a batch B, else [M, N]."""
    return ((shape["B"],) if "B" in shape else ()) + (shape["M"], shape["N"])


def _padded_rows(t: torch.Tensor) -> torch.Tensor:
    """The same values in a buffer whose rows are 16 elements longer: a non-contiguous view."""
    wide = torch.empty(*t.shape[:-1], t.shape[-1] + 16, dtype=t.dtype, device=t.device)
    wide[..., : t.shape[-1]] = t
    return wide[..., : t.shape[-1]]


def _numel(shape, *keys):
    return math.prod(shape.get(k, 1) for k in keys)


def _esize(dtype):
    return torch.empty((), dtype=dtype).element_size()


# Row-wise ops over [M, N] (softmax, norms, reduce) share their shapes.
ROW_SHAPES = [
    {"M": 1024, "N": 1024}, {"M": 4096, "N": 4096}, {"M": 8192, "N": 8192}, {"M": 2048, "N": 32000},
    {"M": 16384, "N": 512}, {"M": 4096, "N": 128}, {"M": 32, "N": 65536}, {"M": 4096, "N": 2048},
    {"B": 4, "M": 1024, "N": 4096},
]
# The timing shape in CPU mode (Triton's interpreter runs one program per row, ~3-15 ms each): its figures are not
# performance figures, the shape only has to run the timing path and, as the determinism stage's shape, be wide
# enough that another summation order rounds differently (N > 256); 16 rows take a quarter of 64's time.
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


def _row_bytes(reads: int, writes: int, params: int = 0):
    """Bytes of a row-wise op: `reads` and `writes` full [M, N] tensors plus `params` N-vectors."""
    def bytes_moved(shape, dtype):
        rows, n = _numel(shape, "B", "M"), shape["N"]
        return ((reads + writes) * rows * n + params * n) * _esize(dtype)
    return bytes_moved


def _row_flops(per_element: int):
    return lambda shape: per_element * _numel(shape, "B", "M", "N")


# --------------------------------------------------------------- what the profiler reads (attribution.Op)
def _rows_of(shape) -> dict:
    """[..., N] as the row-wise types name it: M rows of N."""
    return {"M": math.prod(shape[:-1]), "N": shape[-1]}


def _first_rows(op) -> dict:
    return _rows_of(op.shapes[0])


def _module_rows(input_shape, members) -> dict:
    return _rows_of(input_shape)


# ---------------------------------------------------------------------------------- softmax
def _softmax_inputs(shape, dtype, device, gen):
    return (_randn(_rows(shape), dtype, device, gen, scale=3.0),)


def _softmax_huge_equal(shape, dtype, device, gen):
    # Every logit the same huge value: exp() without subtracting the row max overflows to inf/inf.
    big = min(torch.finfo(dtype).max / 4, 1e30)
    return (torch.full(_rows(shape), big, dtype=dtype, device=device),)


def _softmax_large_spread(shape, dtype, device, gen):
    limit = min(torch.finfo(dtype).max / 4, 1e4)
    return ((_randn(_rows(shape), torch.float32, device, gen, 1e4).clamp(-limit, limit)).to(dtype),)


def _softmax_masked(shape, dtype, device, gen):
    # Causal-mask style -inf entries; column 0 stays finite so every row has a valid answer.
    x = _randn(_rows(shape), dtype, device, gen)
    mask = torch.rand(_rows(shape), device=device, generator=gen) < 0.5
    mask[..., 0] = False
    return (x.masked_fill(mask, float("-inf")),)


BUILTIN.append(KernelSpec(
    name="softmax",
    reference=reference.softmax_ref,
    make_inputs=_softmax_inputs,
    **ROW_TYPE_SHAPES,
    bytes_moved=_row_bytes(1, 1), flops=_row_flops(5),
    adversarial={"huge_equal_logits": _softmax_huge_equal, "large_spread": _softmax_large_spread,
                 "masked_minus_inf": _softmax_masked},
    noncontiguous=lambda inputs: (_padded_rows(inputs[0]),),
    description="softmax over the last dimension",
    profiling=Profiling(ops=frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax"}),
                        kernels=re.compile(r"soft_?max", re.I), op_shape=_first_rows),
    default_speedup=1.2,  # eager's softmax is already one fused kernel
    extra_baselines=lambda liger: {"liger": liger.liger_softmax} if liger else {},
    deployment=Deployment("(Tensor x) -> Tensor", lambda x: x.shape, functions=customops.replace_softmax),
))


# -------------------------------------------------------------------------- layernorm, rmsnorm
def _norm_inputs(with_bias: bool, scale: float = 1.0, offset: float = 0.0):
    def make(shape, dtype, device, gen):
        x = (_randn(_rows(shape), torch.float32, device, gen, scale) + offset).to(dtype)
        weight = _randn((shape["N"],), dtype, device, gen, 0.5) + 1
        if not with_bias:
            return x, weight
        return x, weight, _randn((shape["N"],), dtype, device, gen, 0.5)
    return make


def _norm_noncontiguous(inputs):
    return (_padded_rows(inputs[0]),) + tuple(inputs[1:])


def _row_norm(with_bias: bool) -> dict:
    """What layernorm and rmsnorm share: x [M, N] and the per-column weight (and bias), read once."""
    return dict(make_inputs=_norm_inputs(with_bias=with_bias), **ROW_TYPE_SHAPES,
                bytes_moved=_row_bytes(1, 1, params=2 if with_bias else 1), noncontiguous=_norm_noncontiguous)


BUILTIN.append(KernelSpec(
    name="layernorm",
    reference=reference.layernorm_ref,
    **_row_norm(with_bias=True),
    flops=_row_flops(8),
    adversarial={
        # var = E[x^2] - E[x]^2 cancels catastrophically around a large mean
        "large_mean": _norm_inputs(with_bias=True, scale=1.0, offset=1000.0),
        "near_zero_variance": _norm_inputs(with_bias=True, scale=1e-3, offset=1.0),
    },
    description="LayerNorm over the last dimension, affine",
    profiling=Profiling(modules=re.compile(r"layer_?norm", re.I),
                        ops=frozenset({"aten::layer_norm", "aten::native_layer_norm"}),
                        kernels=re.compile(r"layer_?norm", re.I), op_shape=_first_rows, module_shape=_module_rows),
    default_speedup=1.2,  # eager's layer_norm is already one fused kernel
    extra_baselines=lambda liger: {"liger": lambda x, w, b, eps=1e-5: liger.liger_layer_norm(x, w, b, eps)}
    if liger else {},
    deployment=Deployment("(Tensor x, Tensor weight, Tensor bias, float eps) -> Tensor",
                          lambda x, weight, bias, eps: x.shape,
                          module_site=swap.layernorm_module_site, functions=customops.replace_layer_norm),
))

RMS_CASTS = {"aten::to", "aten::_to_copy", "aten::type_as"}


def _rmsnorm_span(names: list[str], pos: int) -> tuple[int, int] | None:
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
    if first > 0 and names[first - 1] in RMS_CASTS:
        first -= 1  # x.float()
    last = pos + 1
    if last >= len(names) or names[last] != "aten::mul":
        return None  # x * rstd
    if last + 1 < len(names) and names[last + 1] in RMS_CASTS:
        last += 1  # .to(x.dtype)
    if last + 1 < len(names) and names[last + 1] == "aten::mul":
        last += 1  # * weight
    return first, last


def _rmsnorm_baselines(liger) -> dict:
    extra = {"F.rms_norm": lambda x, w, eps=1e-6: F.rms_norm(x, (x.shape[-1],), w, eps)}
    if liger is not None:
        extra["liger"] = lambda x, w, eps=1e-6: liger.liger_rms_norm(x, w, eps, in_place=False)
    return extra


BUILTIN.append(KernelSpec(
    name="rmsnorm",
    reference=reference.rmsnorm_ref,
    **_row_norm(with_bias=False),
    flops=_row_flops(4),
    adversarial={
        # mean(x^2) ~ 1e-8, below eps: eps must be added inside the rsqrt, in fp32
        "near_zero": _norm_inputs(with_bias=False, scale=1e-4),
        # x^2 summed over a row overflows fp16 unless accumulated in fp32
        "large_values": _norm_inputs(with_bias=False, scale=200.0),
    },
    description="RMSNorm (LLaMA) over the last dimension",
    profiling=Profiling(modules=re.compile(r"rms_?norm", re.I),
                        ops=frozenset({"aten::rms_norm", "aten::_fused_rms_norm"}),
                        kernels=re.compile(r"rms_?norm", re.I), op_shape=_first_rows, module_shape=_module_rows,
                        op_pattern=_rmsnorm_span, precedence=-1),  # a class named *RMSLayerNorm* is rmsnorm
    default_speedup=2.0,  # eager runs pow/mean/add+rsqrt/mul/mul as ~5 kernels; one pass moves 1/3 the bytes
    extra_baselines=_rmsnorm_baselines,
    deployment=Deployment("(Tensor x, Tensor weight, float eps) -> Tensor", lambda x, weight, eps: x.shape,
                          module_site=swap.rmsnorm_module_site, functions=customops.replace_rms_norm),
))


# ---------------------------------------------------------------------------------- reduce
def _reduce_inputs(shape, dtype, device, gen):
    return (_randn(_rows(shape), dtype, device, gen),)


def _reduce_cancellation(shape, dtype, device, gen):
    # Pairs of +-100 around small noise: the exact sum is small, an fp16 accumulator loses it.
    x = _randn(_rows(shape), torch.float32, device, gen, 0.1)
    sign = torch.ones(shape["N"], device=device)
    sign[1::2] = -1
    return ((x + 100.0 * sign).to(dtype),)


def _reduce_positive(shape, dtype, device, gen):
    return (_uniform(_rows(shape), device, gen, 0.0, 2.0).to(dtype),)


BUILTIN.append(KernelSpec(
    name="reduce",
    reference=reference.reduce_ref,
    make_inputs=_reduce_inputs,
    shapes=ROW_SHAPES[:8] + [{"M": 16384, "N": 4096}], small_shapes=SMALL_ROW_SHAPES,
    edge_shapes=ROW_EDGES, small_edge_shapes=SMALL_ROW_EDGES,
    bench_shape={"M": 16384, "N": 4096}, small_bench_shape=SMALL_ROW_BENCH,
    bytes_moved=lambda s, dt: (_numel(s, "B", "M", "N") + _numel(s, "B", "M")) * _esize(dt),
    flops=_row_flops(1),
    adversarial={"cancellation": _reduce_cancellation, "all_positive": _reduce_positive},
    noncontiguous=lambda inputs: (_padded_rows(inputs[0]),),
    description="sum over the last dimension",
    profiling=Profiling(ops=frozenset({"aten::sum"}), op_shape=_first_rows),
    default_speedup=1.1,
    deployment=Deployment("(Tensor x, int dim) -> Tensor",
                          lambda x, dim: tuple(s for i, s in enumerate(x.shape) if i != dim % x.dim())),
))


# --------------------------------------------------------------------------- cross_entropy
def _ce_inputs(logit_scale: float = 2.0, confident: bool = False, extreme_targets: bool = False,
               ignored: bool = False):
    def make(shape, dtype, device, gen):
        lead = ((shape["B"],) if "B" in shape else ()) + (shape["N"],)
        logits = _randn(lead + (shape["V"],), torch.float32, device, gen, logit_scale)
        targets = torch.randint(0, shape["V"], lead, device=device, generator=gen)
        if extreme_targets:
            targets = torch.where(torch.rand(lead, device=device, generator=gen) < 0.5, 0, shape["V"] - 1)
        if confident:  # the target logit towers over the rest: loss near 0, exp() of the rest underflows
            logits.scatter_(-1, targets.unsqueeze(-1), 60.0)
        if ignored:  # padding tokens: F.cross_entropy skips target -100 and averages over the rest
            pad = torch.rand(lead, device=device, generator=gen) < 0.3
            pad.view(-1)[0] = False
            targets = targets.masked_fill(pad, -100)
        return logits.to(dtype), targets
    return make


BUILTIN.append(KernelSpec(
    name="cross_entropy",
    reference=reference.cross_entropy_ref,
    make_inputs=_ce_inputs(),
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
    bytes_moved=lambda s, dt: _numel(s, "B", "N", "V") * _esize(dt) + _numel(s, "B", "N") * 8 + 4,
    flops=lambda s: 4 * _numel(s, "B", "N", "V"),
    adversarial={
        "huge_logits": _ce_inputs(logit_scale=3000.0),
        "confident": _ce_inputs(confident=True),
        "first_and_last_class": _ce_inputs(extreme_targets=True),
        "ignored_padding": _ce_inputs(ignored=True),
    },
    noncontiguous=lambda inputs: (_padded_rows(inputs[0]), inputs[1]),
    description="mean cross-entropy over [..., V] logits and integer targets",
    profiling=Profiling(ops=frozenset({"aten::cross_entropy_loss", "aten::nll_loss", "aten::nll_loss_nd"}),
                        op_shape=lambda op: {"N": math.prod(op.shapes[0][:-1]), "V": op.shapes[0][-1]}),
    default_speedup=1.5,  # eager materialises log_softmax over the whole vocabulary
    extra_baselines=lambda liger: {"liger": lambda logits, t: liger.liger_cross_entropy(logits, t)} if liger else {},
    deployment=Deployment("(Tensor logits, Tensor targets) -> Tensor", lambda logits, targets: (),
                          functions=customops.replace_cross_entropy),
))


# ------------------------------------------------------------------------ rotary_embedding
def _rope_tables(seq, dim, device, dtype, offset=0):
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim))
    angles = torch.outer(torch.arange(offset, offset + seq, dtype=torch.float64, device=device), inv_freq)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rope_inputs(scale: float = 1.0, offset: int = 0):
    def make(shape, dtype, device, gen):
        x = _randn((shape["B"], shape["H"], shape["S"], shape["D"]), dtype, device, gen, scale)
        return (x,) + _rope_tables(shape["S"], shape["D"], device, dtype, offset)
    return make


def _rope_noncontiguous(inputs):
    # Models produce q as [B, S, H, D] and transpose it to [B, H, S, D]: a strided view.
    x = inputs[0]
    return (x.transpose(1, 2).contiguous().transpose(1, 2),) + tuple(inputs[1:])


BUILTIN.append(KernelSpec(
    name="rotary_embedding",
    reference=reference.rotary_embedding_ref,
    make_inputs=_rope_inputs(),
    shapes=[{"B": 2, "H": 32, "S": 4096, "D": 128}, {"B": 2, "H": 8, "S": 4096, "D": 128},
            {"B": 1, "H": 32, "S": 2048, "D": 128}, {"B": 4, "H": 16, "S": 1024, "D": 64},
            {"B": 1, "H": 1, "S": 8192, "D": 128}, {"B": 8, "H": 32, "S": 512, "D": 128},
            {"B": 2, "H": 12, "S": 1024, "D": 64}, {"B": 1, "H": 40, "S": 2048, "D": 128}],
    small_shapes=[{"B": 1, "H": 2, "S": 8, "D": 16}, {"B": 2, "H": 4, "S": 32, "D": 64},
                  {"B": 1, "H": 3, "S": 17, "D": 32}, {"B": 2, "H": 2, "S": 64, "D": 128}],
    edge_shapes=[{"B": 1, "H": 4, "S": 1023, "D": 128}, {"B": 1, "H": 2, "S": 1537, "D": 96},
                 {"B": 1, "H": 1, "S": 4097, "D": 80}],
    small_edge_shapes=[{"B": 1, "H": 1, "S": 1023, "D": 16}, {"B": 1, "H": 2, "S": 37, "D": 96},
                       {"B": 1, "H": 1, "S": 129, "D": 80}],
    bench_shape={"B": 2, "H": 32, "S": 4096, "D": 128}, small_bench_shape={"B": 1, "H": 4, "S": 128, "D": 64},
    # x read and written once; the cos and sin tables read once
    bytes_moved=lambda s, dt: (2 * _numel(s, "B", "H", "S", "D") + _numel(s, "S", "D")) * _esize(dt),
    flops=lambda s: 3 * _numel(s, "B", "H", "S", "D"),
    adversarial={"long_positions": _rope_inputs(offset=100_000), "large_values": _rope_inputs(scale=300.0)},
    noncontiguous=_rope_noncontiguous,
    description="rotary position embedding, rotate-half convention",
    profiling=Profiling(
        # case-sensitive so that "Property" is not RoPE: Rotary, RoPE, Rope, rope as a word
        modules=re.compile(r"Rotary|rotary|RoPE|Rope(?![a-z])|(?<![A-Za-z])rope(?![a-z])"),
        functions=re.compile(r"rotary|rotate_half|(?<![a-z])rope(?![a-z])", re.I), per_tensor=True),
    default_speedup=2.0,  # eager: slices, 4 muls, 2 adds and a cat, each a trip through memory
    deployment=Deployment("(Tensor x, Tensor cos, Tensor sin) -> Tensor", lambda x, cos, sin: x.shape,
                          model_functions=swap.rotary_patches),
))


# ----------------------------------------------------------------------------------- matmul
def _matmul_inputs(wide_range: bool = False):
    def make(shape, dtype, device, gen):
        lead = (shape["B"],) if "B" in shape else ()
        a = _randn(lead + (shape["M"], shape["K"]), torch.float32, device, gen)
        b = _randn((shape["K"], shape["N"]), torch.float32, device, gen, 1 / math.sqrt(shape["K"]))
        if wide_range:  # rows and columns spread over 10^-2 .. 10^1.5: outputs up to ~10^3 still fit fp16
            a = a * 10 ** _uniform(lead + (shape["M"], 1), device, gen, -2, 1.5)
            b = b * 10 ** _uniform((1, shape["N"]), device, gen, -2, 1.5)
        return a.to(dtype), b.to(dtype)
    return make


def _matmul_noncontiguous(inputs):
    # B as the transpose of an nn.Linear weight: x @ W.T
    a, b = inputs
    return a, b.t().contiguous().t()


MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                        "aten::_addmm_activation"})


def _matmul_shape(op) -> dict:
    a, b = op.shapes[0], op.shapes[1]
    if op.name in ("aten::addmm", "aten::baddbmm", "aten::_addmm_activation"):
        a, b = op.shapes[1], op.shapes[2]
    if op.name == "aten::linear":  # weight is [N, K]
        return {"M": math.prod(a[:-1]), "N": b[0], "K": a[-1]}
    if len(b) >= 3:  # batched on both sides (bmm, attention scores): one matmul per batch
        return {"B": math.prod(b[:-2]), "M": a[-2], "N": b[-1], "K": a[-1]}
    return {"M": math.prod(a[:-1]), "N": b[-1], "K": a[-1]}


BUILTIN.append(KernelSpec(
    name="matmul",
    reference=reference.matmul_ref,
    make_inputs=_matmul_inputs(),
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
    bytes_moved=lambda s, dt: (_numel(s, "B", "M", "K") + s["K"] * s["N"] + _numel(s, "B", "M", "N")) * _esize(dt),
    flops=lambda s: 2 * _numel(s, "B", "M", "N", "K"),
    adversarial={"wide_dynamic_range": _matmul_inputs(wide_range=True)},
    noncontiguous=_matmul_noncontiguous,
    # where large terms cancel, a correct fp32 sum is off by ~eps * sum|a*b|, not eps * |result|
    error_scale=lambda inputs: inputs[0].abs() @ inputs[1].abs(),
    description="A [..., M, K] @ B [K, N]",
    profiling=Profiling(ops=MATMUL_OPS, kernels=re.compile(r"nvjet|cutlass|gemm|xmma|cublas|wgmma|matmul", re.I),
                        op_shape=_matmul_shape, precedence=-2),
    default_speedup=1.0,  # cuBLAS (nvjet on Hopper) is near the roofline; a Triton matmul ties it at best
    suite_target=SuiteTarget("0.9x cuBLAS", lambda r, b: r["speedup_vs_pytorch"] / 0.9, dtypes=("fp16", "bf16")),
    deployment=Deployment("(Tensor A, Tensor B) -> Tensor", lambda A, B: (*A.shape[:-1], B.shape[-1]),
                          module_site=swap.matmul_module_site, functions=customops.replace_linear),
))


# -------------------------------------------------------------------------- flash_attention
def _attention_inputs(scale: float = 1.0):
    def make(shape, dtype, device, gen):
        dims = (shape["B"], shape["H"], shape["S"], shape["D"])
        q, k, v = (_randn(dims, dtype, device, gen, scale if i < 2 else 1.0) for i in range(3))
        return q, k, v, shape["causal"], shape.get("sm_scale")
    return make


def _attention_noncontiguous(inputs):
    # Q, K, V sliced out of one packed [B, S, 3, H, D] projection, as models produce them.
    q, k, v = inputs[:3]
    packed = torch.stack([t.transpose(1, 2) for t in (q, k, v)], dim=2).contiguous()
    return tuple(packed[:, :, i].transpose(1, 2) for i in range(3)) + tuple(inputs[3:])


def _attention_flops(s):
    full = 4 * s["B"] * s["H"] * s["S"] * s["S"] * s["D"]
    return full // 2 if s["causal"] else full


# SDPA entry points -> (index of is_causal, index of scale) among their arguments
ATTENTION_OPS = {
    "aten::scaled_dot_product_attention": (5, 6),
    "aten::_scaled_dot_product_flash_attention": (4, 6),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (4, 6),
    "aten::_scaled_dot_product_efficient_attention": (6, 7),
    "aten::_scaled_dot_product_cudnn_attention": (6, 8),
    "aten::_flash_attention_forward": (None, None),
    "aten::_efficient_attention_forward": (None, None),
}


def _attention_shape(op) -> dict:
    b, h, s, d = op.shapes[0]
    causal_at, scale_at = ATTENTION_OPS.get(op.name, (None, None))
    causal = bool(op.args[causal_at]) if causal_at is not None and causal_at < len(op.args) else True
    shape = {"B": b, "H": h, "S": s, "D": d, "causal": causal}
    scale = op.args[scale_at] if scale_at is not None and scale_at < len(op.args) else None
    if isinstance(scale, float) and not math.isclose(scale, 1 / math.sqrt(d)):
        shape["sm_scale"] = scale
    return shape


BUILTIN.append(KernelSpec(
    name="flash_attention",
    reference=reference.flash_attention_ref,
    make_inputs=_attention_inputs(),
    shapes=[{"B": 2, "H": 32, "S": 2048, "D": 128, "causal": True},
            {"B": 2, "H": 32, "S": 2048, "D": 128, "causal": False},
            {"B": 1, "H": 16, "S": 4096, "D": 64, "causal": True},
            {"B": 4, "H": 8, "S": 1024, "D": 64, "causal": False},
            {"B": 1, "H": 32, "S": 512, "D": 128, "causal": True},
            {"B": 2, "H": 12, "S": 1024, "D": 64, "causal": True, "sm_scale": 0.1},
            {"B": 8, "H": 16, "S": 256, "D": 64, "causal": False},
            {"B": 1, "H": 8, "S": 8192, "D": 128, "causal": True}],
    small_shapes=[{"B": 1, "H": 1, "S": 16, "D": 16, "causal": True},
                  {"B": 1, "H": 2, "S": 32, "D": 32, "causal": False},
                  {"B": 2, "H": 2, "S": 64, "D": 16, "causal": True},
                  {"B": 1, "H": 1, "S": 48, "D": 64, "causal": False, "sm_scale": 0.2}],
    edge_shapes=[{"B": 1, "H": 4, "S": 1023, "D": 64, "causal": True},
                 {"B": 1, "H": 2, "S": 1537, "D": 128, "causal": False},
                 {"B": 1, "H": 2, "S": 4097, "D": 64, "causal": True},
                 {"B": 1, "H": 4, "S": 1000, "D": 80, "causal": True}],
    small_edge_shapes=[{"B": 1, "H": 1, "S": 1023, "D": 16, "causal": True},
                       {"B": 1, "H": 1, "S": 97, "D": 80, "causal": False}],
    bench_shape={"B": 2, "H": 32, "S": 2048, "D": 128, "causal": True},
    small_bench_shape={"B": 1, "H": 2, "S": 128, "D": 64, "causal": True},
    bytes_moved=lambda s, dt: 4 * _numel(s, "B", "H", "S", "D") * _esize(dt),
    flops=_attention_flops,
    # scores of +-64 sigma: exp() without a running max overflows even in fp32
    adversarial={"large_scores": _attention_inputs(scale=8.0)},
    # fp32 rounding of scores near 250 moves a softmax weight by ~1e-5 relative, and the output with it:
    # measured 1.8e-4 on an H200 against the 1e-4 fp32 tolerance; overflow still gives NaN or O(1) errors
    adversarial_tolerance={"large_scores": 4.0},
    noncontiguous=_attention_noncontiguous,
    description="scaled dot-product attention, causal or not, [batch, heads, seq, head_dim]",
    profiling=Profiling(ops=frozenset(ATTENTION_OPS), kernels=re.compile(r"flash|fmha|attention|attn", re.I),
                        op_shape=_attention_shape, precedence=-3),
    default_speedup=1.05,  # PyTorch's SDPA already runs FlashAttention-2 or cuDNN
    suite_target=SuiteTarget("0.9x SDPA", lambda r, b: r["speedup_vs_pytorch"] / 0.9),
    deployment=Deployment("(Tensor Q, Tensor K, Tensor V, bool causal, float? sm_scale) -> Tensor",
                          lambda Q, K, V, causal, sm_scale: (*Q.shape[:-1], V.shape[-1]),
                          functions=customops.replace_sdpa),
))


# -------------------------------------------------------------------------------- fused_mlp
def _mlp_inputs(scale: float = 1.0):
    def make(shape, dtype, device, gen):
        t, h, i = shape["T"], shape["H"], shape["I"]
        lead = (shape["B"],) if "B" in shape else ()
        x = _randn(lead + (t, h), dtype, device, gen, scale)
        w_gate = _randn((i, h), dtype, device, gen, 1 / math.sqrt(h))
        w_up = _randn((i, h), dtype, device, gen, 1 / math.sqrt(h))
        w_down = _randn((h, i), dtype, device, gen, 1 / math.sqrt(i))
        return x, w_gate, w_up, w_down
    return make


def _mlp_large_activations(shape, dtype, device, gen):
    # h = silu(x Wg^T) * (x Wu^T) grows as scale^2 (up to ~10^3, where fp16 accumulation of the GEMMs
    # would fail); w_down / scale^2 keeps the output O(1), so the absolute tolerance still means something
    # and eager's own 16-bit rounding of h stays within it.
    x, w_gate, w_up, w_down = _mlp_inputs(scale=8.0)(shape, dtype, device, gen)
    return x, w_gate, w_up, w_down / 64


def _matmul_taking(input_shape, members) -> tuple[int, int, int] | None:
    """(rows, K, N) of the first matmul of `members` whose K is input_shape's last dim; rows: the product of
    input_shape's other dims."""
    for op in members:
        if op.name in MATMUL_OPS and op.shapes:
            mm = _matmul_shape(op)
            if input_shape and mm["K"] == input_shape[-1]:
                return math.prod(input_shape[:-1]), input_shape[-1], mm["N"]
    return None


def _mlp_shape(t_h, members) -> dict | None:
    """The MLP's input [..., H] and its first matmul that takes H: [T, H] -> I."""
    found = _matmul_taking(t_h, members)
    return dict(zip(("T", "H", "I"), found)) if found else None


BUILTIN.append(KernelSpec(
    name="fused_mlp",
    reference=reference.fused_mlp_ref,
    make_inputs=_mlp_inputs(),
    shapes=[{"T": 4096, "H": 2048, "I": 5632}, {"T": 2048, "H": 4096, "I": 11008},
            {"T": 512, "H": 768, "I": 3072}, {"T": 1024, "H": 1024, "I": 2816},
            {"T": 8192, "H": 2048, "I": 5632}, {"T": 128, "H": 4096, "I": 11008},
            {"T": 2048, "H": 512, "I": 1536}, {"B": 2, "T": 512, "H": 1024, "I": 2816}],
    small_shapes=[{"T": 16, "H": 32, "I": 64}, {"T": 8, "H": 64, "I": 96}, {"T": 32, "H": 48, "I": 80},
                  {"B": 2, "T": 8, "H": 32, "I": 64}],
    edge_shapes=[{"T": 1023, "H": 1024, "I": 2816}, {"T": 1537, "H": 768, "I": 4097},
                 {"T": 4097, "H": 1000, "I": 1537}],
    small_edge_shapes=[{"T": 1023, "H": 16, "I": 32}, {"T": 37, "H": 24, "I": 1537}],
    bench_shape={"T": 4096, "H": 2048, "I": 5632}, small_bench_shape={"T": 64, "H": 64, "I": 128},
    # x read, three weight matrices read, the output written; the [T, I] intermediate never leaves chip
    bytes_moved=lambda s, dt: (2 * _numel(s, "B", "T", "H") + 3 * s["H"] * s["I"]) * _esize(dt),
    flops=lambda s: 6 * _numel(s, "B", "T", "H", "I"),
    adversarial={"large_activations": _mlp_large_activations},
    noncontiguous=lambda inputs: (_padded_rows(inputs[0]),) + tuple(inputs[1:]),
    description="SwiGLU MLP: down(silu(x @ w_gate.T) * (x @ w_up.T))",
    # an MLP module that runs a silu (SwiGLU), its three matmuls included: the fused kernel replaces the whole
    # MLP and its speedup is measured against the whole MLP (attribution.GATED_MLP_OWNS_MATMULS)
    profiling=Profiling(modules=re.compile(r"mlp|feed_?forward|ffn|swiglu", re.I),
                        module_needs=frozenset({"aten::silu", "aten::silu_"}), module_shape=_mlp_shape),
    default_speedup=1.1,  # three cuBLAS matmuls stay; the gain is the silu*up round trip through memory
    suite_target=SuiteTarget("1.0x eager", lambda r, b: r["speedup_vs_pytorch"]),
    extra_baselines=lambda liger: {"liger": lambda x, wg, wu, wd: F.linear(liger.liger_swiglu(
        F.linear(x, wg), F.linear(x, wu)), wd)} if liger else {},
    deployment=Deployment("(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down) -> Tensor",
                          lambda x, w_gate, w_up, w_down: (*x.shape[:-1], w_down.shape[0]),
                          module_site=swap.swiglu_module_site),
))


# ---------------------------------------------------------------------- add_rmsnorm, add_layernorm
# A decoder layer's residual add and the norm after it, as one kernel returning (sum, normed): x is the
# attention output, residual the layer's input. Shapes of HF models: M = batch x sequence tokens, N = hidden
# (GPT-2 768/1024, TinyLlama 2048, Llama-2 7B 4096, 13B 5120, 70B 8192).
ADD_NORM_SHAPES = [
    {"M": 2048, "N": 2048}, {"M": 4096, "N": 2048}, {"M": 2048, "N": 4096}, {"M": 8192, "N": 4096},
    {"M": 16384, "N": 4096}, {"M": 4096, "N": 768}, {"M": 16384, "N": 768}, {"M": 8192, "N": 1024},
    {"M": 4096, "N": 5120}, {"M": 2048, "N": 8192},
]
ADD_NORM_EDGES = [{"M": 2047, "N": 2048}, {"M": 4097, "N": 768}, {"M": 1537, "N": 5120}, {"M": 7, "N": 8191}]


def _add_norm_inputs(with_bias: bool, scale: float = 1.0, residual_scale: float = 4.0, cancel: bool = False):
    """(x, residual, weight[, bias]): the residual stream larger than the attention output, as in a model.
    cancel: residual = -x plus noise of `scale`, so that the sum is small and made of the low bits."""
    def make(shape, dtype, device, gen):
        x = _randn(_rows(shape), torch.float32, device, gen, residual_scale if cancel else scale)
        noise = _randn(_rows(shape), torch.float32, device, gen, scale if cancel else residual_scale)
        residual = (-x + noise) if cancel else noise
        weight = _randn((shape["N"],), dtype, device, gen, 0.5) + 1
        inputs = (x.to(dtype), residual.to(dtype), weight)
        return inputs + ((_randn((shape["N"],), dtype, device, gen, 0.5),) if with_bias else ())
    return make


def _add_norm_exact_sum(binade: float, scale: float):
    """(x, residual, weight, bias) whose sums lie in [binade, 2 binade) (binade a power of two), x and residual on
    the dtype's grid there: the sum is exact, so its rounding (eager's too, which the float64 oracle does not
    do) stays out of a test of the statistics around a large mean."""
    def make(shape, dtype, device, gen):
        step = binade * torch.finfo(dtype).eps  # the spacing of [binade, 2 binade)
        x = (_randn(_rows(shape), torch.float32, device, gen, scale) / step).round() * step
        r = (_randn(_rows(shape), torch.float32, device, gen, scale) / step).round() * step + 1.5 * binade
        x, r = x.clamp(-binade / 8, binade / 8), r.clamp(1.125 * binade, 1.875 * binade - step)
        weight = _randn((shape["N"],), dtype, device, gen, 0.5) + 1
        return x.to(dtype), r.to(dtype), weight, _randn((shape["N"],), dtype, device, gen, 0.5)
    return make


def _add_norm_noncontiguous(inputs):
    return (_padded_rows(inputs[0]), _padded_rows(inputs[1])) + tuple(inputs[2:])


def _add_norm_profiling(norm_class: str) -> Profiling:
    """The post-attention norm module of a decoder layer (addnorm_sites.POST_ATTENTION_NORMS names it), with the
    residual add run right before it in the layer: the pair is one call."""
    names = "|".join(addnorm_sites.POST_ATTENTION_NORMS)
    return Profiling(modules=re.compile(norm_class, re.I), residual_add=re.compile(rf"(^|\.)({names})$"),
                     module_shape=_module_rows)


def _add_rmsnorm_baselines(liger) -> dict:
    fused = getattr(liger, "liger_fused_add_rms_norm", None)  # Liger >= 0.6 (returns normed, sum)
    if fused is None:
        return {}
    return {"liger": lambda x, r, w, eps=1e-6: fused(x, r, w, eps, in_place=False)[::-1]}


def _add_norm_spec(norm: str, flops_per_element: int, adversarial: dict, schema: str, **rest) -> KernelSpec:
    """add_rmsnorm and add_layernorm: one residual add and one norm, the sum and the normed output returned."""
    name, with_bias = f"add_{norm}", norm == "layernorm"
    return KernelSpec(
        name=name,
        reference=getattr(reference, f"{name}_ref"),
        make_inputs=_add_norm_inputs(with_bias=with_bias),
        shapes=ADD_NORM_SHAPES, small_shapes=SMALL_ROW_SHAPES,
        edge_shapes=ADD_NORM_EDGES, small_edge_shapes=SMALL_ROW_EDGES,
        bench_shape={"M": 16384, "N": 4096}, small_bench_shape=SMALL_ROW_BENCH,
        # x and residual read, the sum and the normed output written, the weight (and bias) read once
        bytes_moved=_row_bytes(2, 2, params=2 if with_bias else 1), flops=_row_flops(flops_per_element),
        adversarial=adversarial,
        noncontiguous=_add_norm_noncontiguous,
        description=f"residual add + {'LayerNorm' if with_bias else 'RMSNorm'}: (x + residual, {norm}(x + residual)), "
                    "the sum rounded first",
        profiling=_add_norm_profiling(r"layer_?norm" if with_bias else r"rms_?norm"),
        deployment=Deployment(schema, lambda x, residual, *params: [x.shape, x.shape],
                              module_site=getattr(addnorm_sites, f"{name}_layer_site")),
        **rest,
    )


BUILTIN.append(_add_norm_spec(
    "rmsnorm", flops_per_element=5,
    adversarial={
        # residual ~ -x: the sum cancels (exactly, Sterbenz) to ~1e-3, its mean square near eps
        "cancellation": _add_norm_inputs(with_bias=False, scale=1e-3, residual_scale=1.0, cancel=True),
        # the sum's squares overflow fp16 unless accumulated in fp32
        "large_values": _add_norm_inputs(with_bias=False, scale=200.0, residual_scale=200.0),
    },
    schema="(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
    default_speedup=1.5,  # eager writes the sum and reads it back before its ~5 norm kernels; compile fuses both
    extra_baselines=_add_rmsnorm_baselines,
))

BUILTIN.append(_add_norm_spec(
    "layernorm", flops_per_element=9,
    adversarial={
        # var = E[s^2] - E[s]^2 cancels catastrophically around a large mean of the sum
        "large_mean": _add_norm_exact_sum(binade=512.0, scale=8.0),
        "near_zero_variance": _add_norm_exact_sum(binade=1.0, scale=1e-3),
    },
    schema="(Tensor x, Tensor residual, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor)",
    default_speedup=1.3,  # eager: the add and the norm as two kernels, the sum written and read back
))


# --------------------------------------------------------------------------- linear_cross_entropy
LCE_IGNORE_INDEX = -100  # F.cross_entropy's default, and the label transformers pads shifted targets with
LCE_MAX_MARGIN = 12.0  # the target's logit is raised by up to this: per-row losses from ~0 to ~log V, as a model's


def _lce_inputs(logit_scale: float = 1.0, ignored: float = 0.0, ignored_half: bool = False):
    """hidden [N, H], weight [V, H] (logits of std logit_scale), targets whose logit a trained head raises
    (a random margin per row), ignore_index. ignored: the share of targets set to ignore_index; ignored_half:
    the first half of the rows as well (whole row blocks with nothing to count)."""
    def make(shape, dtype, device, gen):
        n, h, v = shape["N"], shape["H"], shape["V"]
        weight = _randn((v, h), torch.float32, device, gen, logit_scale / math.sqrt(h))
        target = torch.randint(0, v, (n,), device=device, generator=gen)
        w_t = weight[target]
        margin = _uniform((n, 1), device, gen, 0.0, LCE_MAX_MARGIN * max(1.0, logit_scale))
        hidden = _randn((n, h), torch.float32, device, gen) + margin * w_t / w_t.pow(2).sum(-1, keepdim=True)
        drop = torch.rand(n, device=device, generator=gen) < ignored
        if ignored_half:
            drop[: n // 2] = True
        drop[-1] = False  # at least one target counts: an all-ignored call is 0/0
        target = target.masked_fill(drop, LCE_IGNORE_INDEX)
        return hidden.to(dtype), weight.to(dtype), target, LCE_IGNORE_INDEX
    return make


def _lce_head_shape(input_shape, members) -> dict | None:
    """The loss-evaluated output embedding's input [..., H] and its matmul [N, H] -> V."""
    found = _matmul_taking(input_shape, members)
    return dict(zip(("N", "H", "V"), found)) if found else None


def _lce_baselines(liger) -> dict:
    if liger is None:
        return {}

    def fused(hidden, weight, target, ignore_index=LCE_IGNORE_INDEX):
        return liger.liger_fused_linear_cross_entropy(hidden, weight, target, ignore_index=ignore_index)
    return {"liger": fused}


BUILTIN.append(KernelSpec(
    name="linear_cross_entropy",
    reference=reference.linear_cross_entropy_ref,
    make_inputs=_lce_inputs(),
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
    bytes_moved=lambda s, dt: (s["N"] * s["H"] + s["V"] * s["H"]) * _esize(dt) + s["N"] * 8 + 4,
    flops=lambda s: 2 * s["N"] * s["H"] * s["V"] + 4 * s["N"] * s["V"],
    adversarial={
        "large_logits": _lce_inputs(logit_scale=60.0),  # exp() without the running max overflows even in fp32
        "ignored_padding": _lce_inputs(ignored=0.3),  # counted in the mean, they would move it by ~log V each
        "ignored_row_blocks": _lce_inputs(ignored_half=True),  # whole row blocks with nothing to count
    },
    noncontiguous=lambda inputs: (_padded_rows(inputs[0]),) + tuple(inputs[1:]),
    description="LM head + mean cross-entropy: hidden [N, H] @ weight [V, H].T, fp32 loss over non-ignored targets",
    output_dtype=torch.float32,
    # profile.py --with-loss wraps the output embedding in LMHeadWithLoss, so the head's GEMM and the loss's
    # ops are one module call of this type
    profiling=Profiling(modules=re.compile(r"^LMHeadWithLoss$"), module_shape=_lce_head_shape),
    default_speedup=1.5,  # eager writes the 16-bit logits, an fp32 copy and log_softmax's output: ~3 GB at 8192x32000
    suite_target=SuiteTarget("1.0x torch.compile", lambda r, b: r["speedup_vs_compile"] or 0.0),
    extra_baselines=_lce_baselines,
    deployment=Deployment("(Tensor hidden, Tensor weight, Tensor target, int ignore_index) -> Tensor",
                          lambda hidden, weight, target, ignore_index: (), output_dtype=torch.float32,
                          model_site=swap.lm_head_site),
))


# --------------------------------------------------------------------------- rope_attention
def _hf_rope_tables(seq, dim, device, dtype, offset=0):
    """cos and sin [S, D] as HF's rotary module builds them: cat(freqs, freqs), both halves present."""
    return tuple(torch.cat((t, t), dim=-1) for t in _rope_tables(seq, dim, device, dtype, offset))


def _quarter_turn_tables(seq, dim, device, dtype):
    """cos and sin [S, D] of position p turned by p quarter turns in every frequency: entries 0 and +-1, so a
    rotation rounds nothing and RoPE still differs from position to position."""
    turns = torch.arange(seq, device=device)[:, None].expand(seq, dim) % 4
    cos = torch.tensor([1.0, 0.0, -1.0, 0.0], device=device)[turns]
    sin = torch.tensor([0.0, 1.0, 0.0, -1.0], device=device)[turns]
    return cos.to(dtype), sin.to(dtype)


def _rope_attention_inputs(scale: float = 1.0, offset: int = 0, quarter_turns: bool = False):
    def make(shape, dtype, device, gen):
        b, s, d = shape["B"], shape["S"], shape["D"]
        q = _randn((b, shape["Hq"], s, d), dtype, device, gen, scale)
        k = _randn((b, shape["Hkv"], s, d), dtype, device, gen, scale)
        v = _randn((b, shape["Hkv"], s, d), dtype, device, gen)
        tables = (_quarter_turn_tables(s, d, device, dtype) if quarter_turns
                  else _hf_rope_tables(s, d, device, dtype, offset))
        return (q, k, v, *tables, shape["causal"], shape.get("sm_scale"))
    return make


def _rope_attention_noncontiguous(inputs):
    # q, k, v as HF makes them (a [B, S, H, D] projection viewed as [B, H, S, D]); the tables as its rotary module
    # gives them, [1, S, D]
    q, k, v, cos, sin, *rest = inputs
    return (*(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)), cos[None], sin[None], *rest)


def _rope_attention_shape(hidden_shape, members) -> dict | None:
    """[B, Hq, S, D] from the module's SDPA, Hkv from the fewest heads a [B, H, S, D] tensor inside has (k rotated)."""
    sdpa = next((op for op in members if op.name in ATTENTION_OPS and op.shapes), None)
    if sdpa is None:
        return None
    shape = _attention_shape(sdpa)
    b, s, d = shape["B"], shape["S"], shape["D"]
    heads = []
    for op in members:  # each op's [B, H, S, D] operands, less the broadcast partners (cos [1, 1, S, D])
        four_d = [tuple(t) for t in op.shapes if isinstance(t, (list, tuple)) and len(t) == 4]
        heads += [t[1] for t in four_d if (t[0], t[2], t[3]) == (b, s, d) and t[1] == max(o[1] for o in four_d)]
    return {"B": b, "Hq": shape["H"], "Hkv": min(heads, default=shape["H"]), "S": s, "D": d,
            **{k: shape[k] for k in ("causal", "sm_scale") if k in shape}}


def _sdpa_gqa_after_rope(q, k, v, cos, sin, causal=True, sm_scale=None):
    """The yardstick: RoPE as separate eager ops, then SDPA on the grouped K/V as they are (enable_gqa, no copy)."""
    cos, sin = (t[None] if t.dim() == 2 else t for t in (cos, sin))
    q, k = (x * cos.unsqueeze(1) + reference._rotate_half(x) * sin.unsqueeze(1) for x in (q, k))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale, enable_gqa=True)


def _rope_attention_baselines(liger) -> dict:
    found = {"sdpa_gqa+rope": _sdpa_gqa_after_rope}
    if liger:
        def liger_rope_sdpa(q, k, v, cos, sin, causal=True, sm_scale=None):
            q, k = liger.liger_rope(q, k, cos if cos.dim() == 3 else cos[None], sin if sin.dim() == 3 else sin[None])
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale, enable_gqa=True)
        found["liger_rope+sdpa_gqa"] = liger_rope_sdpa
    return found


def _rope_attention_flops(s):
    full = 4 * _numel(s, "B", "Hq", "S", "S", "D")
    return full // 2 if s["causal"] else full


# the models' attention shapes: TinyLlama (Hq 32, Hkv 4, D 64), Llama-3-8B (32, 8, 128), Qwen2-1.5B (12, 2, 128)
_TINYLLAMA, _LLAMA3, _QWEN2 = ({"Hq": 32, "Hkv": 4, "D": 64}, {"Hq": 32, "Hkv": 8, "D": 128},
                               {"Hq": 12, "Hkv": 2, "D": 128})

BUILTIN.append(KernelSpec(
    name="rope_attention",
    reference=reference.rope_attention_ref,
    make_inputs=_rope_attention_inputs(),
    shapes=[{"B": b, **model, "S": 2048, "causal": True}
            for model, batches in ((_TINYLLAMA, (1, 2, 4)), (_LLAMA3, (1, 2, 4)), (_QWEN2, (1, 4))) for b in batches]
           + [{"B": 2, "Hq": 16, "Hkv": 16, "S": 1024, "D": 64, "causal": False, "sm_scale": 0.1}],
    small_shapes=[{"B": 1, "Hq": 2, "Hkv": 2, "S": 32, "D": 64, "causal": True},
                  {"B": 2, "Hq": 4, "Hkv": 1, "S": 48, "D": 64, "causal": True},
                  {"B": 1, "Hq": 8, "Hkv": 1, "S": 32, "D": 128, "causal": True},
                  # sm_scale 0.12, not 0.2: at 0.2 (scores 2.3x the default's) the bf16 rounding of the rotated q
                  # and k, which eager and the kernel both do, took 9 of 100 seeds past bf16's tolerance; at 0.12
                  # eager's worst of 100 is 0.67 of it, the starter's of 150 0.66, and a kernel that ignores
                  # sm_scale is still off by 12x the tolerance or more
                  {"B": 1, "Hq": 4, "Hkv": 2, "S": 64, "D": 128, "causal": False, "sm_scale": 0.12}],
    edge_shapes=[{"B": 1, **_TINYLLAMA, "S": 1023, "causal": True}, {"B": 1, **_QWEN2, "S": 1537, "causal": True},
                 {"B": 1, "Hq": 8, "Hkv": 2, "S": 1000, "D": 96, "causal": True},
                 {"B": 1, "Hq": 4, "Hkv": 1, "S": 4097, "D": 64, "causal": False}],
    small_edge_shapes=[{"B": 1, "Hq": 2, "Hkv": 1, "S": 37, "D": 96, "causal": True},
                       {"B": 1, "Hq": 4, "Hkv": 4, "S": 97, "D": 64, "causal": False},
                       {"B": 1, "Hq": 2, "Hkv": 1, "S": 129, "D": 32, "causal": True}],
    bench_shape={"B": 1, **_TINYLLAMA, "S": 2048, "causal": True},
    small_bench_shape={"B": 1, "Hq": 2, "Hkv": 1, "S": 128, "D": 64, "causal": True},
    # q and the output once per query head, k and v once per kv head (no repeated copy), the two tables once
    bytes_moved=lambda s, dt: (2 * _numel(s, "B", "Hq", "S", "D") + 2 * _numel(s, "B", "Hkv", "S", "D")
                               + 2 * _numel(s, "S", "D")) * _esize(dt),
    flops=_rope_attention_flops,
    # scores of +-64 sigma: exp() without a running max overflows even in fp32. Rotated by quarter turns, which
    # round nothing: at such scores the 16-bit rounding of a rotated q and k (eager's too) moves a score by
    # eps * |score|, and the output by up to 0.09 (fp16) and 0.63 (bf16) measured for eager itself; this checks
    # the softmax, and long_positions (positions far out, where 16-bit tables are coarse) the rotation
    adversarial={"large_scores": _rope_attention_inputs(scale=8.0, quarter_turns=True),
                 "long_positions": _rope_attention_inputs(offset=100_000)},
    adversarial_tolerance={"large_scores": 4.0},  # as flash_attention's: fp32 rounding of scores near 250
    noncontiguous=_rope_attention_noncontiguous,
    description="RoPE (rotate-half) on q and k, grouped-query attention, [batch, heads, seq, head_dim]",
    profiling=Profiling(modules=re.compile(r"Attention"), module_needs=frozenset(ATTENTION_OPS),
                        module_needs_function=re.compile(r"rotary|rotate_half|(?<![a-z])rope(?![a-z])", re.I),
                        module_leaves=frozenset({"aten::linear"}), module_shape=_rope_attention_shape, opt_in=True),
    # eager runs ~10 RoPE kernels and a repeat_kv copy beside SDPA (rotary 14% and attention 10% of TinyLlama's
    # eager GPU time, issue #19): at SDPA's speed the kernel removes the rest
    default_speedup=1.5,
    suite_target=SuiteTarget("1.0x compile", lambda r, b: r["speedup_vs_compile"] or 0),
    extra_baselines=_rope_attention_baselines,
    deployment=Deployment("(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, bool causal, float? sm_scale) "
                          "-> Tensor", lambda q, k, v, cos, sin, causal, sm_scale: q.shape,
                          module_site=rope_attention_module_site, model_functions=causal_mask_patches),
))


# ------------------------------------------------------------------------------- linear_gelu
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
        x = _randn(lead + (t, h), torch.float32, device, gen, x_scale)
        if row_decades != (0.0, 0.0):
            x = x * 10 ** _uniform(lead + (t, 1), device, gen, *row_decades)
        weight = _randn((i, h), dtype, device, gen, 1 / math.sqrt(h))
        bias = (_randn((i,), torch.float32, device, gen, 0.5) + bias_shift).to(dtype) if shape.get("bias", True) \
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
    x = big * sign + _randn(lead + (t, h), torch.float32, device, gen)
    weight = big + _randn((i, h), torch.float32, device, gen)
    return x.to(dtype), weight.to(dtype), _randn((i,), dtype, device, gen), shape.get("approximate", "none")


def _linear_gelu_noncontiguous(inputs):
    # x with padded rows; the weight as GPT-2's Conv1D holds it, [H, I], passed transposed: a [I, H] view whose
    # rows are strided
    x, weight, *rest = inputs
    return (_padded_rows(x), weight.t().contiguous().t(), *rest)


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
            mm = _matmul_shape(op)
            if input_shape and mm["K"] == input_shape[-1]:
                tanh = any(o.name == "aten::tanh" for o in members)
                return {"T": math.prod(input_shape[:-1]), "H": input_shape[-1], "I": mm["N"],
                        "approximate": "tanh" if tanh else "none"}
    return None


BUILTIN.append(KernelSpec(
    name="linear_gelu",
    reference=reference.linear_gelu_ref,
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
    bytes_moved=lambda s, dt: (_numel(s, "B", "T", "H") + s["I"] * s["H"] + _numel(s, "B", "T", "I") + s["I"])
    * _esize(dt),
    flops=lambda s: 2 * _numel(s, "B", "T", "H", "I") + 10 * _numel(s, "B", "T", "I"),  # the GEMM, bias + GELU
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
    # pointwise part. At cuBLAS speed the kernel saves that round trip, ~25% of the pair at GPT-2's shapes
    default_speedup=1.2,
    suite_target=SuiteTarget("1.0x torch.compile", lambda r, b: r["speedup_vs_compile"] or 0.0),
    # no Liger baseline: Liger-Kernel has GEGLU (gelu(gate) * up, after the GEMMs), not a GEMM with a GELU epilogue
    deployment=Deployment("(Tensor x, Tensor weight, Tensor? bias, str approximate) -> Tensor",
                          lambda x, weight, bias, approximate: (*x.shape[:-1], weight.shape[0]),
                          module_site=gelu_sites.gelu_mlp_module_site),
))
