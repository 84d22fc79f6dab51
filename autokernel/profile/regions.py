"""Regions: the model as torch.compile sees it, every kernel Inductor makes and every extern call it keeps, with
the time each takes (issue 36's first half: `profile.py --regions`).

The built-in types see the model eagerly, by its modules, functions and ops; whatever no rule names is "other".
Compiled, the same model is a list of kernels: Inductor's fused ones (a norm with the residual add before it, an
activation with the casts around it, whatever its scheduler put together) and extern calls (GEMMs, attention).
Each is a *region*: the post-grad FX nodes it computes, the modules they come from, its inputs' shapes and
dtypes, its calls and its time per forward. A region whose nodes the built-in types' rules claim (an RMSNorm
module's nodes, a Linear's mm) belongs to that type; one they do not claim is work no type covers, ranked by the
share of the compiled forward's time it takes: what a region kernel should take over.

How (autokernel's notes on torch.compile's internals, regions-api): a post-grad custom pass snapshots each graph
Inductor lowers; Inductor's provenance tracking maps each kernel it generates to the post-grad nodes it computes;
the profiler times each kernel by name (on the CPU, Inductor's C++ kernels record themselves with
`cpp.enable_kernel_profile`). Kernel names repeat across graphs (`_0`, `_1` restart in each): an event is the
kernel of the first graph that has one of its name (the CPU's events carry a graph number, used where it is the
graph's index), so in a model of several graphs two kernels of one name can be taken for one region.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.profiler import ProfilerActivity, profile, record_function

from autokernel import compat
from autokernel.profile import attribution
from autokernel.profile.profiling import STEP_RANGE, loss_at_head, to_ops
from autokernel.profile.regionkernel import CASTS, op_name

PROVENANCE = "inductor_provenance_tracking_node_mappings"
MIN_SHARE = 0.01  # a region under this share of the compiled forward is not worth a kernel of its own
# ops that compute nothing worth a kernel (views, casts, allocations): they neither decide a region's type nor
# count as its work, and called on their own they are no region
LAYOUT_OPS = {"view", "reshape", "permute", "t", "transpose", "expand", "unsqueeze", "squeeze", "getitem",
              "alias", "slice", "select", "clone", "_unsafe_view", "convert_element_type", "as_strided",
              "empty", "empty_like", "empty_strided", "resolve_conj", "resolve_neg"}
LOWERED = {"aten::linear": {"mm", "addmm", "bmm"}, "aten::matmul": {"mm", "bmm"}}  # eager ops as post-grad has them
_GRAPH_PREFIX = re.compile(r"^graph_(\d+)_")
_FRAME = re.compile(r', in (\w+)\n')


@dataclass
class Region:
    name: str  # Inductor's kernel ("triton_per_fused_add_mean_mul_pow_rsqrt_3"), or "extern aten::mm" and shapes
    kind: str  # "fused" (a kernel Inductor generated) or "extern" (a call it kept: GEMM, attention)
    time_us: float  # per forward
    calls: float  # per forward
    share: float = 0.0  # of the compiled forward's time
    ops: list = field(default_factory=list)  # the aten ops it computes, layout ops left out
    modules: list = field(default_factory=list)  # the modules its nodes come from (paths)
    inputs: list = field(default_factory=list)  # [{"shape", "dtype"}] of the tensors it reads
    type: str | None = None  # the built-in type whose rules claim its nodes; None: no type covers it
    rival: str | None = None  # where opt-in types claim it: the type that would without them (profiling.rivals)
    code: str = ""  # a fused region: its subgraph as Python (regionkernel.reference_source), where it can be cut out
    pattern: str = ""  # the same with its casts, as the model computes it, where it has any


class _Snapshot(CustomGraphPass):
    """The post-grad custom pass: every graph Inductor lowers, {node name: node}, in compile order."""

    def __init__(self):
        self.graphs: list[dict] = []

    def __call__(self, graph) -> None:
        self.graphs.append({n.name: n for n in graph.nodes})

    def uuid(self):
        return None  # never from the FX graph cache: the pass must see every graph

    def __deepcopy__(self, memo):
        return self  # Inductor's config patch copies its values; the graphs must land in this one


class _Capture:
    """While active: every post-grad graph Inductor lowers, and the kernel -> post-grad nodes maps its provenance
    tracking emits, in compile order."""

    def __init__(self):
        self.snapshot = _Snapshot()
        self.graphs = self.snapshot.graphs
        self.kernels: list[dict] = []  # {kernel name: [node names]}
        self._handler = _ProvenanceHandler(self.kernels)

    def __enter__(self):
        logger = logging.getLogger("torch.__trace")
        self._level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self._handler)
        self._patch = torch._inductor.config.patch({"post_grad_custom_post_pass": self.snapshot,
                                                    **compat.provenance_options()})
        self._patch.__enter__()
        return self

    def __exit__(self, *exc):
        self._patch.__exit__(*exc)
        logger = logging.getLogger("torch.__trace")
        logger.removeHandler(self._handler)
        logger.setLevel(self._level)


class _ProvenanceHandler(logging.Handler):
    def __init__(self, sink: list):
        super().__init__()
        self.sink = sink

    def emit(self, record) -> None:
        artifact = (getattr(record, "metadata", None) or {}).get("artifact") or {}
        if artifact.get("name") != PROVENANCE:
            return
        payload = record.payload if isinstance(record.payload, dict) else json.loads(record.payload)
        if "cppCodeToPost" in payload:
            self.sink.append({key.rsplit(":", 1)[0]: nodes for key, nodes in payload["cppCodeToPost"].items()})


def capture(model, inputs, device: str, steps: int = 3, warmup: int = 2, types=None, with_loss: bool = False
            ) -> dict:
    """{"total_us": the compiled forward's time per step, "regions": [Region as a dict], by time} for `model`
    compiled by Inductor as torch.compile(model) would be; types: opt-in types whose rules may claim regions;
    with_loss: each forward computes the next-token loss too, as profile.py --with-loss profiles it eagerly."""
    torch._dynamo.reset()  # a fresh compile: the capture sees every graph
    on_gpu = device.startswith("cuda")
    with _Capture() as seen, torch.inference_mode(), (
            loss_at_head(model, inputs) if with_loss else contextlib.nullcontext()):
        compiled = torch.compile(model)
        for _ in range(warmup):
            compiled(*inputs)
        _sync(on_gpu)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        with profile(activities=activities, record_shapes=True) as prof:
            for _ in range(steps):
                with record_function(STEP_RANGE):
                    compiled(*inputs)
            _sync(on_gpu)
    torch._dynamo.reset()
    ops, total = to_ops(prof.events(), [], on_gpu)  # own time: device time of the kernels, or self CPU time
    regions = regions_of(ops, seen.graphs, seen.kernels, steps, attribution._Rules(attribution._rules(types)))
    if types:  # the same regions as the types without the opt-in ones would claim them
        plain = regions_of(ops, seen.graphs, seen.kernels, steps, attribution._Rules(attribution._rules()))
        without = {r.name: r.type for r in plain}
        for r in regions:
            r.rival = without.get(r.name) if without.get(r.name) not in (None, r.type) else None
    for r in regions:
        r.share = r.time_us / (total / steps) if total else 0.0
        r.calls = round(r.calls, 2)
    return {"total_us": total / steps, "regions": [asdict(r) for r in sorted(regions, key=lambda r: -r.time_us)]}


def _sync(on_gpu: bool) -> None:
    if on_gpu:
        torch.cuda.synchronize()


def regions_of(ops: list, graphs: list[dict], kernels: list[dict], steps: int, rules) -> list[Region]:
    """The regions the timed ops are, per forward (see the module docstring)."""
    found: dict[str, Region] = {}
    known: dict[int, tuple] = {}  # graph index -> (node name -> position, _module_ops of the graph)
    externs = None  # (op, its tensors' shapes) -> the types of the graphs' nodes that call it, built at first need
    for op in ops:
        if op.self_us <= 0 or op.kind not in ("op", "annotation"):
            continue
        index, kernel = _graph_of(op.name, kernels)
        if index is not None:
            node_names = kernels[index][kernel]
            graph = graphs[index] if index < len(graphs) else {}
            key = f"{index}:{kernel}"
            if key not in found:
                if index not in known:
                    known[index] = ({name: i for i, name in enumerate(graph)}, _module_ops(graph))
                order, module_ops = known[index]
                nodes = sorted((graph[n] for n in node_names if n in graph), key=lambda n: order[n.name])
                found[key] = _fused(kernel, nodes, rules, module_ops)
        elif op.kind == "op" and op.name.startswith("aten::") and op.name[len("aten::"):] not in LAYOUT_OPS:
            key = f"extern {op.name} {op.shapes}"
            if key not in found:
                externs = _extern_types(graphs, rules) if externs is None else externs
                votes = _extern_votes(op, ops, externs)
                found[key] = Region(name=key, kind="extern", time_us=0.0, calls=0, ops=[op.name],
                                    inputs=[{"shape": list(s)} for s in op.shapes if s],
                                    type=votes.most_common(1)[0][0] if votes else rules.ops.get(op.name))
        else:
            continue
        found[key].time_us += op.self_us / steps
        found[key].calls += 1 / steps
    return list(found.values())


def _extern_types(graphs: list[dict], rules) -> dict[tuple, Counter]:
    """{(aten op, its tensor inputs' shapes): the types node_type gives the graphs' nodes that call it}: an extern
    call's region is the type of the nodes that make it, in attribution's order, as a fused region's is (an MLP's
    GEMMs are fused_mlp's, which takes the MLP whole, where the op alone would make them matmul's). Calls of one op
    at one shape from modules of two types are the type of the most of them."""
    found: dict[tuple, Counter] = defaultdict(Counter)
    for graph in graphs:
        module_ops = _module_ops(graph)
        for n in graph.values():
            if n.op != "call_function" or op_name(n) in LAYOUT_OPS:
                continue
            shapes = tuple(tuple(a.meta["val"].shape) for a in n.all_input_nodes
                           if isinstance(a.meta.get("val"), torch.Tensor))
            t = node_type(n, rules, module_ops)
            if t:
                found[(f"aten::{op_name(n)}", shapes)][t] += 1
    return found


def _extern_votes(op, ops: list, externs: dict) -> Counter | None:
    """The types of the graphs' nodes that make an extern call (_extern_types'): those of its own op and shapes (an
    out= tensor last, if any), else of the nearest op above it that has some (on a GPU SDPA's time is that of the
    _flash_attention_forward or cuDNN op it calls); None where no node makes it."""
    while op is not None:
        shapes = tuple(tuple(s) for s in op.shapes if s)
        votes = externs.get((op.name, shapes)) or externs.get((op.name, shapes[:-1]))
        if votes:
            return votes
        op = ops[op.parent] if op.parent is not None else None
    return None


def _graph_of(event: str, kernels: list[dict]) -> tuple[int | None, str]:
    """(the index of the graph whose kernel an event is, the kernel's name): by the event's graph prefix where it
    has one and it is that graph's (Inductor's C++ kernels: "graph_1_cpp_fused_..."; its number counts the graphs
    of the process), else the first graph with a kernel of that name."""
    prefixed = _GRAPH_PREFIX.match(event)
    kernel = _GRAPH_PREFIX.sub("", event)
    if prefixed and int(prefixed.group(1)) < len(kernels) and kernel in kernels[int(prefixed.group(1))]:
        return int(prefixed.group(1)), kernel
    return next((i for i, names in enumerate(kernels) if kernel in names), None), kernel


def _fused(kernel: str, nodes: list, rules, module_ops: dict) -> Region:
    """A fused kernel's region (its nodes in graph order): its ops, modules, the tensors it reads, and the type its
    nodes' majority has."""
    inside = {n.name for n in nodes}
    reads, seen = [], set()
    for n in nodes:
        for arg in n.all_input_nodes:
            if arg.name not in inside and arg.name not in seen and isinstance(arg.meta.get("val"), torch.Tensor):
                seen.add(arg.name)
                reads.append(_tensor(arg))
    work = [n for n in nodes if op_name(n) not in LAYOUT_OPS]
    votes = Counter(t for t in (node_type(n, rules, module_ops) for n in work) if t)
    type_ = _with_residual_add(votes.most_common(1)[0][0] if votes and sum(votes.values()) * 2 > len(work) else
                               None, work, rules)
    code, cut_reads = _code(nodes)
    pattern = _code(nodes, casts=True)[0] if code and any(op_name(n) in CASTS for n in nodes) else ""
    return Region(name=kernel, kind="fused", time_us=0.0, calls=0, ops=[f"aten::{op_name(n)}" for n in work],
                  modules=sorted({_module_path(n) for n in nodes if _module_path(n)}), type=type_, code=code,
                  pattern=pattern, inputs=[_tensor(n) for n in cut_reads] if cut_reads else reads)


