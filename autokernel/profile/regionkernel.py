"""A region as code: its subgraph as a reference function, and a plain Triton kernel that computes it.

A region (autokernel/profile/regions.py) is the post-grad nodes of one kernel Inductor made. Cut out of the graph,
with a placeholder for each tensor it reads, it is a function of those tensors: written as Python (torch.ops.aten
calls, the GraphModule's own code) it is the region's reference, run on float64 inputs as the oracle. Casts are
left out of it (prims.convert_element_type becomes its input): the oracle computes in float64, and a kernel in the
dtype of its inputs with an fp32 accumulator.

The starter is generated from the same nodes for the regions made of elementwise ops (POINTWISE) on tensors that
broadcast to the output, up to four dimensions: one program per BLOCK elements of the output, each input loaded
through its broadcast strides, the ops in fp32, the result stored in the output's dtype. Regions with reductions
or other ops get no starter yet (extract.py says so).
"""

from __future__ import annotations

import numbers
import textwrap

import torch

MAX_DIMS = 4
CASTS = {"convert_element_type", "_to_copy"}
VIEWS = {"view", "reshape", "_unsafe_view"}  # of an input: the region reads the view (its shape baked in otherwise)
# aten op -> its Triton expression over the operands {0}, {1}, {2}, all fp32
POINTWISE = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})", "neg": "(-{0})",
    "exp": "tl.exp({0})", "log": "tl.log({0})", "sigmoid": "tl.sigmoid({0})", "rsqrt": "tl.rsqrt({0})",
    "sqrt": "tl.sqrt({0})", "abs": "tl.abs({0})", "relu": "tl.maximum({0}, 0.0)", "reciprocal": "(1.0 / {0})",
    "maximum": "tl.maximum({0}, {1})", "minimum": "tl.minimum({0}, {1})", "where": "tl.where({0} != 0, {1}, {2})",
    "silu": "({0} * tl.sigmoid({0}))", "tanh": "(2.0 * tl.sigmoid(2.0 * {0}) - 1.0)",  # no tl.tanh in every Triton
    "square": "({0} * {0})", "erf": "tl.erf({0})",
}


def op_name(node) -> str:
    """aten.add.Tensor -> "add"; operator.getitem -> "getitem"."""
    target = str(node.target)
    return target.split(".")[1] if target.startswith(("aten.", "prims.")) else getattr(node.target, "__name__", target)


def subgraph(nodes: list, casts: bool = False) -> tuple[torch.fx.GraphModule, list]:
    """(the region's nodes as a GraphModule of its inputs, the outside nodes it reads, in placeholder order); casts
    become their input unless `casts`. The output is the node whose value leaves the region (the last one, if none
    does)."""
    graph, env, reads = torch.fx.Graph(), {}, []
    inside = {n.name for n in nodes}
    for n in nodes:
        if op_name(n) in VIEWS and n.args[0].name not in inside:  # a view of what it reads: read the view
            env[n.name] = graph.placeholder(f"in{len(reads)}")
            reads.append(n)
            continue
        for a in n.all_input_nodes:
            if a.name not in inside and a.name not in env:
                env[a.name] = graph.placeholder(f"in{len(reads)}")
                reads.append(a)
        if op_name(n) in CASTS and not casts:
            env[n.name] = env[n.args[0].name]
            continue
        env[n.name] = graph.node_copy(n, lambda a: env[a.name])
    leaving = [n for n in nodes if any(u.name not in inside for u in n.users)]
    if len(leaving) > 1:
        raise ValueError(f"the region has {len(leaving)} outputs; one is supported")
    graph.output(env[(leaving or nodes)[-1].name])
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(torch.nn.Module(), graph), reads


def reference_source(nodes: list, name: str = "reference", casts: bool = False) -> tuple[str, list]:
    """(`def reference(in0, ...)`: the region's subgraph as Python, the nodes whose values are in0, ...); with
    casts, the subgraph as the model computes it (the pattern deploy looks for), under `name`."""
    module, reads = subgraph(nodes, casts)
    code = module.code.strip().replace("def forward(self, ", f"def {name}(", 1)
    return "\n".join(line.rstrip() for line in code.splitlines() if line.strip()) + "\n", reads


