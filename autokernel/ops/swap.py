"""Plugging kernels into a model, site by site, and saying what was replaced and what was not.

`build(model, types)` returns an `Optimized` model: a copy of the module tree that shares every
parameter and buffer with the original (no weight is copied), in which, as each type's registry entry
(its `Deployment`, in its module under autokernel/types/) says,

  modules are replaced  by the type's module_site (nn.Linear by a KernelLinear, an RMSNorm by a KernelRMSNorm, a
                        decoder layer's forward rewritten, ...) and model_site (a causal LM's output embedding);
  functions are patched while the optimized model runs (and restored after) with the type's drop-in
                        replacements of torch functions (F.scaled_dot_product_attention, F.softmax, F.linear, ...)
                        under every name they go by (F.x, torch.x, `from torch.nn.functional import x`), and with
                        its model_functions (the model's own rotary helpers).

A site is replaced only when the reference of its kernel type computes what the site computes: each
candidate module or function is first run on a small random probe against the type's reference (an
RMSNorm computing (1 + w) * x_hat, as Gemma's does, fails the probe and is left alone). The probe
uses the reference, never the kernel, so a wrong kernel is still swapped in and caught end to end.
A patched function checks every call: a call the kernel does not cover (an attention mask, dropout,
cross-attention, a softmax over another dim, ...) runs the original function, and the site reports
why. Calls are counted in eager runs only, so that the counting code is never traced by dynamo.
This module holds the machinery every type's sites share: KernelModule, probe, the patching and Optimized.
"""

from __future__ import annotations

import copy
import functools
import sys
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from autokernel.kerneltype import TOLERANCES
from autokernel.models import set_submodule
from autokernel.ops import customops
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
class KernelModule(nn.Module):
    """A replacement that keeps the original for inputs the kernel does not take."""

    def __init__(self, original: nn.Module, site: Site, kernel_type: str):
        super().__init__()
        self.original = original
        self.site = site
        self.op = customops.op(kernel_type)
        self._direct("original")

    def _direct(self, *names: str) -> None:
        """Plain references `_<name>` to these submodules, for forward: reading a submodule as an attribute goes
        through nn.Module.__getattr__ (a Python call per read), which a model run without a CUDA graph pays per call."""
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


def dtype_device(module: nn.Module):
    p = next(module.parameters(), None)
    return (p.dtype, p.device) if p is not None else (torch.get_default_dtype(), torch.device("cpu"))


def probe(module: nn.Module, features: int, expected) -> str | None:
    """None when module(x) matches expected(x in float64) on a random x, else the reason."""
    dtype, device = dtype_device(module)
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


def f64(t):
    return None if t is None else t.detach().double()


def _module_site(name, m, types):
    """(Site, replacement) for a module that is a site of a requested type, else None: each type's
    Deployment.module_site in turn, the first that answers decides."""
    for t in types:
        found_by = customops.deployment(t).module_site
        found = found_by(name, m) if found_by is not None else None
        if found is not None:
            return found
    return None


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


def model_modules(model: nn.Module) -> list:
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
                earlier, label = replacements.get(id(fn)), t
                if earlier is not None:  # another type replaces it too
                    wrapper, label = _sharing(earlier, wrapper), f"{type_of[id(earlier)]}+{t}"
                replacements[id(fn)] = wrapper
                type_of[id(wrapper)] = label
    for owner in (F, torch, *model_modules(model)):  # F.x, torch.x, and `from ... import x` aliases
        for name, value in list(vars(owner).items()):
            if id(value) in replacements:
                patches.append((owner, name, replacements[id(value)]))
    for t in types:
        deployment = customops.deployment(t)
        if deployment.model_functions is not None:
            found, rejected = deployment.model_functions(model, sites)
            taken = {(id(owner), name) for owner, name, _ in patches}  # a name two types patch: the first's
            found = [p for p in found if (id(p[0]), p[1]) not in taken]
            patches += found
            notes += rejected
            type_of.update({id(wrapper): t for _, _, wrapper in found})
    return patches, notes, type_of


def _sharing(earlier, later):
    """One replacement of a function two types replace: the one that takes its own calls and hands the others on
    (its `over(then)`: decode_attention's SDPA, taking a cache's decode steps) over the other (flash_attention's,
    taking the prefill); where neither can, the later type's alone, as before."""
    for first, then in ((later, earlier), (earlier, later)):
        if callable(getattr(first, "over", None)):
            return first.over(then)
    return later


