"""The kernels verify.py plugs into a model: which file per type, and each one as a torch.library op.

Which file: for each kernel type the best kernel is the loop's winner, `*<type>*_optimized.py` in
the kernels directory (workspace/kernels by default), else the extracted starter `NN_<type>.py`
there, else the shipped starter `kernels/<type>.py`. A file counts for a type by the KERNEL_TYPE it
declares (read with ast, not by name alone); among several files of one kind the lowest rank number
(the type's biggest share of the profile) wins, and the others are reported as passed over.

Why ops: a Triton launch is opaque to torch.compile, so calling kernel_fn from a model makes dynamo
break the graph at every call. Registered as `autokernel::<type>`, a kernel becomes one node of the
graph and the optimized model compiles whole. Where torch has `torch.library.triton_op` (>= 2.6) the
op is one: traced, its body is the kernel file with each Triton launch recorded (launchers.traceable),
so Inductor launches the kernels from its own generated code, and a compiled model pays no Python op
dispatch per call; a file it cannot trace (CUDA C++) runs behind an opaque custom op `<type>_opaque`
whose fake only computes the output's shape and dtype. The ops are defined once per process
(torch.library cannot redefine a name); what each op runs is looked up at call time (`_IMPLS`,
`_TRACEABLE`), so verify.py can plug in other files (or a single type, to find the kernel behind a
mismatch) without redefining anything. Outside a compile the model calls the kernel straight (through
launchers.fast): the op only matters to a graph, and its dispatch (autograd wrapper, redispatch,
alias checks) costs ~10 us of host time per call, which a model of a hundred kernel calls per forward
pays in full whenever it runs without a CUDA graph. A call that needs a gradient runs the original op.

What an op is (its schema, its output's shape) comes from the type's registry entry (`Deployment`,
autokernel/kerneltype.py), handed over with the kernel (`install`); this module keeps no per-type table.

Drop-in replacements: for each torch function a kernel stands for (F.scaled_dot_product_attention,
F.softmax and torch.softmax, F.layer_norm, F.rms_norm, F.linear, F.cross_entropy, and rotary helpers
of the reference's conventions) a wrapper with the function's own signature runs the op when a call
fits the kernel and the original function otherwise, and records each call site with the reason
(CallSites). The `replace_*` builders are what the built-in entries name as their Deployment's
functions; where the wrappers are patched in, and for how long, is swap.py's business.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from autokernel import compat, kernelfile
from autokernel.ops import launchers

NAMESPACE = "autokernel"

_IMPLS: dict[str, Callable] = {}  # kernel type -> the kernel_fn its op runs now
_LABELS: dict[str, str] = {}  # kernel type -> the file it came from, for error messages
_DEFINED: dict[str, object] = {}  # kernel type -> its op definitions (kept alive)
_TRACEABLE: dict[str, Callable | None] = {}  # kernel type -> kernel_fn as torch.compile traces it
_DEPLOYMENTS: dict = {}  # kernel type -> its registry entry's Deployment (schema, output shape, sites)


class KernelCallError(RuntimeError):
    """A plugged-in kernel raised; the message names the type and the file."""

    def __init__(self, kernel_type: str, message: str):
        super().__init__(message)
        self.kernel_type = kernel_type


@dataclass
class KernelChoice:
    type: str
    path: Path
    source: str  # "optimized" | "extracted" | "starter"
    passed_over: list[Path] = field(default_factory=list)
    spec: object = None  # the type's registry entry (a KernelSpec with a deployment)


def _rank(path: Path) -> tuple[int, str]:
    match = re.match(r"(\d+)_", path.name)
    return (int(match.group(1)) if match else 10**6, path.name)


def _declared_type(path: Path) -> str | None:
    try:
        return kernelfile.kernel_type(kernelfile.read_source(path), path.name)
    except kernelfile.KernelFileError:
        return None


def find_kernels(kernels_dir: Path, starters_dir: Path, types: list[str] | None, entries: dict,
                 winners: bool = True) -> dict[str, KernelChoice]:
    """The best kernel file of every requested type (every entry by default). entries: type -> its registry
    entry (a KernelSpec with a deployment; deploy.entries() gives them). winners=False passes over the loop's
    winners (*_optimized.py): the files the loop began from."""
    wanted = list(types) if types else list(entries)
    unknown = [t for t in wanted if t not in entries]
    if unknown:
        raise ValueError(f"no custom op for kernel type(s) {', '.join(unknown)}; known: {', '.join(entries)}")
    by_type: dict[str, dict[str, list[Path]]] = {}
    for path in sorted(Path(kernels_dir).glob("*.py")) if Path(kernels_dir).is_dir() else []:
        declared = _declared_type(path)
        if declared in wanted:
            kind = "optimized" if path.stem.endswith("_optimized") else "extracted"
            if kind == "optimized" and not winners:
                continue
            by_type.setdefault(declared, {}).setdefault(kind, []).append(path)
    chosen = {}
    for t in wanted:
        found = by_type.get(t, {})
        for kind in ("optimized", "extracted"):
            if found.get(kind):
                best, *rest = sorted(found[kind], key=_rank)
                others = rest + (found.get("extracted", []) if kind == "optimized" else [])
                chosen[t] = KernelChoice(t, best, kind, others, entries[t])
                break
        else:
            starter = Path(starters_dir) / f"{t}.py"
            if starter.is_file():
                chosen[t] = KernelChoice(t, starter, "starter", spec=entries[t])
            elif types:  # asked for by name: say so rather than verify without it
                raise ValueError(f"no {t} kernel in {kernels_dir} and no starter {starter}")
    return chosen


def load(choice: KernelChoice) -> Callable:
    """Import the file, check kernel_fn's signature against the reference, and plug it into its op."""
    try:
        module = kernelfile.import_kernel(choice.path)
    except kernelfile.KernelFileError:
        raise
    except Exception as e:  # a syntax error, a Triton API this version lacks, ...
        raise kernelfile.KernelFileError(f"cannot import {choice.path}: {type(e).__name__}: {e}") from e
    kernelfile.check_signature(module.kernel_fn, choice.spec.reference)
    install(choice.type, module.kernel_fn, str(choice.path), choice.spec.deployment)
    return module.kernel_fn


