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
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout autokernel/ lives in


def interpreting() -> bool:
    """True when Triton kernels run through the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def prepare_interpreter() -> None:
    """Make the interpreter compute what the GPU computes, where it does not on its own, and patch the language
    once per launch."""
    _patch_bf16_dot()
    _patch_scalar_index()
    _patch_lang_once_per_launch()


def _patch_lang_once_per_launch() -> None:
    # The interpreter swaps triton.language's builtins for interpreted ones when a kernel is launched, and
    # restores them when the launch ends. It swaps them again on every call of a @triton.jit helper from inside
    # the kernel (triton 3.6 and 3.9: a scan of every member of tl, tl.core, tl.math and tl.tensor, about a
    # millisecond), though nothing is left to swap: the optimized tiny LLaMA's forward in a CPU verify.py took
    # 1.48 s with it, 1.04 s without. Inside a launch, a helper whose module sees no language module the launch's
    # kernel did not is called as it is.
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter as interp

    original = getattr(interp, "_patch_lang", None)
    if original is None or not hasattr(interp, "_LangPatchScope") or getattr(original, "_autokernel_once", False):
        return
    launch: dict = {}  # "langs": the language modules the running launch swapped

    def patch_lang(fn):
        langs = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}
        if "langs" in launch:  # a helper called inside a launch
            if langs <= launch["langs"]:
                return interp._LangPatchScope()
            launch["langs"] |= langs
            return original(fn)
        scope = original(fn)
        launch["langs"] = langs
        restore = scope.restore

        def end_of_launch():
            launch.pop("langs", None)
            restore()

        scope.restore = end_of_launch
        return scope

    patch_lang._autokernel_once = True
    interp._patch_lang = patch_lang


def _patch_scalar_index() -> None:
    # A scalar argument reaches the interpreter as a one-element array; triton 3.6 turns it into a Python int
    # with int(array), which recent numpy (2.4 here) refuses for an array of one dimension: `range(0, n)` over
    # an argument n == 1 fails. Triton 3.9 squeezes the array first, as this does.
    from triton.runtime import interpreter as interp

    original = getattr(interp, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_autokernel_index", False):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor._autokernel_index = True
    interp._patch_lang_tensor = patch_lang_tensor


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


def recompile_limit_option() -> str:
    """The name of dynamo's limit on compiled entries per code object: recompile_limit (torch >= 2.6), before it
    cache_size_limit."""
    import torch._dynamo.config as config

    return "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"


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

# How a CompiledKernel is launched, read from each release's source (compiler/compiler.py CompiledKernel.__getitem__,
# runtime/jit.py JITFunction.run, backends/nvidia/driver.py CudaLauncher). In every 3.x release the launcher is
# compiled.run(gridX, gridY, gridZ, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args);
#   3.2       *args are the non-constexpr arguments only (JITFunction.run passes non_constexpr_vals): not modelled;
#   3.3       every parameter, constexprs included; hooks are CompiledKernel.launch_enter_hook/_exit_hook (None unset);
#   3.4       hooks moved to triton.knobs.runtime (None unset);
#   3.5-3.9   knobs.runtime's hooks are HookChains, never None: Triton builds launch_metadata (a LazyDict) and its C
#             launcher calls both empty chains on every launch, unless they are passed as None, as here;
#   3.5-3.6   CudaLauncher.__call__ only allocates global/profile scratch and calls its C (or tensor-descriptor
#             expanding) launch(gridX, gridY, gridZ, stream, function, cooperative, pdl, global_scratch,
#             profile_scratch, packed_metadata, launch_metadata, enter_hook, exit_hook, *args): a kernel that needs
#             no scratch is launched through it straight. 3.9 added GSan and argument annotations there: not modelled.
FAST_LAUNCH_TRITON = ((3, 3), (3, 9))  # the releases whose launch protocol FastLaunch knows (inclusive)
DIRECT_LAUNCH_TRITON = ((3, 5), (3, 6))  # the releases whose CudaLauncher.launch it calls straight
MAX_PATTERNS = 256  # call patterns cached per kernel; past that the cache restarts (a model has a few shapes)


def triton_version() -> tuple[int, int]:
    import triton

    return tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit())


def replay_enabled() -> bool:
    """Launches replayed per input signature (autokernel/ops/replay.py) where FastLaunch is on; AUTOKERNEL_REPLAY=0
    keeps FastLaunch alone."""
    return fast_launch_enabled() and os.environ.get("AUTOKERNEL_REPLAY", "1") != "0"


def fast_launch_enabled() -> bool:
    """FastLaunch for the kernels optimize() plugs in; AUTOKERNEL_FAST_LAUNCH=0 launches through Triton's own path,
    as does a Triton release whose launch protocol is not modelled here."""
    low, high = FAST_LAUNCH_TRITON
    return (os.environ.get("AUTOKERNEL_FAST_LAUNCH", "1") != "0" and not interpreting()
            and low <= triton_version() <= high)


class _Uncacheable(Exception):
    """An argument whose specialization this cache does not model (an unknown type): launch the slow way."""


class FastLaunch:
    """A @triton.jit kernel whose launches skip JITFunction.run's per-call work once a call pattern is known.

    JITFunction.run binds the arguments, computes their specialization (dtypes, 16-byte alignment, integer
    values of 1 or multiples of 16), hashes it into a cache key, evaluates the grid, builds launch metadata
    for the profiler hooks and only then launches: tens of microseconds of host time per call on an H200 host,
    against a few of GPU work for a norm at a model's shapes. Here the first call of a pattern goes through
    JITFunction.run, which compiles (or finds) and launches the CompiledKernel; its launcher, function handle,
    packed metadata and grid are kept under a key at least as fine as Triton's own (the current device; the
    grid; tensor dtypes and 16-byte alignment; exact integer, bool and string values; float types; TMA
    descriptors by base, shape, strides and block; constexpr and option values), so a hit never launches a
    kernel compiled for other arguments. A hit calls the launcher straight on the current raw stream (see the
    version notes above). Launches take Triton's own path when a launch hook is set (profilers keep working),
    for a grid function, for a non-constexpr argument passed by keyword, for an argument type not modelled, and
    once a global the kernel read at compile time has changed (Triton then raises, as it would). Not noticed on
    a hit: Triton knobs changed at run time (debug, instrumentation mode).
    """

    def __init__(self, kernel):
        import inspect

        self.kernel = kernel
        params = list(inspect.signature(kernel.fn).parameters.values())
        self.names = [p.name for p in params]
        self.defaults = [p.default for p in params]
        self.constexprs = tuple(sorted(kernel.constexprs))
        self.first_constexpr = self.constexprs[0] if self.constexprs else len(params)
        self.dynamic_names = frozenset(n for i, n in enumerate(self.names) if i not in self.constexprs)
        self.pre_run_hooks = getattr(kernel, "pre_run_hooks", ())  # 3.9: hooks JITFunction.run calls first
        self.device, self.stream, self.hooked, self.arg_key = _launch_context()
        self.cache: dict = {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args, kwargs):
        if (type(grid) is not tuple or self.hooked() or self.pre_run_hooks
                or not self.dynamic_names.isdisjoint(kwargs)):
            return self.kernel[grid](*args, **kwargs)
        device = self.device()
        try:
            key = (device, grid, tuple(map(self.arg_key, args)), tuple(kwargs.items()))
            if len(args) > self.first_constexpr:  # constexprs given by position: keyed by exact value and type
                key += tuple((type(args[i]), args[i]) for i in self.constexprs if i < len(args))
            entry = self.cache.get(key)
        except (_Uncacheable, TypeError):  # TypeError: an unhashable argument
            return self.kernel[grid](*args, **kwargs)
        if entry is None:
            return self._miss(key, grid, args, kwargs)
        run, grid3, head, tail, compiled, used_globals = entry
        if used_globals and any(scope.get(name, _MISSING) != value for name, value, scope in used_globals):
            return self.kernel[grid](*args, **kwargs)  # Triton raises: a global changed since the compile
        run(*grid3, self.stream(device), *head, *args, *tail)
        return compiled

    def _miss(self, key, grid, args, kwargs):
        compiled = self.kernel[grid](*args, **kwargs)  # compiles or finds the kernel, and launches it
        entry = _entry(self.kernel, compiled, grid, self.names[len(args):], self.defaults[len(args):], kwargs)
        if entry is not None:
            if len(self.cache) >= MAX_PATTERNS:
                self.cache.clear()
            self.cache[key] = entry
        return compiled


_MISSING = object()


def _entry(kernel, compiled, grid, rest_names, rest_defaults, kwargs):
    """What a hit launches with: (launcher, grid as 3 ints, arguments between the stream and the kernel's,
    the parameters after the positional ones (constexprs and defaults, fixed by the key), the CompiledKernel,
    the globals the kernel read at compile time); None when compiled is not a CompiledKernel."""
    raw = raw_launcher(compiled)
    if raw is None or not 1 <= len(grid) <= 3:
        return None
    run, head = raw
    tail = tuple(kwargs[n] if n in kwargs else d for n, d in zip(rest_names, rest_defaults))
    used = tuple((name, value, scope) for (name, _), (value, scope) in getattr(kernel, "used_global_vals", {}).items())
    return run, (*grid, 1, 1)[:3], head, tail, compiled, used


def raw_launcher(compiled) -> tuple | None:
    """launcher(compiled) for this Triton (for the releases fast_launch_enabled() accepts); None when compiled is
    not a CompiledKernel."""
    if not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
        return None
    return launcher(compiled, triton_version())


def launcher(compiled, version: tuple[int, int]):
    """(callable, its arguments between the stream and the kernel's) that launch compiled without hooks."""
    run = compiled.run
    low, high = DIRECT_LAUNCH_TRITON
    if (low <= version <= high and type(run).__name__ == "CudaLauncher" and not run.global_scratch_size
            and not getattr(run, "profile_scratch_size", 0)):
        return run.launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                            compiled.packed_metadata, None, None, None)
    return run, (compiled.function, compiled.packed_metadata, None, None, None)


