"""What a kernel type is: `KernelSpec`, the entry the registry holds for each type, and the per-dtype
tolerances. The ground of the library: it imports nothing of autokernel, so the registry, the built-in
types (autokernel/types/, one module each), KernelBench's resolver and the harness all stand on it.

A spec says how to make inputs for a shape, which shapes to sweep (on a GPU and, smaller, through
Triton's CPU interpreter), which adversarial inputs to try, how many bytes and FLOPs one call must
move at least (the roofline), and any tolerance that differs from the per-dtype default; and, for
the rest of the pipeline, how the profiler recognises the type (`profile`), the speedup the plan
assumes until its starter is measured, the suite's target, and how verify.py plugs a kernel of the
type into a model (`deploy`).
"""

from __future__ import annotations

import re
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
class Profiling:
    """How profile.py recognises the type in a profiled model and reads the shape of one call
    (autokernel/profile/attribution.py applies these rules; its docstring gives their order)."""
    modules: re.Pattern | None = None  # a module class whose name matches is one call of the type
    # ...only when one of these ops runs inside it (an MLP is fused_mlp when it runs a silu); such modules
    # are tried before the plain module rules
    module_needs: frozenset = frozenset()
    functions: re.Pattern | None = None  # a Python function whose name matches (RoPE written as a function)
    ops: frozenset = frozenset()  # aten ops that are the type ("aten::mm", ...)
    kernels: re.Pattern | None = None  # device kernels launched outside any known op, by name
    # an `attribution.Op` of one of `ops` (its recorded input shapes and scalar arguments) -> the type's shape
    op_shape: Callable | None = None
    # (a module call's input shape, a list of ints; the ops of the call) -> the type's shape
    module_shape: Callable | None = None
    # (names of the top-level ops of one module, in order; a position) -> (first, last) positions of the type
    # written as plain ops around that position, or None (RMSNorm as pow, mean, add, rsqrt, mul)
    op_pattern: Callable | None = None
    # one call per distinct widest 4-D tensor the matched function's ops take, its shape [B, H, S, D] (RoPE
    # applied to q and k: two calls, GQA's k with fewer heads)
    per_tensor: bool = False
    # a module of `modules` whose path matches this, called right after a top-level aten::add of two tensors of its
    # input's shape in the same parent module: the add and the module are one call (a residual add fused into the
    # norm after it); such a type claims no other module of `modules`
    residual_add: re.Pattern | None = None
    # where rules of two types match the same name, the lower precedence wins (an attention kernel is
    # often a cutlass kernel: flash_attention before matmul)
    precedence: int = 0
    # with module_needs: the module must also run a Python function whose name matches (attention with its RoPE:
    # apply_rotary_pos_emb); such functions get a profiler range when another type's `functions` names them
    module_needs_function: re.Pattern | None = None
    # top-level ops inside a matched module that keep their own type (an attention module's projections stay matmul)
    module_leaves: frozenset = frozenset()
    # a GEMM and the elementwise op right after it as one call (an epilogue fused into the GEMM): a module of `modules`
    # or a top-level op of `ops` called right after, in the same parent module and on as many rows, a top-level op
    # named here or a module range that runs exactly one (an nn.Linear, transformers' Conv1D). Such a type claims no
    # module or op of its own otherwise; module_shape reads its shape from the GEMM's input shape and the pair's ops
    epilogue_of: frozenset = frozenset()
    # the rules apply only where the type is asked for (profile.py --types): a fusion of types that are profiled on
    # their own otherwise (rope_attention takes rotary_embedding's and flash_attention's time in an attention module)
    opt_in: bool = False


@dataclass(frozen=True)
class Deployment:
    """How verify.py and autokernel.optimize plug a kernel of the type into a model (autokernel/ops/customops.py
    defines the op, autokernel/ops/swap.py finds the sites)."""
    # the torch.library schema of `autokernel::<type>`: kernel_fn's parameters, optional ones (eps, causal,
    # sm_scale, dim) always passed explicitly so the op never depends on a kernel file's defaults
    schema: str
    # the op's inputs -> its output's shape (a list of shapes, one per output, for an op returning several
    # tensors): all a fake implementation needs. Written out rather than taken
    # from the reference run on fake tensors, because verify.py patches F.* functions while the optimized
    # model is traced, and the references call those very functions.
    output_shape: Callable
    # (module path, module) -> (Site, replacement module or None) when the module is a site of this type,
    # else None; tried in the order of the requested types, the first that answers decides
    module_site: Callable | None = None
    # CallSites -> {torch function: drop-in replacement} whose calls run the kernel where they fit
    functions: Callable | None = None
    # (model, CallSites) -> ([(owner, attribute, replacement)], [Site notes]): patches found in the model's
    # own code (its rotary helpers)
    model_functions: Callable | None = None
    # the op's output dtype where it is not the first floating input's (a loss in fp32 from fp16 inputs)
    output_dtype: torch.dtype | None = None
    # the model (its module tree, built for the swap) -> (module path, Site, replacement module or None) for
    # a site found from the model as a whole (its output embedding, model.get_output_embeddings()), else
    # None; tried after the module sites, so the replacement may wrap one of theirs
    model_site: Callable | None = None
    # the memory order of a single output's dims, outermost first, where the op promises other than contiguous:
    # flash_attention's (0, 2, 1, 3), sequence-major, which the model's transpose(1, 2) then views (customops)
    output_order: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SuiteTarget:
    """What `bench.py --suite` expects of the starter: a label, and the ratio of a result row that must
    reach 1.0 to meet it (row, baselines) -> float."""
    label: str
    ratio: Callable
    dtypes: tuple = ("fp16",)  # the dtypes the suite benches the starter in


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
    # inputs -> the same values laid out as the type's model sites pass them (rope_attention: q, k and v as views of
    # the [B, S, H, D] projections), where that differs from make_inputs': the time at the model's shapes, its
    # baselines, the screen and the launch record take them so (Harness.model_inputs); None: make_inputs' layout
    model_layout: Callable[[Inputs], Inputs] | None = None
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
    # ---- what the rest of the pipeline needs (None: the type takes no part in that step)
    profiling: Profiling | None = None  # profile.py: recognising the type and reading its shapes
    # the plan's expected speedup over PyTorch eager until the starter is measured (benchmarks/starters.json)
    default_speedup: float | None = None
    suite_target: SuiteTarget | None = None  # bench.py --suite; None: the memory-bound target
    # liger (Liger-Kernel's functional module, or None) -> {baseline name: fn with the reference's signature}
    extra_baselines: Callable | None = None
    # (liger, autokernel.harness.baselines) -> a measurement `bench.py --suite` records beside the type's rows
    # ({"what", "bytes", "kernel": us, "eager": us, ...}): a model's call that the bench shape misses (rotary on q
    # and k together)
    extra_timing: Callable | None = None
    deployment: Deployment | None = None  # verify.py, autokernel.optimize, the exported package
    # the output's dtype where it is not the first floating input's (a loss: fp32 from fp16 inputs)
    output_dtype: torch.dtype | None = None

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
