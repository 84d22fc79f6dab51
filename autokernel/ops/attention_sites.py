"""HF attention modules (LlamaAttention and its relatives) whose RoPE, repeat_kv and attention run as one kernel
call: the model sites of the RoPE-attention type (autokernel/types/rope_attention.py), which hands its name and
reference to `module_site`.

A candidate is a module with q_proj, k_proj, v_proj (or Phi-3's one qkv_proj) and o_proj (or dense) Linears, a
head_dim and num_key_value_groups (Llama and its relatives, Phi), or with GPT-NeoX's query_key_value and dense and a
head_size, and a forward that takes hidden_states, position_embeddings=(cos, sin) and attention_mask (transformers
>= 4.48; the names are read from the forward's signature, not assumed). It is swapped when a probe agrees: the
original forward on a random input, with no mask and no cache, must give the output projection of reference(q, k, v,
cos, sin) computed in float64 from its own weights, q and k normalized per head first where the module has such
norms (Qwen3's q_norm and k_norm, which the replacement runs as the module does), with tables as wide as its
rotary_ndims where it has one (partial rotary: the kernel rotates the first features of a head, as wide as the
tables it is given); one with another scaling fails the probe and is left alone. The probe also records what the
forward returns (its tuple length: (out, weights) in 5.x, (out, weights, cache) in older 4.x), so the replacement
returns the same.

At run time the replacement runs the kernel only for the prefill / loss-evaluation case: full-sequence causal
attention with no attention mask (HF passes None for a plain causal mask to SDPA), no past positions in a cache,
no dropout, no attention weights asked for, and a sliding window (if any) no shorter than the sequence. An empty
cache (HF creates one on every plain forward with use_cache=True) is filled as the original fills it: K is
rotated once more for the cache (one op under torch.compile: rotation.py), since the kernel rotates K only inside;
callers that need no cache (loss evaluation) pass use_cache=False and save that. Everything else runs the original
forward, and the site says why. The projections stay as they are (with matmul requested, F.linear's patch still
takes them).

Under torch.compile, and while a CUDA graph captures the forward, transformers (5.x with torch < 2.14) builds an
explicit causal mask tensor even where it would pass None in eager mode, and a layer given a mask falls back. So
the type (and flash_attention, for the SDPA calls of attention modules no site takes) also patches HF's
create_causal_mask where the model's modules import it (causal_mask_patches): with no attention_mask, no past
positions, SDPA as the implementation and no extra mask functions it returns None, as transformers itself does
in eager mode for that case (SDPA then runs with is_causal=True; nothing is padded, so nothing is lost). A model
switched to the attention interface's kernel (attention_interface.py) gets create_sliding_window_causal_mask patched
alike: the kernel takes the window itself; with SDPA, the window's mask is left out where the sequence is shorter
than the window (Gemma-2's sliding layers at 2048 tokens: compiled, they fell back to SDPA with a mask, 148 us a
call on an H100 where the kernel takes 96 and is_causal SDPA 57).

A layer the kernel runs never calls apply_rotary_pos_emb or F.scaled_dot_product_attention, so the
rotary_embedding and flash_attention types do not claim it as well; they see only the calls of layers that fell
back to the original forward.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn as nn

from autokernel.ops import attention_interface
from autokernel.ops.customops import KERNEL_DTYPES, PerTables, Site, grad_reason, in_eager
from autokernel.ops.rotation import formula as rotation_formula
from autokernel.ops.rotation import rotate_half
from autokernel.ops.swap import PROBE_SEQ, REL_L2_TOLERANCE, KernelModule, dtype_device, f64, model_modules, rel_l2

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
QK_NORMS = ("q_norm", "k_norm")  # per-head norms of q and k before RoPE (Qwen3)
# the KV cache argument by its name in transformers >= 5.24 ("cache"; past_key_values still accepted, deprecated),
# earlier 5.x and 4.x, and GPT-NeoX's
CACHE_NAMES = ("cache", "past_key_values", "past_key_value", "layer_past")
# Which features a module's RoPE turns together, and the tables it takes (the probe finds which): "half", i and i + R/2
# with HF's cat(freqs, freqs) tables (Llama and most); "pairs", 2i and 2i+1 with the same tables (GLM); "own_pairs",
# 2i and 2i+1 with tables of its own order, repeat_interleave(freqs, 2) (Cohere), which the site puts in cat order.
ROTATIONS = ("half", "pairs", "own_pairs")


@dataclass(frozen=True)
class Projections:
    """How an attention module makes q, k and v from its input, and its output from the attention's. layout:
    "separate", q_proj, k_proj and v_proj (Llama and its relatives); "per_head", GPT-NeoX's query_key_value (each
    head's q, k and v side by side) with a head_size; "stacked", Phi-3's qkv_proj (every query head, then the kv
    heads' keys, then their values). out: o_proj (Phi: dense); rotary: the features of a head RoPE rotates (the
    module's rotary_ndims where it has one: partial rotary), else head_dim. split: "stacked"'s widths of q, k and v
    in qkv_proj's output, read once from the module (every call splits by them)."""
    layout: str
    head_dim: int
    out: str  # the output projection's name
    rotary: int
    split: tuple[int, ...] = ()

    INPUT = {"separate": "q_proj", "per_head": "query_key_value", "stacked": "qkv_proj"}  # the input weight's Linear

    @staticmethod
    def of(m) -> Projections | None:
        out = next((p for p in ("o_proj", "dense") if isinstance(getattr(m, p, None), nn.Linear)), None)
        rotary = getattr(m, "rotary_ndims", None)
        grouped = isinstance(getattr(m, "head_dim", None), int) and hasattr(m, "num_key_value_groups")
        split = ()
        if out and grouped and all(isinstance(getattr(m, p, None), nn.Linear) for p in PROJECTIONS[:3]):
            layout, head_dim = "separate", m.head_dim
        elif out and grouped and isinstance(getattr(m, "qkv_proj", None), nn.Linear):
            layout, head_dim, group = "stacked", m.head_dim, m.num_key_value_groups
            kv_width = m.qkv_proj.out_features // (group + 2)  # qkv_proj: (group + 2) x kv heads x head_dim
            split = (group * kv_width, kv_width, kv_width)
        elif isinstance(getattr(m, "query_key_value", None), nn.Linear) and isinstance(getattr(m, "dense", None),
                                                                                          nn.Linear) \
                and isinstance(getattr(m, "head_size", None), int):
            layout, head_dim, out = "per_head", m.head_size, "dense"
        else:
            return None
        return Projections(layout, head_dim, out, rotary if isinstance(rotary, int) and rotary > 0 else head_dim,
                           split)

    def qkv(self, m, x, project) -> tuple:
        """q, k, v [batch, seq, heads, head_dim] (views) of x [batch, seq, hidden]; project(linear, x) applies one."""
        rows, d = x.shape[:2], self.head_dim
        if self.layout == "per_head":
            return project(m.query_key_value, x).view(*rows, -1, 3 * d).split(d, -1)
        if self.layout == "stacked":
            return tuple(t.view(*rows, -1, d) for t in project(m.qkv_proj, x).split(self.split, -1))
        return tuple(project(getattr(m, p), x).view(*rows, -1, d) for p in PROJECTIONS[:3])

    def input_weight(self, m) -> torch.Tensor:
        return getattr(m, self.INPUT[self.layout]).weight

    def heads(self, m) -> tuple[int, int]:
        """(query heads, kv heads)."""
        if self.layout == "stacked":
            return self.split[0] // self.head_dim, self.split[1] // self.head_dim
        width = getattr(m, self.INPUT[self.layout]).out_features // self.head_dim
        if self.layout == "per_head":
            return (width // 3,) * 2
        return width, m.k_proj.out_features // self.head_dim


def _applied(linear, x):
    return linear(x)


def _applied_f64(linear, x):
    return nn.functional.linear(x, f64(linear.weight), f64(linear.bias))


@dataclass(frozen=True)
class CallShape:
    """Where the original forward takes its arguments, and how many values it returns (None: a bare tensor)."""
    positions: dict  # argument name -> its position in forward's signature
    n_outputs: int | None

    def arg(self, name, args, kwargs):
        i = self.positions.get(name)
        return args[i] if i is not None and i < len(args) else kwargs.get(name)

    def cache(self, args, kwargs):
        """The KV cache the call passes, under whichever of its names (a deprecated one included)."""
        return next((c for c in (self.arg(n, args, kwargs) for n in CACHE_NAMES) if c is not None), None)

    def result(self, out, cache):
        if self.n_outputs is None:
            return out
        return (out, None, cache, *(None,) * (self.n_outputs - 3))[: self.n_outputs]


def _per_head(table):
    """A [seq, head_dim] or [batch, seq, head_dim] table as [batch or 1, 1, seq, head_dim]: over q's or k's heads."""
    return (table[None] if table.dim() == 2 else table).unsqueeze(1)


def _broadcast_tables(cos, sin):
    """cos, and sin with its first half negated, both [batch or 1, 1, seq, head_dim]: _rotated's factors."""
    half = sin.shape[-1] // 2
    return _per_head(cos), _per_head(torch.cat((-sin[..., :half], sin[..., half:]), dim=-1))


_CACHE_TABLES = PerTables(_broadcast_tables)
# tables in repeat_interleave(freqs, 2) order (Cohere's) in cat(freqs, freqs) order: the kernel's and the reference's
_CAT_ORDER = PerTables(lambda cos, sin: tuple(torch.cat((t[..., 0::2],) * 2, dim=-1) for t in (cos, sin)))


def _rotated(x, cos, sin, eager: bool, pairs: bool = False):
    """HF's apply_rotary_pos_emb on one tensor: what the original forward puts in the cache. Eagerly bit for bit, in
    four ops, x * cos + roll(x, D/2) * sin_signed: roll(x) is rotate_half(x) without the minus, which moves onto the
    first half of sin (the products are the same: a negation is exact). Every layer gets the same cos and sin, so
    their broadcast forms are made once per forward (six host ops fewer a layer). Traced, one op a trace keeps whole
    (rotation.py: Inductor fused HF's ops with the tables' making, 721 us a forward in one kernel of Qwen3-0.6B's;
    on a GPU the op rounds once, as Inductor computes the compiled original's keys). Tables narrower than x: partial
    rotary, the rest of each head passes. pairs: GLM's interleaved pairs, eagerly in its own ops."""
    if not eager:
        return rotate_half(x, cos, sin, pairs)
    if pairs:
        return rotation_formula(x, cos, sin, True)
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        return torch.cat((_rotated(x[..., :rotary], cos, sin, eager), x[..., rotary:]), dim=-1)
    c, signed = _CACHE_TABLES(cos, sin, eager)
    return x * c + x.roll(x.shape[-1] // 2, -1) * signed


class KernelRopeAttention(KernelModule):
    """The attention module with RoPE + repeat_kv + attention as one kernel call where the call fits (see the
    module docstring); the original forward otherwise."""

    def __init__(self, original: nn.Module, site: Site, call: CallShape, kernel_type: str, projections: Projections,
                 rotation: str = "half"):
        super().__init__(original, site, kernel_type)
        self.call, self.projections, self.rotation = call, projections, rotation
        self.norms = head_norms(original)
        # read once: a module without the attribute makes every lookup raise inside nn.Module.__getattr__
        self.window = getattr(original, "sliding_window", None) or getattr(getattr(original, "config", None),
                                                                           "sliding_window", None)

    def forward(self, *args, **kwargs):
        m, call = self._original, self.call
        hidden = call.arg("hidden_states", args, kwargs)
        tables = call.arg("position_embeddings", args, kwargs)
        cache = call.cache(args, kwargs)
        reason = _unfit(m, self.projections, hidden, tables, call.arg("attention_mask", args, kwargs), cache, kwargs,
                        self.window)
        eager = in_eager()
        if eager:
            self.site.calls += not reason
            self.site.fallbacks += bool(reason)
            self.site.reason = reason or self.site.reason
        if reason:
            return m(*args, **kwargs)
        cos, sin = _CAT_ORDER(*tables, eager) if self.rotation == "own_pairs" else tables
        pairs = self.rotation != "half"
        batch, seq = hidden.shape[:2]
        q, k, v = self.projections.qkv(m, hidden, _applied)
        if self.norms is not None:  # the module's own per-head norms, as its forward runs them
            q, k = self.norms[0](q), self.norms[1](k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if cache is not None:  # an empty cache (prefill): it gets the rotated keys, as from the original
            extra = {"sin": tables[1], "cos": tables[0], "cache_position": kwargs["cache_position"]} \
                if "cache_position" in kwargs else None
            cache.update(_rotated(k, cos, sin, eager, pairs), v, m.layer_idx, *([extra] if extra else []))
        scaling = float(getattr(m, "scaling", self.projections.head_dim ** -0.5))
        out = self.op(q, k, v, cos, sin, True, scaling, pairs)
        return call.result(getattr(m, self.projections.out)(out.transpose(1, 2).reshape(batch, seq, -1)), cache)


def _unfit(m, projections: Projections, hidden, tables, mask, cache, kwargs, window) -> str | None:
    """Why this call must run the original forward, or None; window: the module's sliding window, if any."""
    if mask is not None:
        return "an attention mask is given (padding, or the eager implementation's causal mask)"
    if not isinstance(tables, (tuple, list)) or len(tables) != 2:
        return "no position_embeddings=(cos, sin)"
    if cache is not None and _cached_length(cache, m.layer_idx) != 0:
        return "a KV cache holds past positions (decoding)"
    if kwargs.get("output_attentions") or kwargs.get("is_causal") is False:
        return "attention weights asked for, or not causal"
    if m.training and getattr(m, "attention_dropout", 0.0):
        return "attention dropout"
    cos, sin = tables
    seq = hidden.shape[1] if hidden.dim() == 3 else 0
    if isinstance(window, int) and 0 < window < seq:
        return f"a sliding window of {window} < {seq} positions"
    weight = projections.input_weight(m)
    if hidden.dim() != 3 or seq == 0 or hidden.dtype not in KERNEL_DTYPES or hidden.dtype != weight.dtype:
        return "not a [batch, seq, hidden] input in the weights' dtype"
    if cos.shape != sin.shape or cos.dim() not in (2, 3) or cos.shape[-2] != seq or cos.dtype != hidden.dtype \
            or cos.shape[-1] % 2 or not 0 < cos.shape[-1] <= projections.head_dim:
        return "tables not [(batch,) seq, rotary dim <= head_dim, even] in the input's dtype"
    return grad_reason(hidden, weight)


def _cached_length(cache, layer_idx: int) -> int | None:
    try:
        return int(cache.get_seq_length(layer_idx))
    except Exception:  # a cache of another kind: not ours to fill
        return None


def _probe_tables(rotary_dim: int, dtype, device, own_pairs: bool = False):
    """HF-style [1, seq, rotary_dim] cos and sin (cat(freqs, freqs); own_pairs: repeat_interleave(freqs, 2)) at random
    frequencies."""
    gen = torch.Generator().manual_seed(0)
    angles = torch.outer(torch.arange(PROBE_SEQ, dtype=torch.float64), torch.rand(rotary_dim // 2, generator=gen) * 2)
    emb = (angles.repeat_interleave(2, dim=-1) if own_pairs else torch.cat((angles, angles), dim=-1))[None]
    return emb.cos().to(device, dtype), emb.sin().to(device, dtype)


def head_norms(m) -> tuple | None:
    """(q_norm, k_norm) of an attention that normalizes each head of q and k before RoPE (Qwen3: an RMSNorm over
    head_dim, a 1-D weight of head_dim and a float eps), else None."""
    norms = tuple(getattr(m, name, None) for name in QK_NORMS)
    for norm in norms:
        weight = getattr(norm, "weight", None)
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        if not (isinstance(norm, nn.Module) and isinstance(weight, torch.Tensor)
                and weight.shape == (getattr(m, "head_dim", None),) and isinstance(eps, float)):
            return None
    return norms


def _rms_normed(t, norm):
    """RMSNorm of t's last dimension with norm's weight and eps, in t's (float64) precision: the probe's oracle."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * f64(norm.weight)


def _expected(m, projections: Projections, x, cos, sin, scaling, reference, pairs: bool):
    """What the module must compute, in float64 from its own weights: projections (q and k normalized per head where
    the module has head_norms), the reference, the output projection."""
    x, cos, sin = x.double(), cos.double(), sin.double()
    q, k, v = projections.qkv(m, x, _applied_f64)
    norms = head_norms(m)
    if norms is not None:
        q, k = _rms_normed(q, norms[0]), _rms_normed(k, norms[1])
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = reference(q, k, v, cos, sin, True, scaling, pairs).transpose(1, 2).reshape(*x.shape[:2], -1)
    return _applied_f64(getattr(m, projections.out), out)


def _probe(m, projections: Projections, reference) -> tuple[str | None, int | None, str]:
    """(None or why not, the forward's output count, the rotation of ROTATIONS it computes) from calls of the original
    on a random input, one a rotation until one agrees, with tables as wide as the module's rotary dim (rotary_ndims,
    where it has one: partial rotary) or its head_dim; why not: the first rotation's reason."""
    dtype, device = dtype_device(m)
    hidden = projections.input_weight(m).shape[1]
    x = torch.randn(1, PROBE_SEQ, hidden, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    scaling = float(getattr(m, "scaling", projections.head_dim ** -0.5))
    tables = _probe_tables(projections.rotary, dtype, device)
    first = None
    for rotation in ROTATIONS:
        given = _probe_tables(projections.rotary, dtype, device, True) if rotation == "own_pairs" else tables
        try:
            with torch.no_grad():
                got = m(hidden_states=x, position_embeddings=given, attention_mask=None)
                want = _expected(m, projections, x, *tables, scaling, reference, rotation != "half")
        except Exception as e:  # a forward that wants other arguments is not this kind of site
            return f"probe raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", None, rotation
        n_outputs = len(got) if isinstance(got, tuple) else None
        out = got[0] if isinstance(got, tuple) else got
        if not isinstance(out, torch.Tensor) or out.shape != want.shape:
            return "probe output has another shape than the reference's", n_outputs, rotation
        err = rel_l2(out, want)
        if err <= REL_L2_TOLERANCE.get(dtype, 1e-4):
            return None, n_outputs, rotation
        first = first or f"computes something else than RoPE + GQA causal attention (probe rel. error {err:.2g})"
    return first, n_outputs, ROTATIONS[0]


def module_site(name, m, kernel_type: str, reference):
    """An HF attention module (see the module docstring) that passes the probe against reference (q, k, v, cos,
    sin, causal, sm_scale): (Site, its replacement running kernel_type's op), or None for another module."""
    projections = Projections.of(m)
    if projections is None:
        return None
    (hq, hkv), rotary = projections.heads(m), projections.rotary
    notes = f"{f', rotary {rotary}' if rotary != projections.head_dim else ''}{', q/k norms' if head_norms(m) else ''}"
    what = f"{type(m).__name__}(Hq={hq}, Hkv={hkv}, D={projections.head_dim}{notes})"
    site = Site(name, what, kernel_type, False)
    names = list(inspect.signature(m.forward).parameters)
    if not {"hidden_states", "position_embeddings", "attention_mask"} <= set(names):
        site.reason = "forward takes no hidden_states, position_embeddings and attention_mask (transformers < 4.48)"
        return site, None
    if not getattr(m, "is_causal", True):
        site.reason = "not causal"
        return site, None
    reason, n_outputs, rotation = _probe(m, projections, reference)
    if reason:
        site.reason = reason
        return site, None
    call = CallShape({n: i for i, n in enumerate(names)}, n_outputs)
    site.swapped = True
    site.what = what[:-1] + (", interleaved pairs)" if rotation != "half" else ")")
    return site, KernelRopeAttention(m, site, call, kernel_type, projections, rotation)


# ------------------------------------------------------------------------------ the causal mask under compile
def _no_mask_needed(config, attention_mask, cache, extra, implementations, sequence: int, windowed: bool) -> bool:
    """True where the attention needs no mask: plain causal attention over the whole sequence (windowed, for the
    sliding mask), and the model's implementation one of `implementations` (SDPA then runs with is_causal=True; the
    attention interface's kernel takes the window itself). A window's mask is left out for SDPA as well where the
    sequence is shorter than the window: it hides nothing the causal mask does not (transformers' own rule eagerly;
    Gemma-2's sliding layers at 2048 tokens, whose masked SDPA ran 2.6x slower than is_causal on an H100)."""
    if attention_mask is not None or any(extra.get(k) is not None for k in ("or_mask_function", "and_mask_function",
                                                                              "block_sequence_ids")):
        return False
    if extra.get("allow_is_causal_skip") is False or (cache is not None and _cached_length(cache, 0) != 0):
        return False
    implementation = getattr(config, "_attn_implementation", None)
    window = getattr(config, "sliding_window", None)
    short = windowed and implementation == "sdpa" and isinstance(window, int) and sequence < window
    return implementation in implementations or short


def _causal_mask_wrapper(original, implementations, windowed: bool = False):
    signature = inspect.signature(original)
    config_name, embeds_name, mask_name, cache_name = list(signature.parameters)[:4]  # causal_mask_patches checked

    def create_mask(*args, **kwargs):
        given = signature.bind(*args, **kwargs).arguments  # the call by name, positional or keyword
        if _no_mask_needed(given[config_name], given[mask_name], given[cache_name], given, implementations,
                           given[embeds_name].shape[1], windowed):
            return None
        return original(*args, **kwargs)
    return create_mask


# transformers' mask builders patched, and the implementations for which each leaves the mask out: a window's mask
# only for the attention interface's kernel (SDPA needs it, unless the sequence is shorter than the window)
MASKS = {"create_causal_mask": ("sdpa", *attention_interface.IMPLEMENTATIONS.values()),
         "create_sliding_window_causal_mask": tuple(attention_interface.IMPLEMENTATIONS.values())}
WINDOWED = "create_sliding_window_causal_mask"


def causal_mask_patches(model: nn.Module, sites) -> tuple[list, list[Site]]:
    """Model functions of the attention sites: transformers' mask builders (MASKS) in the model's modules (see the
    docstring)."""
    try:
        from transformers import masking_utils
    except ImportError:
        return [], []
    patches = []
    for name, implementations in MASKS.items():
        original = getattr(masking_utils, name, None)
        leading = list(inspect.signature(original).parameters)[:4] if original is not None else []
        if len(leading) < 4 or leading[:3] != ["config", "inputs_embeds", "attention_mask"] \
                or leading[3] not in CACHE_NAMES:
            continue  # another transformers: its masks are left alone (layers with a mask fall back)
        wrapper = _causal_mask_wrapper(original, implementations, name == WINDOWED)
        patches += [(module, name, wrapper) for module in model_modules(model) if vars(module).get(name) is original]
    return patches, []
