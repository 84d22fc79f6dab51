"""Cheap launches (autokernel.compat.FastLaunch): a known call pattern launches the cached CompiledKernel with
the arguments in the kernel's parameter order; anything new or unmodelled goes through Triton's own path.
The CPU tests drive it with a stand-in kernel (the interpreter has no CompiledKernel); the GPU test checks
that every starter gives bitwise the same output through it.
"""

import pytest
import torch

from autokernel import compat, launchers, replay


class StandIn:
    """What FastLaunch needs of a JITFunction: .fn's signature, and kernel[grid](...) returning a compiled kernel."""

    def __init__(self):
        self.slow, self.fast = [], []
        outer = self

        class Compiled:
            def __getitem__(self, grid):
                return lambda *args: outer.fast.append((grid, args))

        self.compiled = Compiled()

    @staticmethod
    def fn(x_ptr, out_ptr, n, eps, BLOCK: int = 64, EVEN: bool = False):
        pass

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.slow.append((grid, args, kwargs))
            return self.compiled

        return run


def test_a_known_call_pattern_launches_the_compiled_kernel_in_parameter_order():
    kernel = StandIn()
    launch = compat.FastLaunch(kernel)
    x, out = torch.zeros(64), torch.zeros(64)
    launch[(4,)](x, out, 64, 1e-6, BLOCK=32, num_warps=4)
    launch[(4,)](x, out, 64, 1e-5, BLOCK=32, num_warps=4)  # another eps: floats are not specialized on
    assert len(kernel.slow) == 1 and kernel.fast == [((4, 1, 1), (x, out, 64, 1e-5, 32, False))]
    launch[(4,)](x, out, 65, 1e-5, BLOCK=32, num_warps=4)  # another n: Triton may specialize it, so recompile
    launch[(4,)](x.half(), out.half(), 64, 1e-5, BLOCK=32, num_warps=4)  # another dtype
    launch[(4,)](x[1:], out, 63, 1e-5, BLOCK=32, num_warps=4)  # a pointer that is no longer 16-byte aligned
    launch[(4,)](x, out, 64, 1e-5, BLOCK=32, num_warps=8)  # another launch option
    assert len(kernel.slow) == 5 and len(kernel.fast) == 1


def test_arguments_it_does_not_model_always_take_the_slow_path():
    kernel = StandIn()
    launch = compat.FastLaunch(kernel)
    unknown = object()  # an argument type Triton may specialize in ways this cache does not know
    for _ in range(2):
        launch[(1,)](unknown, unknown, 8, 1.0)
        launch[lambda meta: (1,)](torch.zeros(8), torch.zeros(8), 8, 1.0)  # a grid function
    assert len(kernel.slow) == 4 and kernel.fast == []


class Descriptor:  # the fields of triton.tools.tensor_descriptor.TensorDescriptor the key reads
    def __init__(self, base, block_shape):
        self.base, self.shape, self.strides, self.block_shape = base, base.shape, base.stride(), block_shape


def test_tma_descriptors_are_keyed_by_base_shape_and_block():
    kernel = StandIn()
    launch = compat.FastLaunch(kernel)
    a, b = torch.zeros(64, 32), torch.zeros(64, 32)
    launch[(2,)](Descriptor(a, [16, 16]), Descriptor(b, [16, 16]), 64, 1.0)
    launch[(2,)](Descriptor(b, [16, 16]), Descriptor(a, [16, 16]), 64, 1.0)  # same pattern, other tensors
    launch[(2,)](Descriptor(a, [32, 16]), Descriptor(b, [16, 16]), 64, 1.0)  # another block: recompiled
    launch[(2,)](Descriptor(a.t(), [16, 16]), Descriptor(b, [16, 16]), 64, 1.0)  # another layout
    assert len(kernel.slow) == 3 and len(kernel.fast) == 1


# starters whose every call at the registry's shapes is replayed (autokernel/replay.py)
REPLAYED_STARTERS = ("rmsnorm", "layernorm", "softmax", "rotary_embedding", "matmul", "fused_mlp", "flash_attention")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_type", ["rmsnorm", "layernorm", "softmax", "rotary_embedding", "matmul",
                                         "fused_mlp", "flash_attention", "cross_entropy", "reduce"])
def test_every_starter_gives_the_same_output_through_cheap_launches(repo_root, kernel_type):
    from autokernel import kernelfile
    from autokernel.registry import get_spec

    spec = get_spec(kernel_type)
    kernel_fn = kernelfile.import_kernel(repo_root / "kernels" / f"{kernel_type}.py").kernel_fn
    fast = launchers.fast(kernel_fn)
    assert isinstance(fast, replay.Replayed)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for shape in spec.shapes[:3]:
        for _ in range(3):  # the first call records (and compiles), the others replay, each on fresh inputs
            args = spec.make_inputs(shape, torch.float16, "cuda", gen)
            want = kernel_fn(*args)
            got = fast(*args)
            torch.cuda.synchronize()
            assert torch.equal(got, want), (kernel_type, shape)
            assert got.shape == want.shape and got.stride() == want.stride()
    if kernel_type in REPLAYED_STARTERS:
        assert not fast.reasons(), fast.reasons()
    launches = [v for v in fast.fallback.__globals__.values() if isinstance(v, compat.FastLaunch)]
    assert launches


def test_the_launch_copies_of_a_per_shape_table_pick_its_configuration(repo_root, tmp_path):
    """A kernel file the builtin agent ended with a SHAPE_CONFIGS table (issue 16) launches under optimize()
    from copies over a namespace: the table's configuration reaches the launch, and is put back after."""
    import json

    from autokernel.agents.builtin import apply_table, tunable_space
    from autokernel.kernelfile import import_kernel

    source = (repo_root / "kernels" / "rmsnorm.py").read_text()
    best = tunable_space(source)[1]
    path = tmp_path / "rmsnorm.py"
    path.write_text(apply_table(source, {json.dumps([[8, 96], [96]]): {**best, "NUM_WARPS": 8}}, best))
    module = import_kernel(path)
    warps = []

    def recording(kernel):
        class Launch:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    warps.append(kwargs.get("num_warps"))
                    return kernel[grid](*args, **kwargs)

                return run

        return Launch()

    copy = launchers.rebound(module.kernel_fn, lambda v: hasattr(v, "fn") and hasattr(v, "__getitem__"), recording)
    for rows, cols in ((8, 96), (4, 40)):
        x, w = torch.randn(rows, cols), torch.randn(cols)
        torch.testing.assert_close(copy(x, w), module.kernel_fn(x, w))
    assert warps[0] == 8 and warps[1] != 8 and copy.__globals__["NUM_WARPS"] == module.NUM_WARPS == 0