def _raw_stream():
    """The cheapest call that gives a device's current CUDA stream as Triton's launcher takes it (Triton's own
    launch path calls torch._C._cuda_getCurrentRawStream too)."""
    import torch

    return getattr(torch._C, "_cuda_getCurrentRawStream", lambda index: torch.cuda.current_stream(index).cuda_stream)


def _launch_context():
    """(current device, raw stream of a device, whether a launch hook is set, key of an argument): the
    cheapest calls that say what Triton's own launch path would ask."""
    import torch

    device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
    return device, _raw_stream(), launch_hooks_probe(), _arg_key_function(torch.Tensor)


@functools.cache
def launch_hooks_probe() -> Callable[[], bool]:
    """A function that says whether a profiler has set Triton's launch hooks (see the version notes): launches
    must then take Triton's own path."""
    owner = _hook_owner()
    enter, exit_ = owner.launch_enter_hook, owner.launch_exit_hook
    if not hasattr(enter, "calls"):  # 3.3-3.4: a function or None
        return lambda: owner.launch_enter_hook is not None or owner.launch_exit_hook is not None
    # 3.5+: HookChains that profilers add to; a hook assigned in their place (3.4's way) counts too
    return lambda: bool(enter.calls or exit_.calls or owner.launch_enter_hook is not enter
                        or owner.launch_exit_hook is not exit_)


