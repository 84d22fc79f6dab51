"""Region kernels into compiled models: each replaces the subgraph it was cut from, wherever a graph Inductor
compiles computes the same thing (issue 36: deploy by what the model computes, not by its module names).

A region kernel (extract.py --regions; the loop's `*_optimized.py` winner first, else the starter `RNN_<name>.py`)
becomes the op `autokernel::region_<name>` (autokernel/ops/customops.py, as a built-in type's kernel does), and its
region's reference, the captured subgraph, becomes an Inductor pattern (`register_replacement`, traced as Inductor
decomposes) whose replacement calls that op. A post-grad pass applies the patterns to every graph compiled while
it is installed, in this process: the model's compiled forward, torch.compile(model) as the user writes it,
calls the kernel where its region was. Region kernels act only under torch.compile (a region is a piece of the
compiled graph); an eager model runs as it is.

    import autokernel, torch
    installed = autokernel.install_regions()      # workspace/kernels' region kernels, from now on
    model = torch.compile(autokernel.optimize(model))

The pattern matches the region's ops exactly (literals included), in the dtype the region was captured in, each
input bound to a tensor of its own.
verify.py checks and times them (regionverify.py); install_regions follows its report.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import torch

from autokernel import kernelfile
from autokernel.kerneltype import Deployment
from autokernel.ops import customops
from autokernel.types._region import PREFIX

_STATE: dict = {}  # "pass": the installed _RegionPass, "previous": the custom pass it took the place of


def region_files(kernels_dir: str | Path) -> dict[str, Path]:
    """{region type: its kernel file}: the loop's winner (`*_optimized.py`) where there is one, else the starter."""
    found: dict[str, Path] = {}
    for path in sorted(Path(kernels_dir).glob("*.py"), key=lambda p: (not p.stem.endswith("_optimized"), p.name)):
        try:
            declared = kernelfile.declarations(path.read_text(), path.name).get("KERNEL_TYPE")
        except kernelfile.KernelFileError:
            continue
        if isinstance(declared, str) and declared.startswith(PREFIX):
            found.setdefault(declared, path)
    return found


def op_name(region_type: str) -> str:
    return "region_" + region_type[len(PREFIX):]


class _RegionPass:
    """The post-grad pass: the region patterns, then whatever custom pass was there before."""

    def __init__(self, patterns, previous, digest: str):
        self.patterns, self.previous, self.digest, self.matches = patterns, previous, digest, 0

    def __call__(self, graph) -> None:
        self.matches += self.patterns.apply(graph) or 0
        if self.previous is not None:
            self.previous(graph)

    def uuid(self) -> str:
        return self.digest  # the kernels and regions it places: the FX graph cache keys on them

    def __deepcopy__(self, memo):
        return self


def region_pass(kernels_dir: str | Path, previous=None, without=()) -> tuple[_RegionPass | None, list[str]]:
    """(the post-grad pass that puts the region kernels of `kernels_dir` where their regions are, the region types
    it places), (None, []) when there are none; `previous`: a custom pass it runs after its own patterns; `without`:
    region types to leave out. For one compile: torch.compile(model, options={"post_grad_custom_post_pass": the
    pass})."""
    from torch._inductor.custom_graph_pass import CustomGraphPass
    from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, register_replacement

    from autokernel import registry

    files = {t: f for t, f in region_files(kernels_dir).items() if t not in without}
    if not files:
        return None, []
    patterns, digest = PatternMatcherPass(pass_name="autokernel_regions"), hashlib.sha256()
    for region_type, path in files.items():
        spec = registry.get_spec(region_type)
        key = op_name(region_type)
        customops.install(key, kernelfile.import_kernel(path).kernel_fn, str(path), _deployment(spec))
        example = spec.make_inputs(spec.bench_shape, _captured_dtype(spec), "cpu", torch.Generator().manual_seed(0))
        op = getattr(torch.ops.autokernel, key).default
        search = getattr(spec.reference, "pattern", spec.reference)  # with the model's casts, where it has any
        # each input bound to a tensor of its own, as where the region was captured: otherwise the two norms of one
        # sum (each with its weights) both match the graph's first, and its second stays Inductor's beside the kernel
        register_replacement(search, lambda *args, op=op: op(*args), list(example), fwd_only, [patterns],
                             exclusive_arg_names=_arg_names(search))
        digest.update(path.read_bytes())
    CustomGraphPass.register(_RegionPass)  # Inductor asks isinstance(pass, CustomGraphPass)
    return _RegionPass(patterns, previous, digest.hexdigest()), list(files)


