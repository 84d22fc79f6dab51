"""The model sites of the add-norm types (autokernel/types/add_rmsnorm.py, add_layernorm.py): pre-norm decoder
layers whose residual add after attention and the norm after it become one kernel call.

A Llama-family layer (input_layernorm, self_attn, post_attention_layernorm, mlp) or a GPT-2 block (ln_1, attn,
ln_2, mlp) computes, after its attention,

    h = residual + h          (GPT-2: h = attn_output + residual)
    [if cross_attention: ...] (GPT-2 only; taken only with encoder states)
    residual = h
    h = self.post_attention_layernorm(h)

Replacing the norm alone (the rmsnorm / layernorm types) leaves the add as a kernel of its own, which costs
the fusion torch.compile would have made of the two. So the layer's own forward is rewritten: its source
is parsed, these statements become `residual, h = add_norm(self, residual, h)` (one call of the add-norm
kernel returning the sum and the normed sum), and the result is compiled in the module that defined the layer.
Everything else is the original code, so the arguments are passed on and the return value is built exactly
as the installed transformers version does it, whatever its signature. An `if` block between the add and
the norm (GPT-2's cross-attention) keeps the original statements in its taken branch.

A layer is a site when its norm computes the reference (the probe of the norm types) and its forward has the
pattern; otherwise it is left alone with the reason. The rewritten layer keeps its children, which stay
sites of their own types (its first norm, attention, MLP), except the post-attention norm: it is computed
by the fused call and no other type claims it (swap.OWNS).
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import linecache
import textwrap
import types

import torch.nn as nn

from autokernel.ops import customops, swap
from autokernel.ops.customops import KERNEL_DTYPES, Site, grad_reason, in_eager

# (first norm, attention, post-attention norm, MLP) attribute names of a pre-norm decoder layer
DECODER_LAYOUTS = (
    ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"),  # Llama, Mistral, Qwen2, ...
    ("ln_1", "attn", "ln_2", "mlp"),  # GPT-2
)
POST_ATTENTION_NORMS = tuple(layout[2] for layout in DECODER_LAYOUTS)
FUSED_NAME = "_autokernel_add_norm"  # the fused call's name inside the rewritten forward


class AddNorm:
    """The residual add and the norm after it, as one kernel call of a rewritten forward: (sum, normed).

    Called with the add's two operands in the order the original wrote them; where the call does not fit the
    kernel (mixed dtypes, a broadcast, a gradient wanted) it runs the original statements."""

    def __init__(self, site: Site, kernel_type: str, norm_attr: str, eps: float, with_bias: bool):
        self.site, self.norm_attr, self.eps, self.with_bias = site, norm_attr, eps, with_bias
        self.op = customops.op(kernel_type)

    def __call__(self, layer: nn.Module, a, b):
        norm = getattr(layer, self.norm_attr)
        params = self._params(norm, a)
        reason = self._unfit(a, b, params) or grad_reason(a, b, *params)
        if in_eager():
            self.site.calls += not reason
            self.site.fallbacks += bool(reason)
            self.site.reason = reason or self.site.reason
        if reason:
            total = a + b
            return total, norm(total)
        return self.op(a, b, *params, self.eps)  # the sum commutes: a + b is b + a bit for bit

    def _params(self, norm, a) -> tuple:
        # LayerNorm without affine weight or bias: ones and zeros compute the same, and the kernel takes tensors.
        # Each parameter read once: a read goes through nn.Module.__getattr__.
        weight = norm.weight
        weight = weight if weight is not None else a.new_ones(a.shape[-1])
        if not self.with_bias:
            return (weight,)
        bias = norm.bias
        return weight, bias if bias is not None else a.new_zeros(a.shape[-1])

    @staticmethod
    def _unfit(a, b, params) -> str | None:
        if a.shape != b.shape or a.numel() == 0:
            return "the residual add broadcasts, or is empty"
        dtype = a.dtype
        if dtype not in KERNEL_DTYPES or b.dtype != dtype or any(t.dtype != dtype for t in params):
            return "mixed or unsupported dtypes"
        return None


def layout_of(m) -> tuple | None:
    """The (first norm, attention, post-attention norm, MLP) attribute names of a pre-norm decoder layer, or None."""
    return next((layout for layout in DECODER_LAYOUTS
                 if all(isinstance(getattr(m, attr, None), nn.Module) for attr in layout)), None)


def fuse(name, m, norm_attr: str, kernel_type: str, norm_reason: str | None, eps, with_bias: bool):
    """The module site of an add-norm type in decoder layer m: (Site, m with its forward rewritten) or (Site with
    the reason, None). norm_reason: why the norm itself is not a site (None: it is); with_bias: a LayerNorm."""
    site = Site(name, f"{type(m).__name__}(residual add + {norm_attr})", kernel_type, False)
    if norm_reason:
        site.reason = f"{norm_attr}: {norm_reason}"
        return site, None
    forward, reason = rewritten_forward(type(m).forward, norm_attr)
    if forward is None:
        site.reason = reason
        return site, None
    fused = forward(AddNorm(site, kernel_type, norm_attr, eps, with_bias))
    m.forward = types.MethodType(fused, m)
    setattr(m, swap.OWNS, (norm_attr,))
    site.swapped = True
    return site, m


@functools.cache  # once per layer class, not once per layer
def rewritten_forward(forward, norm_attr: str):
    """(factory, "") where factory(add_norm) is `forward` with its residual add and `self.<norm_attr>` call as one
    add_norm(self, a, b) call, or (None, why not)."""
    fn = inspect.unwrap(forward)
    if fn.__code__.co_freevars:  # super() or a closure: the rewritten code could not see the same cells
        return None, "forward is a closure (uses super() or outer variables)"
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError) as e:
        return None, f"the source of forward is not available ({type(e).__name__})"
    fdef = tree.body[0]
    if not _is_loaded_code(fdef, fn):
        return None, "the source file of forward differs from the code loaded (edited since the import?)"
    body = _fused_body(fdef.body, fdef.args.args[0].arg if fdef.args.args else "self", norm_attr)
    if body is None:
        return None, f"forward has no residual add followed by `residual = h; h = self.{norm_attr}(h)`"
    fdef.body = body
    _drop_annotations(fdef)
    source = (f"def _autokernel_factory({FUSED_NAME}):\n{textwrap.indent(ast.unparse(fdef), '    ')}\n"
              f"    return {fdef.name}\n")
    filename = f"<autokernel: {fn.__qualname__} with {FUSED_NAME}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show it
    namespace: dict = {}
    exec(compile(source, filename, "exec"), fn.__globals__, namespace)  # the layer's module's globals, live
    return functools.partial(_annotated, namespace["_autokernel_factory"], fn), ""


def _is_loaded_code(fdef: ast.FunctionDef, fn) -> bool:
    """Whether the source read from disk compiles to the bytecode of the function the process runs."""
    bare = copy.deepcopy(fdef)
    bare.decorator_list = []
    module = compile(ast.Module([bare], []), "<autokernel: source check>", "exec")
    code = next(c for c in module.co_consts if isinstance(c, types.CodeType))
    return code.co_code == fn.__code__.co_code


def _drop_annotations(fdef: ast.FunctionDef) -> None:
    # evaluated where the function is defined, they may name what the model's module imports only for type
    # checkers; the original's annotations are put back as they are (_annotated)
    fdef.returns = None
    for a in (*fdef.args.posonlyargs, *fdef.args.args, *fdef.args.kwonlyargs, fdef.args.vararg, fdef.args.kwarg):
        if a is not None:
            a.annotation = None


def _annotated(factory, original, add_norm):
    fn = factory(add_norm)
    # the function itself, and inside the decorators forward keeps (transformers' deprecate_kwarg), which
    # inspect.signature reads through __wrapped__
    for f in {fn, inspect.unwrap(fn)}:
        f.__annotations__ = dict(getattr(original, "__annotations__", {}))
        f.__doc__ = original.__doc__
    return fn


def _fused_body(body: list, self_name: str, norm_attr: str) -> list | None:
    """The statements with the add, [one `if` block], `residual = h` and `h = self.<norm>(h)` fused, or None."""
    for j in range(1, len(body) - 1):
        h = _norm_call_target(body[j + 1], self_name, norm_attr)
        saved = _copy_of(body[j], h) if h else None
        if saved is None:
            continue
        k = j - 1
        branch = body[k] if isinstance(body[k], ast.If) and not body[k].orelse else None
        k -= branch is not None
        operands = _add_into(body[k], h) if k >= 0 else None
        if operands is None:
            return None
        fused = ast.parse(f"{saved}, {h} = {FUSED_NAME}({self_name}, a, b)").body[0]
        fused.value.args[1:] = operands
        if branch is not None:  # the branch taken: the original statements; else the fused call
            fused = ast.If(branch.test, [body[k], *branch.body, body[j], body[j + 1]], [fused])
        return [*body[:k], fused, *body[j + 2:]]
    return None


def _norm_call_target(stmt, self_name: str, norm_attr: str) -> str | None:
    """h, where stmt is `h = self.<norm_attr>(h)`."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return None
    call, h = stmt.value, stmt.targets[0].id
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == norm_attr
            and isinstance(call.func.value, ast.Name) and call.func.value.id == self_name and not call.keywords
            and len(call.args) == 1 and isinstance(call.args[0], ast.Name) and call.args[0].id == h):
        return None
    return h


def _copy_of(stmt, h: str) -> str | None:
    """r, where stmt is `r = h`."""
    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and isinstance(stmt.value, ast.Name) and stmt.value.id == h and stmt.targets[0].id != h):
        return stmt.targets[0].id
    return None


def _add_into(stmt, h: str) -> list | None:
    """[a, b], where stmt is `h = a + b`."""
    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == h and isinstance(stmt.value, ast.BinOp) and isinstance(stmt.value.op, ast.Add)):
        return [stmt.value.left, stmt.value.right]
    return None