def _arg_key_function(tensor_type):
    import torch

    parameter = torch.nn.Parameter  # types compared first: isinstance(a, torch.Tensor) costs ~0.2 us

    def arg_key(a):
        """What Triton specializes a non-constexpr argument on, or finer."""
        kind = type(a)
        if kind is int or kind is str or a is None:
            return a  # exact: Triton specializes ints on ==1, %16 and their width
        if kind is float:
            return float  # not specialized on its value: eps and scales change without a recompile
        if kind is tensor_type or kind is parameter or isinstance(a, tensor_type):
            return a.dtype, a.data_ptr() % 16 == 0
        if kind is bool:
            return bool, a  # True == 1, but Triton compiles an i1
        if is_host_descriptor(a):
            return (kind, arg_key(a.base), tuple(a.shape), tuple(a.strides), tuple(a.block_shape),
                    getattr(a, "padding", None))
        raise _Uncacheable(kind.__name__)

    return arg_key


def is_host_descriptor(a) -> bool:
    """A host-side TMA descriptor (triton.tools.tensor_descriptor.TensorDescriptor and its kin)."""
    import torch

    return isinstance(getattr(a, "base", None), torch.Tensor) and hasattr(a, "block_shape")


# ---------------------------------------------------------------- launches replayed straight (autokernel/ops/replay.py)


def is_jit_kernel(value) -> bool:
    """A plain @triton.jit function: what replay.py records launches of (an autotuned one is not)."""
    from triton.runtime.jit import JITFunction

    return isinstance(value, JITFunction)


