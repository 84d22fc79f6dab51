"""Which kernel type each piece of profiled time belongs to, and at which shape.

Input: the profiled events as a flat list of `Op` records (an op, a Python function, a module's range
or a profiling step) linked to their parents, each op carrying the time it alone accounts for: on a
GPU the device kernels it launched itself, on a CPU its self CPU time. Every kernel is attached to the
one op that launched it, so summing `self_us` counts each kernel exactly once.

The rules, tried in this order for each timed op (the first that matches decides):
  1. module: the innermost enclosing module whose class names a type: *RMSNorm* -> rmsnorm,
     *LayerNorm* -> layernorm, *Rotary*/*RoPE* -> rotary_embedding, and an MLP/FeedForward module
     that runs a silu (SwiGLU) -> fused_mlp, its three matmuls included (GATED_MLP_OWNS_MATMULS):
     the fused kernel replaces the whole MLP and its speedup is measured against the whole MLP, so
     its share f must be the whole MLP's time too, or Amdahl's gain would be computed on the wrong f.
     A GELU MLP (GPT-2, BERT) is not SwiGLU: its matmuls are matmul, its GELU is "other".
  2. function: an enclosing Python function named *rotary*, *rope* or *rotate_half* -> rotary_embedding
     (RoPE is written as a function more often than as a module).
  3. pattern: RMSNorm written as plain ops: [to] pow|mul -> mean -> [add] -> rsqrt -> mul [to] [mul].
  4. op: the outermost enclosing aten op with a type (linear/matmul/mm/addmm/bmm -> matmul,
     scaled_dot_product_attention and its flash/efficient/cuDNN backends -> flash_attention, ...).
     Outermost, so that the math fallback of SDPA stays attention and cross_entropy's log_softmax
     stays cross_entropy.
  5. kernel: the device kernel's own name (nvjet_*, cutlass, *gemm*, *xmma* -> matmul; flash, fmha
     -> flash_attention; ...), for kernels launched outside any known op.
  6. anything else is "other", kept with the name of the op that spent it.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

OTHER = "other"
GATED_MLP_OWNS_MATMULS = True  # see rule 1; False counts a SwiGLU MLP's matmuls as matmul

MODULE_TYPES = [
    (re.compile(r"rms_?norm", re.I), "rmsnorm"),
    (re.compile(r"layer_?norm", re.I), "layernorm"),
    # case-sensitive so that "Property" is not RoPE: Rotary, RoPE, Rope, rope as a word
    (re.compile(r"Rotary|rotary|RoPE|Rope(?![a-z])|(?<![A-Za-z])rope(?![a-z])"), "rotary_embedding"),
]
MLP_MODULE = re.compile(r"mlp|feed_?forward|ffn|swiglu", re.I)
FUNCTION_TYPES = [(re.compile(r"rotary|rotate_half|(?<![a-z])rope(?![a-z])", re.I), "rotary_embedding")]

MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
              "aten::_addmm_activation"}
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
OP_TYPES = {
    **{name: "matmul" for name in MATMUL_OPS},
    **{name: "flash_attention" for name in ATTENTION_OPS},
    "aten::softmax": "softmax", "aten::_softmax": "softmax", "aten::_safe_softmax": "softmax",
    "aten::layer_norm": "layernorm", "aten::native_layer_norm": "layernorm",
    "aten::rms_norm": "rmsnorm", "aten::_fused_rms_norm": "rmsnorm",
    "aten::cross_entropy_loss": "cross_entropy", "aten::nll_loss": "cross_entropy",
    "aten::nll_loss_nd": "cross_entropy",
    "aten::sum": "reduce",
}
KERNEL_TYPES = [
    (re.compile(r"flash|fmha|attention|attn", re.I), "flash_attention"),
    (re.compile(r"nvjet|cutlass|gemm|xmma|cublas|wgmma|matmul", re.I), "matmul"),
    (re.compile(r"soft_?max", re.I), "softmax"),
    (re.compile(r"layer_?norm", re.I), "layernorm"),
    (re.compile(r"rms_?norm", re.I), "rmsnorm"),
]
RMS_CASTS = {"aten::to", "aten::_to_copy", "aten::type_as"}


@dataclass
class Op:
    """One profiled event. kind: "op" (aten or custom op), "python", "module" (our range), "step"."""
    name: str
    kind: str
    parent: int | None = None
    start: float = 0.0
    self_us: float = 0.0  # time this op alone accounts for (kernels it launched, or self CPU time)
    shapes: list = field(default_factory=list)  # input shapes, as the profiler records them
    args: list = field(default_factory=list)  # concrete scalar arguments (None for tensors)
    kernels: tuple = ()  # names of the device kernels it launched
    frames: tuple = ()  # Python stack, where the profiler attaches one to the op
    module: dict | None = None  # for kind "module": {"name", "cls", "input_shape"}


@dataclass
class Group:
    """One call of one type: a module call, an op call, a matched pattern."""
    type: str
    anchor: int  # the op or module range its shape is read from
    members: list = field(default_factory=list)
    time_us: float = 0.0
    label: str = ""  # for "other": the op that spent the time
    shape: dict | None = None  # set where attribution reads it itself (rotary_embedding: one per tensor rotated)


def attribute(ops: list[Op]) -> list[Group]:
    """Group every timed op into calls of kernel types (see the module docstring for the rules)."""
    chains = _Chains(ops)
    gated = _gated_mlps(ops, chains)
    rms = _rmsnorm_patterns(ops, chains)
    groups: dict[tuple, Group] = {}
    for i, op in enumerate(ops):
        if op.self_us <= 0:
            continue
        type_, key, anchor, label = _classify(i, ops, chains, gated, rms)
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(type_, anchor, label=label)
        group.members.append(i)
        group.time_us += op.self_us
    children = defaultdict(list)
    for i, op in enumerate(ops):
        if op.parent is not None:
            children[op.parent].append(i)
    return [call for g in groups.values()
            for call in (_rotary_calls(g, ops, children) if g.type == "rotary_embedding" else [g])]


class _Chains:
    """Ancestors of every op, innermost first (memoized: the trees are deep and wide)."""

    def __init__(self, ops: list[Op]):
        self.ops = ops
        self._memo: dict[int, tuple] = {}

    def __call__(self, i: int) -> tuple:
        if i not in self._memo:
            parent = self.ops[i].parent
            self._memo[i] = (i,) + (self(parent) if parent is not None else ())
        return self._memo[i]

    def module(self, i: int) -> int | None:
        """The innermost module range enclosing op i."""
        return next((j for j in self(i)[1:] if self.ops[j].kind == "module"), None)

    def top_op(self, i: int) -> int:
        """The outermost op above i before the first non-op (i itself when it is top-level)."""
        top = i
        for j in self(i)[1:]:
            if self.ops[j].kind != "op":
                break
            top = j
        return top


def _classify(i, ops, chains, gated, rms):
    chain = chains(i)
    op_type, op_anchor = _op_level(i, ops, chains)
    for j in chain:
        node = ops[j]
        if node.kind == "module":
            t = gated.get(j) or _module_type(node.module["cls"])
            if t == "fused_mlp" and op_type == "matmul" and not GATED_MLP_OWNS_MATMULS:
                break
            if t:
                return t, ("module", j), j, ""
    functions = [j for j in chain if _function_type(ops[j])]
    if functions:  # the outermost: rotate_half(q) belongs to the apply_rotary_pos_emb(q, k) around it
        j = functions[-1]
        return _function_type(ops[j]), ("function", j), j, ""
    for frame in ops[i].frames:
        t = _function_name_type(frame)
        if t:
            return t, ("frame", chains.module(i), frame), i, ""
    top = chains.top_op(i)
    if top in rms:
        return "rmsnorm", ("pattern", rms[top]), rms[top], ""
    if op_type:
        return op_type, ("op", op_anchor), op_anchor, ""
    for kernel in ops[i].kernels:
        t = next((t for pattern, t in KERNEL_TYPES if pattern.search(kernel)), None)
        if t:
            return t, ("op", i), i, ""
    return OTHER, ("op", top), top, ops[top].name


def _op_level(i, ops, chains):
    """The outermost op in the chain with a type, as (type, index), or (None, None)."""
    found = (None, None)
    for j in chains(i):
        if ops[j].kind != "op":
            break
        if ops[j].name in OP_TYPES:
            found = (OP_TYPES[ops[j].name], j)
    return found


def _module_type(cls: str) -> str | None:
    return next((t for pattern, t in MODULE_TYPES if pattern.search(cls)), None)


def _function_name_type(text: str) -> str | None:
    # "models/llama.py(68): apply_rotary" -> "apply_rotary"
    func = text.rsplit(": ", 1)[-1]
    return next((t for pattern, t in FUNCTION_TYPES if pattern.search(func)), None)


def _function_type(op: Op) -> str | None:
    return _function_name_type(op.name) if op.kind == "python" and "): " in op.name else None


def _gated_mlps(ops, chains) -> dict[int, str]:
    """MLP module ranges that run a silu somewhere inside: SwiGLU, a fused_mlp."""
    gated = {}
    for i, op in enumerate(ops):
        if op.kind == "op" and op.name in ("aten::silu", "aten::silu_"):
            for j in chains(i):
                if ops[j].kind == "module" and MLP_MODULE.search(ops[j].module["cls"]):
                    gated[j] = "fused_mlp"
                    break
    return gated


def _rmsnorm_patterns(ops, chains) -> dict[int, int]:
    """Top-level ops forming an RMSNorm written as plain ops -> the pattern's first op (its anchor)."""
    sequences = defaultdict(list)  # top-level ops, in order, per enclosing module
    for i, op in enumerate(ops):
        if op.kind == "op" and chains.top_op(i) == i:
            sequences[chains.module(i)].append(i)
    found = {}
    for seq in sequences.values():
        names = [ops[i].name for i in seq]
        for pos, name in enumerate(names):
            if name == "aten::rsqrt":
                span = _rms_span(names, pos)
                if span:
                    found.update({seq[k]: seq[span[0]] for k in range(span[0], span[1] + 1)})
    return found


