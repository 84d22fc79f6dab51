"""Every starter kernel passes all five stages of the harness, in fp16, bf16 and fp32.

On the CPU through Triton's interpreter (small shapes); with the `gpu` marker, on a GPU with the full
shape sweep.
"""

from pathlib import Path

import pytest

from autokernel.registry import kernel_types
from autokernel.runner import run_bench

ROOT = Path(__file__).resolve().parent.parent
STARTERS = sorted(p.stem for p in (ROOT / "kernels").glob("*.py"))


def test_every_kernel_type_has_a_starter():
    assert sorted(kernel_types()) == STARTERS


def _assert_passes(result):
    assert result["status"] == "pass", f"{result['failed_stage']}: {result['reason']}\n{result['stderr_tail']}"
    assert len(result["stages"]) == 5 and all(s["passed"] for s in result["stages"])


@pytest.mark.parametrize("kernel_type", STARTERS)
def test_starter_passes_the_harness_on_the_cpu(kernel_type):
    _assert_passes(run_bench(ROOT / "kernels" / f"{kernel_type}.py", device="cpu", timed=False))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_type", STARTERS)
def test_starter_passes_the_harness_on_the_gpu(kernel_type):
    _assert_passes(run_bench(ROOT / "kernels" / f"{kernel_type}.py", device="cuda", timed=False))
