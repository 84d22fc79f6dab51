"""Differences between torch and Triton versions, and between Triton's GPU backend and its CPU interpreter.

Every workaround for a moved API or an interpreter gap lives in this package, once: the version probes and the
switches here; interpreter.py (the interpreter's fixes, `prepare_interpreter`), launch.py (how each Triton
release launches a compiled kernel), fastlaunch.py (FastLaunch, cheap launches built on it), tracing.py (torch's
analysis of a traced Triton launch, done once per kernel and arguments; the compile caches keyed on the installed
kernels) and checkout.py (the checkout's own modules when autokernel is pip-installed). Importers use
`compat.<name>` for all of them. Nothing is patched at import: the harness calls `prepare_interpreter()` in its child
process when it runs on the CPU, customops calls `memoize_kernel_analysis()` when it defines a traceable op and
`tag_compile_caches()` whenever the kernels behind its ops change.
"""

from __future__ import annotations

import os
import platform
import threading

from autokernel.compat.checkout import ROOT, load_root_module
from autokernel.compat.fastlaunch import FastLaunch
from autokernel.compat.interpreter import prepare_interpreter
from autokernel.compat.launch import (
    DESCRIPTOR_EXPANSION_TRITON,
    DIRECT_LAUNCH_TRITON,
    FAST_LAUNCH_TRITON,
    compile_for,
    count_launches,
    descriptor_expansion,
    is_host_descriptor,
    launch_arguments,
    launch_hooks_probe,
    launcher,
    raw_launcher,
    scratch_allocator,
    set_scratch_allocator,
    stream_of,
    triton_version,
)
from autokernel.compat.tracing import memoize_kernel_analysis, tag_compile_caches

__all__ = ["DESCRIPTOR_EXPANSION_TRITON", "DIRECT_LAUNCH_TRITON", "FAST_LAUNCH_TRITON", "ROOT", "FastLaunch",
           "check_cpu_isas", "compile_for", "count_launches", "descriptor_expansion", "fast_launch_enabled",
           "has_triton_op", "interpreting", "is_host_descriptor", "is_jit_kernel", "is_jit_or_interpreted",
           "is_triton_kernel", "launch_arguments", "launch_hooks_probe", "launcher", "load_root_module",
           "memoize_kernel_analysis", "native_compile_enabled", "prepare_interpreter", "provenance_options",
           "raw_launcher", "recompile_limit_option", "replay_enabled", "scratch_allocator", "set_scratch_allocator",
           "stream_of", "tag_compile_caches", "triton_version", "wrap_triton_enabled"]


def interpreting() -> bool:
    """True when Triton kernels run through the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def has_triton_op() -> bool:
    """torch.library.triton_op and wrap_triton (torch >= 2.6): Triton kernels Inductor can trace into."""
    import torch

    return hasattr(torch.library, "triton_op") and hasattr(torch.library, "wrap_triton")


def recompile_limit_option() -> str:
    """The name of dynamo's limit on compiled entries per code object: recompile_limit (torch >= 2.6), before it
    cache_size_limit."""
    import torch._dynamo.config as config

    return "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"


def provenance_options() -> dict:
    """Inductor's config for kernel -> post-grad node provenance (torch >= 2.8: provenance_tracking_level; before it
    a bool, provenance_tracking) and, so that the profiler records each C++ kernel Inductor makes for the CPU,
    cpp.enable_kernel_profile; only the options this torch has."""
    import torch._inductor.config as config

    options = {}
    if hasattr(config.trace, "provenance_tracking_level"):
        options["trace.provenance_tracking_level"] = 1
    elif hasattr(config.trace, "provenance_tracking"):
        options["trace.provenance_tracking"] = True
    if hasattr(config.cpp, "enable_kernel_profile"):
        options["cpp.enable_kernel_profile"] = True
    return options


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


def is_jit_kernel(value) -> bool:
    """A plain @triton.jit function: what replay.py records launches of (an autotuned one is not)."""
    from triton.runtime.jit import JITFunction

    return isinstance(value, JITFunction)


def is_jit_or_interpreted(value) -> bool:
    """A plain @triton.jit function, or what triton.jit makes under TRITON_INTERPRET=1 (autotuned ones are not)."""
    from triton.runtime.interpreter import InterpretedFunction

    return is_jit_kernel(value) or isinstance(value, InterpretedFunction)


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


def check_cpu_isas() -> threading.Thread | None:
    """Start Inductor's checks of the vector instruction sets its C++ kernels may use, side by side, and return
    (the thread that runs them, or None where this torch has no such checks). Each check builds and loads a probe
    with the C++ compiler (once: the build stays in Inductor's cache dir) and loads it in a child process (in each
    process), and Inductor runs them one after another when a process first makes or loads a C++ kernel (a forward
    that computes something on the CPU: HF's Gemma-2 2B, 36 s of its first cold compile on an H100 host). The modules
    they need are imported here, before any thread starts: an import racing another thread's (the model's load) is
    not left to chance."""
    try:
        import torch.utils._filelock  # noqa: F401
        from torch._inductor import codecache, cpp_builder, cpu_vec_isa  # noqa: F401

        candidates = list(cpu_vec_isa.supported_vec_isa_list)
        flags = cpu_vec_isa.x86_isa_checker() if platform.machine() in ("x86_64", "AMD64") else None
    except (ImportError, AttributeError):
        return None
    # where the flags are unknown, Inductor's own list checks each in turn
    checks = [threading.Thread(target=bool, args=(isa,), daemon=True) for isa in candidates
              if flags is not None and all(flag in flags for flag in str(isa).split())]

    def run() -> None:
        for check in checks:
            check.start()
        for check in checks:
            check.join()
        cpu_vec_isa.valid_vec_isa_list()
    thread = threading.Thread(target=run, daemon=True, name="isa-checks")
    thread.start()
    return thread
