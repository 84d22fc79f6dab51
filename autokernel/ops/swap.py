"""Plugging kernels into a model, site by site, and saying what was replaced and what was not.

`build(model, types)` returns an `Optimized` model: a copy of the module tree that shares every
parameter and buffer with the original (no weight is copied), in which (what each type replaces is its
registry entry's `Deployment`: module_site, functions, model_functions; for the built-in types)

  modules are replaced  nn.Linear -> matmul (x @ W.T on a transposed view of W, the bias added after;
                        transformers' Conv1D likewise, x @ W), *RMSNorm* -> rmsnorm, nn.LayerNorm ->
                        layernorm, SwiGLU MLPs (three bias-free Linears, gate/up told apart by the probe)
                        -> fused_mlp; a causal LM's output embedding (model.get_output_embeddings(),
                        no bias, nothing between it and the loss) -> linear_cross_entropy, which runs
                        when the model's next-token loss is evaluated (KernelLMHead.next_token_loss);
  functions are patched while the optimized model runs (and restored after) with the drop-in
                        replacements of autokernel/ops/customops.py: F.scaled_dot_product_attention ->
                        flash_attention, F.softmax / torch.softmax -> softmax, F.layer_norm, F.rms_norm,
                        F.linear, F.cross_entropy, and the model's own rotary functions -> rotary_embedding,
                        under every name they go by (F.x, torch.x, `from torch.nn.functional import x`).

A site is replaced only when the reference of its kernel type computes what the site computes: each
candidate module or rotary function is first run on a small random probe against reference.py (an
RMSNorm computing (1 + w) * x_hat, as Gemma's does, fails the probe and is left alone). The probe
uses the reference, never the kernel, so a wrong kernel is still swapped in and caught end to end.
A patched function checks every call: a call the kernel does not cover (an attention mask, dropout,
cross-attention, a softmax over another dim, ...) runs the original function, and the site reports
why. Calls are counted in eager runs only, so that the counting code is never traced by dynamo.
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
import sys
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from autokernel import compat
from autokernel.ops import customops

try:
    import reference
except ModuleNotFoundError:  # autokernel imported from outside its checkout (an editable install)
    reference = compat.load_root_module("reference")
from autokernel.kerneltype import TOLERANCES
from autokernel.models import output_embedding, set_submodule
from autokernel.ops.customops import KERNEL_DTYPES, CallSites, Site, in_eager

# Relative L2 error, by dtype, within which a probed site must match its reference: the registry's absolute
# tolerances (autokernel/kerneltype.py); verify.py uses the same numbers for the end-to-end check (its
# docstring says where they come from).
REL_L2_TOLERANCE = {dtype: atol for dtype, (atol, _rtol) in TOLERANCES.items()}
PROBE_ROWS = 2, 5  # leading dims of a module probe input [2, 5, features]
PROBE_SEQ = 8  # positions of a rotary probe; its head dim is 16
# attribute of a module whose forward a site rewrote in place: the names of the children it now computes itself
OWNS = "_autokernel_owns"


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want||, in float64."""
    got, want = got.detach().double(), want.detach().double().to(got.device)
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


# ------------------------------------------------------------------------------ module sites
class _KernelModule(nn.Module):
    """A replacement that keeps the original for inputs the kernel does not take."""

    def __init__(self, original: nn.Module, site: Site, kernel_type: str):
        super().__init__()
        self.original = original
        self.site = site
        self.op = customops.op(kernel_type)
        self._direct("original")

    def _direct(self, *names: str) -> None:
        """Plain references `_<name>` to these submodules, for forward: reading a submodule as an attribute goes
        through nn.Module.__getattr__ (~0.7 us a read), which a model run without a CUDA graph pays per call."""
        for name in names:
            self.__dict__[f"_{name}"] = self._modules[name]

    def __getattr__(self, name: str):
        # Model code may read the replaced module's attributes (norm.weight, norm.eps, lin.in_features):
        # whatever this module lacks is the original's.
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["original"], name)

    def _fits(self, x, weight) -> bool:
        ok = x.dtype == weight.dtype and x.dtype in KERNEL_DTYPES and x.numel() > 0
        why = customops.grad_reason(x, weight) if ok else None
        if in_eager():
            self.site.calls += ok and not why
            self.site.fallbacks += not ok or bool(why)
            self.site.reason = why or self.site.reason
        return ok and not why


