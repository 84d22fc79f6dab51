"""Which kernel type each piece of profiled time belongs to, and at which shape.

Input: the profiled events as a flat list of `Op` records (an op, a Python function, a module's range
or a profiling step) linked to their parents, each op carrying the time it alone accounts for: on a
GPU the device kernels it launched itself, on a CPU its self CPU time. Every kernel is attached to the
one op that launched it, so summing `self_us` counts each kernel exactly once.

The rules, tried in this order for each timed op (the first that matches decides); what each type
matches is its registry entry's `Profiling` (autokernel/types/<type>.py for the built-ins):
  0. a residual add and the norm right after it, in a decoder layer (Profiling.residual_add): the
     add_rmsnorm / add_layernorm types take the add and the norm module's time together; and a GEMM with the
     elementwise op right after it (Profiling.epilogue_of): an MLP's up-projection (a Linear or Conv1D module,
     or F.linear) and the GELU module or F.gelu that follows it are one linear_gelu call.
  1. module: the innermost enclosing module whose class names a type: *RMSNorm* -> rmsnorm,
     *LayerNorm* -> layernorm, *Rotary*/*RoPE* -> rotary_embedding, and an MLP/FeedForward module
     that runs a silu (SwiGLU) -> fused_mlp, its three matmuls included (GATED_MLP_OWNS_MATMULS):
     the fused kernel replaces the whole MLP and its speedup is measured against the whole MLP, so
     its share f must be the whole MLP's time too, or Amdahl's gain would be computed on the wrong f.
     A GELU MLP (GPT-2, BERT) is not SwiGLU: its up-projection and GELU are linear_gelu (rule 0), its
     down-projection matmul.
     Asked for (profile.py --types; opt-in rules apply only then), an *Attention* module that runs SDPA
     and a RoPE function (HF Llama's apply_rotary_pos_emb) -> rope_attention: its RoPE, repeat_kv and
     SDPA, not its projections (module_leaves: they stay matmul).
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

from autokernel import registry
from autokernel.kerneltype import Profiling

OTHER = "other"
# see rule 1; False counts the typed ops inside a gated module (a SwiGLU MLP's matmuls) as their own type
GATED_MLP_OWNS_MATMULS = True


def _rules(types=None) -> list[tuple[str, Profiling]]:
    """(type, its profiler rules) of every registered type that has them, in precedence order; a type whose rules
    are opt-in (Profiling.opt_in) only where `types` names it."""
    found = registry.specs_where("profiling")
    rules = [(t, spec.profiling) for t, spec in found.items() if not spec.profiling.opt_in or t in (types or ())]
    return sorted(rules, key=lambda rule: rule[1].precedence)


def function_patterns() -> list[re.Pattern]:
    """The function-name patterns of every type (profiling.py opens a range around such functions)."""
    return [p.functions for _, p in _rules() if p.functions is not None]


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
    shape: dict | None = None  # set where attribution reads it itself (a per-tensor type: one per tensor rotated)


def attribute(ops: list[Op], types=None) -> list[Group]:
    """Group every timed op into calls of kernel types (see the module docstring for the rules); `types` asks for
    the opt-in ones."""
    rules = _Rules(_rules(types))
    chains = _Chains(ops)
    children = defaultdict(list)
    for i, op in enumerate(ops):
        if op.parent is not None:
            children[op.parent].append(i)
    gated = _gated_modules(ops, chains, rules)
    patterns = _op_patterns(ops, chains, rules)
    siblings = _siblings(ops, chains)
    fused = {**_residual_adds(ops, siblings, rules), **_epilogues(ops, chains, siblings, children, rules)}
    groups: dict[tuple, Group] = {}
    for i, op in enumerate(ops):
        if op.self_us <= 0:
            continue
        hit = next((fused[j] for j in chains(i) if j in fused), None)
        type_, key, anchor, label = (hit[0], ("fused", hit[1]), hit[1], "") if hit else \
            _classify(i, ops, chains, gated, patterns, rules)
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(type_, anchor, label=label, shape=hit[2] if hit else None)
        group.members.append(i)
        group.time_us += op.self_us
    return [call for g in groups.values()
            for call in (_per_tensor_calls(g, ops, children, rules) if g.type in rules.per_tensor else [g])]


class _Rules:
    """The registry's profiler rules, arranged for lookup."""

    def __init__(self, rules: list[tuple[str, Profiling]]):
        self.by_type = dict(rules)
        self.modules = [(p.modules, t) for t, p in rules if p.modules is not None and not p.module_needs
                        and p.residual_add is None and not p.epilogue_of]
        self.residual_adds = [(p.modules, p.residual_add, t) for t, p in rules if p.residual_add is not None]
        self.epilogues = [(p.modules, p.ops, p.epilogue_of, t) for t, p in rules if p.epilogue_of]
        self.gated = [(p.modules, p.module_needs, p.module_needs_function, t)
                      for t, p in rules if p.modules is not None and p.module_needs]
        self.leaves = {t: p.module_leaves for t, p in rules if p.module_leaves}
        self.functions = [(p.functions, t) for t, p in rules if p.functions is not None]
        self.ops = {}
        for t, p in reversed(rules):  # the first type in precedence order wins an op two types name
            self.ops.update({name: t for name in p.ops if not p.epilogue_of})
        self.kernels = [(p.kernels, t) for t, p in rules if p.kernels is not None]
        self.patterns = [(p.op_pattern, t) for t, p in rules if p.op_pattern is not None]
        self.per_tensor = {t for t, p in rules if p.per_tensor}


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


