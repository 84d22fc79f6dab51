"""rotary_embedding: RoPE in the rotate-half convention on one [..., seq, head_dim] tensor, and where a model
applies it (its own rotary functions that pass a probe: fn(x, cos, sin), or transformers' fn(q, k, cos, sin))."""

import inspect
import re

import torch
import torch.nn as nn

from autokernel.kerneltype import Deployment, KernelSpec, Profiling
from autokernel.ops import customops
from autokernel.ops.customops import KERNEL_DTYPES, CallSites, PerTables, Site, grad_reason, in_eager
from autokernel.ops.swap import PROBE_SEQ, REL_L2_TOLERANCE, dtype_device, model_modules, rel_l2
from autokernel.types._common import esize, numel, randn, sequence_major

NAME = "rotary_embedding"
K_HEADS = 8  # the k of a grouped-query model beside q's 32 heads (LLaMA-3 8B, TinyLlama), timed together


def rotary_embedding_ref(x, cos, sin):
    """Rotary embedding, rotate-half convention (LLaMA, GPT-NeoX).

    x is [..., seq, head_dim]; cos and sin are [seq, head_dim // 2]. The first half of each head
    is rotated against the second: out = cat(x1*cos - x2*sin, x2*cos + x1*sin).
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_tables(seq, dim, device, dtype, offset=0):
    """cos and sin [seq, dim / 2] of positions offset.. with the usual base of 10000."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim))
    angles = torch.outer(torch.arange(offset, offset + seq, dtype=torch.float64, device=device), inv_freq)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _inputs(scale: float = 1.0, offset: int = 0):
    def make(shape, dtype, device, gen):
        x = randn((shape["B"], shape["H"], shape["S"], shape["D"]), dtype, device, gen, scale)
        return (x,) + rope_tables(shape["S"], shape["D"], device, dtype, offset)
    return make


def _noncontiguous(inputs):
    # Models produce q as [B, S, H, D] and transpose it to [B, H, S, D]: a strided view.
    x = inputs[0]
    return (sequence_major(x),) + tuple(inputs[1:])


def _time_q_and_k(liger, baselines) -> dict:
    """bench.py --suite's extra row: q [2, 32, 4096, 128] and k with K_HEADS heads rotated in one step, as a model
    applies it, the starter against eager, torch.compile and Liger (baselines: autokernel.harness.baselines)."""
    q_shape = SPEC.bench_shape
    k_shape = {**q_shape, "H": K_HEADS}
    sets = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(baselines.INPUT_SETS):
        q, cos, sin = SPEC.make_inputs(q_shape, torch.float16, "cuda", gen)
        k, _, _ = SPEC.make_inputs(k_shape, torch.float16, "cuda", gen)
        sets.append((q, k, cos, sin))
    fns = {name: (lambda q, k, c, s, fn=fn: (fn(q, c, s), fn(k, c, s)))
           for name, fn in baselines.starter_eager_compile(SPEC).items()}
    if liger is not None:
        # Liger takes HF-style [1, seq, head_dim] tables with both halves present.
        full = [(torch.cat([c, c], -1)[None], torch.cat([s, s], -1)[None]) for _, _, c, s in sets]
        fns["liger"] = lambda q, k, c, s: liger.liger_rope(q, k, *full[0])
    times = baselines.median_times(fns, sets)
    nbytes = sum(SPEC.bytes_moved(s, torch.float16) for s in (q_shape, k_shape))
    return {"what": f"Rotary on q {q_shape} and k {k_shape} together (fp16)", "bytes": nbytes, **times}


# ------------------------------------------------------------------------------ where a model applies it
ROTARY_NAME = re.compile(r"rotary|rope", re.I)


