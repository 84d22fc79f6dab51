"""linear_gelu (issue #19): a GELU MLP's up-projection with its bias and GELU as the GEMM's epilogue, through the
harness (a kernel with the wrong GELU or without the bias fails), swapped into HF GELU MLPs (GPT-2's Conv1D MLP with
the tanh GELU, GPT-NeoX's and BERT's with the exact one), and given its time by the profiler. CPU: kernels run
through Triton's interpreter; the `gpu` tests run the starter's variants and a compiled GPT-2 on a GPU."""

import pytest
import torch
from helpers import TOKEN_IDS, sites_of, starter_source

import autokernel
from autokernel.harness.runner import run_bench
from autokernel.ops import swap
from autokernel.profile.profiling import profile_model
from autokernel.types import linear_gelu

transformers = pytest.importorskip("transformers")

TANH_FLAG = 'TANH=approximate == "tanh"'
BIAS_FLAG = "HAS_BIAS=bias is not None"
TANH_GELU = "return acc / (1.0 + tl.exp2("


# ------------------------------------------------------------------------------------ the harness
@pytest.mark.slow
@pytest.mark.usefixtures("warm_launcher")
@pytest.mark.parametrize("wrong, why", [(TANH_FLAG.replace("==", "!="), "the other GELU"),
                                        (BIAS_FLAG.replace("bias is not None", "False"), "no bias")])
def test_a_kernel_with_the_wrong_epilogue_fails(repo_root, tmp_path, wrong, why):
    path = tmp_path / "linear_gelu_wrong.py"
    path.write_text(starter_source("linear_gelu", TANH_FLAG if "TANH" in wrong else BIAS_FLAG, wrong))
    result = run_bench(path, device="cpu", timed=False, quick=True)
    assert result["status"] == "fail", why
    assert "elements off" in result["reason"]


