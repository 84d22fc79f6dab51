"""Fingerprints of everything the verdict depends on, taken before the kernel file is imported.

The static check (autokernel.harness.sourcecheck) keeps a kernel file from reaching the harness; this is the
second layer, for whatever gets past it. Before the import the harness fingerprints the functions that
check and time (its own modules), the torch and triton callables the references and the timing use
(torch, torch.nn.functional, torch.cuda, torch._C, the Tensor classes, torch.cuda.Event), the clocks
(time), the builtins, and the process state a kernel could bend (tracing and profiling hooks, torch's
dispatch and function modes, deterministic-fill switches, signal handlers, Python threads). The harness
compares after the import, after every stage and after timing; any difference is a FAIL that names what
changed. A function counts as changed when its object or its code object is replaced.
"""

from __future__ import annotations

import signal
import sys
import threading
import types

from autokernel.harness.guards import GuardFailed

WATCHED_MODULES = ("builtins", "time", "json", "hmac", "hashlib", "os", "signal", "threading", "gc",
                   "torch", "torch.nn", "torch.nn.functional", "torch.cuda", "torch._C", "torch.linalg", "torch.fft",
                   "torch.utils.deterministic", "torch.overrides", "torch.library",
                   "triton", "triton.language",
                   "reference", "autokernel.harness.checking", "autokernel.harness.guards", "autokernel.harness.timing",
                   "autokernel.harness.perf", "autokernel.harness.harness", "autokernel.registry",
                   "autokernel.kerneltype", "autokernel.types", "autokernel.harness.gpu",
                   "autokernel.harness.integrity", "autokernel.harness.sourcecheck", "autokernel.kernelfile",
                   "autokernel.harness.channel")
# every module under these too: the type modules hold the references and what they call (autokernel.types._common)
WATCHED_PACKAGES = ("autokernel.types",)
WATCHED_SIGNALS = ("SIGALRM", "SIGTERM", "SIGINT", "SIGCHLD", "SIGUSR1", "SIGUSR2", "SIGVTALRM", "SIGPROF")
SCALARS = (bool, int, float, str, bytes, type(None))


class IntegrityError(GuardFailed):
    """Something the verdict depends on changed after the kernel file came into the process."""


def _token(value):
    """What identifies a value for the fingerprint: functions by object and code, scalars by value,
    everything else by object (a replaced object changes; a dict filled in place does not)."""
    if isinstance(value, types.FunctionType):
        return ("function", id(value), id(value.__code__))
    if isinstance(value, SCALARS):
        return ("value", value)
    return ("object", id(value))


def _namespace(ns: dict, public_scalars_only: bool = True) -> dict:
    # Private scalars of a library are its bookkeeping (torch.cuda._initialized flips on first use).
    return {k: _token(v) for k, v in list(ns.items())
            if not (public_scalars_only and k.startswith("_") and isinstance(v, SCALARS))}


def _classes() -> list[type]:
    import torch

    found = [c for c in torch.Tensor.__mro__ if c is not object]
    found += [torch.cuda.Event, torch.cuda.Stream, torch.Generator]
    harness = sys.modules.get("autokernel.harness.harness")
    if harness is not None:
        found.append(harness.Harness)
    guards = sys.modules.get("autokernel.harness.guards")
    if guards is not None:
        found += [c for c in guards.AtenWatch.__mro__ if c is not object]
    return found


def watched_modules() -> tuple[str, ...]:
    """WATCHED_MODULES and the modules of WATCHED_PACKAGES imported so far."""
    inside = sorted(n for n in list(sys.modules) if n.startswith(tuple(p + "." for p in WATCHED_PACKAGES)))
    return WATCHED_MODULES + tuple(inside)


def _process_state() -> dict:
    import torch

    state = {
        "sys.settrace": _token(sys.gettrace()), "sys.setprofile": _token(sys.getprofile()),
        "threading: Python threads": threading.active_count(),
        "torch function modes": torch._C._len_torch_function_stack(),
        "torch dispatch modes": torch._C._len_torch_dispatch_stack(),
        "torch deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "sys.stdout": id(sys.stdout), "sys.stderr": id(sys.stderr),
    }
    for name in WATCHED_SIGNALS:
        if hasattr(signal, name):
            state[f"signal handler {name}"] = _token(signal.getsignal(getattr(signal, name)))
    for name in watched_modules():
        if name in sys.modules:  # one imported later is fingerprinted from then on, not reported as changed
            state[f"sys.modules[{name!r}]"] = id(sys.modules[name])
    return state


def snapshot(*objects) -> dict:
    """The fingerprint now: watched modules, classes and process state, plus the attributes of each
    extra object given (the kernel type's spec)."""
    print_ = {}
    for name in watched_modules():
        module = sys.modules.get(name)
        if module is not None:
            print_[name] = _namespace(vars(module))
    for cls in _classes():
        print_[f"{cls.__module__}.{cls.__qualname__}"] = _namespace(dict(vars(cls)), public_scalars_only=False)
    for i, obj in enumerate(objects):
        print_[f"{type(obj).__name__} {getattr(obj, 'name', i)}"] = _namespace(dict(vars(obj)), False)
    print_["process"] = _process_state()
    return print_


def differences(before: dict, after: dict) -> list[str]:
    """What changed, readably: 'torch.softmax replaced', 'torch._C._TensorBase.double added', ..."""
    changed = []
    for space, names in before.items():
        now = after.get(space, {})
        for name, token in names.items():
            if name not in now:
                changed.append(f"{_where(space, name)} removed")
            elif now[name] != token:
                changed.append(f"{_where(space, name)} {'changed' if space == 'process' else 'replaced'}")
        if space in after and _is_class_space(space):  # a name added to a class shadows its base's
            changed += [f"{_where(space, n)} added" for n in now if n not in names]
    return changed


def _is_class_space(space: str) -> bool:
    return space != "process" and space not in watched_modules() and " " not in space


def _where(space: str, name: str) -> str:
    return name if space == "process" else f"{space}.{name}"


class Watch:
    """The fingerprint taken once, checked at each point the harness names."""

    def __init__(self, *objects):
        self.objects = objects
        self.before = snapshot(*objects)

    def extend(self, *objects) -> None:
        """Watch objects known only after the import too (a user's own spec), from now on."""
        self.objects += objects
        self.before.update({k: v for k, v in snapshot(*objects).items() if k not in self.before})

    def check(self, when: str, ignore_threads: bool = False) -> None:
        now = snapshot(*self.objects)
        changed = differences(self.before, now)
        if ignore_threads:  # torch.compile's worker pools are the baseline's, not the kernel's
            changed = [c for c in changed if not c.startswith("threading")]
        if changed:
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            raise IntegrityError(f"{when}: {', '.join(changed[:3])}{more} since the harness started "
                                 "(the kernel reached into the harness's process)")
