"""The kernel-type registry: one `KernelSpec` (autokernel/kerneltype.py) per type holds everything anyone
needs to know about the type.

Tests, bench.py, profile.py, extract.py, verify.py, the suite and the scripts read a type's shapes,
tolerances, op schema, profiler rules, default speedup and model sites from here and restate none.
The built-in entries are the modules of autokernel/types/, one per type; names under a resolver's prefix are built
on demand ("kb/level1/19_ReLU": a KernelBench problem, kernelbench/spec.py; "region/fused_mul_sigmoid_0": a region
of a model extract.py made a type of, autokernel/types/_region.py).

Adding a built-in type is adding its module to autokernel/types/ and its starter files; a type of the user's own is
one `register(KernelSpec(...))` call (tests/test_kernel_type.py does it with a toy type). `unregister` takes a
type out again.

Imports go one way: kerneltype (what an entry is) <- the machinery the type modules use (customops' ops and call
sites, swap's module replacement and probes, kernelbench.spec) <- the type modules <- this module <- everything
that asks about a type (harness, attribution, plan, suite, baselines, deploy). None of the machinery imports the
registry: customops and swap are handed a type's Deployment with its kernel.
"""

from __future__ import annotations

from collections.abc import Callable

from autokernel import types
from autokernel.kerneltype import (  # noqa: F401  (the registry's public names, as before)
    DTYPES,
    TOLERANCES,
    Inputs,
    KernelSpec,
    Shape,
    dtype_name,
    parse_dtype,
    shape_label,
)
from autokernel.types import _region as regiontype
from kernelbench import spec as kernelbench_spec

_REGISTRY: dict[str, KernelSpec] = {spec.name: spec for spec in types.builtin()}
_RESOLVED: dict[str, KernelSpec] = {}  # specs built on demand from their names (not listed by kernel_types)

# Type-name prefixes whose specs are built on demand from the name: prefix -> a function taking the name and
# returning its KernelSpec (or raising KeyError with the reason). register_resolver adds others.
RESOLVERS: dict[str, Callable[[str], KernelSpec]] = {kernelbench_spec.PREFIX: kernelbench_spec.resolve,
                                                     regiontype.PREFIX: regiontype.resolve}


def register(spec: KernelSpec) -> KernelSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"kernel type {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Take a registered type out again (KeyError if there is none)."""
    del _REGISTRY[name]


def register_resolver(prefix: str, resolve: Callable[[str], KernelSpec]) -> None:
    RESOLVERS[prefix] = resolve


def _resolve(name: str) -> KernelSpec | None:
    for prefix, resolve in RESOLVERS.items():
        if name.startswith(prefix):
            spec = resolve(name)
            _RESOLVED[name] = spec
            return spec
    return None


def get_spec(name: str) -> KernelSpec:
    spec = _REGISTRY.get(name) or _RESOLVED.get(name) or _resolve(name)
    if spec is None:
        known = ", ".join(sorted(_REGISTRY))
        raise KeyError(f"unknown kernel type {name!r}; known types: {known}")
    return spec


def kernel_types() -> list[str]:
    return list(_REGISTRY)


def specs_where(concern: str) -> dict[str, KernelSpec]:
    """Registered types whose entry has the given concern set (e.g. "deployment", "profiling"), by name."""
    return {name: spec for name, spec in _REGISTRY.items() if getattr(spec, concern) is not None}
