"""Cheap launches (autokernel.compat.FastLaunch): a known call pattern launches the cached CompiledKernel with
the arguments in the kernel's parameter order; anything new or unmodelled goes through Triton's own path.
The CPU tests drive it with a stand-in kernel (the interpreter has no CompiledKernel); the GPU test checks
that every starter gives bitwise the same output through it.
"""

import pytest
import torch

from autokernel import compat
from autokernel.compat import fastlaunch
from autokernel.ops import launchers, replay


class StandIn:
    """What FastLaunch needs of a JITFunction: .fn's signature, .constexprs, and kernel[grid](...) launching and
    returning a compiled kernel whose launcher (.run) records what a hit hands it."""

    def __init__(self):
        self.slow, self.fast = [], []
        self.constexprs = [4, 5]  # BLOCK, EVEN
        self.used_global_vals = {}
        outer = self

        class Compiled:
            function, packed_metadata = "function-handle", ("warps", "ctas", "shared")

            @staticmethod
            def run(*args):
                outer.fast.append(args)

        self.compiled = Compiled()

    @staticmethod
    def fn(x_ptr, out_ptr, n, eps, BLOCK: int = 64, EVEN: bool = False):
        pass

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.slow.append((grid, args, kwargs))
            return self.compiled

        return run


STREAM = 0xABC  # the raw stream the stand-in context reports for every device


@pytest.fixture
def launch_context(monkeypatch):
    """FastLaunch's view of CUDA on a CPU: device 0 (switchable), one stream; Triton's real hook probe and key."""
    device = [0]
    real = fastlaunch._launch_context

    def context():
        _, _, hooked, arg_key = real()
        return (lambda: device[0]), (lambda index: STREAM + index), hooked, arg_key

    monkeypatch.setattr(fastlaunch, "_launch_context", context)
    return device


def hit_args(kernel: StandIn, index: int = -1) -> tuple:
    """The kernel's own arguments of a recorded hit (after grid, stream, function and metadata)."""
    return kernel.fast[index][9:]


def test_a_known_call_pattern_calls_the_launcher_straight(launch_context):
    kernel = StandIn()
    launch = compat.FastLaunch(kernel)
    x, out = torch.zeros(64), torch.zeros(64)
    launch[(4,)](x, out, 64, 1e-6, BLOCK=32, num_warps=4)
    launch[(4,)](x, out, 64, 1e-5, BLOCK=32, num_warps=4)  # another eps: floats are not specialized on
    assert len(kernel.slow) == 1
    assert kernel.fast == [(4, 1, 1, STREAM, "function-handle", ("warps", "ctas", "shared"), None, None, None,
                            x, out, 64, 1e-5, 32, False)]  # no launch metadata or hooks; defaults filled in
    y = torch.zeros(64)
    launch[(4,)](y, out, 64, 1e-5, BLOCK=32, num_warps=4)  # other tensors of the same dtype and alignment
    assert len(kernel.slow) == 1 and hit_args(kernel)[0] is y


@pytest.mark.parametrize("change", ["dtype", "misaligned", "n=1", "n=16", "n=17", "constexpr", "bool",
                                    "option", "grid", "device"])
def test_anything_triton_specializes_on_is_a_miss(launch_context, change):
    kernel = StandIn()
    launch = compat.FastLaunch(kernel)
    x, out = torch.zeros(64), torch.zeros(64)
    args, kwargs, grid = [x, out, 32, 1e-5], {"BLOCK": 32, "num_warps": 4}, (4,)
    launch[grid](*args, **kwargs)
    if change == "dtype":
        args[0] = x.half()
    elif change == "misaligned":
        args[0] = x[1:]  # 4 bytes past a 16-byte boundary
    elif change.startswith("n="):
        args[2] = int(change[2:])  # Triton specializes ints equal to 1 and multiples of 16
    elif change == "constexpr":
        kwargs["BLOCK"] = 64
    elif change == "bool":
        kwargs["EVEN"] = True
    elif change == "option":
        kwargs["num_warps"] = 8
    elif change == "grid":
        grid = (8,)
    elif change == "device":
        launch_context[0] = 1  # another current device: another compiled module
    launch[grid](*args, **kwargs)
    assert len(kernel.slow) == 2 and kernel.fast == []
    launch[grid](*args, **kwargs)  # the new pattern is cached in turn
    assert len(kernel.slow) == 2 and len(kernel.fast) == 1


def test_an_int_is_never_a_bool_and_a_positional_constexpr_is_keyed_by_value(launch_context):
    kernel = StandIn()
    launch = compat.FastLaunch(kernel)
    x = torch.zeros(64)
    launch[(1,)](x, x, 1, 1.0)
    launch[(1,)](x, x, True, 1.0)  # True == 1 in Python, an i1 in Triton
    launch[(1,)](x, x, 8, 1.0, 32)  # BLOCK given by position
    launch[(1,)](x, x, 8, 1.0, 64)
    assert len(kernel.slow) == 4 and kernel.fast == []
    launch[(1,)](x, x, 8, 1.0, 64)
    assert hit_args(kernel) == (x, x, 8, 1.0, 64, False)


def test_a_launch_hook_sends_every_launch_through_triton(launch_context, monkeypatch):
    from triton import knobs

    kernel = StandIn()
    launch = compat.FastLaunch(kernel)
    x = torch.zeros(64)
    launch[(1,)](x, x, 8, 1.0)
    launch[(1,)](x, x, 8, 1.0)
    assert len(kernel.fast) == 1
    hook = knobs.runtime.launch_enter_hook
    if hasattr(hook, "add"):  # a HookChain (triton >= 3.5), as a profiler's hook.add(f) leaves it
        monkeypatch.setattr(hook, "calls", [print])
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", print)
    launch[(1,)](x, x, 8, 1.0)
    assert len(kernel.slow) == 2 and len(kernel.fast) == 1


