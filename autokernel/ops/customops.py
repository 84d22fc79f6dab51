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
mismatch) without redefining anything; since dynamo's graph names the op, not the file, torch.compile's caches are
keyed on the files installed (`_DIGESTS`, compat.tag_compile_caches), or a compile would load code compiled with
another file behind the op and launch that file's kernels. Outside a compile the model calls the kernel straight
(through launchers.fast): the op only matters to a graph, and its dispatch (autograd wrapper, redispatch, alias
checks) costs host time on every call, several times a launch's, which a model of a hundred kernel calls per forward
pays in full whenever it runs without a CUDA graph (docs/launch-cost.md). A call that needs a gradient runs the
original op.

What an op is (its schema, its output's shape) comes from the type's registry entry (`Deployment`,
autokernel/kerneltype.py), handed over with the kernel (`install`); this module keeps no per-type table.

Drop-in replacements: a type module (autokernel/types/) names, as its Deployment's functions, wrappers of the torch
functions its kernel stands for (F.softmax, F.linear, ...), built on what is here: `original` (the function before
any patch), `CallSites` (each call site with the reason a call fell back), `grad_reason`, `in_eager`, `PerTables`.
Where the wrappers are patched in, and for how long, is swap.py's business.
"""

from __future__ import annotations

import hashlib
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
_DIGESTS: dict[str, str] = {}  # kernel type -> a digest of the file its kernel came from (the compile caches' key)
_PACKAGE = str(Path(__file__).parent.parent)  # autokernel/: the replacements' code (CallSites.hit skips it)


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
    """Import the file, check kernel_fn's signature against the reference, and plug it into its op (a file that
    predates the reference's last parameters with defaults runs where a call passes those: lacked_defaults)."""
    try:
        module = kernelfile.import_kernel(choice.path)
    except kernelfile.KernelFileError:
        raise
    except Exception as e:  # a syntax error, a Triton API this version lacks, ...
        raise kernelfile.KernelFileError(f"cannot import {choice.path}: {type(e).__name__}: {e}") from e
    lacked = kernelfile.lacked_defaults(module.kernel_fn, choice.spec.reference)
    install(choice.type, module.kernel_fn, str(choice.path), choice.spec.deployment, lacked)
    return module.kernel_fn


def install(kernel_type: str, kernel_fn: Callable, label: str, deployment, lacked: tuple = ()) -> None:
    """Make `autokernel::<type>` run kernel_fn from now on (defining the op on first use from the type's
    Deployment, registry.get_spec(kernel_type).deployment); lacked: the defaults of the op's last arguments that
    kernel_fn does not take (a file older than them)."""
    _DEPLOYMENTS.setdefault(kernel_type, deployment)
    _define(kernel_type)
    _IMPLS[kernel_type] = _older(launchers.fast(kernel_fn), lacked, kernel_type, label)
    _LABELS[kernel_type] = label
    traceable = launchers.traceable(kernel_fn) if compat.native_compile_enabled() else None
    _TRACEABLE[kernel_type] = _older(traceable, lacked, kernel_type, label)
    _DIGESTS[kernel_type] = _digest(kernel_fn, label)
    _retag()


def _older(fn: Callable | None, lacked: tuple, kernel_type: str, label: str) -> Callable | None:
    """fn as the op calls it when its file lacks the op's last arguments: a call passing their defaults runs fn on
    the others; another value is a KernelCallError saying the file must be extracted again."""
    if not lacked or fn is None:
        return fn
    n = len(lacked)

    def call(*args):
        if any(a is not d and (isinstance(a, torch.Tensor) or a != d) for a, d in zip(args[-n:], lacked)):
            raise KernelCallError(kernel_type, f"{label} predates {kernel_type}'s last {n} argument(s), which this "
                                               f"call sets: extract the type again (python extract.py)")
        return fn(*args[:-n])
    return call


def _digest(kernel_fn: Callable, label: str) -> str:
    """What the kernel's file holds (a digest of its bytes) and the values of its module's constants now (a tunable
    set on the imported module, as a test or a notebook does, changes what it launches), so that two kernels of one
    type never share a compiled model; a function with no file of its own is known by its label and name."""
    fn = inspect.unwrap(kernel_fn)
    constants = sorted((k, v) for k, v in getattr(fn, "__globals__", {}).items()
                       if k.isupper() and isinstance(v, (bool, int, float, str, tuple, type(None))))
    try:
        source = Path(inspect.getsourcefile(fn)).read_bytes()
    except (TypeError, OSError):
        source = f"{label}:{getattr(fn, '__qualname__', '')}".encode()
    return hashlib.sha256(source + repr(constants).encode()).hexdigest()[:16]


def _retag() -> None:
    """torch.compile's caches keyed on the kernels installed now (compat.tag_compile_caches): dynamo's graph names
    only the op, whichever file runs behind it."""
    kernels = "".join(f"{t}={d};" for t, d in sorted(_DIGESTS.items()))
    compat.tag_compile_caches(hashlib.sha256(kernels.encode()).hexdigest()[:16])


def is_installed(kernel_type: str) -> bool:
    return kernel_type in _IMPLS


def uninstall(kernel_type: str) -> None:
    """The type's op runs no kernel any more (op() raises, as before install); its definition stays."""
    for table in (_IMPLS, _LABELS, _TRACEABLE, _DIGESTS):
        table.pop(kernel_type, None)
    _retag()


def installed(types) -> dict[str, tuple]:
    """What the ops of `types` run now, to put back with reinstall(): verify.py times two kernel sets in turn."""
    return {t: (_IMPLS[t], _LABELS[t], _TRACEABLE[t], _DIGESTS[t]) for t in types}


def reinstall(kernels: dict[str, tuple]) -> None:
    """Make the ops run what installed() returned."""
    for t, (impl, label, traceable, digest) in kernels.items():
        _IMPLS[t], _LABELS[t], _TRACEABLE[t], _DIGESTS[t] = impl, label, traceable, digest
    _retag()


def op(kernel_type: str):
    """What a model calls, e.g. op("rmsnorm")(x, weight, eps): the custom op under torch.compile or when a
    gradient is wanted (the op has no backward, so asking for one is an error, never a silent zero), the
    kernel itself otherwise."""
    if kernel_type not in _IMPLS:
        raise KeyError(f"no kernel installed for {kernel_type!r}")
    custom = getattr(getattr(torch.ops, NAMESPACE), kernel_type).default

    def call(*args):  # eager under no_grad: a few checks of host time over the kernel_fn it runs
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(
                getattr(a, "requires_grad", False) for a in args)):  # (isinstance(a, Tensor) costs more)
            return custom(*args)
        return _run(kernel_type, *args, layout=_dense)

    return call


