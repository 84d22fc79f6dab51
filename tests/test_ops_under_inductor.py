"""Every starter's op as torch.compile runs it: Inductor traces into the kernel file (a triton_op) and launches its
Triton kernels from its own generated code, and the output is the eager kernel's. The harness times a kernel
eagerly, so a kernel can pass it and still fail here: Inductor types a Python float argument of a user Triton kernel
as fp64, and the decode starter's score scale made Triton refuse its loop (docs/kernels-under-compile.md); a
deployed model then leaves the type out in the compiled modes, and generate() compiled by transformers failed."""

import pytest
import torch
from helpers import every_argument

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
def test_each_starter_s_op_traces_whole_withevery_argument(interpreter, install_starter):
    """On the CPU (no Inductor for Triton there): each op traced by dynamo whole, fake tensors and schema included,
    gives the eager kernel's output."""
    for kernel_type in DEPLOYED:
        _compiled_like_eager(install_starter(kernel_type), kernel_type, [get_spec(kernel_type).small_shapes[0]], "cpu",
                             "aot_eager")


@pytest.mark.parametrize("kernel_type", ["flash_attention", "rope_attention"])
def test_the_model_views_an_attentions_output_where_it_copied_it(interpreter, install_starter, kernel_type):
    """The step after an attention in a model, transpose(1, 2) and a reshape to [B, S, H * D] for the output
    projection, was a copy of the whole output (an Inductor clone_transpose kernel a layer, 4 MB at Pythia-410M's
    1x2048): the kernels write it sequence-major (the Deployment's output_order), so eagerly and traced
    under torch.compile the step is a view, and nothing copies it."""
    from torch._dynamo.backends.common import aot_autograd

    kernel_fn = install_starter(kernel_type)
    spec, call = get_spec(kernel_type), customops.op(kernel_type)
    assert spec.deployment.output_order == (0, 2, 1, 3)
    shape = {"B": 1, "Hq": 4, "Hkv": 2, "S": 32, "D": 16, "causal": True} if kernel_type == "rope_attention" else \
        {"B": 1, "H": 4, "S": 32, "D": 16, "causal": True}
    inputs = every_argument(kernel_fn, spec.make_inputs(shape, torch.float16, "cpu", torch.Generator().manual_seed(0)))
    batch, heads, seq, head_dim = inputs[0].shape

    def attend(*args):
        return call(*args).transpose(1, 2).reshape(batch, seq, heads * head_dim)

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            assert call(*inputs).transpose(1, 2).is_contiguous()  # eagerly: the kernel's own layout
            got = torch.compile(attend, backend=aot_autograd(fw_compiler=capture), fullgraph=True)(*inputs)
            want = attend(*inputs)
    finally:
        torch._dynamo.reset()
    copies = [n for n in graphs[0].graph.nodes if n.op == "call_function" and "clone" in str(n.target)]
    assert not copies, copies
    torch.testing.assert_close(got, want)


def _compiled_like_eager(kernel_fn, kernel_type: str, shapes: list, device: str, backend: str) -> None:
    spec, call = get_spec(kernel_type), customops.op(kernel_type)
    torch._dynamo.reset()
    try:
        for shape in shapes:
            inputs = every_argument(kernel_fn, spec.make_inputs(shape, torch.float16, device,
                                                                 torch.Generator(device).manual_seed(0)))
            with torch.no_grad():
                want = call(*inputs)
                got = torch.compile(lambda *args: call(*args), backend=backend, fullgraph=True)(*inputs)
            torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)  # one kernel: the same sums, in any order
    finally:
        torch._dynamo.reset()


DOUBLED = "\n_single = kernel_fn\n\n\ndef kernel_fn(x, weight, eps=1e-6):\n    return _single(x, weight, eps) * 2\n"


def _two_files(tmp_path) -> tuple:
    """The rmsnorm starter, and a copy of it that doubles its output (another file behind the same op)."""
    from autokernel import kernelfile

    source = (ROOT / "kernels" / "rmsnorm.py").read_text()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "rmsnorm.py").write_text(source)
    (tmp_path / "b" / "rmsnorm.py").write_text(source + DOUBLED)
    return tuple(kernelfile.import_kernel(tmp_path / d / "rmsnorm.py").kernel_fn for d in ("a", "b"))


def test_the_compile_caches_are_keyed_on_the_files_behind_the_ops(tmp_path, install_starter, monkeypatch):
    """Dynamo's graph names the op, not the file: torch.compile's cache key carries the installed files (beside the
    user's own tag), anew for another file, the same again for the same file or a snapshot put back. (The user's tag
    set by the config's own patch: monkeypatch's undo of a torch config module hides the entry for good, and every
    later compile in the process fails to read it.)"""
    with torch.compiler.config.patch(cache_key_tag="users-own"):
        _keyed_on_the_files(tmp_path, install_starter, monkeypatch)


def _keyed_on_the_files(tmp_path, install_starter, monkeypatch):
    install_starter("rmsnorm")
    single, doubled = _two_files(tmp_path)
    deployment = get_spec("rmsnorm").deployment
    customops.install("rmsnorm", single, "a/rmsnorm.py", deployment)
    tag_a, snapshot = torch.compiler.config.cache_key_tag, customops.installed(["rmsnorm"])
    customops.install("rmsnorm", doubled, "b/rmsnorm.py", deployment)
    tag_b = torch.compiler.config.cache_key_tag
    assert tag_a.startswith("users-own|autokernel:") and tag_b.startswith("users-own|autokernel:")
    assert tag_a != tag_b
    customops.reinstall(snapshot)
    assert torch.compiler.config.cache_key_tag == tag_a
    customops.install("rmsnorm", doubled, "elsewhere", deployment)  # the same bytes under another label
    assert torch.compiler.config.cache_key_tag == tag_b
    monkeypatch.setitem(doubled.__globals__, "NUM_WARPS", 16)  # a tunable set on the imported module
    customops.install("rmsnorm", doubled, "elsewhere", deployment)
    assert torch.compiler.config.cache_key_tag not in (tag_a, tag_b)


@pytest.mark.gpu
def test_a_compile_after_another_file_is_installed_runs_that_file(tmp_path, install_starter):
    """verify --against compiles one model with two kernel sets in turn, a deployed winner is compiled where the
    starter was compiled before: each compile launches the file installed when it ran, not one AOTAutograd's cache
    kept for the same graph (on torch 2.11 the second side ran the first side's kernel until the key held the
    files)."""
    install_starter("rmsnorm")
    deployment, call = get_spec("rmsnorm").deployment, customops.op("rmsnorm")
    inputs = get_spec("rmsnorm").make_inputs({"M": 256, "N": 1024}, torch.float16, "cuda",
                                             torch.Generator("cuda").manual_seed(0))
    outputs = []
    try:
        for label, kernel_fn in zip(("a", "b"), _two_files(tmp_path)):
            customops.install("rmsnorm", kernel_fn, label, deployment)
            torch._dynamo.reset()
            with torch.no_grad():
                outputs.append(torch.compile(lambda x, w: call(x, w, 1e-6) + 0)(*inputs[:2]))
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(outputs[1], outputs[0] * 2)