# --------------------------------------------------------------------------------- HF models
def _gpt2():
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=320, n_positions=64)  # V != I
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _neox():
    config = transformers.GPTNeoXConfig(hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                                        num_attention_heads=4, vocab_size=256, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.GPTNeoXForCausalLM(config).eval()


def _bert():
    config = transformers.BertConfig(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                     vocab_size=256, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.BertModel(config, add_pooling_layer=False).eval()


def _output(model, ids):
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def test_hf_gpt2_mlps_run_the_up_projection_and_gelu_as_one_kernel(interpreter, tmp_path):
    model = _gpt2()
    optimized = autokernel.optimize(model, tmp_path, ["linear_gelu", "matmul"], verified=None, quiet=True)
    assert swap.rel_l2(_output(optimized, TOKEN_IDS), _output(model, TOKEN_IDS)) < 1e-4
    fused = sites_of(optimized, "linear_gelu")
    assert sorted(fused) == ["transformer.h.0.mlp", "transformer.h.1.mlp"]
    assert all(s.swapped and s.calls == 1 and not s.fallbacks and "approximate='tanh'" in s.what
               for s in fused.values())  # gelu_new: the tanh GELU, found by the probe
    matmuls = sites_of(optimized, "matmul")
    assert "transformer.h.0.mlp.c_proj" in matmuls and "transformer.h.0.mlp.c_fc" not in matmuls  # down stays matmul
    assert "forward" not in vars(model.transformer.h[0].mlp)  # the original model is left as it was


@pytest.mark.parametrize("build, where, approximate", [(_neox, "gpt_neox.layers.0.mlp", "none"),
                                                       (_bert, "encoder.layer.0.intermediate", "none")])
def test_other_gelu_mlps_are_swapped_with_their_gelu(interpreter, tmp_path, build, where, approximate):
    model = build()
    optimized = autokernel.optimize(model, tmp_path, ["linear_gelu"], verified=None, quiet=True)
    assert swap.rel_l2(_output(optimized, TOKEN_IDS), _output(model, TOKEN_IDS)) < 1e-4
    site = sites_of(optimized, "linear_gelu")[where]
    assert site.swapped and site.calls == 1 and f"approximate={approximate!r}" in site.what


def test_a_wrong_linear_gelu_kernel_changes_the_models_output(repo_root, interpreter, tmp_path):
    # GPT-2 initialises its biases to zero, so the planted error is in the GELU: 10% high
    wrong = TANH_GELU.replace("acc /", "1.1 * acc /")
    (tmp_path / "01_linear_gelu.py").write_text(starter_source("linear_gelu", TANH_GELU, wrong))
    model = _gpt2()
    optimized = autokernel.optimize(model, tmp_path, ["linear_gelu"], verified=None, quiet=True)
    assert optimized.autokernel.choices["linear_gelu"].source == "extracted"
    assert swap.rel_l2(_output(optimized, TOKEN_IDS), _output(model, TOKEN_IDS)) > 1e-2


class QuickGELUMLP(torch.nn.Module):
    def __init__(self, gelu_like: torch.nn.Module):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(16, 64), gelu_like, torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_an_activation_that_is_not_gelu_leaves_the_mlp_alone(interpreter, install_starter):
    install_starter("linear_gelu")
    quick = QuickGELUMLP(transformers.activations.QuickGELUActivation())
    site, replacement = linear_gelu.gelu_mlp_module_site("mlp", quick)
    assert replacement is None and "neither the exact nor the tanh GELU" in site.reason
    assert linear_gelu.gelu_mlp_module_site("mlp", QuickGELUMLP(torch.nn.ReLU())) is None  # not a candidate at all
    exact = QuickGELUMLP(torch.nn.GELU())
    site, replacement = linear_gelu.gelu_mlp_module_site("mlp", exact)
    assert replacement is exact and site.swapped and "approximate='none'" in site.what


# ---------------------------------------------------------------------------------- profiling
def test_profile_gives_the_up_projection_and_its_gelu_to_linear_gelu():
    found = profile_model(_gpt2(), (TOKEN_IDS,), "cpu")["types"]
    assert found["linear_gelu"]["calls"] == 2
    assert [s["shape"] for s in found["linear_gelu"]["shapes"]] == [{"T": 24, "H": 64, "I": 256,
                                                                     "approximate": "tanh"}]
    # the down-projections (c_proj: K = 256) stay matmul; no matmul of the up-projections' shape is left
    matmul_shapes = [s["shape"] for s in found["matmul"]["shapes"]]
    assert {"M": 24, "N": 64, "K": 256} in matmul_shapes and {"M": 24, "N": 256, "K": 64} not in matmul_shapes


# --------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["persistent", "tma"])  # "auto" (grouped, and TMA when large): bench.py's run
def test_each_variant_passes_the_harness_on_the_gpu(repo_root, tmp_path, variant):
    path = tmp_path / f"linear_gelu_{variant}.py"
    path.write_text(starter_source("linear_gelu", 'VARIANT = "auto"', f'VARIANT = "{variant}"'))
    result = run_bench(path, device="cuda", timed=False, quick=True)
    assert result["status"] == "pass", f"{result['failed_stage']}: {result['reason']}"


@pytest.mark.gpu
def test_a_compiled_hf_gpt2_runs_the_kernel_from_inductors_code(tmp_path):
    from torch._inductor.utils import run_and_get_code

    model = _gpt2().to("cuda", torch.float16)
    ids = TOKEN_IDS.to("cuda")
    with torch.no_grad():
        want = _output(model, ids)
        optimized = autokernel.optimize(model, tmp_path, ["linear_gelu"], quiet=True)
        torch._dynamo.reset()
        out, code = run_and_get_code(torch.compile(optimized), ids)
    assert swap.rel_l2(out.logits, want) < swap.REL_L2_TOLERANCE[torch.float16]
    assert "_linear_gelu_kernel" in "\n".join(code)  # the pointer variant, traced: no opaque op


@pytest.mark.gpu
def test_a_large_call_on_tma_descriptors_still_computes_under_torch_compile(repo_root):
    from autokernel import kernelfile
    from autokernel.ops import customops
    from autokernel.registry import get_spec

    spec = get_spec("linear_gelu")
    shape = {"T": 8192, "H": 1024, "I": 4096, "approximate": "tanh"}  # 69 GFLOP: "auto" takes TMA eagerly
    args = spec.make_inputs(shape, torch.float16, "cuda", torch.Generator(device="cuda").manual_seed(0))
    kernel_fn = kernelfile.import_kernel(repo_root / "kernels" / "linear_gelu.py").kernel_fn
    customops.install("linear_gelu", kernel_fn, "kernels/linear_gelu.py", spec.deployment)
    op = customops.op("linear_gelu")
    with torch.no_grad():
        want = kernel_fn(*args)
        torch._dynamo.reset()
        got = torch.compile(lambda *a: op(*a) + 0)(*args)
    assert swap.rel_l2(got, want) < 1e-3