def _code(nodes: list, casts: bool = False) -> tuple[str, list | None]:
    """(the region's subgraph as the Python of a function of its inputs, the nodes it reads), or ("", None) where
    it cannot be cut out; with casts, as the model computes it (the function is then called pattern)."""
    from autokernel.profile import regionkernel

    try:
        return regionkernel.reference_source(nodes, "pattern" if casts else "reference", casts)
    except Exception:  # noqa: BLE001  (a region that cannot be cut out is still listed, without its code)
        return "", None


def _tensor(node) -> dict:
    val = node.meta["val"]
    return {"shape": list(val.shape), "dtype": str(val.dtype)}


def _with_residual_add(type_: str | None, work: list, rules) -> str | None:
    """A norm's region that also computes the residual add before it (an add outside the norm module, the norm's
    path a residual type's: a decoder layer's norm) is that fused type's (add_rmsnorm), as attribution's rule 0."""
    for modules, path_pattern, fused in rules.residual_adds:
        norms = {path for n in work for path, cls in (n.meta.get("nn_module_stack") or {}).values()
                 if modules.search(getattr(cls, "__name__", str(cls))) and path_pattern.search(_clean_path(path))}
        if norms and any(op_name(n) == "add" and not norms & _paths(n) for n in work):
            return fused
    return type_