def rotary_x_cos_sin(fn, sites: CallSites, name: str):
    """fn(x, cos, sin) with cos, sin [seq, head_dim / 2]: the reference's own convention."""
    kernel = customops.op(NAME)

    def rotary(x, cos, sin):
        fits = (x.dim() >= 2 and x.dtype in KERNEL_DTYPES and cos.dtype == sin.dtype == x.dtype
                and tuple(cos.shape) == tuple(sin.shape) == (x.shape[-2], x.shape[-1] // 2))
        reason = grad_reason(x, cos, sin) if fits else "tables not [seq, head_dim/2] in x's dtype"
        if in_eager():
            sites.hit(name, NAME, reason)
        return fn(x, cos, sin) if reason else kernel(x, cos, sin)

    return rotary


def rotary_q_k_cos_sin(fn, sites: CallSites, name: str, partial: bool = False):
    """transformers' fn(q, k, cos, sin, [position_ids=None,] unsqueeze_dim=1) (position_ids is gone from newer
    versions) with cos, sin [1, seq, head_dim] built as cat(freqs, freqs): their first halves are the reference's
    tables. A model hands every layer the same cos and sin: their halves are sliced once per forward, not per layer.
    partial: fn applies narrower tables [1, seq, rot] to the first rot of head_dim and passes the rest through
    (GPT-NeoX, Phi: its probe said so), and so does the wrapper, the kernel on the rotated part. Any other call
    (narrower tables where fn does not take them so, another argument of fn's own) goes to fn as it came."""
    kernel = customops.op(NAME)
    halves = PerTables(lambda cos, sin: (cos[0, :, : cos.shape[-1] // 2], sin[0, :, : sin.shape[-1] // 2]))
    extra_names = list(inspect.signature(fn).parameters)[4:]  # fn's own parameters after sin

    def defaults(rest: tuple, options: dict) -> bool:
        """Whether the arguments after sin ask for what the kernel does (no position_ids, unsqueeze_dim 1)."""
        extra = {**dict(zip(extra_names, rest)), **options}
        return (set(extra) <= {"position_ids", "unsqueeze_dim"} and extra.get("position_ids") is None
                and extra.get("unsqueeze_dim", 1) == 1)

    def rotary(q, k, cos, sin, *rest, **options):
        d, rot = q.shape[-1], cos.shape[-1]
        plain = not (rest or options) or defaults(rest, options)  # a model's call passes none: no dict per call
        fits = (q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and cos.shape[0] == 1
                and tuple(cos.shape) == tuple(sin.shape) and cos.shape[1] == q.shape[2] and k.shape[-1] == d
                and (rot == d or (partial and 0 < rot < d and rot % 2 == 0))
                and q.dtype in KERNEL_DTYPES and q.dtype == k.dtype == cos.dtype == sin.dtype)
        reason = ("called with an argument the kernel does not take" if not plain else
                  "tables not [1, seq, head_dim] in q's dtype" if not fits else grad_reason(q, k, cos, sin))
        eager = in_eager()
        if eager:
            sites.hit(name, NAME, reason)
        if reason:
            return fn(q, k, cos, sin, *rest, **options)
        c, s = halves(cos, sin, eager)
        if rot == d:
            return kernel(q, c, s), kernel(k, c, s)
        return tuple(torch.cat((kernel(t[..., :rot], c, s), t[..., rot:]), dim=-1) for t in (q, k))

    return rotary


def _probe_inputs(dtype, device):
    gen = torch.Generator().manual_seed(0)
    half = 8
    freqs = torch.rand(half, generator=gen, dtype=torch.float64)
    angles = torch.outer(torch.arange(PROBE_SEQ, dtype=torch.float64), freqs)
    q, k = (torch.randn(1, 2, PROBE_SEQ, 2 * half, generator=gen).to(device, dtype) for _ in range(2))
    return q, k, angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def _probed_wrapper(fn, params, probe, sites, label):
    """(wrapper, fits the probe) for a rotary function of either convention, or None for another function."""
    q, k, cos, sin, want_q, want_k, tol = probe
    if params[1:3] == ["cos", "sin"]:
        return rotary_x_cos_sin(fn, sites, label), rel_l2(fn(q, cos, sin), want_q) <= tol
    if params[2:4] == ["cos", "sin"]:
        got_q, got_k = fn(q, k, *_hf_tables(cos, sin))
        fits = max(rel_l2(got_q, want_q), rel_l2(got_k, want_k)) <= tol
        return rotary_q_k_cos_sin(fn, sites, label, partial=fits and _takes_partial(fn, probe)), fits
    return None  # not an apply-rotary function (e.g. one that builds the tables)


def _hf_tables(cos, sin):
    """[1, seq, 2 * n] tables as HF's rotary modules build them, cat(freqs, freqs), from [seq, n] ones."""
    return [torch.cat((t, t), dim=-1)[None] for t in (cos, sin)]


def _takes_partial(fn, probe) -> bool:
    """Whether fn, given tables for half of head_dim, rotates the first half of q and k by them and passes the rest
    through (a partial rotary: GPT-NeoX's and Phi's apply_rotary_pos_emb); False for any other answer or an error."""
    q, k, cos, sin, _, _, tol = probe
    quarter = cos.shape[-1] // 2  # tables for rot = head_dim / 2
    narrow = (cos[:, :quarter], sin[:, :quarter])
    rot = 2 * quarter
    want = [torch.cat((rotary_embedding_ref(t[..., :rot].double(), *(n.double() for n in narrow)),
                       t[..., rot:].double()), dim=-1) for t in (q, k)]
    try:
        got = fn(q, k, *_hf_tables(*narrow))
        return max(rel_l2(g, w) for g, w in zip(got, want)) <= tol
    except Exception:  # tables it does not broadcast: no partial rotary there
        return False


def rotary_patches(model: nn.Module, sites: CallSites) -> tuple[list, list[Site]]:
    """Patches for the model's own rotary functions that pass a probe against the reference."""
    patches, notes = [], []
    dtype, device = dtype_device(model)
    q, k, cos, sin = _probe_inputs(dtype if dtype in KERNEL_DTYPES else torch.float32, device)
    want_q, want_k = (rotary_embedding_ref(t.double(), cos.double(), sin.double()) for t in (q, k))
    probe = (q, k, cos, sin, want_q, want_k, REL_L2_TOLERANCE.get(q.dtype, 1e-4))
    for module in model_modules(model):
        for name, fn in list(vars(module).items()):
            if not (inspect.isfunction(fn) and fn.__module__ == module.__name__ and ROTARY_NAME.search(name)):
                continue
            params = list(inspect.signature(fn).parameters)
            label = f"{module.__name__.rsplit('.', 1)[-1].removeprefix('_autokernel_model_')}.{name}"
            why = "computes something else than rotate-half RoPE (probe)"
            try:
                found = _probed_wrapper(fn, params, probe, sites, label)
            except Exception as e:
                found, why = (None, False), f"probe raised {type(e).__name__}"
            if found is None:
                continue
            if found[1]:
                patches.append((module, name, found[0]))
            else:
                notes.append(Site(label, f"{name}({', '.join(params)})", NAME, False, why))
    return patches, notes


SPEC = KernelSpec(
    name=NAME,
    reference=rotary_embedding_ref,
    make_inputs=_inputs(),
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
    bytes_moved=lambda s, dt: (2 * numel(s, "B", "H", "S", "D") + numel(s, "S", "D")) * esize(dt),
    flops=lambda s: 3 * numel(s, "B", "H", "S", "D"),
    adversarial={"long_positions": _inputs(offset=100_000), "large_values": _inputs(scale=300.0)},
    noncontiguous=_noncontiguous,
    description="rotary position embedding, rotate-half convention",
    profiling=Profiling(
        # case-sensitive so that "Property" is not RoPE: Rotary, RoPE, Rope, rope as a word
        modules=re.compile(r"Rotary|rotary|RoPE|Rope(?![a-z])|(?<![A-Za-z])rope(?![a-z])"),
        functions=re.compile(r"rotary|rotate_half|(?<![a-z])rope(?![a-z])", re.I), per_tensor=True),
    default_speedup=2.0,  # eager: slices, 4 muls, 2 adds and a cat, each a trip through memory
    extra_timing=_time_q_and_k,
    deployment=Deployment("(Tensor x, Tensor cos, Tensor sin) -> Tensor", lambda x, cos, sin: x.shape,
                          model_functions=rotary_patches),
)
