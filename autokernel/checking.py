"""One checked call of a kernel: guards on, output compared with a float64 oracle.

The oracle is the reference run on float64 copies of the inputs, never on the low-precision inputs
themselves (an fp16 reference overflows where a careful kernel does not). The kernel's output must
have the reference's shape and the input's dtype (or the spec's output_dtype: a loss is fp32), hold no
NaN or Inf where the oracle has none, and satisfy |out - oracle| <= atol + rtol * |oracle| everywhere.
"""

from __future__ import annotations

import torch

from autokernel import guards
from autokernel.kerneltype import KernelSpec, dtype_name, shape_label


class CheckFailed(Exception):
    """A check failed; the message is the reason shown to the user."""


def upcast(inputs) -> tuple:
    return tuple(x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)


def oracle(spec: KernelSpec, inputs) -> torch.Tensor:
    return spec.reference(*upcast(inputs))


def out_dtype(inputs) -> torch.dtype:
    return next(x.dtype for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point())


def compare(out, expected, dtype: torch.dtype, atol: float, rtol: float, scale=None) -> str | None:
    """None when out matches, else the reason: shape, dtype, non-finite values or error sizes.

    Each element may be off by atol + rtol * max(|expected|, scale); scale (the spec's error_scale)
    defaults to |expected|. A reference that returns a tuple of tensors (a sum and its norm) wants a tuple
    of as many from the kernel, each held to the same tolerance (scale: a tuple too, or None).
    """
    if isinstance(expected, tuple):
        return _compare_each(out, expected, dtype, atol, rtol, scale)
    if not isinstance(out, torch.Tensor):
        return f"kernel_fn returned {type(out).__name__}, not a tensor"
    if tuple(out.shape) != tuple(expected.shape):
        return f"output shape {tuple(out.shape)}, expected {tuple(expected.shape)}"
    if out.dtype != dtype:
        return f"output dtype {out.dtype}, expected {dtype}"
    got = out.detach().double()
    want = expected.to(got.device)
    bad_nan = ~torch.isfinite(got) & torch.isfinite(want)
    if bad_nan.any():
        n = int(bad_nan.sum())
        kind = "NaN" if torch.isnan(got[bad_nan]).any() else "Inf"
        return (f"{n}/{got.numel()} elements are {kind} where the reference is finite "
                "(unwritten or overflowed)")
    finite = torch.isfinite(want)
    err = torch.where(finite, (got - want).abs(), torch.zeros_like(got))
    mismatched_inf = (~finite) & (got != want)
    magnitude = want.abs().nan_to_num(0.0)
    if scale is not None:
        magnitude = torch.maximum(magnitude, scale.to(magnitude.device, magnitude.dtype))
    off = (err > atol + rtol * magnitude) | mismatched_inf
    if not off.any():
        return None
    rel = err / want.abs().clamp_min(1e-12)
    worst = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape)) if err.dim() else ()
    return (f"max_abs {err.max().item():.3e} max_rel {rel[finite].max().item():.3e}, "
            f"{int(off.sum())}/{off.numel()} elements off (atol {atol:g}, rtol {rtol:g}); "
            f"worst at {worst}: got {got[worst].item():.6g}, want {want[worst].item():.6g}")


def _compare_each(out, expected: tuple, dtype, atol, rtol, scale) -> str | None:
    if not isinstance(out, (tuple, list)) or len(out) != len(expected):
        what = f"{len(out)} outputs" if isinstance(out, (tuple, list)) else type(out).__name__
        return f"kernel_fn returned {what}, expected a tuple of {len(expected)} tensors"
    scales = scale if scale is not None else (None,) * len(expected)
    for i, (got, want, s) in enumerate(zip(out, expected, scales)):
        reason = compare(got, want, dtype, atol, rtol, s)
        if reason:
            return f"output {i}: {reason}"
    return None


def outputs(out) -> tuple:
    """The tensors a kernel returned: its one output, or each of a tuple's."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def checked_call(kernel_fn, spec: KernelSpec, inputs, what: str, tol_scale: float = 1.0):
    """Run kernel_fn once under every guard and check its output. Returns the output.

    `what` names the check (shape and dtype) for the failure message. The oracle is computed from copies
    of the inputs taken before the kernel ran, and the inputs must come back unchanged.
    """
    pristine = pristine_copies(inputs)
    watch = guards.AtenWatch()
    with guards.poisoned_allocations(), watch:
        out = kernel_fn(*inputs)
        poisoned = torch.utils.deterministic.fill_uninitialized_memory and torch.are_deterministic_algorithms_enabled()
    if not poisoned:
        raise guards.GuardFailed(f"{what}: the kernel turned off the NaN fill of new allocations")
    if watch.forbidden:
        ops = ", ".join(f"aten.{op}" for op in watch.forbidden[:5])
        raise CheckFailed(f"{what}: the kernel hands the work to PyTorch ({ops}); "
                          "kernel_fn may allocate, view and copy tensors, the computing is the kernel's")
    verify_output(out, spec, inputs, what, tol_scale, pristine)
    return out


def pristine_copies(inputs) -> tuple:
    """Copies of the tensor inputs, to compute the oracle from and to tell whether the kernel wrote them."""
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in inputs)


def modified_inputs(inputs, pristine) -> list[int]:
    return [i for i, (x, p) in enumerate(zip(inputs, pristine))
            if isinstance(x, torch.Tensor) and not bitwise_equal(x, p)]


def bitwise_equal(a, b) -> bool:
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):  # a kernel's tuple of outputs
        a, b = outputs(a), outputs(b)
        return len(a) == len(b) and all(bitwise_equal(x, y) for x, y in zip(a, b))
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


def verify_output(out, spec: KernelSpec, inputs, what: str, tol_scale: float = 1.0, pristine=None) -> None:
    """Check out against the oracle of `pristine` (copies of the inputs from before the call; the inputs
    themselves when the caller kept none), and that the kernel left the inputs as they were."""
    for t in outputs(out):
        if not isinstance(t, torch.Tensor):
            continue  # compare() says what was returned instead
        if type(t) is not torch.Tensor:  # a subclass could answer the checker's own calls
            raise guards.GuardFailed(f"{what}: kernel_fn returned a {type(t).__name__}, a Tensor subclass; "
                                     "it must return a plain torch.Tensor")
        aliased = guards.aliased_input(t, inputs)
        if aliased is not None:
            raise CheckFailed(f"{what}: the output shares memory with input {aliased}; "
                              "a kernel must write a fresh output")
    if pristine is not None:
        changed = modified_inputs(inputs, pristine)
        if changed:
            raise guards.GuardFailed(f"{what}: the kernel modified its input {changed[0]} (kernel_fn must leave "
                                     "its inputs as they were; the oracle sees copies taken before the call)")
    reference_inputs = inputs if pristine is None else pristine
    dtype = spec.output_dtype or out_dtype(reference_inputs)
    atol, rtol = (tol_scale * t for t in spec.tolerance(dtype))
    scale = spec.error_scale(upcast(reference_inputs)) if spec.error_scale else None
    reason = compare(out, oracle(spec, reference_inputs), dtype, atol, rtol, scale)
    if reason:
        raise CheckFailed(f"{what}: {reason}")


def describe(shape, dtype) -> str:
    return f"{shape_label(shape)} {dtype_name(dtype)}"
