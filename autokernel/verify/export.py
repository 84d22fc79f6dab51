"""`verify.py --export DIR`: the kept kernels as a Python package that installs and runs without this repository.

    DIR/pyproject.toml               pip install DIR (setuptools; needs torch and triton, as the kernels do)
    DIR/<name>/__init__.py           optimize(model, types=None, exclude=(), quiet=False): autokernel.optimize
                                     over the package's own kernels
    DIR/<name>/kernels/<type>.py     the kernel files, as verified
    DIR/<name>/_runtime/*.py         the runtime they need: custom ops and site swapping (copied from
                                     autokernel/, imports made relative)
    DIR/<name>/_runtime/types/*.py   the built-in type modules: each type's sites and the reference its probes
                                     run against

The runtime is copied, not depended on, so the package is self-contained: what runs in the user's
process is exactly what verify.py checked. A CUDA C++ kernel file brings autokernel's build helper
(cuda_build.py) along, since it compiles on first import.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from autokernel import compat

# autokernel modules optimize() runs on, flattened into _runtime (the rooms' modules side by side), and the packages
# copied whole as _runtime/<package>: the type modules, which say how each type is plugged in, and compat
RUNTIME = ("models", "ops/addnorm_sites", "ops/attention_interface", "ops/attention_sites", "ops/customops",
           "verify/deploy", "kernelfile", "kerneltype", "ops/launchers", "ops/replay", "ops/rotation", "ops/swap")
PACKAGES = ("compat", "types")
# What a CUDA C++ kernel file imports: the build helper, which runs the static check of CUDA C++ on every
# source it compiles (sourcecheck, failing with guards.GuardFailed), in the user's process too.
CUDA_RUNTIME = ("cuda/cuda_build", "cuda/cuda_prelude", "harness/guards", "harness/sourcecheck")
VERSION = "0.1.0"  # of the exported package


def write_package(directory: str | Path, kernels: dict[str, Path], name: str = "autokernel_kernels",
                  eager: list[str] | None = None, compiled: list[str] | None = None,
                  graphed: list[str] | None = None) -> Path:
    """Write the package for {kernel type: file} into directory; returns the package's import directory.
    eager, compiled, graphed: the types that run eagerly, where torch.compile traces the model and where a CUDA
    graph captures an eager forward (default: every type; graphed: eager's)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"package name {name!r} is not a Python identifier")
    package = Path(directory) / name
    if package.exists():
        shutil.rmtree(package)  # a re-export replaces the old kernels, never mixes with them
    (package / "kernels").mkdir(parents=True)
    (package / "_runtime").mkdir()
    needs_cuda = False
    for kernel_type, path in sorted(kernels.items()):
        source, cuda = _kernel_source(Path(path).read_text(), name)
        needs_cuda |= cuda
        (package / "kernels" / f"{kernel_type}.py").write_text(source)
    modules = {Path(m).name: compat.ROOT / "autokernel" / f"{m}.py"
               for m in RUNTIME + (CUDA_RUNTIME if needs_cuda else ())}
    for module, path in modules.items():
        (package / "_runtime" / f"{module}.py").write_text(relative_imports(path.read_text()))
    (package / "_runtime" / "__init__.py").write_text('"""Copied from autokernel at export; see the package."""\n')
    for copied in PACKAGES:
        (package / "_runtime" / copied).mkdir()
        for path in sorted((compat.ROOT / "autokernel" / copied).glob("*.py")):
            (package / "_runtime" / copied / path.name).write_text(relative_imports(path.read_text(), copied))
    (package / "kernels" / "__init__.py").write_text('"""The kernel files, one per type."""\n')
    everywhere = sorted(kernels)
    eager = sorted(everywhere if eager is None else eager)
    (package / "__init__.py").write_text(_init_source(name, eager, sorted(everywhere if compiled is None else compiled),
                                                      sorted(eager if graphed is None else graphed)))
    (Path(directory) / "pyproject.toml").write_text(_pyproject(name))
    return package


def relative_imports(source: str, package: str | None = None) -> str:
    """autokernel's absolute imports as imports within _runtime, for a module of _runtime itself or (package) of
    one of the PACKAGES copied into it."""
    return re.sub(r"^(\s*)from autokernel(\.\w+)* import ", lambda m: _relative_from(m, package), source,
                  flags=re.M)


def _target(dotted: str) -> str:
    """Where autokernel's module `dotted` is within _runtime, dotted ("" for _runtime itself): a room's modules side
    by side, a copied package as it is."""
    parts = dotted.split(".")[1:]
    if parts and parts[0] in PACKAGES:
        return ".".join(parts)
    if not parts or (compat.ROOT / "autokernel" / Path(*parts)).is_dir():
        return ""  # autokernel itself, or a room: its modules are _runtime's
    return parts[-1]


def _relative_from(match: re.Match, package: str | None) -> str:
    """`from autokernel[.room] import m` as `from . import m`, `from autokernel[.room].m import x` as
    `from .m import x`; from inside a copied package, its own modules at `.`, the rest of _runtime at `..`."""
    target = _target(match.group(0).strip()[len("from "):-len(" import")])
    if package is None:
        where = "." + target
    elif target == package or target.startswith(package + "."):
        where = "." + target[len(package) + 1:]
    else:
        where = ".." + target
    return f"{match.group(1)}from {where} import "


def _kernel_source(source: str, name: str) -> tuple[str, bool]:
    """A kernel file as the package holds it: imported by path, so autokernel's helper by absolute name."""
    rewritten = re.sub(r"^from autokernel.cuda import cuda_build$", f"from {name}._runtime import cuda_build", source,
                       flags=re.M)
    return rewritten, rewritten != source


def _init_source(name: str, types: list[str], compiled: list[str], graphed: list[str]) -> str:
    what = ", ".join(types) or "none"
    what += "" if compiled == types else f"; under torch.compile: {', '.join(compiled) or 'none'}"
    what += "" if graphed == types else f"; in CUDA graphs: {', '.join(graphed) or 'none'}"
    return f'''"""Kernels optimized by AutoKernel and exported by verify.py: {what}.

    import {name}
    model = {name}.optimize(model)     # or torch.compile({name}.optimize(model))
"""

from pathlib import Path

from ._runtime import deploy

KERNELS = Path(__file__).resolve().parent / "kernels"
TYPES = {types!r}  # those that run eagerly
COMPILED_TYPES = {compiled!r}  # those that run where torch.compile traces the model
GRAPHED_TYPES = {graphed!r}  # those that run where a CUDA graph captures an eager forward


def optimize(model, types=None, exclude=(), quiet=False):
    """The model with this package's kernels in place (a copy over the same weights); one line says what.
    types: these kernels, eagerly, in CUDA graphs and under torch.compile (default: the types verify.py's prune kept
    in each)."""
    return deploy.optimize(model, KERNELS, TYPES if types is None else types, exclude=exclude,
                           compiled_types=COMPILED_TYPES if types is None else types,
                           graphed_types=GRAPHED_TYPES if types is None else types, verified=None,
                           starters=None, quiet=quiet)
'''


def _pyproject(name: str) -> str:
    packages = [name, f"{name}._runtime", f"{name}.kernels", *(f"{name}._runtime.{p}" for p in PACKAGES)]
    return f'''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name.replace("_", "-")}"
version = "{VERSION}"
description = "Triton kernels optimized by AutoKernel, with optimize(model) to put them in place"
requires-python = ">=3.10"
dependencies = ["torch>=2.4", "triton>=3.0"]

[tool.setuptools]
packages = {packages!r}
'''
