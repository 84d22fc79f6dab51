"""Correctness of the optimized model: its output (and a language model's next-token loss) against the original's.

Compared on fresh inputs by relative L2 error, within swap.REL_L2_TOLERANCE (verify.py's docstring says where
those numbers come from); on a mismatch each type is swapped in alone and the types that alone exceed the
tolerance are blamed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch

from autokernel.ops import customops, swap

CHECK_INPUTS = 3  # fresh inputs the optimized model must match the original on
COMPARE_SLICE = 1 << 24  # values compared at a time (128 MB in float64)
CHECK_SEED = 1  # seed of the first checked input (the timed ones start at endtoend.TIMING_SEED: distinct sets)


def check(model, optimized: swap.Optimized, inputs: Callable, dtype, n_inputs: int = CHECK_INPUTS) -> dict:
    """Compare the optimized model with the original on n_inputs fresh inputs; blame on a mismatch."""
    tol = swap.REL_L2_TOLERANCE[dtype]
    runs, failed = [], []  # the first failing input is kept for blame(): logits are large
    for i in range(n_inputs):
        args = inputs(CHECK_SEED + i)
        want = forward(model, args)
        try:
            got = forward(optimized.module(), args, optimized.patched)  # the loss, too, in the patches' scope
        except customops.KernelCallError as e:
            return {"status": "FAIL", "tolerance_rel_l2": tol, "inputs": runs, "blamed": [e.kernel_type],
                    "reason": str(e).splitlines()[0], "forwards": i}
        runs.append(compare_outputs(got, want, tol))
        if not (runs[-1]["ok"] or failed):
            failed.append((args, want))
        del got, want
    result = {"status": "FAIL" if failed else "PASS", "tolerance_rel_l2": tol, "inputs": runs,
              "worst_rel_l2": max(r["rel_l2"] for r in runs), "forwards": n_inputs}
    if failed:
        result["blame"] = blame(model, optimized.swapped_types(), failed, tol)
        result["blamed"] = [t for t, r in result["blame"].items() if not r["ok"]]
        result["reason"] = _mismatch_reason(result)
    return result


def forward(model, args, scope=None):
    """(main output, next-token loss or None) of one forward, inside `scope` (a context) if given."""
    with (scope or contextlib.nullcontext)():
        out = main_output(model(*args))
        return out, _lm_loss(model, args, out)


def main_output(out):
    """The tensor to compare: the output itself, or the logits / last hidden state / first tensor."""
    for name in ("logits", "last_hidden_state"):
        if getattr(out, name, None) is not None:
            return getattr(out, name)
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        out = next((o for o in out if isinstance(o, torch.Tensor)), None)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the model returned {type(out).__name__}: verify.py compares tensors or logits")
    return out


def _lm_loss(model, args, logits):
    """The loss a training step computes on a language model's logits: next-token cross-entropy.

    Computed through F.cross_entropy, so that inside the optimized model's scope it runs the cross_entropy kernel;
    where linear_cross_entropy replaced the model's output embedding (swap.KernelLMHead), computed there instead,
    in a forward of its own that stops at the head: the LM head and the loss are one kernel call on the hidden
    states, and no logits are built for it."""
    import torch.nn.functional as F

    from autokernel.models import config_value

    vocab, ids = config_value(model, "vocab_size"), args[0] if args else None
    if (vocab is None or ids is None or ids.is_floating_point() or ids.dim() != 2 or ids.shape[1] < 2
            or logits.dim() != 3 or tuple(logits.shape) != (*ids.shape, vocab)):
        return None
    head = swap.fused_lm_head(model)
    if head is not None:
        return head.next_token_loss(model, args, ids)
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))


def compare_outputs(got, want, tol: float) -> dict:
    """Norm-wise and elementwise errors of (output, loss) against the original's."""
    (out, loss), (ref, ref_loss) = got, want
    if out.shape != ref.shape:
        return {"ok": False, "rel_l2": float("inf"), "reason": f"output shape {tuple(out.shape)}, "
                                                              f"expected {tuple(ref.shape)}"}
    e = _errors(out, ref)
    r = {"rel_l2": float("inf") if e["bad"] else e["rel_l2"], "max_abs": e["max_abs"],
         "max_rel": e["max_abs"] / (e["max_ref"] or 1.0), "nonfinite": e["bad"]}
    if loss is not None and ref_loss is not None:
        r["loss"], r["ref_loss"] = float(loss), float(ref_loss)
        r["loss_rel"] = abs(float(loss) - float(ref_loss)) / max(abs(float(ref_loss)), 1e-12)
    r["ok"] = r["rel_l2"] <= tol and r.get("loss_rel", 0.0) <= tol
    return r


