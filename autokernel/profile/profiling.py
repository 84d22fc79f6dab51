"""Profiling a model: where its time goes, by kernel type and shape.

The model runs WARMUP_STEPS times, then PROFILE_STEPS times under torch.profiler with shapes
recorded (with a loss, each forward pass also computes the next-token loss at its output embedding),
while forward hooks open a profiler range around every module call (the ranges carry the module's class,
qualified name and input shape, which the profiler itself does not give) and a profile hook opens one
around every call of a function named like a type (apply_rotary, rotate_half). The events become
`attribution.Op` records and the rules in autokernel/profile/attribution.py turn them into calls of kernel types.

What is counted: on a GPU, device time: each kernel once, through the op that launched it; kernels
the profiler could not tie to an op count as "other". On a CPU there are no kernels and CPU time is
profiled instead (the self time of each op; Python overhead between ops is left out), which shows
that the pipeline works, not where a GPU would spend its time.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from autokernel.models import output_embedding, set_submodule
from autokernel.profile.attribution import OTHER, Op, attribute, function_patterns, group_shape

WARMUP_STEPS = 2  # forward passes before profiling: lazy init, cuBLAS/cuDNN heuristics, allocator
PROFILE_STEPS = 3  # profiled forward passes; every time reported is per forward pass
MAX_SHAPES = 8  # shapes kept per type, the most expensive first
MAX_OTHER_OPS = 12  # ops listed under "other"
RIVAL_MIN = 0.005  # of the forward: a type the opt-in types take less time from than this is no rival of theirs
STEP_RANGE = "autokernel.step"
MODULE_RANGE = "autokernel.module#"
FUNCTION_RANGE = "autokernel.function#"
_PYTHON_EVENT = re.compile(r"^(<built-in|nn\.Module: |.*\.py\(\d+\): |.*\(\d+\): )")


class ModuleRanges:
    """Forward hooks that open a profiler range around every module call, and record the call."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.calls: list[dict] = []  # index in the range name -> {"name", "cls", "input_shape"}
        self._open: list = []
        self._handles: list = []

    def __enter__(self):
        for name, module in self.model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        while self._open:  # a forward that raised leaves its ranges open
            self._open.pop().__exit__(None, None, None)

    def _pre(self, name: str):
        def hook(module, args, kwargs):
            first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
            self.calls.append({"name": name or "(model)", "cls": type(module).__name__,
                               "input_shape": list(first.shape) if first is not None else None})
            rf = record_function(f"{MODULE_RANGE}{len(self.calls) - 1}")
            rf.__enter__()
            self._open.append(rf)
        return hook

    def _post(self, module, args, output):
        if self._open:
            self._open.pop().__exit__(None, None, None)


def function_names() -> re.Pattern:
    """Functions worth a range: those whose name names a type (the registry's profiler rules)."""
    patterns = [p.pattern for p in function_patterns()]
    return re.compile("|".join(patterns) if patterns else "(?!)", re.I)


class FunctionRanges:
    """A profiler range around every call of a Python function whose name names a type (RoPE).

    torch.profiler's own Python tracer (with_stack=True) would give the same and more, but it costs
    a range per Python call and, in torch 2.13, now and then returns undecodable event names.
    sys.setprofile sees every call too, and opens a range only for the few that match.
    """

    def __init__(self, pattern: re.Pattern):
        self.pattern = pattern
        self._open: dict[int, object] = {}  # id(frame) -> its open range
        self._previous = None

    def __enter__(self):
        self._previous = sys.getprofile()
        sys.setprofile(self._trace)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._previous)
        for rf in reversed(list(self._open.values())):
            rf.__exit__(None, None, None)
        self._open.clear()

    def _trace(self, frame, event, arg):
        if event == "call" and self.pattern.search(frame.f_code.co_name):
            code = frame.f_code
            rf = record_function(f"{FUNCTION_RANGE}{Path(code.co_filename).name}({code.co_firstlineno}): "
                                 f"{code.co_name}")
            rf.__enter__()
            self._open[id(frame)] = rf
        elif event == "return" and id(frame) in self._open:
            self._open.pop(id(frame)).__exit__(None, None, None)


class LMHeadWithLoss(torch.nn.Module):
    """A language model's output embedding and the next-token loss of its logits as one module call: how a
    profile with a loss (--with-loss) shows the LM head's GEMM and the loss's ops together, as the one call
    of linear_cross_entropy they become (its profiler rule names this class). The logits go on unchanged; the
    loss is kept (self.loss), so torch.compile computes it too (regions.capture) where it would drop a dead value."""

    def __init__(self, head: torch.nn.Module, targets: torch.Tensor):
        super().__init__()
        self.head, self.targets, self.loss = head, targets, None

    def forward(self, x):
        logits = self.head(x)
        if logits.shape[:-1] == self.targets.shape:  # upcast as transformers' loss does
            self.loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), self.targets.reshape(-1))
        return logits


