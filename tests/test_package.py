"""The package stands alone and a kernel type is one module: every library module imports from any directory,
a new module under autokernel/types/ is a registered type, and no other library file spells a type's name."""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

from autokernel.registry import kernel_types

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("autokernel", "kernelbench")


def _clean_env() -> dict:
    """The environment without a path back into the checkout: what an installed package sees."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}


def test_every_library_module_imports_outside_the_checkout(tmp_path):
    code = """
import importlib, pkgutil, autokernel, kernelbench
failed = []
for package in (autokernel, kernelbench):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if ".loop.ray" in info.name:  # the Ray extra
            continue
        try:
            importlib.import_module(info.name)
        except Exception as e:
            failed.append(f"{info.name}: {type(e).__name__}: {e}")
from autokernel.registry import register, kernel_types
print("\\n".join(failed) or "ok", len(kernel_types()))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_clean_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ok", str(len(kernel_types()))], done.stdout


def test_a_new_type_is_one_module(tmp_path):
    """A copy of the package with one more module under types/: the registry lists it, nothing else changed."""
    shutil.copytree(ROOT / "autokernel", tmp_path / "autokernel", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "autokernel" / "types" / "double.py").write_text('''
import torch
from autokernel.kerneltype import KernelSpec

def double_ref(x):
    return 2 * x

def _inputs(shape, dtype, device, gen):
    return (torch.randn(shape["N"], generator=gen).to(dtype),)

SPEC = KernelSpec(name="double", reference=double_ref, make_inputs=_inputs, shapes=[{"N": 8}],
                  small_shapes=[{"N": 8}], edge_shapes=[], small_edge_shapes=[], bench_shape={"N": 8},
                  small_bench_shape={"N": 8}, bytes_moved=lambda s, dt: 2 * s["N"], flops=lambda s: s["N"])
''')
    code = ("from autokernel.registry import get_spec, kernel_types; "
            "print('double' in kernel_types(), get_spec('double').reference.__name__)")
    env = {**_clean_env(), "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "double_ref"]


def _string_constants(path: Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def spelled_names(roots=LIBRARY, base: Path = ROOT) -> list[str]:
    """'file: type' for each library file that spells a built-in type's name as a string, other than the type's
    own module (autokernel/types/<type>.py)."""
    names = set(kernel_types())
    found = []
    for root in roots:
        for path in sorted((base / root).rglob("*.py")):
            own = path.stem if path.parent.name == "types" and path.parent.parent.name == "autokernel" else None
            found += [f"{path.relative_to(base)}: {name!r}" for name in sorted(_string_constants(path) & names)
                      if name != own]
    return found


def test_no_library_file_but_its_own_module_names_a_type():
    assert spelled_names() == []


def test_the_check_sees_a_type_named_elsewhere(tmp_path):
    (tmp_path / "autokernel" / "ops").mkdir(parents=True)
    (tmp_path / "autokernel" / "ops" / "probe.py").write_text('KIND = "rmsnorm"\n"""rmsnorm in prose is fine"""\n')
    (tmp_path / "autokernel" / "types").mkdir()
    (tmp_path / "autokernel" / "types" / "rmsnorm.py").write_text('NAME = "rmsnorm"\n')
    assert spelled_names(("autokernel",), tmp_path) == ["autokernel/ops/probe.py: 'rmsnorm'"]