def install(kernel_type: str, kernel_fn: Callable, label: str, deployment) -> None:
    """Make `autokernel::<type>` run kernel_fn from now on (defining the op on first use from the type's
    Deployment, registry.get_spec(kernel_type).deployment)."""
    _DEPLOYMENTS.setdefault(kernel_type, deployment)
    _define(kernel_type)
    _IMPLS[kernel_type] = launchers.fast(kernel_fn)
    _LABELS[kernel_type] = label
    _TRACEABLE[kernel_type] = launchers.traceable(kernel_fn) if compat.native_compile_enabled() else None


def installed(types) -> dict[str, tuple]:
    """What the ops of `types` run now, to put back with reinstall(): verify.py times two kernel sets in turn."""
    return {t: (_IMPLS[t], _LABELS[t], _TRACEABLE[t]) for t in types}


def reinstall(kernels: dict[str, tuple]) -> None:
    """Make the ops run what installed() returned."""
    for t, (impl, label, traceable) in kernels.items():
        _IMPLS[t], _LABELS[t], _TRACEABLE[t] = impl, label, traceable


def op(kernel_type: str):
    """What a model calls, e.g. op("rmsnorm")(x, weight, eps): the custom op under torch.compile or when a
    gradient is wanted (the op has no backward, so asking for one is an error, never a silent zero), the
    kernel itself otherwise."""
    if kernel_type not in _IMPLS:
        raise KeyError(f"no kernel installed for {kernel_type!r}")
    custom = getattr(getattr(torch.ops, NAMESPACE), kernel_type).default

    def call(*args):  # eager under no_grad: ~1 us of host time over the kernel_fn it runs
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(
                getattr(a, "requires_grad", False) for a in args)):  # (isinstance(a, Tensor) costs more)
            return custom(*args)
        return _run(kernel_type, *args)

    return call


