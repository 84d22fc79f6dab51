"""Launch replay (autokernel/ops/replay.py) on the CPU: kernels launched like @triton.jit ones compute through the raw
addresses they are given, so a replay that passes a wrong pointer, offset or buffer gives a wrong answer."""

import contextlib
import ctypes
import textwrap
import threading
import types

import numpy as np
import pytest
import torch

from autokernel import compat
from autokernel.ops import replay

LAUNCHES = [0]  # launches of every fake kernel, as Triton's launch hook would count them


def floats(address: int, n: int) -> np.ndarray:
    """The n float32 values at a host address, as an array over that memory (numpy: no torch op a replay
    would record, as a GPU kernel runs none)."""
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(address))


class FakeCompiled:
    def __init__(self, body, scratch=0):
        self.body, self.function, self.packed_metadata = body, object(), ()
        self.metadata = types.SimpleNamespace(global_scratch_size=scratch)

    def run(self, gx, gy, gz, stream, function, metadata, launch_metadata, enter, exit_, *args):
        assert function is self.function
        LAUNCHES[0] += 1
        if self.metadata.global_scratch_size:  # as Triton's launcher: from the allocator set in this thread
            compat.scratch_allocator()(self.metadata.global_scratch_size * gx * gy * gz, 128, stream)
        self.body(*[a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args])


class FakeKernel:
    """Launched as kernel[grid](*args, **kwargs), like a @triton.jit function; returns its compiled kernel."""

    def __init__(self, fn, scratch=0):
        self.fn, self.compiled = fn, FakeCompiled(fn, scratch)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            values = compat.launch_arguments(self, args, kwargs)
            self.compiled.run(*(*grid, 1, 1)[:3], 0, self.compiled.function, (), None, None, None, *values)
            return self.compiled
        return launch


@contextlib.contextmanager
def count_launches():
    counted, start = [0], LAUNCHES[0]
    try:
        yield counted
    finally:
        counted[0] = LAUNCHES[0] - start


class Descriptor:
    """A host TMA descriptor as a replay sees one: a base tensor and what else the launcher encodes."""

    def __init__(self, base, n):
        self.base, self.n = base, n


KERNEL_FILE = '''
def _scale_body(x_ptr, out_ptr, n, factor, BLOCK=4):
    floats(out_ptr, n)[:] = floats(x_ptr, n) * factor

def _add_one_body(x_ptr, out_ptr, n):
    floats(out_ptr, n)[:] = floats(x_ptr, n) + 1

_scale = FakeKernel(_scale_body)
_add_one = FakeKernel(_add_one_body)
HIDDEN = {"scale": _scale}
CALLS = []

def kernel_fn(x, factor):
    CALLS.append(1)
    x2 = x.reshape(-1)
    out = torch.empty_like(x2)
    _scale[(1,)](x2, out, x2.numel(), factor, BLOCK=8)
    return out.view(x.shape)

def computing_kernel_fn(x, factor):
    CALLS.append(1)
    x2 = (x * 1.0).reshape(-1)
    out = torch.empty_like(x2)
    _scale[(1,)](x2, out, x2.numel(), factor)
    return out.view(x.shape)

def hidden_kernel_fn(x, factor):
    CALLS.append(1)
    out = torch.empty_like(x)
    HIDDEN["scale"][(1,)](x, out, x.numel(), factor)
    return out

def two_step_kernel_fn(x, factor):
    CALLS.append(1)
    tmp = torch.empty(x.numel(), dtype=x.dtype)
    out = torch.empty(x.numel() + 2, dtype=x.dtype)
    _scale[(1,)](x, tmp, x.numel(), factor)
    _add_one[(2, 1)](tmp, out[2:], x.numel())
    return out[2:].view(x.shape)

def pair_kernel_fn(a, b):
    CALLS.append(1)
    out = torch.empty_like(a)
    _scale[(1,)](b, out, b.numel(), 2.0)
    return out

def _descriptor_body(x_desc, out_desc, factor):  # as Triton's own launcher takes descriptors
    floats(out_desc.base.data_ptr(), out_desc.n)[:] = floats(x_desc.base.data_ptr(), x_desc.n) * factor

_described = FakeKernel(_descriptor_body)

_scale_on_device = FakeKernel(_scale_body, scratch=128)  # as a kernel that makes its TMA descriptors
SCRATCH = []

def _allocate(size, alignment, stream):
    SCRATCH.append(size)
    return torch.empty(size, dtype=torch.int8)

def scratch_kernel_fn(x, factor):
    CALLS.append(1)
    set_scratch_allocator(_allocate)
    out = torch.empty_like(x)
    _scale_on_device[(2,)](x, out, x.numel(), factor)
    return out

def descriptor_kernel_fn(x, factor):
    CALLS.append(1)
    out = torch.empty_like(x)
    _described[(1,)](Descriptor(x, x.numel()), Descriptor(out, out.numel()), factor)
    return out
'''


