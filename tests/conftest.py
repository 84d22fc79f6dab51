"""Shared test setup: the repository root on sys.path, CPU mode, GPU tests skipped cleanly without a GPU."""

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if not torch.cuda.is_available():
    # CPU mode for every Triton kernel this test process touches. Triton reads the switch when each
    # @triton.jit runs, so it is set once, before anything imports a kernel: mixing jit functions made
    # before and after the switch fails inside the interpreter ("Cannot call @triton.jit'd outside of
    # the scope of a kernel").
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def unguarded(monkeypatch):
    """Benches run with the static check off (tests/fixtures/unguarded_harness.py), fresh or forked warm: for
    tests of what lies behind it (the runtime guards, the launcher's handling of hangs and crashes) with
    kernels that do what the static check would refuse."""
    from autokernel import runner

    monkeypatch.setattr(runner, "HARNESS_COMMAND", [str(ROOT / "tests" / "fixtures" / "unguarded_harness.py")])
