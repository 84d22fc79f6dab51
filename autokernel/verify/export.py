"""`verify.py --export DIR`: the kept kernels as a Python package that installs and runs without this repository.

    DIR/pyproject.toml               pip install DIR (setuptools; needs torch and triton, as the kernels do)
    DIR/<name>/__init__.py           optimize(model, types=None, exclude=(), quiet=False): autokernel.optimize
                                     over the package's own kernels
    DIR/<name>/kernels/<type>.py     the kernel files, as verified
    DIR/<name>/_runtime/*.py         the runtime they need: custom ops, site swapping, the references the
                                     swap probes against (copied from autokernel/, imports made relative)

The runtime is copied, not depended on, so the package is self-contained: what runs in the user's
process is exactly what verify.py checked. A CUDA C++ kernel file brings autokernel's build helper
(cuda_build.py) along, since it compiles on first import.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from autokernel import compat

# autokernel modules optimize() runs on; the built-in registry entries (specs) say how each type is plugged in
RUNTIME = ("compat", "models", "ops/addnorm_sites", "ops/attention_sites", "ops/customops", "ops/gelu_sites",
           "verify/deploy", "kernelfile", "kerneltype", "ops/launchers", "ops/replay", "specs", "ops/swap")
# What a CUDA C++ kernel file imports: the build helper, which runs the static check of CUDA C++ on every
# source it compiles (sourcecheck, failing with guards.GuardFailed), in the user's process too.
CUDA_RUNTIME = ("cuda/cuda_build", "cuda/cuda_prelude", "harness/guards", "harness/sourcecheck")
VERSION = "0.1.0"  # of the exported package


def write_package(directory: str | Path, kernels: dict[str, Path], name: str = "autokernel_kernels",
                  eager: list[str] | None = None, compiled: list[str] | None = None) -> Path:
    """Write the package for {kernel type: file} into directory; returns the package's import directory.
    eager, compiled: the types that run eagerly and where torch.compile traces the model (default: every type)."""
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
    modules["reference"] = compat.ROOT / "reference.py"
    for module, path in modules.items():
        (package / "_runtime" / f"{module}.py").write_text(relative_imports(path.read_text()))
    (package / "_runtime" / "__init__.py").write_text('"""Copied from autokernel at export; see the package."""\n')
    (package / "kernels" / "__init__.py").write_text('"""The kernel files, one per type."""\n')
    everywhere = sorted(kernels)
    (package / "__init__.py").write_text(_init_source(name, sorted(everywhere if eager is None else eager),
                                                      sorted(everywhere if compiled is None else compiled)))
    (Path(directory) / "pyproject.toml").write_text(_pyproject(name))
    return package


def relative_imports(source: str) -> str:
    """autokernel's absolute imports (and the checkout's `import reference`) as imports within _runtime."""
    source = re.sub(r"^(\s*)from autokernel(\.\w+)* import ", _relative_from, source, flags=re.M)
    return re.sub(r"^(\s*)import reference$", r"\1from . import reference", source, flags=re.M)


def _relative_from(match: re.Match) -> str:
    """`from autokernel[.room] import m` as `from . import m`, `from autokernel[.room].m import x` as
    `from .m import x`: _runtime holds the modules of every room side by side."""
    dotted = match.group(0).strip()[len("from "):-len(" import")]
    is_package = (compat.ROOT / dotted.replace(".", "/")).is_dir()
    return f"{match.group(1)}from .{'' if is_package else dotted.rsplit('.', 1)[-1]} import "


def _kernel_source(source: str, name: str) -> tuple[str, bool]:
    """A kernel file as the package holds it: imported by path, so autokernel's helper by absolute name."""
    rewritten = re.sub(r"^from autokernel.cuda import cuda_build$", f"from {name}._runtime import cuda_build", source,
                       flags=re.M)
    return rewritten, rewritten != source


def _init_source(name: str, types: list[str], compiled: list[str]) -> str:
    what = ", ".join(types) or "none"
    what += "" if compiled == types else f"; under torch.compile: {', '.join(compiled) or 'none'}"
    return f'''"""Kernels optimized by AutoKernel and exported by verify.py: {what}.

    import {name}
    model = {name}.optimize(model)     # or torch.compile({name}.optimize(model))
"""

from pathlib import Path

from ._runtime import deploy

KERNELS = Path(__file__).resolve().parent / "kernels"
TYPES = {types!r}  # those that run eagerly (and in CUDA graphs captured eagerly)
COMPILED_TYPES = {compiled!r}  # those that run where torch.compile traces the model


def optimize(model, types=None, exclude=(), quiet=False):
    """The model with this package's kernels in place (a copy over the same weights); one line says what.
    types: these kernels, eagerly and under torch.compile (default: the types verify.py's prune kept in each)."""
    return deploy.optimize(model, KERNELS, TYPES if types is None else types, exclude=exclude,
                           compiled_types=COMPILED_TYPES if types is None else types, verified=None,
                           starters=None, quiet=quiet)
'''


def _pyproject(name: str) -> str:
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
packages = ["{name}", "{name}._runtime", "{name}.kernels"]
'''
