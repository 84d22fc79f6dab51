"""A new kernel type is one registry entry plus its starter: a toy type, defined here and registered through the
public API, goes through profile attribution, the plan, extract, the harness and autokernel.optimize with no
other module changed (CPU: the starter runs through Triton's interpreter)."""

import math
import re
import textwrap

import pytest
import torch
import torch.nn as nn

import autokernel
from autokernel import registry, suite
from autokernel.harness import baselines, harness
from autokernel.kerneltype import Deployment, KernelSpec, Profiling, SuiteTarget
from autokernel.ops import customops
from autokernel.profile import plan
from autokernel.profile.extraction import extract
from autokernel.profile.profiling import profile_model

TOY = "toy_double"

STARTER = textwrap.dedent(f'''
    """Toy starter: y = 2 * x, elementwise. One call reads x and writes y once: 2 * numel * element_size bytes."""

    import torch
    import triton
    import triton.language as tl

    KERNEL_TYPE = "{TOY}"

    BLOCK = 256  # elements per program


    @triton.jit
    def _double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n).to(tl.float32)  # the interpreter computes bf16 as fp32
        tl.store(out_ptr + offs, (x * 2).to(out_ptr.dtype.element_ty), mask=offs < n)


    def kernel_fn(x):
        x = x.contiguous()
        out = torch.empty_like(x)
        _double_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
        return out
''')


def double_ref(x):
    return x * 2


class Doubler(nn.Module):
    """The toy type's site in a model: the profiler finds it by class name, optimize replaces it."""

    def forward(self, x):
        return x * 2


class KernelDoubler(nn.Module):
    def __init__(self, original: nn.Module, site: customops.Site):
        super().__init__()
        self.original, self.site, self.op = original, site, customops.op(TOY)

    def forward(self, x):
        if customops.in_eager():
            self.site.calls += 1
        return self.op(x.reshape(-1)).view_as(x)


def doubler_site(name, module):
    if type(module).__name__ != "Doubler":
        return None
    site = customops.Site(name, "Doubler", TOY, True)
    return site, KernelDoubler(module, site)


SHAPES = [{"N": 1000}, {"N": 64}, {"N": 4097}]
SPEC = KernelSpec(
    name=TOY, reference=double_ref,
    make_inputs=lambda s, dt, dev, g: (torch.randn(s["N"], device=dev, generator=g).to(dt),),
    shapes=SHAPES, small_shapes=SHAPES, edge_shapes=SHAPES, small_edge_shapes=SHAPES,
    bench_shape={"N": 1 << 20}, small_bench_shape={"N": 4096},
    bytes_moved=lambda s, dt: 2 * s["N"] * torch.empty((), dtype=dt).element_size(), flops=lambda s: s["N"],
    profiling=Profiling(modules=re.compile(r"Doubler"), module_shape=lambda shape, ops: {"N": math.prod(shape)}),
    default_speedup=3.0,
    suite_target=SuiteTarget("2x eager", lambda r, b: r["speedup_vs_pytorch"] / 2),
    extra_baselines=lambda liger: {"x + x": lambda x: x + x},
    deployment=Deployment("(Tensor x) -> Tensor", lambda x: x.shape, module_site=doubler_site),
    description="toy: twice the input",
)


@pytest.fixture
def toy_type():
    registry.register(SPEC)
    try:
        yield SPEC
    finally:
        registry.unregister(TOY)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 16), Doubler()).eval()


def test_a_toy_type_goes_through_profile_extract_bench_and_optimize(toy_type, tmp_path):
    model = _model()
    x = torch.randn(2, 5, 16)
    prof = profile_model(model, (x,), "cpu")
    assert set(prof["types"]) == {"matmul", TOY}
    the_plan = plan.build_plan(prof)
    toy = next(e for e in the_plan["entries"] if e["type"] == TOY)
    assert (toy["s"], toy["s_source"]) == (3.0, "default")
    assert [s["shape"] for s in toy["shapes"]] == [{"N": 2 * 5 * 16}]

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / f"{TOY}.py").write_text(STARTER)
    (extracted,) = extract({**the_plan, "entries": [toy]}, 1, "triton", tmp_path / "out", tmp_path)
    assert not extracted.problem and extracted.path.name == f"{toy['rank']:02d}_{TOY}.py"
    assert "MODEL_SHAPES = [{'N': 160}]" in extracted.path.read_text()

    result = harness.run(str(extracted.path), "cpu", quick=True, seed=3, dtype="fp32", timed=False)
    assert result["status"] == "pass", result["reason"]

    with torch.no_grad():
        optimized = autokernel.optimize(model, tmp_path / "out", [TOY], verified=None, starters=None, quiet=True)
        got, want = optimized(x), model(x)
    assert type(optimized[1]).__name__ == "KernelDoubler" and type(model[1]) is Doubler
    assert torch.equal(got, want)
    assert optimized.autokernel.choices[TOY].source == "extracted"
    assert [s.calls for s in optimized.autokernel.sites() if s.kernel_type == TOY] == [1]


def test_a_toy_types_suite_target_and_baselines_come_from_its_entry(toy_type):
    assert suite.target(TOY).label == "2x eager"
    assert suite.target(TOY).ratio({"speedup_vs_pytorch": 3.0}, {}) == 1.5
    assert list(baselines.extra_baselines(None)[TOY]) == ["x + x"]


def test_unregistering_takes_the_type_out_again(toy_type):
    assert TOY in registry.kernel_types()
    registry.unregister(TOY)
    try:
        assert TOY not in registry.kernel_types() and plan.default_speedup(TOY) == plan.FALLBACK_SPEEDUP
    finally:
        registry.register(SPEC)