class KernelLinear(_KernelModule):
    def forward(self, x):
        linear = self._original
        w = linear.weight
        if not self._fits(x, w):
            return linear(x)
        y = self.op(x, w.t())  # B = W.T is a [K, N] view with unit stride along K: no copy
        bias = linear.bias
        return y if bias is None else y + bias


class KernelConv1D(_KernelModule):
    """transformers' GPT-2 Conv1D: x @ W + b with W [in, out], already the kernel's [K, N] layout."""

    def forward(self, x):
        conv = self._original
        w = conv.weight
        if not self._fits(x, w):
            return conv(x)
        y = self.op(x, w)
        bias = conv.bias
        return y if bias is None else y + bias


class KernelRMSNorm(_KernelModule):
    def __init__(self, original, site, eps: float):
        super().__init__(original, site, "rmsnorm")
        self.eps = eps

    def forward(self, x):
        w = self._original.weight
        if not self._fits(x, w):
            return self._original(x)
        return self.op(x, w, self.eps)


class KernelLayerNorm(_KernelModule):
    def __init__(self, original: nn.LayerNorm, site):
        super().__init__(original, site, "layernorm")

    def forward(self, x):
        # no affine weight or bias: ones and zeros compute the same, and the kernel takes tensors
        norm = self._original
        w, b = norm.weight, norm.bias
        w = w if w is not None else x.new_ones(x.shape[-1])
        b = b if b is not None else x.new_zeros(x.shape[-1])
        if not self._fits(x, w) or b.dtype != x.dtype:
            return norm(x)
        return self.op(x, w, b, norm.eps)


class KernelSwiGLU(_KernelModule):
    def __init__(self, original, site, gate: nn.Linear, up: nn.Linear, down: nn.Linear):
        super().__init__(original, site, "fused_mlp")
        self.gate, self.up, self.down = gate, up, down
        self._direct("gate", "up", "down")

    def forward(self, x):
        w_gate = self._gate.weight
        if not self._fits(x, w_gate):
            return self._original(x)
        return self.op(x, w_gate, self._up.weight, self._down.weight)


def _dtype_device(module: nn.Module):
    p = next(module.parameters(), None)
    return (p.dtype, p.device) if p is not None else (torch.get_default_dtype(), torch.device("cpu"))


