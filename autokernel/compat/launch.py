"""How each Triton release launches a compiled kernel, and the calls around a launch that moved between releases.

What FastLaunch (fastlaunch.py) and replay (autokernel/ops/replay.py) build on: the launcher of a CompiledKernel
and its arguments, the launch hooks a profiler sets, the current raw stream, the scratch allocator, the launcher
that expands host TMA descriptors, and a compile for a GPU target without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

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


def triton_version() -> tuple[int, int]:
    import triton

    return tuple(int(p) for p in triton.__version__.split(".")[:2] if p.isdigit())


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


def raw_stream():
    """The cheapest call that gives a device's current CUDA stream as Triton's launcher takes it (Triton's own
    launch path calls torch._C._cuda_getCurrentRawStream too)."""
    import torch

    return getattr(torch._C, "_cuda_getCurrentRawStream", lambda index: torch.cuda.current_stream(index).cuda_stream)


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


def _hook_owner():
    """Where Triton keeps its launch hooks: triton.knobs.runtime from 3.4, CompiledKernel before."""
    if triton_version() < (3, 4):
        from triton.compiler.compiler import CompiledKernel

        return CompiledKernel
    from triton import knobs

    return knobs.runtime


def is_host_descriptor(a) -> bool:
    """A host-side TMA descriptor (triton.tools.tensor_descriptor.TensorDescriptor and its kin)."""
    import torch

    return isinstance(getattr(a, "base", None), torch.Tensor) and hasattr(a, "block_shape")


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
    stream = raw_stream()
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