def _run(kernel_type: str, *args, layout=None) -> torch.Tensor:
    """The installed kernel on args, its errors named by type and file; each output contiguous (the op's fake
    promises that), or as `layout` has it (the kernel called eagerly: _dense)."""
    try:
        out = _IMPLS[kernel_type](*args)
    except KernelCallError:  # already names the type and the file (a file older than the op's arguments)
        raise
    except Exception as e:
        raise KernelCallError(kernel_type, f"the {kernel_type} kernel ({_LABELS[kernel_type]}) raised "
                                           f"{type(e).__name__}: {e}") from e
    layout = layout or _contiguous
    if isinstance(out, (tuple, list)):  # an op of several outputs (a sum and its norm)
        return tuple(layout(t) for t in out)
    return layout(out)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _promised(deployment) -> Callable:
    """The layout the op's fake promises: contiguous, or the Deployment's output_order."""
    order = deployment.output_order
    if order is None:
        return _contiguous

    def in_order(t: torch.Tensor) -> torch.Tensor:
        if t.permute(order).is_contiguous():
            return t
        return _empty_in_order(t.shape, order, t).copy_(t)

    return in_order


def _empty_in_order(shape, order: tuple[int, ...], like: torch.Tensor, dtype=None) -> torch.Tensor:
    """An empty tensor of `shape` whose dims lie in memory in `order`, outermost first."""
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return like.new_empty([shape[d] for d in order], dtype=dtype or like.dtype).permute(inverse)