def _errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """The errors of out against ref in float64, a slice at a time: a long sequence's logits over a large vocabulary
    (Gemma-2 at 8192 tokens: 2.1 G values) are 16 GB in float64, and a whole copy of them would not fit beside the
    model."""
    bad, sq_diff, sq_ref, max_abs, max_ref = 0, 0.0, 0.0, 0.0, 0.0
    if not out.numel():
        return {"bad": 0, "rel_l2": 0.0, "max_abs": 0.0, "max_ref": 0.0}
    ref = ref.detach().to(out.device)
    for o, w in zip(out.detach().reshape(-1).split(COMPARE_SLICE), ref.reshape(-1).split(COMPARE_SLICE)):
        bad += int((~torch.isfinite(o) & torch.isfinite(w)).sum())
        o, w = o.double(), w.double()
        d = o - w
        sq_diff, sq_ref = sq_diff + float(d.square().sum()), sq_ref + float(w.square().sum())
        max_abs = max(max_abs, float(d.abs().nan_to_num(float("inf")).max()))
        max_ref = max(max_ref, float(w.abs().max()))
    return {"bad": bad, "rel_l2": math.sqrt(sq_diff) / max(math.sqrt(sq_ref), 1e-30), "max_abs": max_abs,
            "max_ref": max_ref}


def blame(model, types, cases, tol) -> dict:
    """Each swapped type alone in the model: its error on the failing inputs."""
    found = {}
    for t in types:
        single = swap.build(model, [t])
        results = []
        for args, want in cases:
            try:
                results.append(compare_outputs(forward(single.model, args, single.patched), want, tol))
            except customops.KernelCallError as e:
                results.append({"ok": False, "rel_l2": float("inf"), "reason": str(e).splitlines()[0]})
        found[t] = max(results, key=lambda r: (not r["ok"], r["rel_l2"]))
    return found


def _mismatch_reason(result) -> str:
    worst = max(result["inputs"], key=lambda r: r["rel_l2"])
    what = f"relative L2 error {worst['rel_l2']:.3g} > {result['tolerance_rel_l2']:g}"
    if worst.get("nonfinite"):
        what = f"{worst['nonfinite']} NaN/Inf outputs where the original is finite"
    elif worst.get("loss_rel", 0) > result["tolerance_rel_l2"]:
        what = f"loss off by {worst['loss_rel']:.3g} (relative)"
    if result["blamed"]:
        return f"{what}; alone over the tolerance: {', '.join(result['blamed'])}"
    errors = {t: r["rel_l2"] for t, r in result["blame"].items()}
    top = max(errors, key=errors.get) if errors else "none"
    return f"{what}; no kernel alone exceeds the tolerance, their errors add up (largest alone: {top})"


def graph_breaks(optimized, args) -> dict:
    """Graphs and graph breaks dynamo makes of the optimized model (0 breaks: the kernels are graph nodes)."""
    import torch._dynamo

    explained = torch._dynamo.explain(optimized.module())(*args)
    torch._dynamo.reset()  # explain's traces are not the ones to time
    return {"graphs": explained.graph_count, "graph_breaks": explained.graph_break_count,
            "break_reasons": [str(b.reason) for b in explained.break_reasons][:10]}
