"""decode_attention's mask: a model's boolean mask (left padding, a static cache's empty tail; HF's decode step folds
a group's query heads into the tokens of one mask row) decides which keys each token sees, in the kernel and the
harness's shapes."""

import pytest
import torch
from helpers import bench_planted

from autokernel.kernelfile import import_kernel
from autokernel.registry import get_spec

TYPE = "decode_attention"

# planted bugs, each a one-line edit of the starter: (what is replaced, what replaces it)
BUGS = {
    "the mask ignored": ("MASKED=mask is not None", "MASKED=False"),  # positions only: padded keys seen
    "every token reads the first mask row": ("mask.stride(1) if mask.shape[1] > 1 else 0", "0"),
}


def test_the_small_shapes_cover_a_mask_per_token_and_a_folded_one():
    shapes = get_spec(TYPE).small_shapes
    assert {s.get("masked") for s in shapes} >= {"causal", "folded"}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_kernel_that_misreads_the_mask_fails_the_harness(tmp_path, bug):
    result = bench_planted(tmp_path, TYPE, *BUGS[bug])
    assert result["status"] == "fail" and result["failed_stage"] in ("smoke", "shape_sweep")


def test_the_mask_s_padding_is_not_seen(interpreter, repo_root):
    """A left-padded sequence: the padded keys hold huge values that would swamp the output if they were read."""
    kernel = import_kernel(repo_root / "kernels" / f"{TYPE}.py")
    spec = get_spec(TYPE)
    q, k, v = (torch.randn(1, 2, 1, 16) for _ in range(3))
    k = k.repeat(1, 1, 40, 1)
    v = torch.randn(1, 2, 40, 16)
    v[:, :, :8] = 1e4  # the padding
    mask = torch.zeros(1, 1, 40, dtype=torch.bool)
    mask[:, :, 8:30] = True  # padding, then the prompt and the tokens so far; the cache's tail empty
    seqlens = torch.tensor([30], dtype=torch.int32)
    got = kernel.kernel_fn(q, k, v, seqlens, None, mask)
    torch.testing.assert_close(got, spec.reference(q, k, v, seqlens, None, mask))
    assert got.abs().max() < 10
    with pytest.raises(ValueError, match="bool"):
        kernel.kernel_fn(q, k, v, seqlens, None, mask.float())


def _tiny_llama(heads: int, kv_heads: int):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=256,
                                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.slow(10)
@pytest.mark.parametrize("types", [["flash_attention", TYPE], [TYPE, "flash_attention"]])
def test_generate_with_a_static_cache_runs_the_decode_kernel_and_flash_attention_the_prefill(interpreter,
                                                                                             install_starter, types):
    """SDPA's decode steps (HF folds a group's heads into the rows of one mask row) run decode_attention, the
    prompt's prefill flash_attention, whichever order the types come in; the tokens are the original's."""
    from autokernel.ops import swap

    for kernel_type in types:
        install_starter(kernel_type)
    model = _tiny_llama(heads=4, kv_heads=2)
    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    optimized = swap.build(model, types)
    kwargs = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False, "cache_implementation": "static",
              "pad_token_id": 0, "disable_compile": True}
    with torch.no_grad():
        want = model.generate(prompt, **kwargs)
        got = optimized.module().generate(prompt, **kwargs)
    assert torch.equal(got, want)
    sites = {s.kernel_type: s for s in optimized.sites() if s.swapped and s.calls}
    assert sites[TYPE].calls == 2 * 3 and sites["flash_attention"].calls == 2  # 3 steps after the prefill, 2 layers
    assert "autokernel" not in sites[TYPE].where and "sdpa_attention" in sites[TYPE].where  # transformers' call
    planned = optimized.planned()
    assert planned[TYPE] == ["F.scaled_dot_product_attention"] and planned[TYPE][0] in planned["flash_attention"]


@pytest.mark.gpu
def test_generate_compiled_by_transformers_runs_the_decode_kernel_in_cuda_graphs(install_starter):
    """As a user runs a static cache: transformers compiles each decode step with Inductor in reduce-overhead mode
    (CUDA graphs), our kernel and the model's boolean mask inside; the tokens are the original's, and the compiled
    steps launched the kernel (sites count eager calls only: the profiler sees the launches; the prefill's 160
    rows go to SDPA)."""
    from autokernel.ops import swap

    install_starter(TYPE)
    model = _tiny_llama(heads=8, kv_heads=2).cuda()  # fp32: no near ties between the two models' logits
    prompt = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(0)).cuda()
    optimized = swap.build(model, [TYPE])
    kwargs = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False, "cache_implementation": "static",
              "pad_token_id": 0}
    with torch.no_grad():
        want = model.generate(prompt, **kwargs, disable_compile=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            got = optimized.module().generate(prompt, **kwargs)  # transformers compiles the decode steps on a GPU
    compiled = "_compiled_call" in vars(optimized.module())
    torch._dynamo.reset()
    assert compiled
    assert torch.equal(got, want)
    assert any("_split_kernel" in event.name for event in prof.events())  # the decode starter's first kernel
