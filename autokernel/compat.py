"""Differences between Triton versions and between Triton's GPU backend and its CPU interpreter.

Every workaround for a moved API or an interpreter gap lives here, once. Nothing is patched at
import: the harness calls `prepare_interpreter()` in its child process when it runs on the CPU.
"""

from __future__ import annotations

import os


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