def _rms_span(names: list[str], pos: int) -> tuple[int, int] | None:
    """(first, last) positions of the RMSNorm around the rsqrt at pos, or None if it is not one."""
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


# ----------------------------------------------------------------------------------- shapes
def group_shape(group: Group, ops: list[Op]) -> dict | None:
    """The group's shape as the registry names it (autokernel/specs.py), or None if unknown."""
    anchor = ops[group.anchor]
    try:
        if anchor.kind == "module" and group.type == "fused_mlp":
            return _mlp_shape(anchor, [ops[i] for i in group.members])
        if anchor.kind == "module" and group.type in ("rmsnorm", "layernorm") and anchor.module["input_shape"]:
            return _rows(anchor.module["input_shape"])
        if group.type == "rotary_embedding":
            return group.shape
        return SHAPERS[group.type](anchor) if group.type in SHAPERS and anchor.kind == "op" else None
    except (IndexError, TypeError, ValueError, KeyError):
        return None  # an op recorded without shapes: its time still counts


def _rotary_calls(group: Group, ops: list[Op], children: dict) -> list[Group]:
    """A rotary group as one call per tensor it rotates, each with that tensor's [B, H, S, D] as its shape.

    One function often rotates two tensors of different head counts: HF's apply_rotary_pos_emb(q, k)
    does q * cos + rotate_half(q) * sin, and the same for k (GQA: fewer heads). Each rotary function
    nested inside (rotate_half(q), rotate_half(k)) is one tensor; without any, each distinct tensor
    is. A tensor is the widest 4-D operand inside: the halves a rotate-half slices out are narrower,
    and the cos/sin tables it broadcasts against hold fewer elements. The group's time is shared by
    the calls in proportion to their elements."""
    inner = [j for j in _subtree(group.anchor, children)[1:] if _function_type(ops[j])]
    leaves = [j for j in inner if not any(_function_type(ops[k]) for k in _subtree(j, children)[1:])]
    found = [shape for j in leaves for shape in _rotated(j, ops, children)[:1]] or \
        _rotated(group.anchor, ops, children)
    if not found:
        return [group]
    total = sum(math.prod(shape) for shape in found)
    return [Group(group.type, group.anchor, list(group.members), group.time_us * math.prod(shape) / total,
                  shape=dict(zip("BHSD", shape))) for shape in found]


