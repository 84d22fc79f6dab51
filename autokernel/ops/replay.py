"""A kernel_fn's launches replayed: after the first call with given inputs, later calls with inputs of the same
signature skip kernel_fn's Python and call the compiled Triton kernels straight.

One call of a starter's kernel_fn costs host time in three parts: its own Python (reshape, contiguous, empty,
tile heuristics, TMA descriptors), JITFunction.run (binding, specialization key, cache lookup), and the compiled
launcher itself; the first two are most of it (docs/launch-cost.md). All but the launcher and the output's
allocation depend only on the inputs' signature (dtypes, shapes, strides, 16-byte alignment, devices and the values
of the other arguments), so they are worked out once.

The first call of a signature runs kernel_fn once, recording:
- every Triton launch (the kernel's @triton.jit functions are wrapped in a copy of its namespace, as in
  launchers.rebound): the CompiledKernel, the grid and all its arguments;
- every torch op it runs (a TorchDispatchMode). Only allocations (empty*, zeros*) and views are allowed:
  anything that computes (a copy, a cast, an add) makes the signature unreplayable, and kernel_fn runs
  as it is for it from then on;
- how each tensor argument of a launch, and the output, relate to the inputs and the allocations: the same
  storage at a fixed byte offset. A pointer inside two inputs' storage is ambiguous: unreplayable.
Triton's own launch hook counts the launches meanwhile; a launch the wrappers did not see (a kernel reached
some other way) makes the signature unreplayable.

A replay allocates the buffers, fills each launch's pointer arguments as integers (input or buffer address
plus offset; Triton's launchers take an int as a device pointer) and calls the compiled launcher with the
current stream: an allocation per buffer and one launcher call per kernel. A kernel that makes its TMA descriptors
on the device takes global scratch from the allocator kernel_fn set (triton.set_allocator, per thread): the plan
keeps it and sets it again before it replays, as kernel_fn would have. Launch hooks set by a profiler
(proton, ...) send every call back through kernel_fn, so they see the launches as usual.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autokernel import compat

aten = torch.ops.aten
ALLOCATIONS = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
               aten.new_empty.default, aten.new_empty_strided.default}
ZEROED = {aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default}


# Descriptor expansions kept per descriptor of a plan, by base address: one plan serves every layer of a model, so
# each weight and each reused activation block has its own; past that they start again.
MAX_ENCODED = 256
MAX_SIGNATURES = 1024  # plans kept per kernel; past that they start again (a model has a few shapes, a sweep many)


class Unreplayable(Exception):
    """What kernel_fn did for this signature cannot be replayed (the reason is the message)."""


@dataclass
class Buffer:
    size: tuple
    stride: tuple
    dtype: torch.dtype
    device: torch.device
    zeroed: bool

    def allocate(self) -> torch.Tensor:
        t = torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)
        return t.zero_() if self.zeroed else t


@dataclass
class Launch:
    run: Callable  # the compiled kernel's launcher (compat.raw_launcher)
    grid: tuple  # x, y, z
    head: tuple  # the launcher's arguments between the stream and the kernel's
    args: list  # the kernel's arguments, constants in place; pointers and descriptors filled per call
    pointers: list = field(default_factory=list)  # (position, from an input (else a buffer), index, byte offset)
    descriptors: list = field(default_factory=list)  # (position, template, from an input, index)
    # With compat.descriptor_expansion, run is the launcher beneath Triton's and args hold each descriptor's
    # expansion in place: (start, template, from an input, index, expand, {base address: its expansion})
    expanded: list = field(default_factory=list)
    scratch: bool = False  # the kernel asks the launcher for global scratch (it makes TMA descriptors on the device)


@dataclass
class Plan:
    buffers: list[Buffer]
    launches: list[Launch]
    output: tuple  # (from an input, index, shape, stride, element offset, is the whole buffer), or a tuple of them
    stream: Callable[[], int]
    allocator: Callable | None = None  # the scratch allocator kernel_fn left set, where a launch takes scratch

    def run(self, args: tuple, pointers: list):
        if self.allocator is not None:  # as kernel_fn would set it: this thread may never have called kernel_fn
            compat.set_scratch_allocator(self.allocator)
        buffers = [b.allocate() for b in self.buffers]
        addresses = [b.data_ptr() for b in buffers]
        stream = self.stream()
        for launch in self.launches:
            values = launch.args.copy()
            for position, from_input, index, offset in launch.pointers:
                values[position] = (pointers if from_input else addresses)[index] + offset
            for position, template, from_input, index in launch.descriptors:
                values[position] = copy.copy(template)
                values[position].base = (args if from_input else buffers)[index]
            for start, template, from_input, index, expand, encoded in launch.expanded:
                address = (pointers if from_input else addresses)[index]
                expansion = encoded.get(address)  # the same address (a weight, a reused block): the same map
                if expansion is None:
                    if len(encoded) >= MAX_ENCODED:
                        encoded.clear()
                    descriptor = copy.copy(template)
                    descriptor.base = (args if from_input else buffers)[index]
                    expansion = encoded[address] = expand(descriptor)
                values[start:start + len(expansion)] = expansion
            launch.run(*launch.grid, stream, *launch.head, *values)
        if type(self.output[0]) is tuple:
            return tuple(_view(o, args, buffers) for o in self.output)
        return _view(self.output, args, buffers)


def _allocated_as_viewed(specs: list, buffers: list[Buffer]) -> list:
    """The output specs, where an output is a contiguous view of a whole buffer that no other output views (a
    kernel_fn's `out.view(x.shape)`) with that buffer allocated in the view's shape instead: a replay then returns
    it as it is allocated, not through as_strided (host time on every call). The launches see only addresses."""
    viewers = [i for from_input, i, *_ in specs if not from_input]
    kept = []
    for spec in specs:
        from_input, index, shape, stride, offset, whole = spec
        buffer = None if from_input else buffers[index]
        if (buffer is not None and not whole and not offset and viewers.count(index) == 1
                and math.prod(shape) == math.prod(buffer.size)
                and stride == torch.empty(shape, device="meta").stride()):  # contiguous
            buffers[index] = Buffer(shape, stride, buffer.dtype, buffer.device, buffer.zeroed)
            spec = (from_input, index, shape, stride, offset, True)
        kept.append(spec)
    return kept


def _view(spec: tuple, args: tuple, buffers: list) -> torch.Tensor:
    from_input, index, shape, stride, offset, whole = spec  # offset: elements from the start of the input or buffer
    t = (args if from_input else buffers)[index]
    return t if whole else t.as_strided(shape, stride, t.storage_offset() + offset)


class Replayed:
    """kernel_fn with its launches replayed per input signature (see the module's docstring); `fallback` (kernel_fn
    with cheaper launches, or kernel_fn itself) runs the signatures that cannot be replayed.
    is_kernel picks the launchable kernels in kernel_fn's namespace; count_launches counts launches the
    wrappers may not see. Both are Triton's by default; tests give their own."""

    def __init__(self, kernel_fn: Callable, fallback: Callable, is_kernel: Callable | None = None,
                 count_launches: Callable | None = None):
        from autokernel.ops import launchers

        self.kernel_fn = kernel_fn
        self.fallback = fallback
        self.launches: list = []
        self.recording = launchers.rebound(kernel_fn, is_kernel or compat.is_jit_kernel,
                                           lambda kernel: launchers.Intercepted(kernel, self._launch))
        self.count_launches = count_launches or compat.count_launches
        self.hooked = compat.launch_hooks_probe()
        self.plans: dict = {}  # signature -> Plan, or the reason it cannot be replayed
        self.__name__ = getattr(kernel_fn, "__name__", "kernel_fn")
        self.__wrapped__ = kernel_fn

    def __call__(self, *args):
        key, pointers = signature(args)
        plan = self.plans.get(key)
        if type(plan) is Plan and not self.hooked():
            return plan.run(args, pointers)
        if plan is not None or self.recording is None:
            return self.fallback(*args)
        if len(self.plans) >= MAX_SIGNATURES:
            self.plans.clear()
        out, self.plans[key] = self._record(args)
        return out

    def reasons(self) -> dict:
        """For each signature seen, why it is not replayed (the signatures that are replayed are left out)."""
        return {k: v for k, v in self.plans.items() if type(v) is not Plan}

    # ------------------------------------------------------------------ recording
    def _launch(self, kernel, grid, args: tuple, kwargs: dict):
        compiled = kernel[grid](*args, **kwargs)
        self.launches.append((kernel, grid, args, kwargs, compiled))
        return compiled

    def _record(self, args: tuple):
        """(kernel_fn's output, its Plan or the reason it has none)."""
        self.launches = []
        log = _OpLog()
        with self.count_launches() as counted, log:
            out = self.recording(*args)
        try:
            if counted is None:
                raise Unreplayable("launches cannot be counted (a launch hook is set)")
            if counted[0] != len(self.launches):
                raise Unreplayable(f"{counted[0]} launches, {len(self.launches)} of them through the kernel file's "
                                   "own @triton.jit names")
            plan = _plan(args, out, log, self.launches)
        except Unreplayable as e:
            return out, str(e)
        finally:
            self.launches = []
        return out, plan


def signature(args: tuple) -> tuple[tuple, list]:
    """(what a replay must match, the tensors' addresses): per tensor its dtype, shape, strides, address modulo 16
    (Triton specializes pointers on 16-byte alignment) and device; any other argument by type and value."""
    key, pointers = [], []
    for a in args:
        if isinstance(a, torch.Tensor):
            p = a.data_ptr()
            pointers.append(p)
            key.append((a.dtype, a.shape, a.stride(), p % 16, a.get_device()))
        else:
            pointers.append(None)
            key.append((type(a), a))
    return tuple(key), pointers


class _OpLog(TorchDispatchMode):
    """The torch ops a kernel_fn runs: allocations are kept (the tensors), views pass, anything else is noted."""

    def __init__(self):
        super().__init__()
        self.allocations: list[tuple[torch.Tensor, bool]] = []
        self.refused: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in ALLOCATIONS or func in ZEROED:
            self.allocations.append((out, func in ZEROED))
        elif not func.is_view and self.refused is None:
            self.refused = str(func)
        return out


def _plan(args: tuple, out, log: _OpLog, launches: list) -> Plan:
    if log.refused:
        raise Unreplayable(f"kernel_fn computes with torch ({log.refused})")
    inputs = [a if isinstance(a, torch.Tensor) else None for a in args]
    devices = {a.get_device() for a in inputs if a is not None}
    if len(devices) != 1:
        raise Unreplayable("inputs on several devices, or no tensor input")
    buffers = [t for t, _ in log.allocations]
    where = _Locator(inputs, buffers)
    plan_launches = [_launch(where, *launch) for launch in launches]
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    if not outputs or not all(isinstance(o, torch.Tensor) for o in outputs):
        raise Unreplayable("the output is not a tensor or a tuple of tensors")
    specs = [_output(where, o) for o in outputs]
    used = sorted({i for launch in plan_launches for _, from_input, i, _ in launch.pointers if not from_input}
                  | {i for launch in plan_launches for _, _, from_input, i in launch.descriptors if not from_input}
                  | {i for launch in plan_launches for _, _, from_input, i, *_ in launch.expanded if not from_input}
                  | {i for from_input, i, *_ in specs if not from_input})
    renumber = {old: new for new, old in enumerate(used)}  # allocations nothing refers to are not replayed
    for launch in plan_launches:
        launch.pointers = [(p, s, i if s else renumber[i], o) for p, s, i, o in launch.pointers]
        launch.descriptors = [(p, t, s, i if s else renumber[i]) for p, t, s, i in launch.descriptors]
        launch.expanded = [(p, t, s, i if s else renumber[i], *rest) for p, t, s, i, *rest in launch.expanded]
    specs = [(s, i if s else renumber[i], *rest) for s, i, *rest in specs]
    kept = [Buffer(tuple(buffers[i].shape), buffers[i].stride(), buffers[i].dtype, buffers[i].device,
                   log.allocations[i][1]) for i in used]
    specs = _allocated_as_viewed(specs, kept)
    output = tuple(specs) if isinstance(out, (tuple, list)) else specs[0]
    allocator = compat.scratch_allocator() if any(launch.scratch for launch in plan_launches) else None
    return Plan(kept, plan_launches, output, compat.stream_of(devices.pop()), allocator)


class _Locator:
    """Which input or allocation a tensor lives in, and at which byte offset from its start."""

    def __init__(self, inputs: list, buffers: list):
        self.storages = {}
        for from_input, tensors in ((True, inputs), (False, buffers)):
            for i, t in enumerate(tensors):
                if t is not None and t.numel():
                    self.storages.setdefault(t.untyped_storage().data_ptr(), []).append((from_input, i, t))

    def find(self, t: torch.Tensor) -> tuple[bool, int, int, torch.Tensor]:
        owners = self.storages.get(t.untyped_storage().data_ptr(), [])
        if len(owners) != 1:
            raise Unreplayable("a tensor argument shares its memory with no input or allocation" if not owners
                               else "a tensor argument lies in memory that several inputs share")
        source, i, owner = owners[0]
        return source, i, t.data_ptr() - owner.data_ptr(), owner


def _launch(where: _Locator, kernel, grid, args: tuple, kwargs: dict, compiled) -> Launch:
    if not isinstance(grid, tuple) or not all(isinstance(g, int) for g in grid):
        raise Unreplayable("a launch grid that is not a tuple of ints")
    raw = compat.raw_launcher(compiled)
    if raw is None:
        raise Unreplayable("this Triton's compiled kernels cannot be launched straight")
    values = compat.launch_arguments(kernel, args, kwargs)
    scratch = bool(getattr(getattr(compiled, "metadata", None), "global_scratch_size", 0))
    launch = Launch(run=raw[0], grid=(*grid, 1, 1)[:3], head=raw[1], args=list(values), scratch=scratch)
    for position, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            source, index, offset, _ = where.find(value)
            launch.pointers.append((position, source, index, offset))
            launch.args[position] = None  # filled per call; the recorded tensor is not kept alive
        elif isinstance(getattr(value, "base", None), torch.Tensor):  # a host TMA descriptor
            source, index, offset, owner = where.find(value.base)
            if offset or value.base.dtype != owner.dtype:
                raise Unreplayable("a TMA descriptor on a view that starts inside a tensor")
            template = copy.copy(value)
            template.base = None
            launch.descriptors.append((position, template, source, index))
            launch.args[position] = None
    expansion = compat.descriptor_expansion(launch.run) if launch.descriptors else None
    return _expanded(launch, values, *expansion) if expansion else launch


def _expanded(launch: Launch, values: list, beneath: Callable, expand: Callable) -> Launch:
    """launch calling the launcher beneath Triton's descriptor expansion, each descriptor's arguments in place and
    encoded once per base address (compat.descriptor_expansion)."""
    descriptors = {entry[0]: (k, entry) for k, entry in enumerate(launch.descriptors)}  # position -> (k, entry)
    args, moved, expanded = [], {}, []
    for position, value in enumerate(values):
        if position not in descriptors:
            moved[position] = len(args)
            args.append(launch.args[position])
            continue
        k, (_, template, source, index) = descriptors[position]
        first = expand(value, k)  # the recorded descriptor: how many arguments it becomes, and for which address
        expand_k = functools.partial(expand, k=k)
        expanded.append((len(args), template, source, index, expand_k, {value.base.data_ptr(): first}))
        args.extend(first)
    pointers = [(moved[p], source, index, offset) for p, source, index, offset in launch.pointers]
    return Launch(run=beneath, grid=launch.grid, head=launch.head, args=args, pointers=pointers, expanded=expanded,
                  scratch=launch.scratch)


def _output(where: _Locator, out: torch.Tensor) -> tuple:
    source, index, offset, owner = where.find(out)
    if offset % out.element_size():
        raise Unreplayable("an output that starts between two elements")
    whole = (out.dtype == owner.dtype and out.shape == owner.shape and out.stride() == owner.stride() and not offset
             and not source)
    if out.dtype != owner.dtype:
        raise Unreplayable("an output viewed as another dtype")
    return source, index, tuple(out.shape), out.stride(), offset // out.element_size(), whole
