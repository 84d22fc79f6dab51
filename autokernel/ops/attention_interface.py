"""transformers' attention interface as a site of the flash_attention type: the sliding windows and logit soft caps
that HF builds into masks and eager attention (Mistral's and Gemma-2's windows, Gemma-2's soft cap) run by the
kernel.

transformers (5.x) runs each attention module's core as ALL_ATTENTION_FUNCTIONS[config._attn_implementation](module,
q, k, v, attention_mask, scaling=, sliding_window=, softcap=, ...) and builds the masks through
ALL_MASK_ATTENTION_FUNCTIONS under the same name. SDPA cannot take a window or a cap, so HF hands it a mask tensor
(a window shorter than the sequence), or runs eager attention (Gemma-2 has no SDPA path): the patch of
F.scaled_dot_product_attention never sees those calls. Here the optimized copy of such a model (swap.build's clone,
with its own config) gets IMPLEMENTATIONS[its implementation] as its implementation, registered in both
interfaces (one name per implementation it stands in for, so that the name says which one a fallback runs):

- its mask function returns no mask where the mask would only say "causal, within the window": no padding mask,
  nothing cached before the queries, no extra mask functions (HF's own allow_is_causal_skip); anything else gets the
  mask of the model's own implementation, as before;
- its attention function runs the kernel (causal or not, the module's window and cap, K/V heads grouped as they
  are) where there is no mask and the queries and keys are one sequence; any other call runs the model's own
  implementation, with the mask it was given, or, where the kernel refused a call that came without a mask, with
  the causal and window mask made explicit.

A model whose attention has neither a window nor a cap, and runs SDPA, is left to the F.scaled_dot_product_attention
patch (nothing here changes it).
"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn

from autokernel.ops.customops import KERNEL_DTYPES, Site, grad_reason, in_eager

IMPLEMENTATIONS = {original: f"autokernel_{original}" for original in ("sdpa", "eager")}  # the model's -> ours
ATTRIBUTE = "_autokernel_attention"  # set on each attention module of the clone: its Site


def interface_site(model: nn.Module, kernel_type: str, op):
    """Deployment.model_site: (path, Site, None) when the model's attention modules dispatch through transformers'
    interface with a window or a cap (or eagerly), after switching the clone's config to ours; else None."""
    config = getattr(model, "config", None)
    original = getattr(config, "_attn_implementation", None)
    interfaces = _interfaces()
    if interfaces is None or original not in IMPLEMENTATIONS:
        return None
    modules = [m for m in model.modules() if getattr(m, "config", None) is config and hasattr(m, "scaling")
               and hasattr(m, "is_causal")]
    variant = any(_window(m) or _softcap(m) for m in modules)
    if not modules or not (variant or original == "eager"):
        return None
    attention, masks = interfaces
    attention.register(IMPLEMENTATIONS[original], _attention_function(op, original))
    masks.register(IMPLEMENTATIONS[original], _mask_function(original))
    site = Site("model.config", f"AttentionInterface({original}, {'windows or soft caps' if variant else 'eager'})",
                kernel_type, True)  # transformers' attention interface; optimize()'s summary says AttentionInterface x1
    for m in modules:
        setattr(m, ATTRIBUTE, site)
    config._attn_implementation = IMPLEMENTATIONS[original]
    return "", site, None


def _interfaces():
    try:
        from transformers.masking_utils import AttentionMaskInterface
        from transformers.modeling_utils import AttentionInterface
    except ImportError:
        return None
    return AttentionInterface, AttentionMaskInterface


def _window(m) -> int:
    """The module's sliding window (its own, Gemma-2's alternating layers; else its config's, Mistral's), 0: none."""
    window = getattr(m, "sliding_window", getattr(m.config, "sliding_window", None))
    return window if isinstance(window, int) and window > 0 else 0


def _softcap(m) -> float:
    cap = getattr(m, "attn_logit_softcapping", None)
    return float(cap) if isinstance(cap, (int, float)) and cap > 0 else 0.0


def _mask_function(original: str):
    def mask(*args, **kwargs):
        """No mask where it would only be causal (and windowed); else the mask of the model's own implementation."""
        one_sequence = kwargs.get("q_length") is not None and kwargs.get("q_length") == kwargs.get("kv_length")
        if kwargs.get("allow_is_causal_skip") and kwargs.get("attention_mask") is None and one_sequence \
                and not kwargs.get("q_offset") and not kwargs.get("kv_offset"):
            return None
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        return ALL_MASK_ATTENTION_FUNCTIONS[original](*args, **kwargs)

    return mask


def _attention_function(op, original: str):
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                  softcap=None, **kwargs):
        site = getattr(module, ATTRIBUTE, None)
        causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", True)))
        window = sliding_window if isinstance(sliding_window, int) and sliding_window > 0 else 0
        cap = float(softcap) if softcap else 0.0
        reason = _unfit(module, query, key, value, attention_mask, dropout, causal, window, kwargs)
        if site is not None and in_eager():
            site.calls += not reason
            site.fallbacks += bool(reason)
            site.reason = reason or site.reason
        if reason:
            if attention_mask is None and query.shape[2] == key.shape[2]:  # what our mask function left out
                attention_mask = _explicit_mask(query, window, causal)
            return _original_function(module, original)(module, query, key, value, attention_mask, dropout=dropout,
                                                        scaling=scaling, sliding_window=sliding_window,
                                                        softcap=softcap, **kwargs)
        out = op(query, key, value, causal, None if scaling is None else float(scaling), window, cap, None)
        return out.transpose(1, 2).contiguous(), None

    return attention


def _unfit(module, q, k, v, mask, dropout, causal, window, kwargs) -> str | None:
    if mask is not None:
        return "a mask is given (padding, a cache, or extra mask functions)"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or q.shape[2] != k.shape[2] or k.shape != v.shape:
        return "queries and keys differ in length (a KV cache)"
    if dropout and module.training:
        return "attention dropout"
    if kwargs.get("output_attentions"):
        return "attention weights asked for"
    if window and not causal:
        return "a window on a bidirectional attention"
    if q.dtype not in KERNEL_DTYPES or not q.dtype == k.dtype == v.dtype:
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype}"
    if q.shape[1] % k.shape[1]:
        return "query heads not a multiple of K/V heads"
    return grad_reason(q, k, v)


def sees(i, j, causal: bool, window: int):
    """Whether query position i sees key position j (tensors, broadcast): j <= i when causal, and i - j < window
    with a window (0: none). The kernel's variants as the reference, the explicit mask and flex_attention's mask
    read them."""
    seen = (j <= i) if causal else (j >= 0)  # positions are never negative: every key
    return seen & (i - j < window) if window else seen


def _explicit_mask(query, window: int, causal: bool) -> torch.Tensor:
    """[1, 1, S, S] additive mask: 0 where query i sees key j, else the dtype's lowest value (what HF's eager and
    SDPA attention add to the scores)."""
    positions = torch.arange(query.shape[2], device=query.device)
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    seen = sees(positions[:, None], positions[None, :], causal, window)
    return torch.where(seen, zero, torch.finfo(query.dtype).min)[None, None]


def _original_function(module, original: str):
    """The model's own implementation: SDPA from the interface, eager attention from the module's modeling file."""
    if original != "eager":
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return ALL_ATTENTION_FUNCTIONS[original]
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        from transformers.models.llama.modeling_llama import eager_attention_forward as eager
    return eager
