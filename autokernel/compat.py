"""Differences between Triton versions and between Triton's GPU backend and its CPU interpreter.

Every workaround for a moved API or an interpreter gap lives here, once. Nothing is patched at
import: the harness calls `prepare_interpreter()` in its child process when it runs on the CPU.
"""

from __future__ import annotations

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


def wrap_triton_enabled() -> bool:
    """False inside a triton_op called eagerly on real tensors (its kernels run as they are), True when traced."""
    from torch._library.triton import is_wrap_triton_enabled

    return is_wrap_triton_enabled()


def is_triton_kernel(value) -> bool:
    """A @triton.jit function, or one under @triton.autotune: what wrap_triton takes."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    return isinstance(value, (JITFunction, Autotuner))