def _paths(node) -> set[str]:
    return {path for path, _ in (node.meta.get("nn_module_stack") or {}).values()}


def node_type(node, rules, module_ops: dict) -> str | None:
    """The built-in type whose rules claim a post-grad node, in attribution's order: a module that needs an op
    (a SwiGLU MLP: a silu among its nodes), a module by its class, a function on its stack, its op."""
    t = _epilogue_type(node, rules)
    if t:
        return t
    stack = list((node.meta.get("nn_module_stack") or {}).values())[::-1]  # innermost first
    for depth, (path, cls) in enumerate(stack):
        name = getattr(cls, "__name__", str(cls))
        ops, functions = module_ops.get(path, (set(), set()))
        for pattern, needs, needs_function, t in rules.gated:
            if pattern.search(name) and {n.replace("aten::", "") for n in needs} & ops and (
                    needs_function is None or any(needs_function.search(f) for f in functions)) and \
                    not _left(node, depth, rules.leaves.get(t)):
                return t
        t = attribution._module_type(name, rules)
        if t and not _left(node, depth, rules.leaves.get(t)):
            return t
    for func in _FRAME.findall(node.meta.get("stack_trace") or ""):
        t = next((t for pattern, t in rules.functions if pattern.search(func)), None)
        if t:
            return t
    t = rules.ops.get(f"aten::{op_name(node)}")
    return t if t or stack else _read_type(node, rules, module_ops)


