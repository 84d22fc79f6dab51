'''The ModelNew starters that `python -m kernelbench setup` writes, for the triton and cuda backends.

A starter is a kernel file: docstring, KERNEL_TYPE, tunables and TUNABLES, a kernel to adapt, and
`class ModelNew` made from the problem's own Model: the same constructor (so the parameters carry
Model's names and shapes, and the harness can load Model's weights into them) and a forward that
raises NotImplementedError, with Model's forward kept beside it as comments (what to replace). The
problem's helper classes and functions, and the constants they use, are copied too. Evaluating a
starter as it is therefore fails at the smoke stage with a message that says what to write.
'''

from __future__ import annotations

import ast
import re

from kernelbench.problems import Problem, ProblemError

BACKENDS = ("triton", "cuda")
INPUT_HELPERS = ("get_inputs", "get_init_inputs")

HEADER = '''"""KernelBench @@KEY@@: ModelNew, @@BACKEND@@ kernels to beat the problem's Model.

@@SUMMARY@@

The reference is the problem's Model, in a read-only copy:
    @@PROBLEM_PATH@@
The harness builds Model and ModelNew with the same constructor arguments under one seed and loads
Model's weights into ModelNew (keep the parameter names and shapes), feeds both the problem's own
get_inputs() with fresh values for every check, and times ModelNew against eager Model and
torch.compile(Model), in @@DTYPE@@. Inside
forward PyTorch may only allocate, view and copy tensors; parameters may be read, not computed on:
every computation is a kernel of this file. Tolerance: atol = rtol = 1e-2 (KernelBench's) against
Model in float64.
"""
'''

TRITON_BODY = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl

KERNEL_TYPE = "@@TYPE@@"

BLOCK_SIZE = 1024  # elements per program
NUM_WARPS = 4  # warps per program

TUNABLES = {"BLOCK_SIZE": [256, 512, 1024, 2048, 4096], "NUM_WARPS": [1, 2, 4, 8]}


