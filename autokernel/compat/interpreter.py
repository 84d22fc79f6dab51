"""Triton's CPU interpreter made to compute what the GPU computes, where it does not on its own.

Nothing is patched at import: the harness calls `prepare_interpreter()` in its child process when it runs on the
CPU (tests/conftest.py does for the test process). Each patch marks what it installs, so a second call stacks
nothing.
"""

from __future__ import annotations


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