class Optimized:
    """The model with kernels plugged in; call it like the model. Patches live only during a call."""

    def __init__(self, model: nn.Module, patches: list, module_sites: list[Site], notes: list[Site],
                 call_sites: CallSites, types: list[str], patch_types: dict | None = None):
        self.model, self.patches, self.types = model, patches, types
        self.patch_types = patch_types or {}  # id(replacement) -> its kernel type
        self.module_sites, self.notes, self.call_sites = module_sites, notes, call_sites
        self.traced: Optimized | None = None  # what torch.compile traces instead, when it runs other types
        self.graphed: Optimized | None = None  # what a CUDA graph captures instead, when it runs other types

    def traced_types(self) -> list[str]:
        """The types that run where torch.compile traces the model."""
        return self.traced.types if self.traced is not None else self.types

    def graphed_types(self) -> list[str]:
        """The types that run where a CUDA graph captures the model's eager forward."""
        return self.graphed.types if self.graphed is not None else self.types

    def module(self) -> nn.Module:
        """The model itself with the kernels in place, as users call it: its forward applies the function
        patches for the call's duration, so model(...), model.generate(...), torch.compile(model) (dynamo
        traces the patches: no graph break) and CUDA graphs all run the kernels. `.autokernel` is this."""
        model = self.model
        if "forward" not in vars(model):
            self.over(model)
        return model

    def over(self, tree: nn.Module) -> nn.Module:
        """tree, a copy of the model's module tree (its blocks compiled, say), called as module() calls the model:
        its own forward with the function patches around it. A copy of module() made by copy.copy would keep
        module()'s forward, which runs the model's tree, not the copy's."""
        inner, patches = tree.forward, self.patches
        wrapped = getattr(inner, "model_forward", None)  # tree copies module()'s model: the forward that one wraps
        if wrapped is not None:
            own = getattr(wrapped, "__func__", None) is type(tree).forward  # the class's, bound to the model
            inner = type(tree).forward.__get__(tree) if own else wrapped
        traced = self.traced.module() if self.traced is not None else None
        graphed = self.graphed.module() if self.graphed is not None else None
        warm = set()  # the input signatures the graphed copy ran: its kernels are loaded for them

        @functools.wraps(inner)  # generate() reads forward's signature
        def forward(*args, **kwargs):
            if traced is not None and not in_eager():  # dynamo folds the test: the trace holds one model
                return traced(*args, **kwargs)
            if graphed is not None and in_eager():
                signature = _signature(args, kwargs)
                if signature not in warm or _capturing():
                    warm.add(signature)  # the first call of a signature is the warm-up before its capture
                    return graphed(*args, **kwargs)
            saved = [getattr(owner, name) for owner, name, _ in patches]
            for owner, name, new in patches:
                setattr(owner, name, new)
            try:
                return inner(*args, **kwargs)
            finally:
                for (owner, name, _), old in zip(patches, saved):
                    setattr(owner, name, old)

        forward.model_forward = inner
        tree.forward = forward
        tree.autokernel = self  # a plain attribute (not a submodule): state_dict and .to() ignore it
        return tree

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
            for kernel_type in self.patch_types[id(new)].split("+"):  # a function two types share: both
                found.setdefault(kernel_type, {})[prefix + name] = 0
        return {t: [f"{w} x{n}" if n else w for w, n in what.items()] for t, what in sorted(found.items())}

    def sites(self) -> list[Site]:
        return self.module_sites + list(self.call_sites.sites.values()) + self.notes

    def swapped_types(self) -> list[str]:
        """Types whose kernel ran at least once (after an eager call)."""
        return sorted({s.kernel_type for s in self.sites() if s.swapped and s.calls})


@functools.cache
def _has_cuda() -> bool:  # once: the query costs host time on every call
    return torch.cuda.is_available()


def _capturing() -> bool:
    """Whether the current CUDA stream captures a graph (never, on a torch built without CUDA, where asking raises)."""
    return _has_cuda() and torch.cuda.is_current_stream_capturing()


def _signature(args: tuple, kwargs: dict) -> tuple:
    """The shapes and dtypes of a call's tensors (other arguments by type): what the kernels' compiles depend on."""
    describe = lambda a: (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__
    return tuple(map(describe, args)), tuple((k, describe(v)) for k, v in sorted(kwargs.items()))


def build(model: nn.Module, types, traced=None, graphed=None) -> Optimized:
    """The model with the installed kernels of `types` plugged in (see customops.install).

    traced: the types that run where torch.compile traces the model, when they are not `types` (a kernel can win
    eagerly, where it saves launches, and lose under torch.compile, against Inductor's fused code): the model's
    forward hands a trace to a second copy over the same weights, with those types plugged in. graphed: likewise
    the types that run while a CUDA graph captures an eager forward, when they are not `types` (a kernel can save
    GPU time and cost more host time than it saves, eagerly: ViT-B/16's layernorm at batch 32, 1.07x graphed and
    0.87x eagerly on an H100); the first eager call with given input shapes runs that copy too, as the warm-up
    before a capture, which loads its kernels for them (Triton loads a kernel with cuModuleLoadData, which a
    capturing stream forbids). Other eager calls run `types`."""
    types = list(types)
    apart = {"traced": traced, "graphed": graphed}
    if any(t is not None and sorted(t) != sorted(types) for t in apart.values()):
        optimized = build(model, types)
        for name, other in apart.items():
            if other is not None and sorted(other) != sorted(types):
                setattr(optimized, name, build(model, other))
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


def fused_lm_head(model: nn.Module):
    """The module of the model that computes its next-token loss itself (a type's model site put it there: its
    `next_token_loss(model, args, ids)`), else None."""
    return next((m for m in model.modules() if callable(getattr(type(m), "next_token_loss", None))), None)


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
