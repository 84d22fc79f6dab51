"""The kernel-type registry: one `KernelSpec` per type holds everything the harness needs.

A spec says how to make inputs for a shape, which shapes to sweep (on a GPU and, smaller, through
Triton's CPU interpreter), which adversarial inputs to try, how many bytes and FLOPs one call must
move at least (the roofline), and any tolerance that differs from the per-dtype default. Tests,
bench.py, extract.py and verify.py all read shapes and tolerances from here and restate none.

Adding a type is one `register(KernelSpec(...))` call (see autokernel/specs.py) plus its
reference function; the harness itself does not change.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

Shape = dict  # named dimensions, e.g. {"M": 4096, "N": 4096}; may carry flags such as "causal"
Inputs = tuple  # positional arguments of the reference and of kernel_fn

DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# (atol, rtol) by dtype. rtol matches atol so that large outputs (a matmul over K=4096, a row sum)
# are judged relative to their size and small ones absolutely.
TOLERANCES = {
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float32: (1e-4, 1e-4),
}


@dataclass(frozen=True)
class KernelSpec:
    name: str
    reference: Callable
    # (shape, dtype, device, generator) -> positional inputs; fresh random values on every call
    make_inputs: Callable[[Shape, torch.dtype, torch.device, torch.Generator], Inputs]
    shapes: list[Shape]  # GPU sweep, 8-10 shapes
    small_shapes: list[Shape]  # CPU sweep through the interpreter
    edge_shapes: list[Shape]  # non-power-of-two sizes (GPU)
    small_edge_shapes: list[Shape]  # the same idea, small enough for the interpreter
    bench_shape: Shape  # the primary timing shape on a GPU
    small_bench_shape: Shape  # the timing shape in CPU mode
    bytes_moved: Callable[[Shape, torch.dtype], int]  # the fewest bytes one call must move
    flops: Callable[[Shape], int]
    # name -> (shape, dtype, device, generator) -> inputs that stress the numerics
    adversarial: dict[str, Callable] = field(default_factory=dict)
    # inputs -> the same values laid out non-contiguously (a strided view); None if not applicable
    noncontiguous: Callable[[Inputs], Inputs] | None = None
    tolerances: dict = field(default_factory=dict)  # dtype -> (atol, rtol), overriding TOLERANCES
    # float64 inputs -> the magnitude a correct kernel's rounding error scales with, where that exceeds
    # |out|: for a matmul whose terms cancel, |A| @ |B|. rtol applies to max(|out|, this).
    error_scale: Callable[[Inputs], torch.Tensor] | None = None
    # adversarial name -> factor on (atol, rtol): inputs that are ill-conditioned on purpose (scores of
    # +-64 sigma in attention amplify fp32 rounding) test robustness, not the last digits
    adversarial_tolerance: dict = field(default_factory=dict)
    description: str = ""
    dtypes: tuple = DTYPES  # the dtypes the stages check (a KernelBench problem: its one dtype)
    # (kernel module, device) -> the callable the stages check and time, for kernel files whose entry is
    # not kernel_fn (a KernelBench ModelNew, built with the reference's weights); None: module.kernel_fn
    bind: Callable | None = None

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        return self.tolerances.get(dtype, TOLERANCES[dtype])

    def sweep(self, small: bool) -> list[Shape]:
        return self.small_shapes if small else self.shapes

    def edges(self, small: bool) -> list[Shape]:
        return self.small_edge_shapes if small else self.edge_shapes

    def timing_shape(self, small: bool) -> Shape:
        return self.small_bench_shape if small else self.bench_shape

    def smoke_shape(self) -> Shape:
        return self.small_shapes[0]


_REGISTRY: dict[str, KernelSpec] = {}
_RESOLVED: dict[str, KernelSpec] = {}  # specs built on demand from their names (not listed by kernel_types)

# Type-name prefixes whose specs are built on demand from the name: prefix -> "module:function" taking the
# name and returning its KernelSpec (or raising KeyError with the reason). "kb/level1/19_ReLU" is a
# KernelBench problem. register_resolver adds others.
RESOLVERS: dict[str, str | Callable[[str], KernelSpec]] = {"kb/": "kernelbench.spec:resolve"}


def register(spec: KernelSpec) -> KernelSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"kernel type {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def _load_builtin_specs() -> None:
    from autokernel import specs  # noqa: F401  (registers the nine built-in types on import)


def register_resolver(prefix: str, resolve: Callable[[str], KernelSpec]) -> None:
    RESOLVERS[prefix] = resolve


def _resolve(name: str) -> KernelSpec | None:
    for prefix, resolve in RESOLVERS.items():
        if name.startswith(prefix):
            if isinstance(resolve, str):
                module, _, function = resolve.partition(":")
                resolve = getattr(importlib.import_module(module), function)
            spec = resolve(name)
            _RESOLVED[name] = spec
            return spec
    return None


def get_spec(name: str) -> KernelSpec:
    _load_builtin_specs()
    spec = _REGISTRY.get(name) or _RESOLVED.get(name) or _resolve(name)
    if spec is None:
        known = ", ".join(sorted(_REGISTRY))
        raise KeyError(f"unknown kernel type {name!r}; known types: {known}")
    return spec


def kernel_types() -> list[str]:
    _load_builtin_specs()
    return list(_REGISTRY)


def shape_label(shape: Shape) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}.get(dtype, str(dtype))


def parse_dtype(name: str) -> torch.dtype:
    table = {
        "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
        "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
        "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    }
    try:
        return table[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of fp16, bf16, fp32") from None
