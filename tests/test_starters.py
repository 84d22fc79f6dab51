"""Every starter kernel passes all five stages of the harness, in fp16, bf16 and fp32.

On the CPU through Triton's interpreter (small shapes); with the `gpu` marker, on a GPU with the full
shape sweep.
"""

from pathlib import Path

import pytest
import torch

from autokernel.harness.runner import run_bench
from autokernel.registry import kernel_types

ROOT = Path(__file__).resolve().parent.parent
STARTERS = sorted(p.stem for p in (ROOT / "kernels").glob("*.py"))


def test_every_kernel_type_has_a_starter():
    assert sorted(kernel_types()) == STARTERS


def _assert_passes(result):
    assert result["status"] == "pass", f"{result['failed_stage']}: {result['reason']}\n{result['stderr_tail']}"
    assert len(result["stages"]) == 5 and all(s["passed"] for s in result["stages"])


# Measured seconds on the 2-core machine (the longest start first, tests/conftest.py); 5 for the others
CPU_SECONDS = {"linear_cross_entropy": 19, "flash_attention": 13, "rope_attention": 10, "reduce": 10,
               "cross_entropy": 9, "fused_mlp": 7, "add_layernorm": 7, "layernorm": 6, "add_rmsnorm": 6}


@pytest.mark.usefixtures("warm_launcher")
@pytest.mark.parametrize("kernel_type", [pytest.param(t, marks=pytest.mark.slow(CPU_SECONDS.get(t, 5)))
                                         for t in STARTERS])
def test_starter_passes_the_harness_on_the_cpu(kernel_type):
    _assert_passes(run_bench(ROOT / "kernels" / f"{kernel_type}.py", device="cpu", timed=False))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_type", STARTERS)
def test_starter_passes_the_harness_on_the_gpu(kernel_type):
    _assert_passes(run_bench(ROOT / "kernels" / f"{kernel_type}.py", device="cuda", timed=False))


# Layouts the starters launch without a copy or a reshape where they can (host time per call): each gives the
# reference's output, contiguous. Size-1 dims (any stride), row gaps, transposed views, extra leading dims.
LAYOUTS = {
    "rmsnorm": [lambda: (torch.randn(37, 96), torch.randn(96)),
                lambda: (torch.randn(4, 1, 48).expand(4, 3, 48), torch.randn(48)),
                lambda: (torch.randn(1, 4, 48).transpose(0, 1), torch.randn(48)),  # contiguous, dim 1 strided 192
                lambda: (torch.randn(6, 100)[:, :80], torch.randn(80)),
                lambda: (torch.randn(2, 7, 64).transpose(0, 1), torch.randn(64)),
                lambda: (torch.randn(64), torch.randn(64))],
    "rotary_embedding": [lambda: (torch.randn(2, 3, 10, 16), torch.randn(10, 8), torch.randn(10, 8)),
                         lambda: (torch.randn(2, 10, 3, 16).transpose(1, 2), torch.randn(10, 8), torch.randn(10, 8)),
                         lambda: (torch.randn(10, 16), torch.randn(8, 10).t(), torch.randn(8, 10).t()),
                         lambda: (torch.randn(2, 2, 3, 10, 16), torch.randn(1, 1, 10, 8), torch.randn(1, 1, 10, 8))],
    "matmul": [lambda: (torch.randn(37, 24), torch.randn(24, 40)),
               lambda: (torch.randn(2, 5, 24), torch.randn(40, 24).t())],
}


@pytest.mark.parametrize("kernel_type,case", [(t, i) for t, cases in LAYOUTS.items() for i in range(len(cases))])
def test_starters_give_the_reference_on_every_layout(kernel_type, case):
    from autokernel.kernelfile import import_kernel
    from autokernel.registry import get_spec

    torch.manual_seed(case)
    args = LAYOUTS[kernel_type][case]()
    got = import_kernel(ROOT / "kernels" / f"{kernel_type}.py").kernel_fn(*args)
    assert got.is_contiguous()
    atol, rtol = get_spec(kernel_type).tolerance(torch.float32)
    torch.testing.assert_close(got, get_spec(kernel_type).reference(*args), atol=atol, rtol=rtol)


def test_the_mlp_starter_shrinks_its_tiles_where_the_grid_would_leave_sms_idle():
    """TinyLlama at T=512 ran 0.71x with fused_mlp in, graphed (an H100): its down projection in 128x256 tiles is 32
    programs for 132 SMs. Tiles chosen by shape shrink until the grid fills the GPU; shapes that fill it keep theirs,
    and without a GPU (sms unknown) nothing changes."""
    from helpers import import_file

    mlp = import_file(ROOT / "kernels" / "fused_mlp.py", "fused_mlp_tiles")
    down = lambda t, hidden, sms=132: mlp._auto_config(t, hidden, torch.float16, False, False, sms)[:2]  # noqa: E731
    gate = lambda t, inter, sms=132: mlp._auto_config(t, inter, torch.float16, True, False, sms)[:2]  # noqa: E731
    assert down(2048, 2048) == (128, 256)  # TinyLlama at 2048: 128 programs
    assert down(512, 2048) == (64, 128)  # 32 programs in 128x256, 64 in 128x128, 128 in 64x128
    assert down(2048, 1024) == (128, 128)  # Qwen3-0.6B at 2048: 64 programs in 128x256
    assert gate(512, 5632) == gate(2048, 5632) == (128, 128)  # 176 and 704 programs
    assert down(512, 2048, sms=None) == (128, 256) and down(16, 2048) == (64, 128)  # the interpreter; decode
    mlp.DOWN_BLOCK_N = 128  # a size the file sets wins, and the other is the default's
    assert mlp._config(512, 2048, torch.float16, False, False, 132)[:2] == (128, 128)
