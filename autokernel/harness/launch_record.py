"""What a kernel_fn puts on the GPU, as one digest: two files with equal digests run the same GPU work.

The loop benches every change an agent makes, and most changes of a tunable touch a path the model's shapes
never take (a looped variant's chunk size where the single pass runs): the same kernels launch, and any
difference in their timing is noise, which a keep on one slow baseline turns into a false win (docs/loop.md). So the
harness records, per input set, what one call does:
- every Triton launch through the kernel file's own @triton.jit names (rebound as replay.py records them):
  the kernel's source (with its @triton.jit helpers: Triton's cache key), its compiled variant where Triton
  compiled one (constexprs, warps, stages, specialization), the grid, and each argument: a tensor by dtype,
  shape, strides and 16-byte alignment, anything else by value;
- every torch op it runs (a TorchDispatchMode): its name and its arguments described the same way.
The digest is None, and the candidate is timed as usual, when a launch escapes the record: a kernel reached
another way (Triton's own launch counter sees more launches than were recorded), an autotuned kernel, a grid
Triton computes, an argument of a kind not described here. (Under Triton's interpreter there is no launch
counter: there the record trusts the file's own names.) An equal digest only ever makes the loop revert
without timing (the change cannot be faster), so a file that fakes its digest gains nothing.
"""

from __future__ import annotations

import functools
import hashlib
import inspect

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from autokernel import compat


class Unrecorded(Exception):
    """Something a call did is not captured by the record."""


def digest(kernel_fn, input_sets: list[tuple]) -> str | None:
    """The digest of what kernel_fn runs on each of input_sets (see the module docstring), or None."""
    from autokernel.ops import launchers

    if any(_tuned(v) for v in getattr(kernel_fn, "__globals__", {}).values()):
        return None  # which configuration it launches is decided at run time, outside the record
    record = _Record()
    launch = functools.partial(_launch, record)
    recording = launchers.rebound(kernel_fn, compat.is_jit_or_interpreted,
                                  lambda kernel: launchers.Intercepted(kernel, launch))
    if recording is None:
        return None
    try:
        for inputs in input_sets:
            before = len(record)
            with compat.count_launches() as counted, _Ops(record):
                recording(*inputs)
            if counted is None:
                raise Unrecorded("a launch hook is set: launches cannot be counted")
            if not compat.interpreting() and counted[0] != sum(1 for r in record[before:] if r[0] == "launch"):
                raise Unrecorded("a launch not through the file's own @triton.jit names")
            record.append(("end of call",))
    except Unrecorded:
        return None
    return hashlib.sha256(repr(record).encode()).hexdigest()[:24]


class _Record(list):
    """The entries of the record; `launching` is set while a launch runs (the interpreter's own torch ops are
    not the kernel file's)."""

    launching = False


def _launch(record: _Record, kernel, grid, args: tuple, kwargs: dict):
    """kernel[grid](*args, **kwargs), appended to the record."""
    if not (isinstance(grid, tuple) and all(isinstance(g, int) for g in grid)):
        raise Unrecorded("a grid Triton computes")
    record.launching = True
    try:
        compiled = kernel[grid](*args, **kwargs)
    finally:
        record.launching = False
    record.append(("launch", _source(kernel), grid, [_describe(a) for a in args],
                   sorted((k, _describe(v)) for k, v in kwargs.items()), getattr(compiled, "hash", None)))
    return compiled


def _tuned(value) -> bool:
    """An @triton.autotune or @triton.heuristics kernel (a Triton kernel that is not a plain one)."""
    from triton.runtime.jit import KernelInterface

    return isinstance(value, KernelInterface) and not compat.is_jit_or_interpreted(value)


def _source(kernel) -> str:
    """Triton's cache key (the source with its @triton.jit helpers'), or the source under the interpreter."""
    key = getattr(kernel, "cache_key", None)
    return key if isinstance(key, str) else inspect.getsource(kernel.fn)


class _Ops(TorchDispatchMode):
    def __init__(self, record: _Record):
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.record.launching:
            flat, _ = tree_flatten((args, kwargs or {}))
            self.record.append(("op", str(func), [_describe(a, strict=False) for a in flat]))
        return func(*args, **(kwargs or {}))


def _describe(value, strict: bool = True):
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.stride(), value.device.type,
                value.data_ptr() % 16 if value.device.type != "meta" else None)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return (type(value).__name__, str(value))
    base = getattr(value, "base", None)
    if isinstance(base, torch.Tensor):  # a host TMA descriptor: what it points at and how it tiles it
        return ("descriptor", _describe(base), *(tuple(getattr(value, n, ())) for n in ("shape", "strides",
                                                                                         "block_shape")))
    if strict:
        raise Unrecorded(f"an argument of kind {type(value).__name__}")
    return (type(value).__name__,)
