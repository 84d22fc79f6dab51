"""compat's fixes to Triton's CPU interpreter (autokernel/compat/interpreter.py: prepare_interpreter)."""

import torch
from helpers import import_file

from autokernel import compat

# imported after the interpreter fixture has switched the interpreter on (on a GPU machine too)
KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def _add_one(x):
    return x + 1


@triton.jit
def add_n_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, TIMES: tl.constexpr):
    """out = x + TIMES, one helper call per step."""
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    for _ in tl.static_range(TIMES):
        x = _add_one(x)
    tl.store(out_ptr + offsets, x, mask=offsets < n)
'''


def test_the_language_is_patched_once_per_launch_however_many_helper_calls(interpreter, monkeypatch, tmp_path):
    import triton.language as tl
    from triton.runtime import interpreter as interp

    (tmp_path / "helper_kernels.py").write_text(KERNELS)
    kernel = import_file(tmp_path / "helper_kernels.py", "helper_kernels").add_n_kernel
    scans = []
    original = interp._patch_builtin
    monkeypatch.setattr(interp, "_patch_builtin", lambda *args: scans.append(1) or original(*args))
    x = torch.arange(8, dtype=torch.float32)
    counts = []
    for times in (1, 12):
        out = torch.empty_like(x)
        before = len(scans)
        kernel[(1,)](x, out, 8, BLOCK=8, TIMES=times)
        counts.append(len(scans) - before)
        assert torch.equal(out, x + times)
    assert counts[0] == counts[1] > 0  # twelve helper calls scan the language no more than one does
    assert tl.core.is_builtin(tl.load)  # restored when the launch ended
    patched = interp._patch_lang
    compat.prepare_interpreter()  # again: nothing stacks
    assert interp._patch_lang is patched