def _classify(i, ops, chains, gated, patterns, rules):
    chain = chains(i)
    op_type, op_anchor = _op_level(i, ops, chains, rules)
    for j in chain:
        node = ops[j]
        if node.kind == "module":
            t = gated.get(j) or _module_type(node.module["cls"], rules)
            if j in gated and op_type and not GATED_MLP_OWNS_MATMULS:
                break
            if t in rules.leaves and ops[chains.top_op(i)].name in rules.leaves[t]:
                continue  # an op the module leaves to its own type (a projection inside an attention)
            if t:
                return t, ("module", j), j, ""
    functions = [j for j in chain if _function_type(ops[j], rules)]
    if functions:  # the outermost: rotate_half(q) belongs to the apply_rotary_pos_emb(q, k) around it
        j = functions[-1]
        return _function_type(ops[j], rules), ("function", j), j, ""
    for frame in ops[i].frames:
        t = _function_name_type(frame, rules)
        if t:
            return t, ("frame", chains.module(i), frame), i, ""
    top = chains.top_op(i)
    if top in patterns:
        t, anchor = patterns[top]
        return t, ("pattern", anchor), anchor, ""
    if op_type:
        return op_type, ("op", op_anchor), op_anchor, ""
    for kernel in ops[i].kernels:
        t = next((t for pattern, t in rules.kernels if pattern.search(kernel)), None)
        if t:
            return t, ("op", i), i, ""
    return OTHER, ("op", top), top, ops[top].name


def _op_level(i, ops, chains, rules):
    """The outermost op in the chain with a type, as (type, index), or (None, None)."""
    found = (None, None)
    for j in chains(i):
        if ops[j].kind != "op":
            break
        if ops[j].name in rules.ops:
            found = (rules.ops[ops[j].name], j)
    return found


def _module_type(cls: str, rules) -> str | None:
    return next((t for pattern, t in rules.modules if pattern.search(cls)), None)


def _function_name_type(text: str, rules) -> str | None:
    # "models/llama.py(68): apply_rotary" -> "apply_rotary"
    func = text.rsplit(": ", 1)[-1]
    return next((t for pattern, t in rules.functions if pattern.search(func)), None)


def _function_type(op: Op, rules) -> str | None:
    return _function_name_type(op.name, rules) if op.kind == "python" and "): " in op.name else None


def _gated_modules(ops, chains, rules) -> dict[int, str]:
    """Module ranges of a type that needs an op inside (an MLP that runs a silu: SwiGLU, a fused_mlp), and where
    its rule says so a function too (an attention that runs RoPE: rope_attention) -> type."""
    met = defaultdict(set)  # (module range, type) -> which of its needs ran inside: "op", "function"
    for i, op in enumerate(ops):
        for pattern, needs, function, t in rules.gated:
            if op.kind == "op" and op.name in needs:
                need = "op"
            elif function is not None and op.kind == "python" and function.search(op.name.rsplit(": ", 1)[-1]):
                need = "function"
            else:
                continue
            for j in chains(i):
                if ops[j].kind == "module" and pattern.search(ops[j].module["cls"]):
                    met[j, t].add(need)
                    break
    gated = {}
    for _, _, function, t in rules.gated:  # precedence order: the first type whose needs a module meets
        for (j, of), found in met.items():
            if of == t and j not in gated and "op" in found and (function is None or "function" in found):
                gated[j] = t
    return gated


def _op_patterns(ops, chains, rules) -> dict[int, tuple[str, int]]:
    """Top-level ops forming a type written as plain ops -> (the type, the pattern's first op: its anchor)."""
    sequences = defaultdict(list)  # top-level ops, in order, per enclosing module
    for i, op in enumerate(ops):
        if op.kind == "op" and chains.top_op(i) == i:
            sequences[chains.module(i)].append(i)
    found = {}
    for seq in sequences.values():
        names = [ops[i].name for i in seq]
        for span_of, t in rules.patterns:
            for pos in range(len(names)):
                span = span_of(names, pos)
                if span:
                    found.update({seq[k]: (t, seq[span[0]]) for k in range(span[0], span[1] + 1)})
    return found


def _siblings(ops, chains) -> list[list[int]]:
    """The top-level ops and module ranges of each module, in the order they ran."""
    siblings = defaultdict(list)
    for i, op in enumerate(ops):
        if op.kind == "module" or (op.kind == "op" and chains.top_op(i) == i):
            siblings[chains.module(i)].append(i)
    return [sorted(items, key=lambda i: ops[i].start) for items in siblings.values()]