@triton.jit
def _elementwise_kernel(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    """out = x over a flat tensor, one BLOCK_SIZE piece per program: put the problem's math here."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x, mask=mask)


def _elementwise(x: torch.Tensor) -> torch.Tensor:
    """A launch to adapt: a fresh output, one program per BLOCK_SIZE elements."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _elementwise_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, out, n, BLOCK_SIZE=BLOCK_SIZE, num_warps=NUM_WARPS)
    return out
'''

CUDA_BODY = '''
import functools

import torch
import torch.nn as nn

from autokernel.cuda import cuda_build

KERNEL_TYPE = "@@TYPE@@"

THREADS = 256  # threads per block

TUNABLES = {"THREADS": [128, 256, 512, 1024]}

# Plain CUDA C++ after autokernel's prelude (the ak:: helpers); built by autokernel.cuda.cuda_build, which runs the
# harness's static check on it and caches the build on disk.
CUDA_SRC = r"""
__global__ void elementwise_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i];  // put the problem's math here
}

void elementwise_launch(int64_t x, int64_t out, int64_t n, int threads, int64_t stream) {
    int64_t blocks = (n + threads - 1) / threads;
    if (n > 0)
        elementwise_kernel<<<blocks, threads, 0, ak::as_stream(stream)>>>((const float*)x, (float*)out, n);
    ak::check_launch("elementwise_kernel");
}
"""
PROTOTYPES = ["void elementwise_launch(int64_t x, int64_t out, int64_t n, int threads, int64_t stream)"]


@functools.cache
def _module():
    return cuda_build.load("@@EXT_NAME@@", cuda_build.PRELUDE + CUDA_SRC, PROTOTYPES)


def _elementwise(x: torch.Tensor) -> torch.Tensor:
    """A launch to adapt: a fresh float32 output, THREADS per block."""
    if x.dtype != torch.float32 or not x.is_cuda:
        raise TypeError(f"expects a float32 CUDA tensor, got {x.dtype} on {x.device}")
    x = x.contiguous()
    out = torch.empty_like(x)
    _module().elementwise_launch(x.data_ptr(), out.data_ptr(), x.numel(), THREADS, cuda_build.stream_of(x))
    return out
'''


def _segment(lines: list[str], node: ast.AST) -> list[str]:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return lines[first - 1:node.end_lineno]


def _model_new(lines: list[str], cls: ast.ClassDef) -> list[str]:
    """Model's source renamed ModelNew, its forward's body turned into comments and a raise."""
    out = _segment(lines, cls)
    offset = min([cls.lineno] + [d.lineno for d in cls.decorator_list])
    forward = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if forward is None:
        raise ProblemError("the problem's Model has no forward method")
    start, end = forward.body[0].lineno, forward.end_lineno
    indent = " " * forward.body[0].col_offset
    if start == forward.lineno:  # `def forward(self, x): return ...` on one line
        head = f"{' ' * forward.col_offset}def forward({ast.unparse(forward.args)}):"
        out[start - offset] = head
        start += 1
    out = [re.sub(r"\bModel\b", "ModelNew", line).replace("super(ModelNew, self)", "super()") for line in out]
    body = ([f"{indent}# Model.forward, the PyTorch to replace with kernels:"]
            + [f"{indent}#     {line[len(indent):] if line.startswith(indent) else line.strip()}".rstrip()
               for line in lines[forward.body[0].lineno - 1:end]]
            + [f'{indent}raise NotImplementedError("ModelNew.forward is a skeleton: launch this file\'s kernels '
               f'here (see _elementwise)")'])
    out[start - offset:end - offset + 1] = body
    return out


def _helpers(tree: ast.Module, lines: list[str]) -> tuple[list[str], set[str]]:
    """The problem's other classes and functions, and the module-level names the copied code reads."""
    kept, used = [], set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name not in INPUT_HELPERS + ("Model",):
            kept += _segment(lines, node) + ["", ""]
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name not in INPUT_HELPERS:
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            local = {a.arg for n in ast.walk(node) if isinstance(n, ast.arguments)
                     for a in n.posonlyargs + n.args + n.kwonlyargs}
            used |= names - local
    return kept, used


def _constants(tree: ast.Module, lines: list[str], used: set[str]) -> list[str]:
    """Module-level assignments the copied code reads (a default argument, a helper's constant)."""
    kept = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in used for t in node.targets):
            kept += _segment(lines, node)
    return kept + ([""] if kept else [])


def summary(problem: Problem) -> str:
    """The first line of Model's docstring, else the problem's name."""
    try:
        tree = ast.parse(problem.code)
    except SyntaxError:
        return problem.name
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    doc = ast.get_docstring(cls) if cls else None
    return doc.strip().splitlines()[0].strip() if doc else problem.name.split("_", 1)[-1].replace("_", " ")


def render(problem: Problem, backend: str, kernel_type: str, problem_path: str, dtype: str = "fp32") -> str:
    """The starter kernel file of `problem` for `backend`."""
    if backend not in BACKENDS:
        raise ProblemError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    try:
        tree = ast.parse(problem.code)
    except SyntaxError as e:
        raise ProblemError(f"{problem.key}: syntax error line {e.lineno}: {e.msg}") from None
    lines = problem.code.splitlines()
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if cls is None:
        raise ProblemError(f"{problem.key} defines no class Model")
    helpers, used = _helpers(tree, lines)
    header = (HEADER.replace("@@KEY@@", problem.key).replace("@@BACKEND@@", "Triton" if backend == "triton"
                                                             else "CUDA C++")
              .replace("@@SUMMARY@@", summary(problem)).replace("@@PROBLEM_PATH@@", problem_path)
              .replace("@@DTYPE@@", dtype))
    body = (TRITON_BODY if backend == "triton" else CUDA_BODY).replace("@@TYPE@@", kernel_type)
    body = body.replace("@@EXT_NAME@@", "kb_" + re.sub(r"\W", "_", problem.key))
    parts = [header + body, "", *_constants(tree, lines, used), *helpers, *_model_new(lines, cls), ""]
    return "\n".join(parts)