def _rotated(root: int, ops: list[Op], children: dict) -> list[tuple]:
    """The distinct widest 4-D tensors the ops under `root` take, leaving out broadcast partners."""
    shapes = []
    for i in _subtree(root, children):
        four_d = [tuple(s) for s in ops[i].shapes if isinstance(s, (list, tuple)) and len(s) == 4]
        shapes += [s for s in four_d if not any(o[-1] == s[-1] and math.prod(o) > math.prod(s) for o in four_d)]
    if not shapes:
        return []
    width = max(s[-1] for s in shapes)
    return list(dict.fromkeys(s for s in shapes if s[-1] == width))


def _subtree(root: int, children: dict) -> list[int]:
    """root and every op under it, in order."""
    out, todo = [], [root]
    while todo:
        i = todo.pop()
        out.append(i)
        todo.extend(reversed(children.get(i, ())))
    return out


def _rows(shape) -> dict:
    return {"M": math.prod(shape[:-1]), "N": shape[-1]}


def _matmul_shape(op: Op) -> dict:
    a, b = op.shapes[0], op.shapes[1]
    if op.name in ("aten::addmm", "aten::baddbmm", "aten::_addmm_activation"):
        a, b = op.shapes[1], op.shapes[2]
    if op.name == "aten::linear":  # weight is [N, K]
        return {"M": math.prod(a[:-1]), "N": b[0], "K": a[-1]}
    if len(b) >= 3:  # batched on both sides (bmm, attention scores): one matmul per batch
        return {"B": math.prod(b[:-2]), "M": a[-2], "N": b[-1], "K": a[-1]}
    return {"M": math.prod(a[:-1]), "N": b[-1], "K": a[-1]}