def kernel_module():
    module = types.ModuleType("fake_kernel_file")
    module.__dict__.update(torch=torch, FakeKernel=FakeKernel, floats=floats, Descriptor=Descriptor,
                           set_scratch_allocator=compat.set_scratch_allocator)
    exec(compile(textwrap.dedent(KERNEL_FILE), "fake_kernel_file.py", "exec"), module.__dict__)
    return module


def replayed(module, name="kernel_fn"):
    fn = getattr(module, name)
    return replay.Replayed(fn, fn, is_kernel=lambda v: isinstance(v, FakeKernel), count_launches=count_launches)


def test_later_calls_of_a_signature_skip_the_python_and_compute_on_their_own_inputs():
    module = kernel_module()
    fn = replayed(module)
    xs = [torch.randn(3, 8) for _ in range(3)]
    outs = [fn(x, 3.0) for x in xs]
    assert len(module.CALLS) == 1  # recorded once, then replayed
    for x, out in zip(xs, outs):
        assert out.shape == x.shape and torch.equal(out, x * 3.0)
    assert outs[1].data_ptr() != outs[2].data_ptr()  # every call gets its own output
    # kernel_fn's out.view(x.shape) of its flat buffer: the replay allocates the buffer in that shape (no view)
    assert outs[0]._base is not None and outs[1]._base is None and outs[1].is_contiguous()
    assert fn.reasons() == {}


def test_another_shape_alignment_or_scalar_is_another_signature():
    module = kernel_module()
    fn = replayed(module)
    fn(torch.randn(3, 8), 3.0)
    wide = torch.randn(4, 8)
    assert torch.equal(fn(wide, 3.0), wide * 3.0)
    assert torch.equal(fn(wide, 0.5), wide * 0.5)  # a float argument is part of the signature, by value
    base = torch.randn(4 * 8 + 1)
    shifted = base[1:].view(4, 8)  # 4 bytes off the 16-byte alignment: Triton would compile another kernel
    assert torch.equal(fn(shifted, 3.0), shifted * 3.0)
    assert len(module.CALLS) == 4
    fn(torch.randn(4, 8), 0.5)
    assert len(module.CALLS) == 4


def test_buffers_offsets_and_views_between_two_launches():
    module = kernel_module()
    fn = replayed(module, "two_step_kernel_fn")
    for _ in range(3):
        x = torch.randn(5, 4)
        out = fn(x, 2.0)
        assert out.shape == x.shape and torch.allclose(out, x * 2.0 + 1)
        assert out.storage_offset() == 2  # a view that starts inside its buffer stays one
    assert len(module.CALLS) == 1


@pytest.mark.parametrize("name, why", [("computing_kernel_fn", "computes with torch (aten.mul"),
                                       ("hidden_kernel_fn", "1 launches, 0 of them")])
def test_a_kernel_fn_that_cannot_be_replayed_runs_as_it_is_every_time(name, why):
    module = kernel_module()
    fn = replayed(module, name)
    for _ in range(3):
        x = torch.randn(2, 8)
        assert torch.equal(fn(x, 3.0), x * 3.0)
    assert len(module.CALLS) == 3
    assert why in next(iter(fn.reasons().values()))