def _probe(module: nn.Module, features: int, expected) -> str | None:
    """None when module(x) matches expected(x in float64) on a random x, else the reason."""
    dtype, device = _dtype_device(module)
    x = torch.randn(*PROBE_ROWS, features, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    try:
        with torch.no_grad():
            got, want = module(x), expected(x.double())
    except Exception as e:  # a module that does not take one tensor is not this kind of site
        return f"probe raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return "probe output has another shape than the reference's"
    err = rel_l2(got, want)
    tol = REL_L2_TOLERANCE.get(dtype, 1e-4)
    return None if err <= tol else f"computes something else than the reference (probe rel. error {err:.2g})"


def _f64(t):
    return None if t is None else t.detach().double()


def _rmsnorm_site(name, m):
    site, eps = rmsnorm_probed(name, m)
    return site, (KernelRMSNorm(m, site, eps) if site.swapped else None)


def rmsnorm_probed(name, m) -> tuple[Site, float | None]:
    """rmsnorm's Site for an RMSNorm module and its eps; site.swapped only where it computes the reference."""
    eps = getattr(m, "eps", getattr(m, "variance_epsilon", None))
    weight = getattr(m, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return Site(name, type(m).__name__, "rmsnorm", False, "no 1-D weight"), None
    if eps is None and hasattr(m, "eps"):  # nn.RMSNorm(eps=None) uses the dtype's machine epsilon
        eps = torch.finfo(weight.dtype).eps
    if not isinstance(eps, float):
        return Site(name, type(m).__name__, "rmsnorm", False, "no float eps / variance_epsilon attribute"), None
    site = Site(name, f"{type(m).__name__}({weight.shape[0]})", "rmsnorm", True)
    reason = _probe(m, weight.shape[0], lambda x: reference.rmsnorm_ref(x, _f64(weight), eps))
    if reason:
        site.swapped, site.reason = False, reason
    return site, eps


def _layernorm_site(name, m: nn.LayerNorm):
    site = Site(name, f"LayerNorm({', '.join(map(str, m.normalized_shape))})", "layernorm", False)
    if len(m.normalized_shape) != 1:
        site.reason = "normalizes over more than the last dimension"
        return site, None
    site.swapped = True
    return site, KernelLayerNorm(m, site)


def _swiglu_site(name, m, linears: dict):
    """A module with exactly three bias-free Linears, two H->I and one I->H, computing down(silu(gate)*up).

    None when the Linears are not shaped so (not a candidate at all); a kept site when they are but
    the module computes something else (a GELU MLP, say)."""
    down = [n for n, l in linears.items() if l.in_features != l.out_features
            and sum(o.in_features == l.in_features for o in linears.values()) == 1]
    if len(down) != 1 or any(l.bias is not None for l in linears.values()):
        return None
    d = linears[down[0]]
    pair = [n for n in linears if n != down[0]]
    if any((linears[n].in_features, linears[n].out_features) != (d.out_features, d.in_features) for n in pair):
        return None
    site = Site(name, f"{type(m).__name__}(three Linears)", "fused_mlp", False)
    for gate, up in (pair, pair[::-1]):  # which of the two is the gate is settled by the probe
        g, u = linears[gate], linears[up]
        expected = lambda x, g=g, u=u: reference.fused_mlp_ref(x, _f64(g.weight), _f64(u.weight), _f64(d.weight))
        reason = _probe(m, d.out_features, expected)
        if reason is None:
            site.what, site.swapped = f"{type(m).__name__}(gate={gate}, up={up}, down={down[0]})", True
            return site, KernelSwiGLU(m, site, g, u, d)
    site.reason = reason
    return site, None


def swiglu_module_site(name, m):
    """fused_mlp's module site: a module holding exactly three bias-free Linears that computes SwiGLU."""
    if isinstance(m, nn.Linear):
        return None
    linears = {n: c for n, c in m.named_children() if type(c) is nn.Linear}
    return _swiglu_site(name, m, linears) if len(linears) == 3 else None


def rmsnorm_module_site(name, m):
    """rmsnorm's module site: a module whose class is named *RMSNorm* and passes the probe."""
    return _rmsnorm_site(name, m) if "RMSNorm" in type(m).__name__ else None


def layernorm_module_site(name, m):
    """layernorm's module site: nn.LayerNorm itself (a subclass's forward may differ)."""
    if not isinstance(m, nn.LayerNorm):
        return None
    if type(m) is not nn.LayerNorm:
        reason = "a LayerNorm subclass: its forward may differ"
        return Site(name, type(m).__name__, "layernorm", False, reason), None
    return _layernorm_site(name, m)


def matmul_module_site(name, m):
    """matmul's module sites: nn.Linear itself, and transformers' Conv1D (x @ W + b) where it passes the probe."""
    if type(m).__name__ == "Conv1D" and getattr(m, "weight", None) is not None:
        return _conv1d_site(name, m)
    if isinstance(m, nn.Linear):
        what = f"{type(m).__name__} {m.in_features}->{m.out_features}" + ("" if m.bias is None else " +bias")
        if type(m) is not nn.Linear:
            return Site(name, what, "matmul", False, "a Linear subclass: its forward may differ"), None
        site = Site(name, what, "matmul", True)
        return site, KernelLinear(m, site, "matmul")
    return None


def _module_site(name, m, types):
    """(Site, replacement) for a module that is a site of a requested type, else None: each type's
    Deployment.module_site in turn, the first that answers decides."""
    for t in types:
        found_by = customops.deployment(t).module_site
        found = found_by(name, m) if found_by is not None else None
        if found is not None:
            return found
    return None


def _conv1d_site(name, m):
    w, b = m.weight, getattr(m, "bias", None)
    site = Site(name, f"Conv1D {w.shape[0]}->{w.shape[-1]}", "matmul", False)
    if w.dim() != 2:
        site.reason = "weight is not 2-D"
        return site, None
    expected = lambda x: x @ _f64(w) + (0 if b is None else _f64(b))
    site.reason = _probe(m, w.shape[0], expected) or ""
    site.swapped = not site.reason
    return site, KernelConv1D(m, site, "matmul") if site.swapped else None


def _replace_modules(model: nn.Module, types) -> list[Site]:
    sites, skip, owned = [], (), ()
    for name, m in list(model.named_modules())[1:]:  # the root itself is not replaced
        if skip and name.startswith(skip):
            continue  # inside a module already replaced whole (a fused MLP)
        if owned and (name + ".").startswith(owned):
            continue  # computed by its parent's rewritten forward (a decoder layer's post-attention norm)
        found = _module_site(name, m, types)
        if found is None:
            continue
        site, replacement = found
        sites.append(site)
        if replacement is m:  # its forward rewritten in place: its children stay sites, but those it took over
            owned += tuple(f"{name}.{child}." for child in getattr(m, OWNS, ()))
        elif replacement is not None:
            set_submodule(model, name, replacement)
            skip = name + "."
    return sites


# ------------------------------------------------------------------------------ rotary functions
ROTARY_NAME = re.compile(r"rotary|rope", re.I)


def _rope_probe_inputs(dtype, device):
    gen = torch.Generator().manual_seed(0)
    half = 8
    freqs = torch.rand(half, generator=gen, dtype=torch.float64)
    angles = torch.outer(torch.arange(PROBE_SEQ, dtype=torch.float64), freqs)
    q, k = (torch.randn(1, 2, PROBE_SEQ, 2 * half, generator=gen).to(device, dtype) for _ in range(2))
    return q, k, angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def rotary_patches(model: nn.Module, sites: CallSites) -> tuple[list, list[Site]]:
    """Patches for the model's own rotary functions that pass a probe against the reference."""
    patches, notes = [], []
    dtype, device = _dtype_device(model)
    q, k, cos, sin = _rope_probe_inputs(dtype if dtype in KERNEL_DTYPES else torch.float32, device)
    want_q, want_k = (reference.rotary_embedding_ref(t.double(), cos.double(), sin.double()) for t in (q, k))
    tol = REL_L2_TOLERANCE.get(q.dtype, 1e-4)
    for module in _model_modules(model):
        for name, fn in list(vars(module).items()):
            if not (inspect.isfunction(fn) and fn.__module__ == module.__name__ and ROTARY_NAME.search(name)):
                continue
            params = list(inspect.signature(fn).parameters)
            label = f"{module.__name__.rsplit('.', 1)[-1].removeprefix('_autokernel_model_')}.{name}"
            try:
                if params[1:3] == ["cos", "sin"]:
                    ok = rel_l2(fn(q, cos, sin), want_q) <= tol
                    wrapper = customops.rotary_x_cos_sin(fn, sites, label)
                elif params[2:4] == ["cos", "sin"]:
                    full = [torch.cat((t, t), dim=-1)[None] for t in (cos, sin)]
                    got_q, got_k = fn(q, k, *full)
                    ok = max(rel_l2(got_q, want_q), rel_l2(got_k, want_k)) <= tol
                    wrapper = customops.rotary_q_k_cos_sin(fn, sites, label)
                else:
                    continue  # not an apply-rotary function (e.g. one that builds the tables)
            except Exception as e:
                ok, why = False, f"probe raised {type(e).__name__}"
            else:
                why = "computes something else than rotate-half RoPE (probe)"
            if ok:
                patches.append((module, name, wrapper))
            else:
                notes.append(Site(label, f"{name}({', '.join(params)})", "rotary_embedding", False, why))
    return patches, notes


def _model_modules(model: nn.Module) -> list:
    """The Python modules that define the model's classes (where its helper functions live)."""
    names = sorted({type(m).__module__ for m in model.modules()})
    return [sys.modules[n] for n in names if n in sys.modules and not n.startswith("torch.")]


# ------------------------------------------------------------------------------ the model
def _function_patches(model: nn.Module, types, sites: CallSites) -> tuple[list, list[Site], dict]:
    """(owner, attribute, replacement) for every patched function, notes on rejected candidates, and the
    kernel type of each replacement (by id)."""
    replacements, patches, notes, type_of = {}, [], [], {}
    for t in types:
        deployment = customops.deployment(t)
        if deployment.functions is not None:
            for fn, wrapper in deployment.functions(sites).items():
                replacements[id(fn)] = wrapper
                type_of[id(wrapper)] = t
    for owner in (F, torch, *_model_modules(model)):  # F.x, torch.x, and `from ... import x` aliases
        for name, value in list(vars(owner).items()):
            if id(value) in replacements:
                patches.append((owner, name, replacements[id(value)]))
    for t in types:
        deployment = customops.deployment(t)
        if deployment.model_functions is not None:
            found, rejected = deployment.model_functions(model, sites)
            patches += found
            notes += rejected
            type_of.update({id(wrapper): t for _, _, wrapper in found})
    return patches, notes, type_of


class Optimized:
    """The model with kernels plugged in; call it like the model. Patches live only during a call."""

    def __init__(self, model: nn.Module, patches: list, module_sites: list[Site], notes: list[Site],
                 call_sites: CallSites, types: list[str], patch_types: dict | None = None):
        self.model, self.patches, self.types = model, patches, types
        self.patch_types = patch_types or {}  # id(replacement) -> its kernel type
        self.module_sites, self.notes, self.call_sites = module_sites, notes, call_sites
        self.traced: Optimized | None = None  # what torch.compile traces instead, when it runs other types

    def traced_types(self) -> list[str]:
        """The types that run where torch.compile traces the model."""
        return self.traced.types if self.traced is not None else self.types

    def module(self) -> nn.Module:
        """The model itself with the kernels in place, as users call it: its forward applies the function
        patches for the call's duration, so model(...), model.generate(...), torch.compile(model) (dynamo
        traces the patches: no graph break) and CUDA graphs all run the kernels. `.autokernel` is this."""
        model = self.model
        if "forward" in vars(model):
            return model
        inner, patches = model.forward, self.patches
        traced = self.traced.module() if self.traced is not None else None

        @functools.wraps(inner)  # generate() reads forward's signature
        def forward(*args, **kwargs):
            if traced is not None and not in_eager():  # dynamo folds the test: the trace holds one model
                return traced(*args, **kwargs)
            saved = [getattr(owner, name) for owner, name, _ in patches]
            for owner, name, new in patches:
                setattr(owner, name, new)
            try:
                return inner(*args, **kwargs)
            finally:
                for (owner, name, _), old in zip(patches, saved):
                    setattr(owner, name, old)

        model.forward = forward
        model.autokernel = self  # a plain attribute (not a submodule): state_dict and .to() ignore it
        return model

    @contextmanager
    def patched(self):
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in self.patches]
        try:
            for owner, name, new in self.patches:
                setattr(owner, name, new)
            yield
        finally:
            for owner, name, old in reversed(saved):
                setattr(owner, name, old)

    def __call__(self, *args, **kwargs):
        return self.module()(*args, **kwargs)

    def compiled(self, backend: str = "inductor", mode: str | None = None):
        """torch.compile of the model as a user compiles it (the patches are traced with it)."""
        return torch.compile(self.module(), backend=backend, mode=mode)

    def planned(self) -> dict[str, list[str]]:
        """Kernel type -> what it replaces, before any call: "Linear x10" (modules), "F.linear" (functions)."""
        found: dict[str, dict[str, int]] = {}
        for site in self.module_sites:
            if site.swapped:
                what = found.setdefault(site.kernel_type, {})
                kind = site.what.split("(")[0].split(" ")[0]
                what[kind] = what.get(kind, 0) + 1
        for owner, name, new in self.patches:
            prefix = {F: "F.", torch: "torch."}.get(owner, getattr(owner, "__name__", "").rsplit(".", 1)[-1] + ".")
            found.setdefault(self.patch_types[id(new)], {})[prefix + name] = 0
        return {t: [f"{w} x{n}" if n else w for w, n in what.items()] for t, what in sorted(found.items())}

    def sites(self) -> list[Site]:
        return self.module_sites + list(self.call_sites.sites.values()) + self.notes

    def swapped_types(self) -> list[str]:
        """Types whose kernel ran at least once (after an eager call)."""
        return sorted({s.kernel_type for s in self.sites() if s.swapped and s.calls})


def build(model: nn.Module, types, traced=None) -> Optimized:
    """The model with the installed kernels of `types` plugged in (see customops.install).

    traced: the types that run where torch.compile traces the model, when they are not `types` (a kernel can win
    eagerly, where it saves launches, and lose under torch.compile, against Inductor's fused code): the model's
    forward hands a trace to a second copy over the same weights, with those types plugged in. Eager calls and
    CUDA graphs captured from them run `types`."""
    types = list(types)
    if traced is not None and sorted(traced) != sorted(types):
        optimized = build(model, types)
        optimized.traced = build(model, traced)
        return optimized
    memo = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    clone = copy.deepcopy(model, memo)  # a new module tree over the same weights
    module_sites = _replace_modules(clone, types)
    module_sites += _model_sites(clone, types)
    call_sites = CallSites()
    patches, notes, patch_types = _function_patches(model, types, call_sites)
    optimized = Optimized(clone, patches, module_sites, notes, call_sites, types, patch_types)
    optimized.original = model  # optimize() of an optimized model starts again from it
    return optimized


# ------------------------------------------------------------------------------ the LM head and its loss
# config entries that put a transformation between the output embedding and the loss (Gemma 2's soft-capping,
# Cohere's logit_scale, Granite's logits_scaling): the fused kernel computes the loss of x @ W.T itself
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
IGNORE_INDEX = -100  # transformers' label for a position without a target


class LossReady(Exception):
    """Raised by a KernelLMHead in loss mode with the loss: the model's forward stops at its head, so nothing
    after it (a logits tensor, its upcast) is ever built."""

    def __init__(self, loss: torch.Tensor):
        super().__init__("the loss is computed at the output embedding")
        self.loss = loss


class KernelLMHead(_KernelModule):
    """A causal LM's output embedding. A forward returns the logits through what it wraps (the original head,
    or matmul's replacement of it); in loss mode (`next_token_loss`) the head takes the hidden states it is
    given and the targets it was armed with to linear_cross_entropy, which never holds the [N, V] logits."""

    def __init__(self, original: nn.Module, site: Site):
        super().__init__(original, site, "linear_cross_entropy")
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


def fused_lm_head(model: nn.Module) -> KernelLMHead | None:
    """The model's output embedding where linear_cross_entropy replaced it, else None."""
    return next((m for m in model.modules() if isinstance(m, KernelLMHead)), None)


def lm_head_site(model: nn.Module):
    """linear_cross_entropy's site: the model's output embedding (model.get_output_embeddings()) when it computes
    x @ W.T with no bias and nothing transforms the logits before the loss. Tied weights are fine: the kernel
    reads W wherever it lives. (path, Site, KernelLMHead or None), or None for a model without one."""
    found = output_embedding(model)
    if found is None:
        return None
    path, head = found
    base = head.original if isinstance(head, _KernelModule) else head  # the probe runs the reference, never a kernel
    w, bias = getattr(base, "weight", None), getattr(base, "bias", None)
    site = Site(path, f"{type(base).__name__} output embedding", "linear_cross_entropy", False)
    config = getattr(model, "config", None)
    transforms = [k for k in LOGIT_TRANSFORMS if getattr(config, k, None) not in (None, 1, 1.0)]
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        site.reason = "no 2-D weight"
    elif bias is not None:
        site.reason = "the output embedding has a bias (the kernel computes x @ W.T)"
    elif transforms:
        site.reason = f"the logits are transformed before the loss ({', '.join(transforms)})"
    else:
        site.reason = _probe(base, w.shape[1], lambda x: x @ _f64(w).T) or ""
    site.swapped = not site.reason
    return path, site, KernelLMHead(head, site) if site.swapped else None


def _model_sites(model: nn.Module, types) -> list[Site]:
    """Sites found from the model as a whole (Deployment.model_site), after the module sites."""
    sites = []
    for t in types:
        found_by = customops.deployment(t).model_site
        found = found_by(model) if found_by is not None else None
        if found is not None:
            path, site, replacement = found
            sites.append(site)
            if replacement is not None:
                set_submodule(model, path, replacement)
    return sites