def _run(kernel_type: str, *args) -> torch.Tensor:
    """The installed kernel on args, its errors named by type and file."""
    try:
        out = _IMPLS[kernel_type](*args)
    except Exception as e:
        raise KernelCallError(kernel_type, f"the {kernel_type} kernel ({_LABELS[kernel_type]}) raised "
                                           f"{type(e).__name__}: {e}") from e
    # The op's fake promises contiguous tensors; a strided result would break that promise.
    if isinstance(out, (tuple, list)):  # an op of several outputs (a sum and its norm)
        return tuple(t if t.is_contiguous() else t.contiguous() for t in out)
    return out if out.is_contiguous() else out.contiguous()


def _define(kernel_type: str) -> None:
    """`autokernel::<type>`: a triton_op where torch has them (Inductor traces into the kernel file and launches
    its Triton kernels from its own generated code), else an opaque custom op; see launchers.traceable."""
    if kernel_type in _DEFINED:
        return
    deployment = _DEPLOYMENTS.get(kernel_type)
    if deployment is None:
        raise ValueError(f"no custom-op schema for kernel type {kernel_type!r}")
    name = f"{NAMESPACE}::{kernel_type}"
    native = compat.has_triton_op()

    def run(*args):
        return _run(kernel_type, *args)

    def fake(*args):
        return _fake_output(kernel_type, args)

    opaque = torch.library.custom_op(name + "_opaque" if native else name, run, mutates_args=(),
                                     schema=deployment.schema)
    opaque.register_fake(fake)
    _DEFINED[kernel_type] = opaque
    if not native:
        return
    opaque_op = getattr(getattr(torch.ops, NAMESPACE), f"{kernel_type}_opaque").default

    def traced(*args):
        if not compat.wrap_triton_enabled():  # the op called eagerly on real tensors: the kernel as it is
            return _run(kernel_type, *args)
        traceable = _TRACEABLE.get(kernel_type)
        if traceable is not None:  # traced (fake tensors): Triton launches become graph nodes
            try:
                return traceable(*args)
            except launchers.NotTraceable:  # a launch Inductor would misread: the kernel runs as an opaque op
                pass
        return opaque_op(*args)

    traced.__signature__ = _signature(deployment.schema)  # triton_op infers its schema from the signature
    _DEFINED[kernel_type] = (opaque, torch.library.triton_op(name, traced, mutates_args=()))


_SCHEMA_TYPES = {"Tensor": torch.Tensor, "float": float, "bool": bool, "int": int, "str": str, "float?": float | None,
                 "Tensor?": torch.Tensor | None}


def _signature(schema: str) -> inspect.Signature:
    """The Python signature of a schema string such as "(Tensor x, float eps) -> Tensor"."""
    params = schema.split(")", 1)[0].lstrip("(").split(", ")
    outputs = schema.rsplit("->", 1)[1].strip().strip("()").split(", ")
    returns = torch.Tensor if len(outputs) == 1 else tuple[(torch.Tensor,) * len(outputs)]
    return inspect.Signature([inspect.Parameter(p.split()[1], inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                annotation=_SCHEMA_TYPES[p.split()[0]]) for p in params],
                             return_annotation=returns)


def _fake_output(kernel_type: str, args):
    """An empty contiguous tensor of the output's shape, in the first floating input's dtype (the kernel contract)
    or the Deployment's output_dtype; a tuple of them for an op of several outputs (its output_shape gives a
    list of shapes)."""
    deployment = _DEPLOYMENTS[kernel_type]
    dtype = deployment.output_dtype or next(a.dtype for a in args
                                            if isinstance(a, torch.Tensor) and a.is_floating_point())
    shape = deployment.output_shape(*args)
    if isinstance(shape, list):
        return tuple(args[0].new_empty(s, dtype=dtype) for s in shape)
    return args[0].new_empty(shape, dtype=dtype)


# ------------------------------------------------- drop-in replacements of torch functions
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# torch functions as they are before any patch, so wrappers never call each other.
_ORIGINALS = {name: getattr(F, name) for name in
              ("scaled_dot_product_attention", "softmax", "layer_norm", "rms_norm", "linear", "cross_entropy")
              if hasattr(F, name)}
_TORCH_SOFTMAX = torch.softmax


@dataclass
class Site:
    where: str  # module path, or the call's file:line (function)
    what: str  # e.g. "Linear 128->384", "F.scaled_dot_product_attention"
    kernel_type: str | None
    swapped: bool
    reason: str = ""  # why it was left alone (or why some calls were)
    calls: int = 0  # calls that ran the kernel (eager runs)
    fallbacks: int = 0  # calls that did not fit the kernel and ran the original

    def to_dict(self) -> dict:
        return asdict(self)


