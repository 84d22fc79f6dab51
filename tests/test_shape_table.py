"""scripts/shape_table.py --against: another version of a kernel, from a file or a git revision, timed in the same
rounds; a name that is neither says so in one line."""

import importlib.util
import inspect
import subprocess

import pytest
from helpers import ROOT


def _shape_table():
    spec = importlib.util.spec_from_file_location("shape_table", ROOT / "scripts" / "shape_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_against_a_revision_imports_that_revision_s_kernel_file():
    shown = subprocess.run(["git", "show", "HEAD:kernels/rmsnorm.py"], cwd=ROOT, capture_output=True, text=True)
    if shown.returncode:
        pytest.skip("not a git checkout")
    kernel_fn = _shape_table()._other_version("rmsnorm", "HEAD")
    assert kernel_fn.__module__.startswith("_autokernel_candidate_")
    assert inspect.getsourcefile(kernel_fn) != str(ROOT / "kernels" / "rmsnorm.py")  # a file of its own
    assert open(inspect.getsourcefile(kernel_fn)).read() == shown.stdout


def test_against_neither_a_file_nor_a_revision_says_so(tmp_path):
    with pytest.raises(SystemExit, match="neither a file nor a revision"):
        _shape_table()._other_version("rmsnorm", "no-such-revision-0123")