def _read_type(node, rules, module_ops: dict, hops: int = 4) -> str | None:
    """A node with no module stack was made by a pass after tracing (on a GPU Inductor's online softmax makes the
    loss's prepare_softmax_online so: a compiled GPT-NeoX gave 2.6% of its forward to no type): it computes for what
    it reads, so it takes the type of the nearest node it reads (over any ops) that has a stack and a type."""
    frontier = list(node.all_input_nodes)
    for _ in range(hops):
        t = next((t for n in frontier if n.meta.get("nn_module_stack") and (t := node_type(n, rules, module_ops))),
                 None)
        if t:
            return t
        frontier = [m for n in frontier for m in n.all_input_nodes]
    return None


def _epilogue_type(node, rules) -> str | None:
    """A GEMM whose result goes (through layout ops) to the epilogue of a type's rules (Profiling.epilogue_of: the
    GELU after an MLP's up-projection), and the epilogue's nodes that read such a GEMM: that type's, as attribution
    pairs them eagerly. Inductor decomposes a GELU into erf, mul and add; each keeps aten.gelu as its original."""
    for modules, names, gemms, t in rules.epilogues:
        is_end = functools.partial(_in_epilogue, modules=modules, ends=_lowered(names))
        starts = _lowered(gemms)
        if op_name(node) in starts and _reaches(node, lambda n: list(n.users), is_end):
            return t
        if is_end(node) and _reaches(node, lambda n: n.all_input_nodes, lambda n, s=starts: op_name(n) in s, is_end):
            return t
    return None


