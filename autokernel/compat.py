"""Differences between Triton versions and between Triton's GPU backend and its CPU interpreter.

Every workaround for a moved API or an interpreter gap lives here, once. Nothing is patched at
import: the harness calls `prepare_interpreter()` in its child process when it runs on the CPU.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout autokernel/ lives in


def interpreting() -> bool:
    """True when Triton kernels run through the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def prepare_interpreter() -> None:
    """Make the interpreter compute what the GPU computes, where it does not on its own."""
    _patch_bf16_dot()


def _patch_bf16_dot() -> None:
    # The interpreter stores bfloat16 as uint16 and hands those raw bits to numpy's matmul, so a
    # tl.dot of two bf16 tiles multiplies integers (seen with triton 3.9). Upcast them to float32
    # first, as the tensor cores do (bf16 products are exact in fp32).
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    if getattr(builder.create_dot, "_autokernel_bf16", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        import triton.language as tl

        if a.dtype.scalar == tl.bfloat16:
            a = self.cast_impl(a, tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = self.cast_impl(b, tl.float32)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._autokernel_bf16 = True
    builder.create_dot = create_dot


def load_root_module(name: str):
    """A top-level module of the checkout (reference.py) when the checkout is not on sys.path: autokernel
    was pip-installed in editable mode and is imported from the user's own directory."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    if spec is None or not (ROOT / f"{name}.py").is_file():
        raise ModuleNotFoundError(f"no module named {name!r} (nor {ROOT / name}.py)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def has_triton_op() -> bool:
    """torch.library.triton_op and wrap_triton (torch >= 2.6): Triton kernels Inductor can trace into."""
    import torch

    return hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")


def native_compile_enabled() -> bool:
    """Kernels traced into Inductor's code under torch.compile; AUTOKERNEL_TRITON_OP=0 keeps them opaque ops."""
    return has_triton_op() and os.environ.get("AUTOKERNEL_TRITON_OP", "1") != "0"


def wrap_triton_enabled() -> bool:
    """False inside a triton_op called eagerly on real tensors (its kernels run as they are), True when traced."""
    from torch._library.triton import is_wrap_triton_enabled

    return is_wrap_triton_enabled()


def is_triton_kernel(value) -> bool:
    """A @triton.jit function, or one under @triton.autotune: what wrap_triton takes."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    return isinstance(value, (JITFunction, Autotuner))


# ------------------------------------------------------------------ cheap launches of compiled Triton kernels


FAST_LAUNCH_TRITON = (3, 2)  # from triton 3.2 a CompiledKernel is launched with every parameter, constexprs included


def replay_enabled() -> bool:
    """Launches replayed per input signature (autokernel/replay.py) where FastLaunch is on; AUTOKERNEL_REPLAY=0
    keeps FastLaunch alone."""
    return fast_launch_enabled() and os.environ.get("AUTOKERNEL_REPLAY", "1") != "0"


def fast_launch_enabled() -> bool:
    """FastLaunch for the kernels optimize() plugs in; AUTOKERNEL_FAST_LAUNCH=0 launches through Triton's own path."""
    import triton

    version = tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit())
    return (os.environ.get("AUTOKERNEL_FAST_LAUNCH", "1") != "0" and not interpreting()
            and version >= FAST_LAUNCH_TRITON)


class _Uncacheable(Exception):
    """An argument whose specialization this cache does not model (a TMA descriptor, ...): launch the slow way."""


class FastLaunch:
    """A @triton.jit kernel whose launches skip JITFunction.run's per-call work once a call pattern is known.

    JITFunction.run binds the arguments, computes their specialization (dtypes, 16-byte alignment, integer
    values of 1 or multiples of 16), hashes it into a cache key, evaluates the grid and only then launches:
    tens of microseconds of host time per call on an H200 host, against a few of GPU work for a norm at a
    model's shapes. Here the first call of a pattern goes through JITFunction.run, which compiles and returns
    the CompiledKernel; later calls whose key matches (tensor dtypes, devices and 16-byte alignment; exact
    integer and bool values; float types; TMA descriptors by base, shape, strides and block; constexpr and
    option values: a finer key than Triton's own, so a hit is never a kernel compiled for other arguments)
    launch that CompiledKernel straight through CompiledKernel[grid](*args), the launch path Triton keeps
    public across its 3.x versions (descriptors are expanded by its launcher, as on Triton's own path).
    """

    def __init__(self, kernel):
        import inspect

        self.kernel = kernel
        self.params = [(p.name, p.default) for p in inspect.signature(kernel.fn).parameters.values()]
        self.cache: dict = {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args, kwargs):
        try:
            key = (tuple(map(_arg_key, args)), tuple(sorted(kwargs.items())), grid)
            compiled = self.cache.get(key)
        except (_Uncacheable, TypeError):  # TypeError: an unhashable argument
            return self.kernel[grid](*args, **kwargs)
        if compiled is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if callable(getattr(compiled, "__getitem__", None)) and isinstance(grid, tuple):
                self.cache[key] = compiled
            return compiled
        launch_grid = (*grid, 1, 1)[:3]
        compiled[launch_grid](*args, *(kwargs.get(n, d) for n, d in self.params[len(args):]))
        return compiled


def is_host_descriptor(a) -> bool:
    """A host-side TMA descriptor (triton.tools.tensor_descriptor.TensorDescriptor and its kin)."""
    import torch

    return isinstance(getattr(a, "base", None), torch.Tensor) and hasattr(a, "block_shape")


def _arg_key(a):
    import torch

    if isinstance(a, torch.Tensor):
        return a.dtype, a.device.index, a.data_ptr() % 16 == 0
    if isinstance(a, float):
        return float  # not specialized on its value: eps and scales change without a recompile
    if a is None or isinstance(a, (int, bool, str)):
        return type(a), a
    if is_host_descriptor(a):
        return (type(a), _arg_key(a.base), tuple(a.shape), tuple(a.strides), tuple(a.block_shape),
                getattr(a, "padding", None))
    raise _Uncacheable(type(a).__name__)


# ------------------------------------------------------------------ launches replayed straight (autokernel/replay.py)


def is_jit_kernel(value) -> bool:
    """A plain @triton.jit function: what replay.py records launches of (an autotuned one is not)."""
    from triton.runtime.jit import JITFunction

    return isinstance(value, JITFunction)


def raw_launcher(compiled) -> tuple | None:
    """(launcher, function, packed metadata) of a CompiledKernel: from triton 3.2 its launcher is called as
    run(grid x, y, z, stream, function, packed metadata, launch metadata, enter hook, exit hook, *every argument),
    constexprs included (CompiledKernel.__getitem__'s own call, unchanged through 3.9). None before 3.2."""
    if _triton_version() < FAST_LAUNCH_TRITON:
        return None
    try:
        return compiled.run, compiled.function, compiled.packed_metadata
    except AttributeError:
        return None


def launch_arguments(kernel, args: tuple, kwargs: dict) -> list:
    """Every parameter of a @triton.jit kernel as its launcher takes them, in order, defaults applied; launch
    options (num_warps, num_stages, ...) are not parameters and are left out (they are in the metadata)."""
    import inspect

    params = inspect.signature(kernel.fn).parameters
    bound = inspect.signature(kernel.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in params})
    bound.apply_defaults()
    return list(bound.arguments.values())