@contextmanager
def loss_at_head(model, inputs):
    """The model with its output embedding wrapped in LMHeadWithLoss for next-token targets of its token ids
    inputs[0] (the last position has none); ValueError where the model has no output embedding or no ids."""
    found = output_embedding(model)
    ids = inputs[0] if inputs else None
    if found is None or not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.dim() != 2:
        raise ValueError("profiling with a loss needs a language model (get_output_embeddings()) and token ids "
                         "[batch, seq] as its first input")
    path, head = found
    set_submodule(model, path, LMHeadWithLoss(head, F.pad(ids[:, 1:], (0, 1), value=-100)))
    try:
        yield model
    finally:
        set_submodule(model, path, head)


def run_profiler(model, inputs, device: str, steps: int = PROFILE_STEPS, warmup: int = WARMUP_STEPS,
                 trace_path: str | Path | None = None, with_loss: bool = False):
    """(profiler events, module calls) for `steps` forward passes after `warmup` unprofiled ones; with_loss,
    each forward pass computes the next-token loss too (loss_at_head)."""
    on_gpu = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with torch.inference_mode(), (loss_at_head(model, inputs) if with_loss else nullcontext()):
        for _ in range(warmup):
            model(*inputs)
        _sync(device)
        with profile(activities=activities, record_shapes=True) as prof:
            with ModuleRanges(model) as ranges, FunctionRanges(function_names()):
                for _ in range(steps):
                    with record_function(STEP_RANGE):
                        model(*inputs)
            _sync(device)
    if trace_path:
        Path(trace_path).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
    return prof.events(), ranges.calls


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def to_ops(events, calls: list[dict], on_gpu: bool) -> tuple[list[Op], float]:
    """Op records of the CPU events inside profiling steps, and the total time they stand for (us).

    On a GPU the total is every device event's duration, so that kernels tied to no op still count.
    """
    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    index = {id(e): k for k, e in enumerate(cpu)}
    ops: list[Op] = []
    in_step: list[bool] = []
    for e in cpu:
        parent = index.get(id(e.cpu_parent)) if e.cpu_parent is not None else None
        op = _op_from_event(e, parent, calls)
        under = op.kind == "step" or (parent is not None and in_step[parent])
        in_step.append(under)
        if under:
            op.self_us = (sum(k.duration for k in e.kernels) if on_gpu
                          else (e.self_cpu_time_total if op.kind == "op" else 0.0))
        ops.append(op)
    if on_gpu:
        total = device_time_us(events)
    else:
        _median_over_steps(ops)
        total = sum(op.self_us for op in ops)
    return ops, max(total, sum(op.self_us for op in ops))


def device_time_us(events) -> float:
    """Time of the work the device did: kernels, copies and sets.

    Each record_function range (our module and step ranges, ProfilerStep) also has a device-side
    shadow, a user annotation spanning all the kernels inside it; counting those would count the same
    time again, once per level of nesting (many times a forward's real device time, all of it
    "unattributed").
    """
    return sum(e.time_range.elapsed_us() for e in events if is_device_work(e))


def is_device_work(e) -> bool:
    """Whether a profiler event is the device's own work (not a CPU event, nor a range's device-side shadow)."""
    if e.device_type == DeviceType.CPU or getattr(e, "is_user_annotation", False):
        return False
    return not e.name.startswith(("autokernel.", "ProfilerStep"))


def _median_over_steps(ops: list[Op]) -> None:
    """Give the k-th timed op of every step the median of their times (CPU only).

    Every step runs the same ops in the same order, so position k is the same op each time. On a
    shared CPU one op now and then loses the core for milliseconds; a median of the steps drops that.
    """
    per_step: dict[int, list[Op]] = defaultdict(list)
    step_of: dict[int, int] = {}
    for i, op in enumerate(ops):
        step = i if op.kind == "step" else step_of.get(op.parent)
        if step is not None:
            step_of[i] = step
            if op.self_us > 0:
                per_step[step].append(op)
    runs = list(per_step.values())
    if len(runs) < 3 or len({len(r) for r in runs}) != 1:
        return  # steps that differ (data-dependent control flow): keep the plain times
    for same_op in zip(*runs):
        median = statistics.median(op.self_us for op in same_op)
        for op in same_op:
            op.self_us = median


def _op_from_event(e, parent: int | None, calls: list[dict]) -> Op:
    name = e.name
    if name == STEP_RANGE:
        kind, module = "step", None
    elif name.startswith(MODULE_RANGE):
        kind, module = "module", calls[int(name[len(MODULE_RANGE):])]
    elif name.startswith(FUNCTION_RANGE):
        kind, module, name = "python", None, name[len(FUNCTION_RANGE):]
    elif getattr(e, "is_python_function", False) or _PYTHON_EVENT.match(name):
        kind, module = "python", None
    elif getattr(e, "is_user_annotation", False):
        kind, module = "annotation", None
    else:
        kind, module = "op", None
    return Op(name=name, kind=kind, parent=parent, start=e.time_range.start,
              shapes=list(e.input_shapes or []), args=list(getattr(e, "concrete_inputs", None) or []),
              kernels=tuple(k.name for k in e.kernels), frames=tuple(e.stack or ()), module=module)


