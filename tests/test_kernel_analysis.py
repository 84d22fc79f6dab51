"""compat.memoize_kernel_analysis: torch's write analysis of a traced Triton launch, once per kernel and arguments."""

import torch
import torch._higher_order_ops.triton_kernel_wrap as wrap
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from autokernel import compat
from autokernel.compat import tracing


def counting_analysis(monkeypatch, holder=None):
    """torch's analysis (under whichever name this torch has) replaced by one that counts its calls and answers
    the written tensors' names, held by `holder` too if given (a module that imported it by name); then memoized
    as customops memoizes it."""
    name = next(n for n in tracing.ANALYSES if hasattr(wrap, n))
    calls = []

    def analysis(kernel, kwargs, tma_metadata):
        calls.append(kernel)
        return [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and k.startswith("out")]

    analysis.__name__ = name
    monkeypatch.setattr(wrap, name, analysis)
    if holder is not None:
        setattr(holder, name, analysis)
    compat.memoize_kernel_analysis()
    compat.memoize_kernel_analysis()  # twice: still one memo around the analysis
    return getattr(wrap, name), calls


def test_each_layer_s_launch_is_analysed_once(monkeypatch):
    analyse, calls = counting_analysis(monkeypatch)
    kernel = object()
    for _ in range(22):  # a decoder's layers launch the same kernel with the same arguments
        got = analyse(kernel, {"x": torch.empty(4, 8), "out": torch.empty(4, 8), "n": 8, "BLOCK": 64}, {})
    assert got == ["out"] and len(calls) == 1
    got.append("spoiled")  # what a caller does with its answer never reaches the next caller
    assert analyse(kernel, {"x": torch.empty(4, 8), "out": torch.empty(4, 8), "n": 8, "BLOCK": 64}, {}) == ["out"]


def test_what_can_change_the_answer_is_analysed_again(monkeypatch):
    analyse, calls = counting_analysis(monkeypatch)
    kernel, other = object(), object()
    base = {"x": torch.empty(4, 8), "out": torch.empty(4, 8), "n": 8, "BLOCK": 64}
    analyse(kernel, base, {})
    analyse(other, base, {})  # another kernel
    analyse(kernel, {**base, "BLOCK": 128}, {})  # another compile-time constant
    analyse(kernel, {**base, "x": torch.empty(4, 8, dtype=torch.float16)}, {})  # another dtype
    analyse(kernel, {**base, "x": torch.empty(32)}, {})  # another rank
    analyse(kernel, {**base, "out": 3}, {})  # a scalar where a tensor was
    assert len(calls) == 6
    analyse(kernel, {**base, "x": torch.empty(9, 9)}, {})  # only the sizes differ: the same code, the same answer
    assert len(calls) == 6


def test_a_module_that_imported_the_analysis_by_name_calls_the_memo(monkeypatch):
    """Inductor's IR may hold torch's analysis under its own name, imported before the memo: it gets the memo too,
    or every layer's launch is analysed again there."""
    import sys
    import types as pytypes

    holder = pytypes.ModuleType("torch._autokernel_test_holder")
    monkeypatch.setitem(sys.modules, holder.__name__, holder)
    analyse, calls = counting_analysis(monkeypatch, holder)
    kernel = object()
    for _ in range(4):
        getattr(holder, analyse.__name__)(kernel, {"x": torch.empty(2)}, {})
    assert len(calls) == 1 and getattr(holder, analyse.__name__) is analyse


def _store(x_ptr, N: tl.constexpr):
    tl.store(x_ptr, N)


def _store_twice(x_ptr, N: tl.constexpr):
    tl.store(x_ptr, N)
    tl.store(x_ptr + 1, N)


def test_one_kernel_in_two_objects_is_analysed_once(monkeypatch):
    """torch hands the analysis a different kernel object for one @triton.jit function from layer to layer: the
    memo knows the kernel by what it compiles, and a kernel with other code is analysed afresh."""
    analyse, calls = counting_analysis(monkeypatch)
    args = {"x_ptr": torch.empty(4), "N": 8}
    for _ in range(3):
        analyse(JITFunction(_store), dict(args), {})  # what @triton.jit makes outside the interpreter
    assert len(calls) == 1
    analyse(JITFunction(_store_twice), dict(args), {})
    assert len(calls) == 2
    # torch wraps a launch that passes num_warps in an autotuner of one config, a new one per launch
    for _ in range(3):
        analyse(triton.autotune([triton.Config({}, num_warps=4)], key=[])(JITFunction(_store)), dict(args), {})
    assert len(calls) == 3
    analyse(triton.autotune([triton.Config({}, num_warps=8)], key=[])(JITFunction(_store)), dict(args), {})
    assert len(calls) == 4  # another config