@functools.cache
def _lowered(ops: frozenset) -> frozenset:
    """The names a post-grad graph's nodes have for eager aten ops ("aten::linear" -> mm, addmm, bmm)."""
    return frozenset().union(*(LOWERED.get(op, {op.replace("aten::", "")}) for op in ops))


def _in_epilogue(node, modules, ends: frozenset) -> bool:
    """Whether a node computes an epilogue: one of its ops (`ends`), or anything inside a module of its class."""
    classes = (getattr(cls, "__name__", str(cls)) for _, cls in (node.meta.get("nn_module_stack") or {}).values())
    return bool(_names(node) & ends) or (modules is not None and any(modules.search(c) for c in classes))


def _reaches(node, step, found, through=lambda n: False, hops: int = 8) -> bool:
    """Whether a node `found` accepts is `hops` steps or fewer away from node along `step` (users or inputs), over
    layout ops and the nodes `through` accepts."""
    frontier = list(step(node))
    for _ in range(hops):
        if any(found(n) for n in frontier):
            return True
        frontier = [m for n in frontier if op_name(n) in LAYOUT_OPS or through(n) for m in step(n)]
    return False


def _names(node) -> set[str]:
    """The node's op as lowered and as the aten op it was decomposed from."""
    original = str(node.meta.get("original_aten"))
    return {op_name(node)} | ({original.split(".")[1]} if original.startswith("aten.") else set())


def _left(node, depth: int, leaves) -> bool:
    """A node that a module's rule leaves to its own type (module_leaves, as attribution leaves an attention's
    projections to matmul): inside a child module (depth > 0 in the stack) and computing a leaf op as it is lowered
    (a Linear's aten::linear is an mm or addmm by then)."""
    return depth > 0 and op_name(node) in _lowered(leaves or frozenset())


def _module_ops(graph: dict) -> dict[str, tuple[set, set]]:
    """{module path: (the op names of the graph's nodes inside it at any depth, each as lowered and as the aten op
    it was decomposed from (silu, which the CPU lowers to exp and div); the Python functions on their stacks)}."""
    found = defaultdict(lambda: (set(), set()))
    for n in graph.values():
        names = _names(n)
        functions = set(_FRAME.findall(n.meta.get("stack_trace") or ""))
        for path, _ in (n.meta.get("nn_module_stack") or {}).values():
            found[path][0].update(names)
            found[path][1].update(functions)
    return found


def _module_path(node) -> str:
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    return _clean_path(stack[-1][0]) if stack else ""


def _clean_path(path: str) -> str:
    """Dynamo's "L['self'].layers[0].mlp" -> "layers.0.mlp"."""
    path = re.sub(r"^L\['[^']+'\]\.?", "", path)
    return re.sub(r"\[(\d+)\]", r".\1", re.sub(r"\['([^']+)'\]", r".\1", path)).strip(".")


def unplaced(found: dict | None, placed: dict[str, list[str]]) -> None:
    """A fused region claimed by the rules of a type that deploys by module sites (placed's keys), none of whose
    modules a site of that type takes in this model (deployed.placed_modules), is covered by no type after all:
    its type becomes None, "claimed_by" keeps the rules' type (a GPT-NeoX layer's add and layer norm: add_layernorm's
    rules claim them, its sites do not take a parallel-residual block). A region of no module (nodes a pass made,
    typed by what they read) keeps its type."""
    for r in (found or {}).get("regions", []):
        t = r["type"]
        if r["kind"] == "fused" and t in placed and r["modules"] and not any(
                m == p or m.startswith(p + ".") for m in r["modules"] for p in placed.get(t, [])):
            r["claimed_by"], r["type"] = t, None


def uncovered(found: dict | None) -> list[dict]:
    """The regions no built-in type covers that take at least MIN_SHARE of the compiled forward, the largest first:
    the plan's "regions"."""
    if not found:
        return []
    return [{**r, "f": r["share"]} for r in found["regions"] if not r["type"] and r["share"] >= MIN_SHARE]
