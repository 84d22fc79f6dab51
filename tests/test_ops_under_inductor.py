"""Every starter's op as torch.compile runs it: Inductor traces into the kernel file (a triton_op) and launches its
Triton kernels from its own generated code, and the output is the eager kernel's. The harness times a kernel
eagerly, so a kernel can pass it and still fail here: Inductor types a Python float argument of a user Triton kernel
as fp64, and the decode starter's score scale made Triton refuse its loop (docs/kernels-under-compile.md); a
deployed model then leaves the type out in the compiled modes, and generate() compiled by transformers failed."""

import inspect

import pytest
import torch

from autokernel.compat import ROOT
from autokernel.ops import customops
from autokernel.registry import get_spec, kernel_types

DEPLOYED = [t for t in kernel_types() if get_spec(t).deployment is not None and (ROOT / "kernels" / f"{t}.py").exists()]


def test_every_deployed_starter_is_checked_here():
    assert {"decode_attention", "flash_attention", "rmsnorm", "rope_attention", "fused_mlp"} <= set(DEPLOYED)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_type", DEPLOYED)
def test_each_starter_s_op_compiled_by_inductor_gives_the_eager_output(install_starter, kernel_type):
    _compiled_like_eager(install_starter(kernel_type), kernel_type, [get_spec(kernel_type).bench_shape], "cuda",
                         "inductor")  # the shape the harness times: the variants large calls take (TMA) included


@pytest.mark.slow(8)
def test_each_starter_s_op_traces_whole_with_every_argument(interpreter, install_starter):
    """On the CPU (no Inductor for Triton there): each op traced by dynamo whole, fake tensors and schema included,
    gives the eager kernel's output."""
    for kernel_type in DEPLOYED:
        _compiled_like_eager(install_starter(kernel_type), kernel_type, [get_spec(kernel_type).small_shapes[0]], "cpu",
                             "aot_eager")


def _compiled_like_eager(kernel_fn, kernel_type: str, shapes: list, device: str, backend: str) -> None:
    spec, call = get_spec(kernel_type), customops.op(kernel_type)
    torch._dynamo.reset()
    try:
        for shape in shapes:
            inputs = _every_argument(kernel_fn, spec.make_inputs(shape, torch.float16, device,
                                                                 torch.Generator(device).manual_seed(0)))
            with torch.no_grad():
                want = call(*inputs)
                got = torch.compile(lambda *args: call(*args), backend=backend, fullgraph=True)(*inputs)
            torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)  # one kernel: the same sums, in any order
    finally:
        torch._dynamo.reset()


def _every_argument(kernel_fn, inputs) -> tuple:
    """The inputs with kernel_fn's defaults after them: the op's schema asks for every argument, as a site passes."""
    bound = inspect.signature(kernel_fn).bind(*inputs)
    bound.apply_defaults()
    return tuple(bound.arguments.values())