def is_jit_or_interpreted(value) -> bool:
    """A plain @triton.jit function, or what triton.jit makes under TRITON_INTERPRET=1 (autotuned ones are not)."""
    from triton.runtime.interpreter import InterpretedFunction

    return is_jit_kernel(value) or isinstance(value, InterpretedFunction)


def launch_arguments(kernel, args: tuple, kwargs: dict) -> list:
    """Every parameter of a @triton.jit kernel as its launcher takes them, in order, defaults applied; launch
    options (num_warps, num_stages, ...) are not parameters and are left out (they are in the metadata)."""
    import inspect

    signature = inspect.signature(kernel.fn)
    bound = signature.bind(*args, **{k: v for k, v in kwargs.items() if k in signature.parameters})
    bound.apply_defaults()
    return list(bound.arguments.values())


# 3.6's CudaLauncher.launch, for a kernel with host TMA descriptors, is wrap_handle_tensordesc's `inner`: on every
# call it turns each descriptor into its encoded CUtensorMap (cuTensorMapEncodeTiled), shape and strides, then calls
# the C launcher. The map depends on the base address, shape, strides and block only, and the C launcher copies it
# into the kernel's parameters, so a caller that knows the address is unchanged may reuse the expansion.
DESCRIPTOR_EXPANSION_TRITON = ((3, 6), (3, 6))


def descriptor_expansion(launch: Callable) -> tuple[Callable, Callable] | None:
    """(the C launcher beneath `launch`, expand(descriptor, k) -> the arguments the k-th descriptor parameter
    becomes) when `launch` (launcher()'s callable) expands host TMA descriptors per call; else None."""
    low, high = DESCRIPTOR_EXPANSION_TRITON
    code, closure = getattr(launch, "__code__", None), getattr(launch, "__closure__", None)
    if not low <= triton_version() <= high or code is None or not closure or launch.__name__ != "inner":
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in closure)))
    if not {"launcher", "tensordesc_meta"} <= cells.keys():
        return None
    from triton.backends.nvidia.driver import make_tensordesc_arg

    meta = cells["tensordesc_meta"]
    return cells["launcher"], lambda descriptor, k: make_tensordesc_arg(descriptor, meta[k] if meta else None)


def compile_for(target: tuple, kernel, arguments: dict, options: dict):
    """A @triton.jit kernel compiled for a GPU target (backend, compute capability, warp size) as a launch with these
    arguments (by name) and options (num_warps, num_stages) would compile it, with no device: Triton's compiler
    and its bundled ptxas run on a CPU-only machine. Tensors become typed pointers, host TMA descriptors
    tensordesc<dtype[block]>, constexpr parameters constants (Triton >= 3.4's signature strings)."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int64: "i64",
             torch.int32: "i32", torch.int8: "i8", torch.bool: "i1"}
    signature, constants = {}, {}
    for param in kernel.params:
        value = arguments[param.name]
        if param.is_constexpr or value is None:
            signature[param.name], constants[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + names[value.dtype]
        elif is_host_descriptor(value):
            block = ",".join(str(b) for b in value.block_shape)
            signature[param.name] = f"tensordesc<{names[value.base.dtype]}[{block}]>"
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
        else:
            signature[param.name] = "fp32"
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants)
    return triton.compile(source, target=GPUTarget(*target), options=options)


def scratch_allocator():
    """What Triton's launcher asks for a kernel's global scratch (device-side TMA descriptors live there): the
    allocator triton.set_allocator set in this context (a ContextVar since 3.4: a new thread starts without one)."""
    from triton.runtime import _allocation

    allocator = _allocation._allocator
    return allocator.get() if hasattr(allocator, "get") else allocator


def set_scratch_allocator(allocator: Callable) -> None:
    import triton

    triton.set_allocator(allocator)


def stream_of(device: int) -> Callable[[], int]:
    """The current raw CUDA stream of a device, as the launcher takes it (0 on the CPU)."""
    if device < 0:
        return lambda: 0
    stream = _raw_stream()
    return lambda: stream(device)


@contextlib.contextmanager
def count_launches():
    """Counts the Triton launches made inside, by Triton's launch-enter hook: yields [count], or None when a
    profiler's hook is set (3.3-3.4 hold a single hook, which is not shared)."""
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


def _hook_owner():
    """Where Triton keeps its launch hooks: triton.knobs.runtime from 3.4, CompiledKernel before."""
    if triton_version() < (3, 4):
        from triton.compiler.compiler import CompiledKernel

        return CompiledKernel
    from triton import knobs

    return knobs.runtime
