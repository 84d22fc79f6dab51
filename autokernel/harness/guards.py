"""Guards against kernels that look correct without doing the work.

Each guard turns one way of cheating into a FAIL with a reason:
  - handing the work to PyTorch: every aten op the kernel dispatches is watched; allocation, views,
    copies and metadata are fine, compute is not;
  - reaching for the reference, a compiler or the harness itself in the source: autokernel.harness.sourcecheck;
  - leaving output elements unwritten: fresh allocations are filled with NaN while checking;
  - returning (a view of) an input as the output.
Caching across calls and speed only on seen inputs are caught by the harness itself (it refills the
same buffers with new values, and checks the outputs of the timed runs), and impossible speed by the
roofline check in timing.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops a kernel may dispatch: making, viewing, copying and describing tensors.
ALLOWED_ATEN_OPS = frozenset("""
    empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros ones
    ones_like new_ones full full_like new_full fill fill_ zero zero_ scalar_tensor arange resize_
    view _unsafe_view reshape as_strided t transpose permute expand unsqueeze squeeze select slice
    alias narrow unflatten flatten view_as split chunk unbind detach lift_fresh set_ _reshape_alias
    contiguous clone copy copy_ _to_copy to _copy_from _copy_from_and_resize
    sym_size sym_stride sym_numel sym_storage_offset is_contiguous size stride dim
    _local_scalar_dense is_same_size record_stream
""".split())


class GuardFailed(Exception):
    """The kernel reached for the verdict instead of doing the work (the static check, the fingerprints, a
    forged result, an input it changed, a timing the host clock contradicts); the message names how."""


class AtenWatch(TorchDispatchMode):
    """Records every aten op outside ALLOWED_ATEN_OPS dispatched while active."""

    def __init__(self):
        super().__init__()
        self.forbidden: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in ALLOWED_ATEN_OPS and name not in self.forbidden:
            self.forbidden.append(name)
        return func(*args, **(kwargs or {}))


@contextmanager
def poisoned_allocations():
    """New tensors start as NaN (floats) or the max value (integers) instead of stale memory.

    Without this an unwritten output element can hold the right answer left over from the previous
    call. torch's deterministic mode does the fill; warn_only keeps ops without a deterministic
    implementation usable.
    """
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn)
        torch.utils.deterministic.fill_uninitialized_memory = was_fill


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return (t.data_ptr(), t.data_ptr())
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return (t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size())


def aliased_input(out: torch.Tensor, inputs) -> int | None:
    """Index of the input whose memory the output overlaps, or None."""
    lo, hi = _byte_range(out)
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.device == out.device:
            xlo, xhi = _byte_range(x)
            if lo < xhi and xlo < hi:
                return i
    return None