def raw_stream(device: int) -> int:
    """The current CUDA stream of a device as the launcher takes it (0 on the CPU)."""
    import torch

    return torch._C._cuda_getCurrentRawStream(device) if device >= 0 else 0


@functools.cache
def _hook_owner():
    """Where Triton keeps its launch hooks: triton.knobs.runtime from 3.4, CompiledKernel before."""
    try:
        from triton import knobs

        return knobs.runtime
    except ImportError:
        from triton.compiler.compiler import CompiledKernel

        return CompiledKernel


def launch_hooks_set() -> bool:
    """A launch hook is set (a profiler such as proton): launches must go through Triton's own path."""
    owner = _hook_owner()
    hooks = (getattr(owner, "launch_enter_hook", None), getattr(owner, "launch_exit_hook", None))
    return any(bool(h.calls) if hasattr(h, "calls") else h is not None for h in hooks)


@contextlib.contextmanager
def count_launches():
    """Counts the Triton launches made inside, by Triton's launch-enter hook: yields [count], or None when another
    hook is set already (3.4's single hook) and cannot be shared."""
    counter = [0]

    def hook(*_):
        counter[0] += 1

    owner = _hook_owner()
    current = getattr(owner, "launch_enter_hook", None)
    if hasattr(current, "add"):  # a HookChain (triton >= 3.5)
        current.add(hook)
        try:
            yield counter
        finally:
            current.remove(hook)
    elif current is None:
        owner.launch_enter_hook = hook
        try:
            yield counter
        finally:
            owner.launch_enter_hook = None
    else:
        yield None


def _triton_version() -> tuple:
    import triton

    return tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit())
