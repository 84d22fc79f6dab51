"""The registry: every type makes sensible inputs, and a user's own op is one new entry."""

import textwrap

import pytest
import torch

from autokernel import types
from autokernel.harness import checking
from autokernel.harness.runner import run_bench
from autokernel.registry import DTYPES, get_spec, kernel_types

ALL = kernel_types()


def test_the_built_in_types_are_registered():
    assert ALL == [spec.name for spec in types.builtin()] and len(ALL) == 15  # the seed's nine, #19's five, decode


@pytest.mark.parametrize("name", ALL)
def test_each_spec_declares_enough_shapes_and_fresh_inputs(name):
    spec = get_spec(name)
    assert 8 <= len(spec.shapes) <= 10 and spec.edge_shapes and spec.small_edge_shapes and spec.adversarial
    gen = torch.Generator().manual_seed(0)
    shape = spec.small_shapes[0]
    a = spec.make_inputs(shape, torch.float32, "cpu", gen)
    b = spec.make_inputs(shape, torch.float32, "cpu", gen)
    assert not torch.equal(a[0], b[0])  # every check sees new values
    for dtype in DTYPES:
        inputs = spec.make_inputs(shape, dtype, "cpu", gen)
        want = checking.oracle(spec, inputs)
        assert all(torch.isfinite(t).all() for t in checking.outputs(want))
        assert checking.out_dtype(inputs) == dtype
        assert spec.bytes_moved(shape, dtype) > 0 and spec.flops(shape) > 0


@pytest.mark.parametrize("name", ALL)
def test_adversarial_inputs_have_finite_answers_that_fit_the_dtype(name):
    spec = get_spec(name)
    gen = torch.Generator().manual_seed(1)
    shape = spec.small_shapes[min(2, len(spec.small_shapes) - 1)]
    for maker in spec.adversarial.values():
        for dtype in DTYPES:
            for want in checking.outputs(checking.oracle(spec, maker(shape, dtype, "cpu", gen))):
                assert torch.isfinite(want).all() and want.abs().max() < torch.finfo(dtype).max


@pytest.mark.parametrize("name", [n for n in ALL if get_spec(n).noncontiguous])
def test_noncontiguous_inputs_hold_the_same_values(name):
    spec = get_spec(name)
    inputs = spec.make_inputs(spec.small_shapes[0], torch.float32, "cpu", torch.Generator().manual_seed(2))
    strided = spec.noncontiguous(inputs)
    assert any(isinstance(t, torch.Tensor) and not t.is_contiguous() for t in strided)
    # The same values give the same float64 oracle up to summation order (a BLAS may take another path for
    # a transposed operand: torch 2.13's CPU matmul does).
    torch.testing.assert_close(checking.oracle(spec, inputs), checking.oracle(spec, strided), rtol=1e-12, atol=1e-12)


USER_TYPE = textwrap.dedent('''
    """A user's own op, scale by two, registered beside its kernel: no harness file changes."""
    import torch
    import triton
    import triton.language as tl

    from autokernel.registry import KernelSpec, register

    KERNEL_TYPE = "scale2x"
    BLOCK = 256


    def scale2x_ref(x):
        return x * 2


    ROWS = [{"N": 1000}, {"N": 64}, {"N": 4097}]
    register(KernelSpec(
        name="scale2x", reference=scale2x_ref,
        make_inputs=lambda s, dt, dev, g: (torch.randn(s["N"], device=dev, generator=g).to(dt),),
        shapes=ROWS, small_shapes=ROWS, edge_shapes=ROWS, small_edge_shapes=ROWS,
        bench_shape={"N": 1 << 20}, small_bench_shape={"N": 4096},
        bytes_moved=lambda s, dt: 2 * s["N"] * 2, flops=lambda s: s["N"],
        adversarial={"large": lambda s, dt, dev, g: (torch.full((s["N"],), 100.0, device=dev).to(dt),)},
    ))


    @triton.jit
    def _scale2x_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n).to(tl.float32)
        tl.store(out_ptr + offs, (x * 2).to(out_ptr.dtype.element_ty), mask=offs < n)


    def kernel_fn(x):
        out = torch.empty_like(x)
        _scale2x_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
        return out
''')


def test_a_users_own_op_runs_through_the_unchanged_harness(tmp_path, warm_launcher):
    path = tmp_path / "scale2x.py"
    path.write_text(USER_TYPE)
    result = run_bench(path, device="cpu", timed=False)
    assert result["status"] == "pass", result["reason"] + result["stderr_tail"]
    assert result["kernel_type"] == "scale2x"


def test_an_error_scale_judges_cancelling_sums_by_their_terms_not_their_result():
    want = torch.tensor([1e-3, 5.0], dtype=torch.float64)
    terms = torch.tensor([3000.0, 5.0], dtype=torch.float64)  # |A| @ |B|: the first entry cancelled
    close = torch.tensor([1e-3 + 5e-3, 5.0], dtype=torch.float32)  # fp32-sized error on 3000-sized terms
    assert checking.compare(close, want, torch.float32, 1e-4, 1e-4) is not None
    assert checking.compare(close, want, torch.float32, 1e-4, 1e-4, scale=terms) is None
    wrong = torch.tensor([1.0, 5.0], dtype=torch.float32)
    assert "elements off" in checking.compare(wrong, want, torch.float32, 1e-4, 1e-4, scale=terms)