def summarize(ops: list[Op], total_us: float, steps: int, types=None) -> dict:
    """Per-type time, share and shapes; "other" by op; time by module class and by op. Per forward pass.
    `types` asks for the types whose profiler rules are opt-in (rope_attention)."""
    groups = attribute(ops, types)
    by_type: dict[str, dict] = {}
    other_ops: dict[str, float] = defaultdict(float)
    for g in groups:
        if g.type == OTHER:
            other_ops[g.label] += g.time_us
            continue
        entry = by_type.setdefault(g.type, {"time_us": 0.0, "calls": 0, "shapes": {}})
        entry["time_us"] += g.time_us
        entry["calls"] += 1
        shape = group_shape(g, ops)
        key = repr(sorted(shape.items())) if shape else "unknown"
        slot = entry["shapes"].setdefault(key, {"shape": shape, "time_us": 0.0, "calls": 0})
        slot["time_us"] += g.time_us
        slot["calls"] += 1
    types = {t: _finish(e, total_us, steps) for t, e in by_type.items()}
    other_us = sum(other_ops.values()) + (total_us - sum(op.self_us for op in ops))
    return {
        "total_us": total_us / steps,
        "types": dict(sorted(types.items(), key=lambda kv: -kv[1]["time_us"])),
        "other": {"time_us": other_us / steps, "share": _share(other_us, total_us),
                  "ops": _top({k: v / steps for k, v in other_ops.items()}, MAX_OTHER_OPS),
                  "unattributed_us": (total_us - sum(op.self_us for op in ops)) / steps},
        "by_module": _top({k: v / steps for k, v in _by_module(ops).items()}),
        "by_op": _top({k: v / steps for k, v in _by_op(ops).items()}),
    }


def rivals(ops: list[Op], total_us: float, steps: int, types, found: dict) -> dict:
    """{type: its summarize() entry in the model profiled without the opt-in `types`} for each type they take time
    from (at least RIVAL_MIN of the forward): rope_attention takes flash_attention's and rotary_embedding's inside
    an attention module, and verify's prune deploys those in its place where the model runs faster with them
    (autokernel/verify/rivals.py), so the plan keeps them at hand for the night (plan.py)."""
    without = summarize(ops, total_us, steps)["types"]
    least = RIVAL_MIN * total_us / steps
    return {t: e for t, e in without.items()
            if t not in types and e["time_us"] - found.get(t, {}).get("time_us", 0.0) > least}


def _finish(entry: dict, total_us: float, steps: int) -> dict:
    shapes = sorted(entry["shapes"].values(), key=lambda s: -s["time_us"])
    return {
        "time_us": entry["time_us"] / steps,
        "share": _share(entry["time_us"], total_us),
        "calls": entry["calls"] // steps,
        "shapes": [{"shape": s["shape"], "time_us": s["time_us"] / steps, "calls": max(1, s["calls"] // steps),
                    "share_of_type": _share(s["time_us"], entry["time_us"])}
                   for s in shapes[:MAX_SHAPES] if s["shape"]],
    }


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def _top(table: dict, n: int | None = None) -> dict:
    items = sorted(table.items(), key=lambda kv: -kv[1])
    return dict(items[:n] if n else items)


def _by_op(ops: list[Op]) -> dict:
    table = defaultdict(float)
    for op in ops:
        if op.self_us > 0:
            table[op.name] += op.self_us
    return table


def _by_module(ops: list[Op]) -> dict:
    """Time inside each module class (inclusive; a class nested in itself counts once)."""
    table = defaultdict(float)
    classes_memo: dict[int, frozenset] = {}
    for i, op in enumerate(ops):
        classes = classes_memo.get(op.parent, frozenset())  # parents come before their children
        if op.kind == "module":
            classes = classes | {op.module["cls"]}
        classes_memo[i] = classes
        if op.self_us > 0:
            for cls in classes:
                table[cls] += op.self_us
    return table


def profile_model(model, inputs, device: str, steps: int = PROFILE_STEPS, warmup: int = WARMUP_STEPS,
                  trace_path: str | Path | None = None, with_loss: bool = False, types=None) -> dict:
    """Run and attribute: the profile as a JSON-ready dict (see summarize), plus how it was measured."""
    events, calls = run_profiler(model, inputs, device, steps, warmup, trace_path, with_loss)
    on_gpu = device.startswith("cuda")
    ops, total = to_ops(events, calls, on_gpu)
    if total <= 0 or not math.isfinite(total):
        raise RuntimeError("the profiler recorded no time: did the model run any ops?")
    summary = summarize(ops, total, steps, types)
    if types:
        summary.update(opt_in=sorted(types), rivals=rivals(ops, total, steps, types, summary["types"]))
    summary.update({"time_kind": "device" if on_gpu else "cpu", "steps": steps, "warmup": warmup})
    if with_loss:
        summary["with_loss"] = True
    return summary