def _residual_adds(ops, siblings, rules) -> dict[int, tuple[str, int, None]]:
    """A residual add and the norm module right after it (Profiling.residual_add): the module range and the add
    -> (their type, the module range, None). The add is the top-level aten::add just before the module in their
    parent module, of two tensors of the module's input shape."""
    found = {}
    for items in siblings:
        for before, j in zip(items, items[1:]):
            module, add = ops[j].module, ops[before]
            t = next((t for cls, path, t in rules.residual_adds if ops[j].kind == "module"
                      and cls.search(module["cls"]) and path.search(module["name"])), None)
            shape = module["input_shape"] if t else None
            if t and add.name in ("aten::add", "aten::add_") and [list(s) for s in add.shapes[:2]] == [shape] * 2:
                found[j] = found[before] = (t, j, None)
    return found


def _epilogues(ops, chains, siblings, children, rules) -> dict[int, tuple[str, int, dict]]:
    """A GEMM and the epilogue right after it (Profiling.epilogue_of): both -> (their type, the GEMM, the call's
    shape). The GEMM is a top-level op of epilogue_of or a module range that runs exactly one; the epilogue a
    module of the type's `modules` or a top-level op of its `ops`, on as many rows as the GEMM's input."""
    found = {}
    for items in siblings:
        for before, j in zip(items, items[1:]):
            t = next((t for cls, names, _, t in rules.epilogues if (ops[j].name in names and ops[j].kind == "op")
                      or (ops[j].kind == "module" and cls is not None and cls.search(ops[j].module["cls"]))), None)
            if t is None:
                continue
            gemms = rules.by_type[t].epilogue_of
            pair = _subtree(before, children) + _subtree(j, children)
            inner = [k for k in _subtree(before, children)
                     if ops[k].kind == "op" and ops[k].name in gemms and chains.top_op(k) == k]
            rows_in, rows_out = _input_shape(ops[before]), _input_shape(ops[j])
            if len(inner) != 1 or not rows_in or not rows_out or math.prod(rows_in[:-1]) != math.prod(rows_out[:-1]):
                continue
            shape = rules.by_type[t].module_shape(rows_in, [ops[k] for k in pair])
            if shape:
                found[j] = found[before] = (t, before, shape)
    return found


def _input_shape(op: Op) -> list | None:
    """A module range's input shape, or an op's first operand's."""
    if op.kind == "module":
        return op.module["input_shape"]
    return list(op.shapes[0]) if op.shapes and isinstance(op.shapes[0], (list, tuple)) else None


# ----------------------------------------------------------------------------------- shapes
def group_shape(group: Group, ops: list[Op]) -> dict | None:
    """The group's shape as the registry names it (its entry's Profiling readers), or None if unknown."""
    anchor = ops[group.anchor]
    spec = registry.specs_where("profiling").get(group.type)
    if spec is None:
        return None
    profiling = spec.profiling
    try:
        if profiling.per_tensor or group.shape is not None:
            return group.shape
        if anchor.kind == "module" and profiling.module_shape is not None:
            shape = anchor.module["input_shape"]
            return profiling.module_shape(shape, [ops[i] for i in group.members]) if shape else None
        return profiling.op_shape(anchor) if profiling.op_shape is not None and anchor.kind == "op" else None
    except (IndexError, TypeError, ValueError, KeyError):
        return None  # an op recorded without shapes: its time still counts


def _per_tensor_calls(group: Group, ops: list[Op], children: dict, rules) -> list[Group]:
    """A per-tensor group (rotary) as one call per tensor it rotates, each with that tensor's [B, H, S, D] as its shape.

    One function often rotates two tensors of different head counts: HF's apply_rotary_pos_emb(q, k)
    does q * cos + rotate_half(q) * sin, and the same for k (GQA: fewer heads). Each rotary function
    nested inside (rotate_half(q), rotate_half(k)) is one tensor; without any, each distinct tensor
    is. A tensor is the widest 4-D operand inside: the halves a rotate-half slices out are narrower,
    and the cos/sin tables it broadcasts against hold fewer elements. The group's time is shared by
    the calls in proportion to their elements. A group that takes no 4-D tensor rotates none (HF's
    LlamaRotaryEmbedding module computes the cos and sin tables): it is other's time, not a call of the type."""
    inner = [j for j in _subtree(group.anchor, children)[1:] if _function_type(ops[j], rules)]
    leaves = [j for j in inner if not any(_function_type(ops[k], rules) for k in _subtree(j, children)[1:])]
    found = [shape for j in leaves for shape in _rotated(j, ops, children)[:1]] or \
        _rotated(group.anchor, ops, children)
    if not found:
        anchor = ops[group.anchor]
        label = anchor.module["cls"] if anchor.kind == "module" and anchor.module else anchor.name
        return [Group(OTHER, group.anchor, list(group.members), group.time_us, label=label)]
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
