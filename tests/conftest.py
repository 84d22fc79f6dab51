"""Shared test setup: the repository root on sys.path, CPU mode, GPU tests skipped cleanly without a GPU, one
warm launcher for the benches of the whole run. Helpers shared by test modules are in tests/helpers.py."""

import os
import sys
import tempfile
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One OpenMP thread per xdist worker and the processes it starts (before torch is imported): `-n logical`
    # already puts a worker on every CPU, and two workers' OpenMP threads spinning for each other on two cores
    # made the 2-core suite 25% slower.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

# verify.py's prune holds verdicts of earlier runs (autokernel/verify/recall.py): each test process starts with none,
# and its verify.py runs write nowhere but here
os.environ["AUTOKERNEL_CACHE"] = tempfile.mkdtemp(prefix="autokernel-cache-")

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):  # the project's modules; tests/helpers.py whatever pytest's import mode
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

if not torch.cuda.is_available():
    # CPU mode for every Triton kernel this test process touches. Triton reads the switch when each
    # @triton.jit runs, so it is set once, before anything imports a kernel: mixing jit functions made
    # before and after the switch fails inside the interpreter ("Cannot call @triton.jit'd outside of
    # the scope of a kernel").
    os.environ.setdefault("TRITON_INTERPRET", "1")


SLOW_S = 5  # a `slow` test without a measured figure: at least this long (pyproject.toml's marker)


def measured_s(item) -> float:
    """A test's measured seconds on the 2-core machine: `@pytest.mark.slow(120)`, 5 for a bare `slow`, 0 else."""
    slow = item.get_closest_marker("slow")
    if slow is None:
        return 0.0
    return float(slow.args[0]) if slow.args else SLOW_S


def pytest_configure(config):
    # pytest-xdist sends one test at a time to whichever worker is free (a --maxschedchunk given wins). Its
    # default deals each worker a block of a quarter of its share up front: with the longest first, one
    # worker would get all the long tests while the other ran everything else and then idled.
    if getattr(config.option, "maxschedchunk", False) is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(config, items):
    # Longest first (every worker collects the same order, as xdist requires): the long end-to-end tests start
    # at once on both workers and the short ones fill in behind them, so that the two workers end together
    # instead of one starting a long test last while the other idles.
    items.sort(key=measured_s, reverse=True)
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
def interpreter(monkeypatch):
    """Triton's interpreter for the kernel files a test imports (on a GPU machine too, for a model run on the CPU),
    switched off again after; with compat's fixes, so that it computes what the GPU computes."""
    from autokernel import compat

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    compat.prepare_interpreter()


@pytest.fixture
def install_starter():
    """install_starter(kernel_type): the shipped starter kernels/<type>.py plugged into the type's op for this
    test, as optimize() does before it builds any site; what the op ran before is put back afterwards, so no
    test depends on a kernel an earlier test installed."""
    from autokernel import kernelfile
    from autokernel.ops import customops
    from autokernel.registry import get_spec

    tables = ("_IMPLS", "_LABELS", "_TRACEABLE", "_DIGESTS")
    before = {name: dict(getattr(customops, name)) for name in tables}

    def install(kernel_type: str):
        path = ROOT / "kernels" / f"{kernel_type}.py"
        kernel_fn = kernelfile.import_kernel(path).kernel_fn
        customops.install(kernel_type, kernel_fn, str(path), get_spec(kernel_type).deployment)
        return kernel_fn

    yield install
    for name, table in before.items():
        getattr(customops, name).clear()
        getattr(customops, name).update(table)
    customops._retag()


@pytest.fixture
def unguarded(monkeypatch):
    """Benches run with the static check off (tests/fixtures/unguarded_harness.py), fresh or forked warm: for
    tests of what lies behind it (the runtime guards, the launcher's handling of hangs and crashes) with
    kernels that do what the static check would refuse."""
    from autokernel.harness import runner

    monkeypatch.setattr(runner, "HARNESS_COMMAND", [str(ROOT / "tests" / "fixtures" / "unguarded_harness.py")])


@pytest.fixture(scope="session")
def _warm_launcher_of_the_run():
    from autokernel.harness import runner

    yield
    runner.stop_warm()


@pytest.fixture
def warm_launcher(request, _warm_launcher_of_the_run):
    """A running warm launcher (autokernel.harness.zygote) for CPU benches, shared by the whole test run: run_bench
    forks each harness child from it, as the loop does, instead of starting a fresh Python that imports torch,
    triton and the harness again (3 s or more per bench on a CPU). For benches that test what the harness
    finds, not how it is started: tests/test_zygote.py shows that a forked bench is the fresh one. A launcher
    that another test stopped, killed or replaced is started again here. None for a GPU test: its benches
    start fresh, as they always have."""
    from autokernel.harness import runner

    if request.node.get_closest_marker("gpu"):
        return None
    launcher = runner.warm_launcher()
    if launcher is None or not launcher.alive() or not launcher.matches(runner.child_env("cpu"), runner.REPO_ROOT):
        assert runner.start_warm("cpu")
    runner.warm_launcher().ready()  # its imports done here, not inside a bench a test times
    return runner.warm_launcher()


@pytest.fixture(autouse=True)
def _gpu_benches_start_fresh(request):
    """run_bench forks from any launcher running, replacing one of another environment: a GPU test finds
    none, so that its benches run fresh as they always have (unless the test starts one itself)."""
    if request.node.get_closest_marker("gpu"):
        from autokernel.harness import runner

        runner.stop_warm()