GRAD_REASON = "a gradient is wanted (the kernels have no backward: the original op runs)"


def grad_reason(*tensors) -> str | None:
    """Why a call must run the original op to keep autograd working, or None: training through an optimized
    model stays correct (and as fast as the original), inference under no_grad gets the kernels."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return GRAD_REASON
    return None


def in_eager() -> bool:
    """False while dynamo traces: call counting stays out of compiled graphs."""
    return not torch.compiler.is_compiling()


class CallSites:
    """Sites of patched function calls, keyed by what was called and from where (eager runs only)."""

    def __init__(self):
        self.sites: dict[tuple[str, str], Site] = {}
        self._by_line: dict[tuple, Site] = {}  # (what, code, line) -> its site: each described once, not per call

    def hit(self, what: str, kernel_type: str, reason: str | None = None, depth: int = 2) -> None:
        frame = sys._getframe(depth)  # 0 hit, 1 the wrapper, 2 the model code that called the function
        line = (what, frame.f_code, frame.f_lineno)
        site = self._by_line.get(line)
        if site is None:
            code = frame.f_code
            name = getattr(code, "co_qualname", code.co_name)
            where = f"{code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} {name}"
            site = self._by_line[line] = self.sites.setdefault((what, where), Site(where, what, kernel_type, False))
        if reason is None:
            site.calls += 1
            site.swapped = True
        else:
            site.fallbacks += 1
            site.reason = reason


def _attention_unfit(q, k, v, attn_mask, dropout_p, enable_gqa) -> str | None:
    if attn_mask is not None:
        return "an attention mask is given (the kernel takes causal or none)"
    if dropout_p:
        return "attention dropout"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "not [batch, heads, seq, head_dim] tensors"
    if q.dtype not in KERNEL_DTYPES or not q.dtype == k.dtype == v.dtype:
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype}"
    if q.shape[2] != k.shape[2] or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        return "queries and keys differ in length (cross-attention or a KV cache)"
    if q.shape[1] != k.shape[1] and not (enable_gqa and q.shape[1] % k.shape[1] == 0):
        return "different head counts for queries and keys"
    return None


def replace_sdpa(sites: CallSites) -> dict:
    """F.scaled_dot_product_attention -> flash_attention where the call fits."""
    return {_ORIGINALS["scaled_dot_product_attention"]: _sdpa_wrapper(sites)}


def replace_softmax(sites: CallSites) -> dict:
    """F.softmax and torch.softmax -> softmax over the last dimension."""
    f_softmax, torch_softmax = _softmax_wrappers(sites)
    return {_ORIGINALS["softmax"]: f_softmax, _TORCH_SOFTMAX: torch_softmax}


def replace_layer_norm(sites: CallSites) -> dict:
    return {_ORIGINALS["layer_norm"]: _layer_norm_wrapper(sites)}


def replace_rms_norm(sites: CallSites) -> dict:
    """F.rms_norm (torch >= 2.4 has it) -> rmsnorm."""
    return {_ORIGINALS["rms_norm"]: _rms_norm_wrapper(sites)} if "rms_norm" in _ORIGINALS else {}


def replace_linear(sites: CallSites) -> dict:
    return {_ORIGINALS["linear"]: _linear_wrapper(sites)}


def replace_cross_entropy(sites: CallSites) -> dict:
    return {_ORIGINALS["cross_entropy"]: _cross_entropy_wrapper(sites)}


def _sdpa_wrapper(sites: CallSites):
    original = _ORIGINALS["scaled_dot_product_attention"]
    kernel = op("flash_attention")

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     scale=None, enable_gqa=False):
        reason = _attention_unfit(query, key, value, attn_mask, dropout_p, enable_gqa) or grad_reason(query, key, value)
        if in_eager():
            sites.hit("F.scaled_dot_product_attention", "flash_attention", reason)
        if reason:
            extra = {"enable_gqa": True} if enable_gqa else {}
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **extra)
        if key.shape[1] != query.shape[1]:  # grouped-query attention: expand K/V to every query head
            groups = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        return kernel(query, key, value, bool(is_causal), scale)

    return scaled_dot_product_attention


def _softmax_unfit(x, dim) -> str | None:
    if dim is None or x.dim() == 0 or dim % x.dim() != x.dim() - 1:
        return "not over the last dimension"
    if x.dtype not in KERNEL_DTYPES or x.numel() == 0:
        return f"dtype {x.dtype}" if x.numel() else "empty input"
    return None


def _softmax_wrappers(sites: CallSites):
    kernel = op("softmax")

    def run(name, x, dim, dtype, fallback):
        if dtype is not None:  # softmax(x, dtype=float32) is the softmax of x cast first
            x = x.to(dtype)
        reason = _softmax_unfit(x, dim) or grad_reason(x)
        if in_eager():
            sites.hit(name, "softmax", reason, depth=3)
        return fallback(x) if reason else kernel(x)

    def f_softmax(input, dim=None, _stacklevel=3, dtype=None):
        return run("F.softmax", input, dim, dtype, lambda x: _ORIGINALS["softmax"](x, dim))

    def torch_softmax(input, dim, dtype=None):
        return run("torch.softmax", input, dim, dtype, lambda x: _TORCH_SOFTMAX(x, dim))

    return f_softmax, torch_softmax


def _norm_unfit(input, normalized_shape, *params) -> str | None:
    shape = tuple(normalized_shape)
    if len(shape) != 1 or input.dim() == 0 or shape[0] != input.shape[-1]:
        return "normalizes over more than the last dimension"
    if input.dtype not in KERNEL_DTYPES or any(t is not None and t.dtype != input.dtype for t in params):
        return "mixed or unsupported dtypes"
    return None


def _layer_norm_wrapper(sites: CallSites):
    original, kernel = _ORIGINALS["layer_norm"], op("layernorm")

    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
        reason = _norm_unfit(input, normalized_shape, weight, bias) or grad_reason(input, weight, bias)
        if in_eager():
            sites.hit("F.layer_norm", "layernorm", reason)
        if reason:
            return original(input, normalized_shape, weight, bias, eps)
        # no affine weight or bias: ones and zeros compute the same, and the kernel takes tensors
        weight = weight if weight is not None else input.new_ones(input.shape[-1])
        return kernel(input, weight, bias if bias is not None else input.new_zeros(input.shape[-1]), eps)

    return layer_norm


def _rms_norm_wrapper(sites: CallSites):
    original, kernel = _ORIGINALS["rms_norm"], op("rmsnorm")

    def rms_norm(input, normalized_shape, weight=None, eps=None):
        reason = _norm_unfit(input, normalized_shape, weight) or grad_reason(input, weight)
        if in_eager():
            sites.hit("F.rms_norm", "rmsnorm", reason)
        if reason:
            return original(input, normalized_shape, weight, eps)
        weight = weight if weight is not None else input.new_ones(input.shape[-1])
        return kernel(input, weight, torch.finfo(input.dtype).eps if eps is None else eps)  # F.rms_norm's default

    return rms_norm


def _linear_wrapper(sites: CallSites):
    original, kernel = _ORIGINALS["linear"], op("matmul")

    def linear(input, weight, bias=None):
        fits = weight.dim() == 2 and input.dtype == weight.dtype and input.dtype in KERNEL_DTYPES
        reason = grad_reason(input, weight, bias) if fits else "mixed dtypes or a non-2-D weight"
        if in_eager():
            sites.hit("F.linear", "matmul", reason)
        if reason:
            return original(input, weight, bias)
        y = kernel(input, weight.t())
        return y if bias is None else y + bias

    return linear


def _cross_entropy_wrapper(sites: CallSites):
    original, kernel = _ORIGINALS["cross_entropy"], op("cross_entropy")

    def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                      reduction="mean", label_smoothing=0.0):
        reason = None
        if weight is not None or size_average is not None or reduce is not None or label_smoothing:
            reason = "class weights, label smoothing or legacy reduction arguments"
        elif reduction != "mean" or ignore_index != -100:  # -100 targets: the kernel must skip them too
            reason = f"reduction={reduction!r}, ignore_index={ignore_index} (the kernel: mean, -100)"
        elif input.dim() != 2 or target.dim() != 1 or target.dtype != torch.long or input.dtype not in KERNEL_DTYPES:
            reason = "not [N, V] logits with [N] integer targets"
        reason = reason or grad_reason(input)
        if in_eager():
            sites.hit("F.cross_entropy", "cross_entropy", reason)
        if reason:
            return original(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
        return kernel(input, target)

    return cross_entropy


def deployment(kernel_type: str):
    """The Deployment the type's op was defined from (install records it)."""
    return _DEPLOYMENTS[kernel_type]