def test_what_it_does_not_model_always_takes_the_slow_path(launch_context):
    kernel = StandIn()
    launch = compat.FastLaunch(kernel)
    unknown = object()  # an argument type Triton may specialize in ways this cache does not know
    x = torch.zeros(8)
    for _ in range(2):
        launch[(1,)](unknown, unknown, 8, 1.0)
        launch[lambda meta: (1,)](x, x, 8, 1.0)  # a grid function
        launch[(1,)](x, out_ptr=x, n=8, eps=1.0)  # a tensor by keyword: its pointer changes per call
    assert len(kernel.slow) == 6 and kernel.fast == []
    assert not launch.cache


def test_a_changed_global_of_the_kernel_goes_back_to_triton(launch_context):
    kernel = StandIn()
    scope = {"SCALE": 2}
    kernel.used_global_vals = {("SCALE", id(scope)): (2, scope)}
    launch = compat.FastLaunch(kernel)
    x = torch.zeros(8)
    launch[(1,)](x, x, 8, 1.0)
    launch[(1,)](x, x, 8, 1.0)
    scope["SCALE"] = 3  # Triton's own path raises for this
    launch[(1,)](x, x, 8, 1.0)
    assert len(kernel.slow) == 2 and len(kernel.fast) == 1


def test_a_scratch_free_cuda_launcher_of_triton_3_6_is_called_at_its_c_entry():
    calls = []

    class CudaLauncher:  # triton 3.6's backends/nvidia/driver.py: __call__ allocates scratch, then calls launch
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid, launch_pdl = False, True

        def launch(self, *args):
            calls.append(args)

    class Compiled:
        run, function, packed_metadata = CudaLauncher(), "fn", (4, 1, 0)

    run, head = compat.launcher(Compiled(), (3, 6))
    run(1, 2, 3, STREAM, *head, "x")
    assert calls == [(1, 2, 3, STREAM, "fn", False, True, None, None, (4, 1, 0), None, None, None, "x")]
    assert compat.launcher(Compiled(), (3, 9))[0] is Compiled.run  # another release: its __call__
    Compiled.run.global_scratch_size = 128
    assert compat.launcher(Compiled(), (3, 6))[0] is Compiled.run  # scratch to allocate: its __call__


def test_only_modelled_triton_releases_get_cheap_launches(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for version, enabled in (((3, 2), False), ((3, 3), True), ((3, 6), True), ((3, 9), True), ((3, 10), False)):
        monkeypatch.setattr(compat, "triton_version", lambda v=version: v)
        assert compat.fast_launch_enabled() is enabled, version


class Descriptor:  # the fields of triton.tools.tensor_descriptor.TensorDescriptor the key and launchers read
    def __init__(self, base, block_shape):
        self.base, self.shape, self.strides, self.block_shape = base, base.shape, base.stride(), block_shape
        self.padding = "zero"


def test_tma_descriptors_are_keyed_by_base_shape_and_block(launch_context):
    kernel = StandIn()
    launch = compat.FastLaunch(kernel)
    a, b = torch.zeros(64, 32), torch.zeros(64, 32)
    launch[(2,)](Descriptor(a, [16, 16]), Descriptor(b, [16, 16]), 64, 1.0)
    launch[(2,)](Descriptor(b, [16, 16]), Descriptor(a, [16, 16]), 64, 1.0)  # same pattern, other tensors
    launch[(2,)](Descriptor(a, [32, 16]), Descriptor(b, [16, 16]), 64, 1.0)  # another block: recompiled
    launch[(2,)](Descriptor(a.t(), [16, 16]), Descriptor(b, [16, 16]), 64, 1.0)  # another layout
    assert len(kernel.slow) == 3 and len(kernel.fast) == 1


def test_triton_3_6s_per_call_descriptor_expansion_is_unwrapped():
    """compat.descriptor_expansion on the launcher Triton 3.6 builds for a kernel with a TMA descriptor: the C
    launcher beneath, and the expansion Triton would make of each descriptor on every call."""
    if compat.triton_version() != (3, 6):
        pytest.skip("the expansion is unwrapped for Triton 3.6 only")
    from triton.backends.nvidia import driver

    calls = []
    wrapped = driver.wrap_handle_tensordesc(lambda *args: calls.append(args),
                                            {0: "tensordesc<fp16[16, 16]>", 1: "i32"}, None)
    beneath, expand = compat.descriptor_expansion(wrapped)
    descriptor = Descriptor(torch.zeros(64, 32), [16, 16])
    head = tuple(range(driver._BASE_ARGS_FORMAT_LEN))
    wrapped(*head, descriptor, 5)
    beneath(*head, *expand(descriptor, 0), 5)
    assert len(calls) == 2 and calls[0] == calls[1]
    assert compat.descriptor_expansion(lambda *args: None) is None  # a launcher that expands nothing


# starters whose every call at the registry's shapes is replayed (autokernel/ops/replay.py)
REPLAYED_STARTERS = ("rmsnorm", "layernorm", "softmax", "rotary_embedding", "matmul", "fused_mlp", "flash_attention",
                     "linear_cross_entropy")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_type", ["rmsnorm", "layernorm", "softmax", "rotary_embedding", "matmul",
                                         "fused_mlp", "flash_attention", "cross_entropy", "reduce",
                                         "linear_cross_entropy"])
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
            for _ in range(2):  # the same addresses again: TMA descriptors encoded at the last call are reused
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

    from autokernel.kernelfile import import_kernel
    from autokernel.loop.agents.builtin import apply_table, tunable_space

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