def _attention_shape(op: Op) -> dict:
    b, h, s, d = op.shapes[0]
    causal_at, scale_at = ATTENTION_OPS.get(op.name, (None, None))
    causal = bool(op.args[causal_at]) if causal_at is not None and causal_at < len(op.args) else True
    shape = {"B": b, "H": h, "S": s, "D": d, "causal": causal}
    scale = op.args[scale_at] if scale_at is not None and scale_at < len(op.args) else None
    if isinstance(scale, float) and not math.isclose(scale, 1 / math.sqrt(d)):
        shape["sm_scale"] = scale
    return shape


def _mlp_shape(module: Op, members: list[Op]) -> dict | None:
    t_h = module.module["input_shape"]
    for op in members:
        if op.name in MATMUL_OPS and op.shapes:
            mm = _matmul_shape(op)
            if t_h and mm["K"] == t_h[-1]:
                return {"T": math.prod(t_h[:-1]), "H": t_h[-1], "I": mm["N"]}
    return None


SHAPERS = {
    "matmul": _matmul_shape,
    "flash_attention": _attention_shape,
    "softmax": lambda op: _rows(op.shapes[0]),
    "layernorm": lambda op: _rows(op.shapes[0]),
    "rmsnorm": lambda op: _rows(op.shapes[0]),
    "reduce": lambda op: _rows(op.shapes[0]),
    "cross_entropy": lambda op: {"N": math.prod(op.shapes[0][:-1]), "V": op.shapes[0][-1]},
}