def test_a_pointer_into_memory_that_two_inputs_share_is_not_replayed():
    module = kernel_module()
    fn = replayed(module, "pair_kernel_fn")
    both = torch.randn(2, 8)
    assert torch.equal(fn(both[0], both[1]), both[1] * 2.0)
    assert "several inputs share" in next(iter(fn.reasons().values()))
    a, b = torch.randn(6), torch.randn(6)  # separate memory (another signature): replayable, and replayed
    fn(a, b)
    assert torch.equal(fn(a, b), b * 2.0)
    assert len(module.CALLS) == 2


def test_a_launch_hook_sends_calls_through_the_kernel_file():
    from triton import knobs

    module = kernel_module()
    fn = replayed(module)
    fn(torch.randn(2, 8), 3.0)
    profiler = lambda metadata: None  # noqa: E731  (a profiler wants to see every launch)
    knobs.runtime.launch_enter_hook.add(profiler)
    try:
        x = torch.randn(2, 8)
        assert torch.equal(fn(x, 3.0), x * 3.0)
    finally:
        knobs.runtime.launch_enter_hook.remove(profiler)
    assert len(module.CALLS) == 2
    fn(x, 3.0)
    assert len(module.CALLS) == 2


def test_descriptors_are_encoded_once_per_address(monkeypatch):
    """Where Triton's launcher expands each TMA descriptor on every call (compat.descriptor_expansion), a replay
    calls the launcher beneath with the expansion it made for the same base address before (one plan serves every
    layer of a model: each layer's weight has its own address)."""
    encoded = []

    def expand(descriptor, k):
        encoded.append((k, descriptor.base.data_ptr()))
        return [descriptor.base.data_ptr(), descriptor.n]  # a "map" of the address, and the shape

    def beneath(gx, gy, gz, stream, function, metadata, launch_metadata, enter, exit_, x_address, x_n, out_address,
                out_n, factor):
        LAUNCHES[0] += 1
        floats(out_address, out_n)[:] = floats(x_address, x_n) * factor

    monkeypatch.setattr(compat, "descriptor_expansion", lambda launch: (beneath, expand))
    module = kernel_module()
    fn = replayed(module, "descriptor_kernel_fn")
    x, y = torch.randn(16), torch.randn(16)
    assert torch.equal(fn(x, 3.0), x * 3.0)  # recorded: each descriptor expanded once, to size the arguments
    assert len(encoded) == 2 and len(module.CALLS) == 1
    outs = [fn(x, 3.0)]  # x's address again: only the fresh output is encoded
    assert [k for k, _ in encoded[2:]] == [1]
    outs += [fn(y, 3.0)]  # a new input address: encoded
    assert (0, y.data_ptr()) in encoded[3:]
    seen = len(encoded)
    outs += [fn(x, 3.0), fn(y, 3.0)]  # both inputs' maps are kept: only the outputs' addresses can be new
    assert all(k == 1 for k, _ in encoded[seen:])
    assert [torch.equal(out, want) for out, want in zip(outs, (x * 3.0, y * 3.0, x * 3.0, y * 3.0))] == [True] * 4
    assert len(module.CALLS) == 1


def test_a_kernel_that_takes_scratch_replays_with_the_allocator_kernel_fn_set():
    """A kernel that makes its TMA descriptors on the device takes global scratch from triton's allocator, which
    kernel_fn sets per thread: a replay in a thread that never called kernel_fn sets the same one."""
    module = kernel_module()
    fn = replayed(module, "scratch_kernel_fn")
    before = compat.scratch_allocator()
    try:
        x, y = torch.randn(16), torch.randn(16)
        assert torch.equal(fn(x, 3.0), x * 3.0)
        results = []
        thread = threading.Thread(target=lambda: results.append(_outcome(fn, y, 3.0)))
        thread.start()
        thread.join()
    finally:
        compat.set_scratch_allocator(before)
    assert results and torch.equal(results[0], y * 3.0), results
    assert len(module.CALLS) == 1 and module.SCRATCH == [256, 256]


def _outcome(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # the thread's failure, for the assertion to show
        return e