def pointwise_expression(code: str) -> tuple[list[str], str]:
    """(the reference's parameters, the Triton expression of its result) for a reference made of POINTWISE ops;
    a ValueError naming what is not."""
    namespace = {"torch": torch, "inf": float("inf"), "nan": float("nan")}
    exec(compile(code, "<region>", "exec"), namespace)  # noqa: S102  (our own generated code, traced below)
    traced = torch.fx.symbolic_trace(namespace["reference"])
    values, params = {}, []
    for n in traced.graph.nodes:
        if n.op == "placeholder":
            params.append(n.name)
            values[n.name] = f"x_{n.name}"
        elif n.op == "call_function":
            values[n.name] = _expression(n, values)
        elif n.op == "output":
            return params, values[n.args[0].name]
    raise ValueError("the reference has no output")


def _expression(node, values: dict) -> str:
    name = op_name(node)
    operands = []
    for a in node.args:
        if isinstance(a, torch.fx.Node):
            operands.append(values[a.name])
        elif isinstance(a, bool) or not isinstance(a, numbers.Number):
            raise ValueError(f"{name} takes {a!r}: only tensors and numbers are supported")
        else:
            operands.append(repr(float(a)))
    if node.kwargs.get("alpha", 1) != 1:
        operands[1] = f"({operands[1]} * {float(node.kwargs['alpha'])!r})"
    if name == "pow" and len(operands) == 2 and operands[1] in ("2.0", "3.0"):
        return "(" + " * ".join([operands[0]] * int(float(operands[1]))) + ")"
    if name not in POINTWISE:
        raise ValueError(f"aten.{name} is not an elementwise op the generator knows")
    return POINTWISE[name].format(*operands)


STARTER = '''"""A region kernel of {model}: {share:.1%} of its compiled forward, {calls:g} calls.

It computes {ops}.
Written by extract.py from the region's subgraph; workspace/regions/{module}.py holds its reference, read-only.
One program per BLOCK elements of the output, each input loaded through its broadcast strides, the math in fp32.
Inductor's own kernel for the region is what to beat (the baseline torch.compile makes of the reference).
"""

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "{type_name}"

BLOCK = 1024  # output elements per program
NUM_WARPS = 4
TUNABLES = {{"BLOCK": [256, 512, 1024, 2048, 4096], "NUM_WARPS": [1, 2, 4, 8]}}


@triton.jit
def _region(out_ptr, {pointers}, n, S1, S2, S3, {strides}, BLOCK: tl.constexpr):
    flat = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = flat < n
    i3 = flat % S3
    rest = flat // S3
    i2 = rest % S2
    rest = rest // S2
    i1 = rest % S1
    i0 = rest // S1
{loads}
    result = {expression}
    tl.store(out_ptr + flat, result.to(out_ptr.dtype.element_ty), mask=mask)


def _strides(x, shape):
    """x's strides broadcast to `shape` (0 along a broadcast dimension), padded to four dimensions."""
    strides = list(x.expand(shape).stride())
    return [0] * (4 - len(strides)) + strides


def kernel_fn({params}):
    shape = torch.broadcast_shapes({shapes})
    out = torch.empty(shape, dtype={first}.dtype, device={first}.device)
    sizes = [1] * (4 - len(shape)) + list(shape)
    strides = [s for x in ({params},) for s in _strides(x, shape)]
    _region[(triton.cdiv(out.numel(), BLOCK),)](out, {params}, out.numel(), sizes[1], sizes[2], sizes[3], *strides,
                                               BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out
'''


def starter_source(region: dict, type_name: str, module: str, model: str) -> str:
    """The Triton starter of a pointwise region (a ValueError saying why there is none for another)."""
    if not region.get("code"):
        raise ValueError("the region could not be cut out of its graph")
    if any(len(i["shape"]) > MAX_DIMS for i in region["inputs"]):
        raise ValueError(f"an input has more than {MAX_DIMS} dimensions")
    params, expression = pointwise_expression(region["code"])
    loads = "\n".join(f"    x_{p} = tl.load({p}_ptr + i0 * {p}_s0 + i1 * {p}_s1 + i2 * {p}_s2 + i3 * {p}_s3, "
                      "mask=mask, other=0.0).to(tl.float32)" for p in params)
    ops = " ".join(op.replace("aten::", "") for op in region["ops"])
    return STARTER.format(
        ops=textwrap.fill(ops, 100, subsequent_indent="    "), model=model, share=region["share"],
        calls=region["calls"], module=module, type_name=type_name, expression=expression, loads=loads,
        pointers=", ".join(f"{p}_ptr" for p in params), params=", ".join(params),
        strides=", ".join(f"{p}_s{d}" for p in params for d in range(MAX_DIMS)),
        shapes=", ".join(f"{p}.shape" for p in params), first=params[0])
