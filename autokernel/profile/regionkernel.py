"""A region as code: its subgraph as a reference function, and a plain Triton kernel that computes it.

A region (autokernel/profile/regions.py) is the post-grad nodes of one kernel Inductor made. Cut out of the graph,
with a placeholder for each tensor it reads, it is a function of those tensors: written as Python (torch.ops.aten
calls, the GraphModule's own code) it is the region's reference, run on float64 inputs as the oracle. Casts are
left out of it (prims.convert_element_type becomes its input): the oracle computes in float64, and a kernel in the
dtype of its inputs with an fp32 accumulator.

The starter is generated from the same nodes. A region of elementwise ops (POINTWISE) on tensors that broadcast to
the output, up to four dimensions, gets one program per BLOCK elements of the output, each input loaded through its
broadcast strides. A region that also reduces over the last dimension (REDUCTIONS: a norm, a softmax's max and
sum) gets a program per block of rows (or programs that loop over the blocks: PER_SM), the rows in registers, a
weight of one row read once per program. A region may have several outputs (a residual stream and its norm), each
rows or one value per row. The math is fp32, the results stored in the output's dtype. Regions with other ops get
no starter yet (extract.py says which op).
"""

from __future__ import annotations

import numbers
import textwrap

import torch

MAX_DIMS = 4
MAX_OUTPUTS = 4
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
    become their input unless `casts`. The outputs are the nodes whose values leave the region (the last one, if
    none does): one tensor, or a tuple of them (a residual stream and its norm)."""
    graph, env, reads = torch.fx.Graph(), {}, []
    nodes = _with_items(nodes)
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
    leaving = [n for n in nodes if any(u.name not in inside for u in n.users)] or nodes[-1:]
    if len(leaving) > MAX_OUTPUTS:
        raise ValueError(f"the region has {len(leaving)} outputs; at most {MAX_OUTPUTS} are supported")
    graph.output(env[leaving[0].name] if len(leaving) == 1 else tuple(env[n.name] for n in leaving))
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(torch.nn.Module(), graph), reads


def _with_items(nodes: list) -> list:
    """The nodes with the getitems that take apart their tuples (var_mean's variance and mean), each after its
    tuple: a fused kernel's origins leave them out, and a tuple whose items are read inside is no output."""
    inside, out = {n.name for n in nodes}, []
    for n in nodes:
        out += [n, *(u for u in n.users if op_name(u) == "getitem" and u.name not in inside)]
    return out


def reference_source(nodes: list, name: str = "reference", casts: bool = False) -> tuple[str, list]:
    """(`def reference(in0, ...)`: the region's subgraph as Python, the nodes whose values are in0, ...); with
    casts, the subgraph as the model computes it (the pattern deploy looks for), under `name`."""
    module, reads = subgraph(nodes, casts)
    code = module.code.strip().replace("def forward(self, ", f"def {name}(", 1)
    return "\n".join(line.rstrip() for line in code.splitlines() if line.strip()) + "\n", reads


def reference_of(code: str):
    """The `reference` function a region's code (reference_source) defines."""
    namespace = {"torch": torch, "device": torch.device, "inf": float("inf"), "nan": float("nan")}  # as printed
    exec(compile(code, "<region>", "exec"), namespace)  # noqa: S102  (our own generated code)
    return namespace["reference"]


REDUCTIONS = {"sum", "mean", "var_mean", "amax", "amin"}  # over the last dimension: a row kernel's


def statements(code: str, rank: int = MAX_DIMS) -> tuple[list[str], list[str], list[str], bool]:
    """(the reference's parameters, the Triton statements that compute it, the variables of its outputs, whether it
    reduces over rows) for a reference made of POINTWISE ops and REDUCTIONS over the last dimension of its
    rank-dimensional rows; a ValueError naming what is not."""
    try:
        traced = torch.fx.symbolic_trace(reference_of(code))
    except Exception as e:  # ops that make tensors of their own on a device this machine lacks (iota on a GPU)
        raise ValueError(f"its code does not trace here ({type(e).__name__}: {str(e).splitlines()[0]})") from e
    values, params, lines, reduces = {}, [], [], False
    seen = {}  # what a statement computes -> its variable: the same math twice (two norms of one sum) computed once
    for n in traced.graph.nodes:
        if n.op == "placeholder":
            params.append(n.name)
            values[n.name] = f"x_{n.name}"
        elif n.op == "call_function" and op_name(n) == "getitem":
            values[n.name] = values[n.args[0].name][n.args[1]]
        elif n.op == "call_function" and op_name(n) in REDUCTIONS:
            reduces = True
            key = (op_name(n), values[n.args[0].name], repr(n.args[1:]), repr(n.kwargs))
            values[n.name] = seen[key] if key in seen else seen.setdefault(key, _reduction(n, values, lines, rank))
        elif n.op == "call_function":
            expression = _expression(n, values)
            if expression not in seen:
                lines.append(f"v{len(lines)} = {expression}")
                seen[expression] = f"v{len(lines) - 1}"
            values[n.name] = seen[expression]
        elif n.op == "get_attr":  # a tensor the code made of its own (an iota, a mask): not an input's element
            raise ValueError("it makes tensors of its own (an index or a mask), which a starter does not compute")
        elif n.op == "output":
            results = n.args[0] if isinstance(n.args[0], (tuple, list)) else (n.args[0],)
            return params, lines, [values[r.name] for r in results], reduces
    raise ValueError("the reference has no output")


def _reduction(node, values: dict, lines: list, rank: int) -> str | tuple:
    """The statements of a reduction over a row's last dimension (masked columns left out); its variable, or a
    (variance, mean) pair for var_mean."""
    name, x = op_name(node), values[node.args[0].name]
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if not isinstance(dims, (list, tuple)) or len(dims) != 1 or dims[0] not in (-1, rank - 1):
        raise ValueError(f"{name} over {dims}: only a reduction over the last dimension is supported")
    total = f"tl.sum(tl.where(mask, {x}, 0.0), axis=1)[:, None]"  # kept [ROWS, 1]: it broadcasts over the row
    k = len(lines)
    if name == "sum":
        lines.append(f"v{k} = {total}")
    elif name == "mean":
        lines.append(f"v{k} = {total} / N")
    elif name in ("amax", "amin"):
        fill = "-inf" if name == "amax" else "inf"
        lines.append(f"v{k} = tl.{name[1:]}(tl.where(mask, {x}, float('{fill}')), axis=1)[:, None]")
    else:  # var_mean
        correction = node.kwargs.get("correction", 1)
        lines.append(f"v{k} = {total} / N")
        lines.append(f"v{k + 1} = tl.where(mask, {x} - v{k}, 0.0)")
        lines.append(f"v{k + 2} = tl.sum(v{k + 1} * v{k + 1}, axis=1)[:, None] / (N - {float(correction)!r})")
        return (f"v{k + 2}", f"v{k}")
    return f"v{k}"


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
One program per BLOCK elements of the output, the math in fp32. Where every input is laid out as the output
(contiguous, nothing broadcast: the usual call) each is read at the output's own offsets; otherwise through its
broadcast strides, four index divisions per element. Offsets are 32-bit below 2**31 elements.
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
def _region({outputs}, {pointers}, n, S1, S2, S3, {strides}, BLOCK: tl.constexpr, FLAT: tl.constexpr,
            WIDE: tl.constexpr):
    pid = tl.program_id(0)
    if WIDE:  # more elements than 32-bit offsets reach
        pid = pid.to(tl.int64)
    flat = pid * BLOCK + tl.arange(0, BLOCK)
    mask = flat < n
    if FLAT:  # every input laid out as the output
{flat_loads}
    else:
        i3 = flat % S3
        rest = flat // S3
        i2 = rest % S2
        rest = rest // S2
        i1 = rest % S1
        i0 = rest // S1
{loads}
{body}
{stores}


def _strides(x, shape):
    """x's strides broadcast to `shape` (0 along a broadcast dimension), padded to four dimensions."""
    strides = list(x.expand(shape).stride())
    return [0] * (4 - len(strides)) + strides


def kernel_fn({params}):
    shape = torch.broadcast_shapes({shapes})
    outs = [torch.empty(shape, dtype={first}.dtype, device={first}.device) for _ in range({n_outputs})]
    sizes = [1] * (4 - len(shape)) + list(shape)
    strides = [s for x in ({params},) for s in _strides(x, shape)]
    flat = all(x.shape == shape and x.stride() == outs[0].stride() for x in ({params},))
    n = outs[0].numel()
    _region[(triton.cdiv(n, BLOCK),)](*outs, {params}, n, sizes[1], sizes[2], sizes[3], *strides, BLOCK=BLOCK,
                                     FLAT=flat, WIDE=n + BLOCK >= 2**31, num_warps=NUM_WARPS)
    return {returned}
'''


ROW_STARTER = '''"""A region kernel of {model}: {share:.1%} of its compiled forward, {calls:g} calls.

It computes {ops}.
Written by extract.py from the region's subgraph; workspace/regions/{module}.py holds its reference, read-only.
ROWS rows of the output at a time, in registers: the reductions over each row, then the elementwise math, in fp32.
One program per ROWS rows, or (PER_SM > 0) PER_SM programs per SM, each looping over blocks of rows with its
weight rows loaded once: fewer, longer programs keep more loads in flight where the rows are few.
Inductor's own kernel for the region is what to beat (the baseline torch.compile makes of it).
"""

import functools

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "{type_name}"

ROWS = 1  # rows a program holds at a time: more share a weight row's load and make fewer, larger programs
PER_SM = 0  # 0: one program per ROWS rows; k: k programs per SM, each looping over blocks of rows
NUM_WARPS = 4
TUNABLES = {{"ROWS": [1, 2, 4, 8], "PER_SM": [0, 2, 4, 8], "NUM_WARPS": [1, 2, 4, 8, 16]}}


@triton.jit
def _region({outputs}, {pointers}, M, N, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)[None, :]
{col_loads}
    for block in tl.range(tl.program_id(0), tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows = (block * ROWS + tl.arange(0, ROWS)[:, None]).to(tl.int64)  # 64-bit offsets: rows * N
        in_rows = rows < M
        mask = in_rows & (cols < N)
        offs = rows * N + cols
{loads}
{body}
{stores}


def _programs(blocks, device):
    """The grid: a program per block of rows, or PER_SM programs per SM (one SM where there is no GPU)."""
    return blocks if PER_SM == 0 else min(blocks, PER_SM * _sm_count(device))


@functools.cache
def _sm_count(device):  # once per device: the query costs host time on every call
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def kernel_fn({params}):
    rows = {row}.shape
    outs = [torch.empty(shape, dtype={first}.dtype, device={first}.device) for shape in ({allocs})]
    n = rows[-1]
    m = {row}.numel() // n
    _region[(_programs(triton.cdiv(m, ROWS), {row}.device),)](*outs, {arguments}, m, n, ROWS=ROWS,
                                                            BLOCK_N=triton.next_power_of_2(n), num_warps=NUM_WARPS)
    return {returned}
'''
STORES = {"row": "offs, {r}, mask=mask", **dict.fromkeys(("per_row", "per_row_keep"), "rows, {r}, mask=in_rows")}
ALLOCS = {"row": "rows", "per_row": "rows[:-1]", "per_row_keep": "(*rows[:-1], 1)"}  # each output's shape
LOADS = {"row": "tl.load({p}_ptr + offs, mask=mask, other=0.0)",
         "col": "tl.load({p}_ptr + cols, mask=cols < N, other=0.0)",
         "per_row": "tl.load({p}_ptr + rows, mask=in_rows, other=0.0)"}


def starter_source(region: dict, type_name: str, module: str, model: str) -> str:
    """The Triton starter of an elementwise region, or of one that reduces over its rows' last dimension (a
    ValueError saying why there is none for another)."""
    if not region.get("code"):
        raise ValueError("the region could not be cut out of its graph")
    shapes = [i["shape"] for i in region["inputs"]]
    if any(len(shape) > MAX_DIMS for shape in shapes):
        raise ValueError(f"an input has more than {MAX_DIMS} dimensions")
    params, lines, results, reduces = statements(region["code"], max(len(shape) for shape in shapes))
    ops = " ".join(op.replace("aten::", "") for op in region["ops"])
    common = dict(ops=textwrap.fill(ops, 100, subsequent_indent="    "), model=model, share=region["share"],
                  calls=region["calls"], module=module, type_name=type_name, n_outputs=len(results),
                  body="\n".join(f"    {line}" for line in lines), params=", ".join(params), first=params[0],
                  pointers=", ".join(f"{p}_ptr" for p in params),
                  outputs=", ".join(f"out{k}_ptr" for k in range(len(results))),
                  stores="\n".join(f"    tl.store(out{k}_ptr + flat, {r}.to(out{k}_ptr.dtype.element_ty), mask=mask)"
                                   for k, r in enumerate(results)),
                  returned="outs[0]" if len(results) == 1 else "tuple(outs)")
    if reduces:
        kinds, row, written = row_layout(region["code"], params, shapes)

        def load(p: str, indent: str) -> str:
            return f"{indent}x_{p} = {LOADS[kinds[p]].format(p=p)}.to(tl.float32)"

        col_loads = "\n".join(load(p, "    ") for p in params if kinds[p] == "col")  # once a program
        loads = "\n".join(load(p, "        ") for p in params if kinds[p] != "col")
        arguments = ", ".join(f"{p}.contiguous()" for p in params)
        stores = "\n".join(f"        tl.store(out{k}_ptr + "
                           + STORES[kind].format(r=f"{r}.to(out{k}_ptr.dtype.element_ty)") + ")"
                           for k, (r, kind) in enumerate(zip(results, written)))
        allocs = "".join(f"{ALLOCS[kind]}, " for kind in written)
        body = "\n".join(f"        {line}" for line in lines)
        return ROW_STARTER.format(**{**common, "stores": stores, "body": body}, col_loads=col_loads, loads=loads,
                                  row=row, arguments=arguments, allocs=allocs)
    loads = "\n".join(f"        x_{p} = tl.load({p}_ptr + i0 * {p}_s0 + i1 * {p}_s1 + i2 * {p}_s2 + i3 * {p}_s3, "
                      "mask=mask, other=0.0).to(tl.float32)" for p in params)
    flat_loads = "\n".join(f"        x_{p} = tl.load({p}_ptr + flat, mask=mask, other=0.0).to(tl.float32)"
                           for p in params)
    strides = ", ".join(f"{p}_s{d}" for p in params for d in range(MAX_DIMS))
    return STARTER.format(**common, loads=loads, flat_loads=flat_loads, strides=strides,
                          shapes=", ".join(f"{p}.shape" for p in params))


def row_layout(code: str, params: list[str], shapes: list[list[int]]) -> tuple[dict[str, str], str, list[str]]:
    """({parameter: "row", "col" or "per_row"}, a parameter of the rows' shape, each output's kind) for a row kernel:
    the outputs are rows of N or a value per row, and each input is rows of N (the widest output's shape), one row
    of N (a weight) or one value per row; a ValueError otherwise."""
    made = reference_of(code)(*(torch.empty(shape, device="meta") for shape in shapes))
    made = made if isinstance(made, tuple) else (made,)
    out = max((m.shape for m in made), key=len)  # the rows the kernel runs over: the widest output's
    n, rows = out[-1], out.numel() // max(out[-1], 1)
    written = [_output_kind(list(m.shape), list(out)) for m in made]
    kinds = {}
    for p, shape in zip(params, shapes):
        numel = torch.Size(shape).numel()
        if list(shape) == list(out):
            kinds[p] = "row"
        elif shape and shape[-1] == n and numel == n:
            kinds[p] = "col"
        elif shape and shape[-1] == 1 and numel == rows:
            kinds[p] = "per_row"
        else:
            raise ValueError(f"input {p} of shape {shape} is neither rows of {n}, one row nor one value per row")
    row = next((p for p in params if kinds[p] == "row"), None)
    if row is None:
        raise ValueError(f"no input has the output's shape {list(out)}")
    return kinds, row, written


def _output_kind(shape: list[int], rows: list[int]) -> str:
    """How a row kernel writes an output: whole rows, or one value per row (with its reduced dimension kept or
    not); a ValueError for another shape."""
    for kind, like in (("row", rows), ("per_row_keep", [*rows[:-1], 1]), ("per_row", rows[:-1])):
        if shape == like:
            return kind
    raise ValueError(f"an output of shape {shape} is neither rows of {rows} nor one value per row")