class PerTables:
    """What a model's layers derive from the cos and sin tables it hands every layer of a forward (the very same
    tensors): derived for the first layer, reused by the others, made again for new tables. The last pair and its
    derivation are one tuple, replaced whole (no torn read between threads); only eager calls keep it (a trace
    keeps no tensors)."""

    def __init__(self, derive: Callable):
        self.derive, self.last = derive, None

    def __call__(self, cos, sin, eager: bool):
        last = self.last
        if eager and last is not None and last[0] is cos and last[1] is sin:
            return last[2]
        derived = self.derive(cos, sin)
        if eager:
            self.last = (cos, sin, derived)
        return derived


def rotary_x_cos_sin(fn, sites: CallSites, name: str):
    """fn(x, cos, sin) with cos, sin [seq, head_dim / 2]: the reference's own convention."""
    kernel = op("rotary_embedding")

    def rotary(x, cos, sin):
        fits = (x.dim() >= 2 and x.dtype in KERNEL_DTYPES and cos.dtype == sin.dtype == x.dtype
                and tuple(cos.shape) == tuple(sin.shape) == (x.shape[-2], x.shape[-1] // 2))
        reason = grad_reason(x, cos, sin) if fits else "tables not [seq, head_dim/2] in x's dtype"
        if in_eager():
            sites.hit(name, "rotary_embedding", reason)
        return fn(x, cos, sin) if reason else kernel(x, cos, sin)

    return rotary


def rotary_q_k_cos_sin(fn, sites: CallSites, name: str):
    """transformers' fn(q, k, cos, sin, [position_ids=None,] unsqueeze_dim=1) (position_ids is gone from newer
    versions) with cos, sin [1, seq, head_dim] built as cat(freqs, freqs): their first halves are the reference's
    tables. A model hands every layer the same cos and sin: their halves are sliced once (two views, ~2 us of host
    time each, per layer otherwise). Any other call (a partial rotary's narrower tables: GPT-NeoX, Phi; another
    argument of fn's own) goes to fn as it came."""
    kernel = op("rotary_embedding")
    halves = PerTables(lambda cos, sin: (cos[0, :, : cos.shape[-1] // 2], sin[0, :, : sin.shape[-1] // 2]))
    extra_names = list(inspect.signature(fn).parameters)[4:]  # fn's own parameters after sin

    def defaults(rest: tuple, options: dict) -> bool:
        """Whether the arguments after sin ask for what the kernel does (no position_ids, unsqueeze_dim 1)."""
        extra = {**dict(zip(extra_names, rest)), **options}
        return (set(extra) <= {"position_ids", "unsqueeze_dim"} and extra.get("position_ids") is None
                and extra.get("unsqueeze_dim", 1) == 1)

    def rotary(q, k, cos, sin, *rest, **options):
        d = q.shape[-1]
        plain = not (rest or options) or defaults(rest, options)  # a model's call passes none: no dict per call
        fits = (q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and cos.shape[0] == 1
                and tuple(cos.shape) == tuple(sin.shape) and cos.shape[1:] == (q.shape[2], d)
                and q.dtype in KERNEL_DTYPES and q.dtype == k.dtype == cos.dtype == sin.dtype)
        reason = ("called with an argument the kernel does not take" if not plain else
                  "tables not [1, seq, head_dim] in q's dtype" if not fits else grad_reason(q, k, cos, sin))
        eager = in_eager()
        if eager:
            sites.hit(name, "rotary_embedding", reason)
        if reason:
            return fn(q, k, cos, sin, *rest, **options)
        c, s = halves(cos, sin, eager)
        return kernel(q, c, s), kernel(k, c, s)

    return rotary