def _dense(t: torch.Tensor) -> torch.Tensor:
    """t as the kernel laid it out where every element has a place of its own and the storage no gaps (a permuted
    layout: flash_attention's sequence-major output, which the model's transpose then views), else contiguous: an
    expanded or overlapping result could not take the model's in-place ops."""
    if t.is_contiguous():
        return t
    by_stride = sorted(range(t.dim()), key=lambda d: -t.stride(d))  # dense: contiguous once its dims are so ordered
    return t if t.permute(by_stride).is_contiguous() else t.contiguous()


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

    promised = _promised(deployment)  # the layout the fake below gives Inductor

    def run(*args):
        return _run(kernel_type, *args, layout=promised)

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
            return _run(kernel_type, *args, layout=promised)
        traceable = _TRACEABLE.get(kernel_type)
        if traceable is not None:  # traced (fake tensors): Triton launches become graph nodes
            try:
                return traceable(*args)
            except launchers.NotTraceable:  # a launch Inductor would misread: the kernel runs as an opaque op
                pass
        return opaque_op(*args)

    traced.__signature__ = _signature(deployment.schema)  # triton_op infers its schema from the signature
    compat.memoize_kernel_analysis()  # each layer's launches traced alike: one write analysis for all of them
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
    """An empty tensor of the output's shape, contiguous or in the Deployment's output_order, in the first floating
    input's dtype (the kernel contract) or the Deployment's output_dtype; a tuple of contiguous ones for an op of
    several outputs (its output_shape gives a list of shapes)."""
    deployment = _DEPLOYMENTS[kernel_type]
    dtype = deployment.output_dtype or next(a.dtype for a in args
                                            if isinstance(a, torch.Tensor) and a.is_floating_point())
    shape = deployment.output_shape(*args)
    if isinstance(shape, list):
        return tuple(args[0].new_empty(s, dtype=dtype) for s in shape)
    if deployment.output_order is not None:
        return _empty_in_order(shape, deployment.output_order, args[0], dtype)
    return args[0].new_empty(shape, dtype=dtype)


# ------------------------------------------------- drop-in replacements of torch functions
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# torch's functions as they are before any patch (this module is imported before a model is optimized), so that a
# drop-in wrapper never calls another one
_ORIGINALS = {id(owner): dict(vars(owner)) for owner in (F, torch)}


def original(owner, name: str):
    """owner.name (owner: torch.nn.functional or torch) as it was before any patch; None where torch has none."""
    return _ORIGINALS[id(owner)].get(name)


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
    """Sites of patched function calls, keyed by what was called, from where and by which type's replacement (two
    types share SDPA: one takes the prefill, one the decode steps) (eager runs only)."""

    def __init__(self):
        self.sites: dict[tuple[str, str, str], Site] = {}
        self._by_line: dict[tuple, Site] = {}  # (what, type, code, line) -> its site: described once, not per call

    def hit(self, what: str, kernel_type: str, reason: str | None = None, depth: int = 2) -> None:
        frame = sys._getframe(depth)  # 0 hit, 1 the wrapper, 2 the model code that called the function
        replaced = what.rsplit(".", 1)[-1]
        while frame.f_back is not None and frame.f_code.co_name == replaced and frame.f_code.co_filename.startswith(
                _PACKAGE):  # another type's replacement of the function, which handed the call on (swap._sharing)
            frame = frame.f_back
        line = (what, kernel_type, frame.f_code, frame.f_lineno)
        site = self._by_line.get(line)
        if site is None:
            code = frame.f_code
            name = getattr(code, "co_qualname", code.co_name)
            where = f"{code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} {name}"
            site = self._by_line[line] = self.sites.setdefault((what, where, kernel_type),
                                                               Site(where, what, kernel_type, False))
        if reason is None:
            site.calls += 1
            site.swapped = True
        else:
            site.fallbacks += 1
            site.reason = reason


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