def install_regions(kernels_dir: str | Path = Path("workspace") / "kernels", verified: str | Path | None = "auto",
                    quiet: bool = False) -> list[str]:
    """Put the region kernels of `kernels_dir` into every graph Inductor compiles from now on (see the module
    docstring); the region types placed. Installing again replaces what was installed. verified: verify.py's
    report (default "auto": workspace/verify.json beside the kernels); where it found the region kernels wrong or
    slower, none is installed, and a warning says why; a region type it left out on its own stays out."""
    uninstall_regions()
    refused, left_out = _verdict(kernels_dir, verified)
    if refused:
        if not quiet:
            warnings.warn(f"autokernel: region kernels not installed: verify.py {refused}", stacklevel=2)
        return []
    config = torch._inductor.config
    made, types = region_pass(kernels_dir, config.post_grad_custom_post_pass, left_out)
    if made is not None:
        _STATE.update(previous=config.post_grad_custom_post_pass, **{"pass": made})
        config.post_grad_custom_post_pass = made
    return types


def _verdict(kernels_dir: str | Path, verified: str | Path | None) -> tuple[str | None, set[str]]:
    """(why verify.py's report beside the kernels turned the region kernels down, or None; the region types it left
    out one by one)."""
    path = Path(kernels_dir).parent / "verify.json" if verified == "auto" else verified
    if path is None or not Path(path).is_file():
        return None, set()
    regions = json.loads(Path(path).read_text()).get("regions") or {}
    refused = None if regions.get("kept", True) else regions.get("why", "left them out")
    return refused, set(regions.get("left_out") or {})


def uninstall_regions() -> None:
    """Take the region pass out of Inductor's config again (the custom pass before it comes back)."""
    if "pass" in _STATE and torch._inductor.config.post_grad_custom_post_pass is _STATE["pass"]:
        torch._inductor.config.post_grad_custom_post_pass = _STATE["previous"]
    _STATE.clear()


def matches() -> int:
    """How many region subgraphs the installed pass has replaced so far, in every graph it saw (a graph from the
    FX graph cache, compiled with these kernels before, is not seen again)."""
    return _STATE["pass"].matches if "pass" in _STATE else 0


def _arg_names(fn) -> tuple[str, ...]:
    """The names of fn's positional parameters (a reference's inputs)."""
    return fn.__code__.co_varnames[:fn.__code__.co_argcount]


def _deployment(spec) -> Deployment:
    """The op's schema and output shapes: one tensor, or a tuple of them (a region whose residual stream and norm
    both leave it), shaped as the reference's outputs."""
    params = _arg_names(spec.reference)
    example = spec.make_inputs(spec.bench_shape, torch.float32, "meta", None)
    made = spec.reference(*example)
    outputs = len(made) if isinstance(made, tuple) else 1
    returns = "Tensor" if outputs == 1 else "(" + ", ".join(["Tensor"] * outputs) + ")"

    def output_shape(*args):  # called on fake tensors (torch.compile's tracing): the reference says the shapes
        out = spec.reference(*args)
        return out.shape if outputs == 1 else [o.shape for o in out]
    return Deployment("(" + ", ".join(f"Tensor {p}" for p in params) + f") -> {returns}", output_shape)


def _captured_dtype(spec) -> torch.dtype:
    """The dtype the region was captured in (regiontype.region_spec): its pattern matches graphs of that dtype."""
    return getattr(torch, spec.make_inputs.captured[0][1])
