"""How a plugged-in kernel_fn launches its Triton kernels: cheaply when called eagerly, visibly when traced.

Both are copies of the kernel file's functions over a namespace in which each kernel is wrapped
(`rebound`); the kernel file's own module is left as it is, so the harness, which imports the file
itself, times exactly what the agent wrote. `fast`: each @triton.jit kernel behind compat.FastLaunch,
a cached CompiledKernel per call pattern (a few microseconds of host time per launch instead of
JITFunction.run's tens), and the whole call replayed per input signature where it can be (replay.py).
`traceable`: each kernel behind torch.library.wrap_triton, for the triton_op that torch.compile traces
(customops).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable

import torch

from autokernel import compat
from autokernel.ops import replay


def traceable(kernel_fn: Callable) -> Callable | None:
    """kernel_fn as torch.compile can trace it: its @triton.jit kernels wrapped by torch.library.wrap_triton, so
    that under FakeTensors a launch records the kernel and its arguments (Inductor then launches it from its
    own code) and on real tensors runs it as is. Done here rather than in the kernel file so that kernel files
    stay plain Triton (the harness calls them eagerly, where wrap_triton's dispatch would cost host time).
    None when the file launches no @triton.jit kernel (a CUDA C++ kernel): that type stays an opaque op."""
    if compat.interpreting():  # the interpreter's kernels cannot be traced
        return None
    return rebound(kernel_fn, compat.is_triton_kernel, _traced, settings=TRACED_SETTINGS)


# Module constants the traced copy takes in place of the file's, where the file has them. DESCRIPTORS: host TMA
# descriptors cannot be traced (_traced), so a file that can make them on the device does so under torch.compile,
# and Inductor launches its kernel from its own code instead of an opaque op's Python dispatch on every call (an
# opaque op made a compiled model without graphs slower than torch.compile alone). Eagerly the file's own choice
# stands: device descriptors cost kernel time there.
TRACED_SETTINGS = {"DESCRIPTORS": "device"}


class NotTraceable(Exception):
    """A launch Inductor would misread: the caller falls back to the opaque op."""


def _traced(kernel):
    """kernel behind wrap_triton, refusing host TMA descriptors: torch (2.11) traces a launch that takes one
    without knowing which tensor the kernel writes through it (`identify_mutated_tensors` fails on the
    descriptor), so the compiled model dropped the kernel's output (a fused MLP looked far faster than
    torch.compile because its output was never written)."""
    wrapped = torch.library.wrap_triton(kernel)

    class Launch:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                if any(compat.is_host_descriptor(a) for a in (*args, *kwargs.values())):
                    raise NotTraceable(f"{getattr(kernel, '__name__', kernel)} takes a host TMA descriptor")
                return wrapped[grid](*args, **kwargs)
            return launch

    return Launch()


def fast(kernel_fn: Callable) -> Callable:
    """kernel_fn with its @triton.jit kernels launched through compat.FastLaunch (a cached CompiledKernel per
    call pattern); kernel_fn itself in the interpreter or with AUTOKERNEL_FAST_LAUNCH=0."""
    if not compat.fast_launch_enabled():
        return kernel_fn
    quick = rebound(kernel_fn, compat.is_jit_kernel, compat.FastLaunch)
    if quick is None:  # no Triton kernel: a CUDA C++ file
        return kernel_fn
    if not compat.replay_enabled() or any(getattr(v, "__name__", "") == "autokernel.cuda.cuda_build"
                                          for v in kernel_fn.__globals__.values()):
        return quick
    return replay.Replayed(kernel_fn, quick)


class Intercepted:
    """A kernel whose launches, kernel[grid](*args, **kwargs), go through launch(kernel, grid, args, kwargs) instead;
    everything else (kernel.fn, kernel.run, ...) is the kernel's. What replay.py and launch_record.py record with."""

    def __init__(self, kernel, launch: Callable):
        self._kernel, self._launch = kernel, launch

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(self._kernel, grid, args, kwargs)

    def __getattr__(self, name):
        return getattr(self._kernel, name)


def rebound(kernel_fn: Callable, is_kernel: Callable, wrap: Callable, settings: dict | None = None) -> Callable | None:
    """A copy of kernel_fn's module functions over a namespace in which every kernel (is_kernel) is wrap(kernel)
    and each of `settings` the module defines takes the value given; the kernel file's module is left as it is.
    None when the module holds no such kernel."""
    namespace = kernel_fn.__globals__
    kernels = {n: v for n, v in namespace.items() if is_kernel(v)}
    if not kernels:
        return None
    copy = dict(namespace)
    copy.update({n: wrap(v) for n, v in kernels.items()})
    copy.update({n: v for n, v in (settings or {}).items() if n in namespace})
    for n, v in namespace.items():
        if inspect.isfunction(v) and v.__globals__ is namespace:  # the file's own helpers, not imported ones
            rebuilt = types.FunctionType(v.__code__, copy, v.__name__, v.__defaults__, v.__closure__)
            rebuilt.__kwdefaults__ = v.__kwdefaults__
            copy[n] = rebuilt
    return copy.get(kernel_fn.__name__)
