"""rope_attention (issue #19): RoPE + grouped-query attention as one kernel type, through the harness, HF Llama's
attention modules (optimize / verify) and profile attribution. CPU: Triton's interpreter at small shapes."""

import inspect
import json

import pytest
import torch
from helpers import compiled_ops

import autokernel
import verify
from autokernel.harness.runner import run_bench
from autokernel.profile.attribution import Op, attribute
from autokernel.profile.profiling import profile_model
from autokernel.registry import get_spec

transformers = pytest.importorskip("transformers")

TYPE = "rope_attention"
# planted bugs, each a one-line edit of the starter: (what is replaced, what replaces it)
BUGS = {
    "RoPE on k skipped": ("k = _rotate_k(k, cos3", "_ = _rotate_k(k, cos3"),  # the default variant's pre-pass
    "the wrong kv head": ("kv = (h // GROUP).to(tl.int64)", "kv = (h % (H // GROUP)).to(tl.int64)"),
    # partial rotary read as whole-head RoPE on the tables it is given: the small shape with R < D fails
    "partial rotary ignored": ("rot_half = cos3.shape[-1] // 2", "rot_half = head_dim // 2"),
    # GLM's interleaved pairs turned as rotate-half's: the small shapes with interleaved pairs fail
    "interleaved pairs ignored": ("sm_scale=None, interleaved=False):", "sm_scale=None, interleaved=False):\n"
                                  "    interleaved = False"),
}


def _bugged(repo_root, tmp_path, bug: str, name: str):
    old, new = BUGS[bug]
    source = (repo_root / "kernels" / f"{TYPE}.py").read_text()
    assert old in source, "the planted bug no longer fits the starter"
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(source.replace(old, new))
    return path


def test_the_small_shapes_cover_both_head_dims_and_gqa_groups_1_4_8():
    shapes = get_spec(TYPE).small_shapes
    assert {s["D"] for s in shapes} >= {64, 128}
    assert {s["Hq"] // s["Hkv"] for s in shapes} >= {1, 4, 8}


@pytest.mark.usefixtures("warm_launcher")
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_wrong_kernel_fails_the_harness(repo_root, tmp_path, bug):
    result = run_bench(_bugged(repo_root, tmp_path, bug, f"{TYPE}.py"), device="cpu", timed=False)
    assert result["status"] == "fail" and result["failed_stage"] in ("smoke", "shape_sweep")


# ------------------------------------------------------------------------------ HF Llama
def _tiny_llama(**extra):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=256,
                                      **extra)
    return transformers.LlamaForCausalLM(config).eval()


def _tiny_neox():
    """GPT-NeoX: one query_key_value Linear, rotary on a quarter of each head of 64."""
    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                                        num_attention_heads=2, vocab_size=256, rotary_pct=0.25)
    return transformers.GPTNeoXForCausalLM(config).eval()


def _tiny_glm():
    """GLM: interleaved RoPE pairs (2i, 2i+1) on half of each head, HF's cat(freqs, freqs) tables."""
    torch.manual_seed(0)
    config = transformers.GlmConfig(hidden_size=128, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=32, vocab_size=256, pad_token_id=0)
    return transformers.GlmForCausalLM(config).eval()


def _tiny_cohere():
    """Cohere: interleaved pairs on the whole head, with tables of its own order (repeat_interleave(freqs, 2))."""
    torch.manual_seed(0)
    config = transformers.CohereConfig(hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=256, pad_token_id=0)
    return transformers.CohereForCausalLM(config).eval()


def _ids(batch=2, seq=24):
    return torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(1))


def _optimize(model, kernels, types):
    return autokernel.optimize(model, kernels, types, verified=None, quiet=True)


def test_optimize_runs_hf_llama_attention_as_one_kernel_call(interpreter, tmp_path):
    model, ids = _tiny_llama(), _ids()
    types = [TYPE, "rotary_embedding", "flash_attention"]
    with torch.no_grad():
        optimized = _optimize(model, tmp_path / "none", types)
        attention = optimized.model.layers[0].self_attn
        assert type(attention).__name__ == "KernelRopeAttention"
        assert attention.q_proj.weight is model.model.layers[0].self_attn.q_proj.weight  # projections stay
        for use_cache in (False, True):  # with a cache, the prefill fills it with the rotated keys, as HF does
            got, want = optimized(ids, use_cache=use_cache), model(ids, use_cache=use_cache)
            torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.past_key_values.layers[1].keys, want.past_key_values.layers[1].keys)
    sites = optimized.autokernel.sites()
    ours = [s for s in sites if s.kernel_type == TYPE]
    assert len(ours) == 2 and all(s.swapped and s.calls == 2 and not s.fallbacks for s in ours)
    # the layers the kernel ran never reached the rotary or SDPA patches: those types claimed no call
    assert not [s for s in sites if s.kernel_type in ("rotary_embedding", "flash_attention") and s.calls]


@pytest.mark.parametrize("family, layers", [("llama", 2), ("gpt_neox", 1)])
def test_under_torch_compile_the_kernel_is_one_node_of_the_graph(interpreter, tmp_path, family, layers):
    # transformers builds a causal mask tensor while compiling (a layer given a mask falls back); the type's
    # create_causal_mask patch passes None where eager transformers would, so the kernel runs compiled too
    model, ids = (_tiny_llama() if family == "llama" else _tiny_neox()), _ids()
    with torch.no_grad():
        ops = compiled_ops(_optimize(model, tmp_path / "none", [TYPE]), model, ids)
    assert sum(f"autokernel.{TYPE}" in op for op in ops) == layers  # one per layer
    assert not any("scaled_dot_product" in op for op in ops)


@pytest.mark.parametrize("window, kernels", [(64, 2), (8, 0)])  # 24 tokens: the window hides nothing / the first keys
def test_under_torch_compile_a_window_longer_than_the_sequence_leaves_no_mask(interpreter, tmp_path, window, kernels):
    """Sliding-window layers with SDPA (Mistral; Gemma-2 in transformers before 5.24): compiled, transformers built
    their window's mask where eagerly it leaves it out (the sequence shorter than the window), the layers fell back
    to SDPA with a mask (2.6x slower than is_causal at Gemma-2's on an H100). A window that masks still falls back."""
    torch.manual_seed(0)
    config = transformers.MistralConfig(hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=256,
                                        sliding_window=window, attn_implementation="sdpa")
    model = transformers.MistralForCausalLM(config).eval()
    with torch.no_grad():
        ops = compiled_ops(_optimize(model, tmp_path / "none", [TYPE]), model, _ids())
    assert sum(f"autokernel.{TYPE}" in op for op in ops) == kernels
    assert sum("scaled_dot_product" in op for op in ops) == 2 - kernels


@pytest.mark.slow(3)
def test_flash_attention_alone_also_takes_the_attention_where_transformers_would_build_a_mask(interpreter, tmp_path):
    """A GPT-NeoX attention is no rope_attention site (partial rotary), so flash_attention takes its SDPA call; under
    torch.compile (and in a CUDA graph's capture) transformers builds the causal mask a plain forward leaves out, and
    a call given a mask falls back. flash_attention carries the same create_causal_mask patch: one kernel node per
    layer, the original's output (without it the graphed model ran 0.93x of the original on an H100)."""
    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, vocab_size=256, rotary_pct=0.25)
    model, ids = transformers.GPTNeoXForCausalLM(config).eval(), _ids()
    with torch.no_grad():
        ops = compiled_ops(_optimize(model, tmp_path / "none", ["flash_attention"]), model, ids)
    assert sum("autokernel.flash_attention" in op for op in ops) == 2  # one per layer
    assert not any("scaled_dot_product" in op for op in ops)


@pytest.mark.gpu
def test_inductor_launches_the_kernel_from_its_own_code(tmp_path):
    """Inductor passes a Python float to a user kernel as fp64 (the score scale): the file keeps its loop's
    accumulator fp32 (a type change in the loop fails Inductor's compile), and the compiled model launches the
    kernel from Inductor's own code, no opaque op's Python dispatch, with and without CUDA graphs."""
    from torch._inductor.utils import run_and_get_code

    from autokernel.ops import swap

    model, ids = _tiny_llama().to("cuda", torch.float16), _ids(seq=128).cuda()
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        optimized = _optimize(model, tmp_path / "none", [TYPE])
        torch._dynamo.reset()
        got, code = run_and_get_code(torch.compile(optimized), ids, use_cache=False)
        code = "\n".join(code)
        assert "_rope_attention_kernel" in code and "_opaque" not in code
        assert swap.rel_l2(got.logits, want) < swap.REL_L2_TOLERANCE[torch.float16]
        torch._dynamo.reset()
        graphed = torch.compile(optimized, mode="reduce-overhead")
        for _ in range(3):  # warm-up, record, replay
            got = graphed(ids, use_cache=False)
        assert swap.rel_l2(got.logits, want) < swap.REL_L2_TOLERANCE[torch.float16]


def _mask_before_5_24(config, inputs_embeds, attention_mask, past_key_values, position_ids=None,
                      or_mask_function=None, allow_is_causal_skip=True):
    return "a mask"


def _mask_since_5_24(config, inputs_embeds, attention_mask, cache, position_ids=None, or_mask_function=None,
                     allow_is_causal_skip=True):
    return "a mask"


@pytest.mark.parametrize("original", [_mask_before_5_24, _mask_since_5_24])
def test_the_causal_mask_patch_reads_the_call_by_its_names(original):
    """transformers 5.24 renamed create_causal_mask's past_key_values to cache; callers pass keywords."""
    from types import SimpleNamespace

    from autokernel.ops import attention_sites

    cache_name = list(inspect.signature(original).parameters)[3]
    patched = attention_sites._causal_mask_wrapper(original, attention_sites.MASKS["create_causal_mask"])
    sdpa, x = SimpleNamespace(_attn_implementation="sdpa"), torch.zeros(1, 4, 8)
    plain = {"config": sdpa, "inputs_embeds": x, "attention_mask": None, cache_name: None}
    assert patched(**plain) is None and patched(sdpa, x, None, None) is None  # eager transformers' "no mask"
    for call in ({**plain, "attention_mask": torch.ones(1, 4)}, {**plain, "allow_is_causal_skip": False},
                 {**plain, "or_mask_function": lambda *a: True},
                 {**plain, "config": SimpleNamespace(_attn_implementation="eager")}):
        assert patched(**call) == "a mask"
    window = attention_sites._causal_mask_wrapper(original, attention_sites.MASKS[attention_sites.WINDOWED], True)
    # 4 tokens: a window of 5 needs no mask; one of 4 hides nothing either, but transformers keeps it (its rule: <)
    for sliding, mask in ((5, None), (4, "a mask"), (None, "a mask")):
        config = SimpleNamespace(_attn_implementation="sdpa", sliding_window=sliding)
        assert window(**{**plain, "config": config}) == mask


def test_calls_the_kernel_does_not_cover_run_the_original_forward(interpreter, tmp_path):
    model, ids = _tiny_llama(), _ids()
    padded = torch.ones_like(ids)
    padded[0, :5] = 0  # left padding: a real attention mask
    with torch.no_grad():
        optimized = _optimize(model, tmp_path / "none", [TYPE])
        prefill = model(ids, use_cache=True)
        step = dict(past_key_values=prefill.past_key_values, use_cache=True)
        want_step = model(ids[:, :1], **{**step, "past_key_values": _copy_cache(prefill.past_key_values)})
        got_step = optimized(ids[:, :1], **step)
        torch.testing.assert_close(got_step.logits, want_step.logits)
        torch.testing.assert_close(optimized(ids, attention_mask=padded).logits,
                                   model(ids, attention_mask=padded).logits)
    reasons = {s.reason for s in optimized.autokernel.sites() if s.kernel_type == TYPE}
    assert any("KV cache" in r for r in reasons) or any("mask" in r for r in reasons)
    assert all(s.fallbacks == 2 and s.calls == 0 for s in optimized.autokernel.sites() if s.kernel_type == TYPE)


def _copy_cache(cache):
    import copy

    return copy.deepcopy(cache)


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_wrong_kernel_changes_the_models_output(interpreter, repo_root, tmp_path, bug):
    kernels = tmp_path / "kernels"
    _bugged(repo_root, tmp_path, bug, f"kernels/01_{TYPE}.py")
    family = _tiny_neox if "partial" in bug else _tiny_glm if "interleaved" in bug else _tiny_llama
    model, ids = family(), _ids()
    with torch.no_grad():
        wrong = _optimize(model, kernels, [TYPE])
        err = (wrong(ids, use_cache=False).logits - model(ids, use_cache=False).logits).abs().max()
    assert wrong.autokernel.choices[TYPE].source == "extracted" and not err <= 1e-2  # (NaN is wrong too)


def _tiny_qwen3():
    torch.manual_seed(0)
    config = transformers.Qwen3Config(hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=256)
    return transformers.Qwen3ForCausalLM(config).eval()


@pytest.mark.parametrize("family, what", [(_tiny_qwen3, "q/k norms"), (_tiny_neox, "D=64, rotary 16"),
                                          (_tiny_glm, "interleaved pairs"), (_tiny_cohere, "interleaved pairs")],
                         ids=["qwen3", "gpt_neox", "glm", "cohere"])
def test_an_attention_s_prologue_runs_with_the_kernel_and_fills_the_cache_as_the_original(interpreter, tmp_path,
                                                                                          family, what):
    """Qwen3 normalizes q and k per head before RoPE: the module's own norms run, then RoPE and attention as one
    kernel call. GPT-NeoX projects q, k and v with one Linear and rotates a quarter of each head: the site splits the
    fused projection as the module does and the kernel rotates only the features the tables cover. GLM turns
    interleaved pairs (2i, 2i+1) of half of each head by HF's usual tables, Cohere the pairs of the whole head by
    tables in its own order, which the site reorders. Each way the original's output, and the same keys in its
    cache."""
    model = family()
    with torch.no_grad():
        optimized = _optimize(model, tmp_path / "none", [TYPE])
        got, want = optimized(_ids(), use_cache=True), model(_ids(), use_cache=True)
        torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.past_key_values.layers[0].keys, want.past_key_values.layers[0].keys)
    (site,) = [s for s in optimized.autokernel.sites() if s.kernel_type == TYPE]
    assert site.swapped and site.calls == 1 and what in site.what


@pytest.mark.slow(3)
@pytest.mark.parametrize("family", [_tiny_qwen3, _tiny_glm], ids=["qwen3", "glm"])
def test_traced_the_keys_for_the_cache_are_rotated_by_one_op(interpreter, tmp_path, family):
    """Compiled with a cache, the keys the site rotates for it are one op (autokernel::rotate_half), which Inductor
    cannot fuse with Qwen3's per-head norm and the tables' making: fused, a roll made a kernel ptxas compiled for over
    six minutes on an H100, and HF's ops one that ran 721 us a forward on an H200. GLM's interleaved pairs alike."""
    model = family()
    graphs = []

    def backend(gm, example):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        optimized = _optimize(model, tmp_path / "none", [TYPE])
        got = torch.compile(optimized, backend=backend, fullgraph=True)(_ids(), use_cache=True)
        want = model(_ids(), use_cache=True)
    torch.testing.assert_close(got.past_key_values.layers[0].keys, want.past_key_values.layers[0].keys)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)
    ops = [str(n.target) for g in graphs for n in g.graph.nodes if n.op in ("call_function", "call_method")]
    assert any(f"autokernel.{TYPE}" in op for op in ops) and not any("roll" in op for op in ops)
    assert sum("autokernel.rotate_half" in op for op in ops) == 1  # the one layer's keys


def test_an_attention_that_computes_something_else_is_left_alone(interpreter, tmp_path):
    # OLMo2 normalizes the whole of q and k (not each head) before RoPE: the same projections and call, another result
    torch.manual_seed(0)
    config = transformers.Olmo2Config(hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    model = transformers.Olmo2ForCausalLM(config).eval()
    with torch.no_grad():
        optimized = _optimize(model, tmp_path / "none", [TYPE])
        torch.testing.assert_close(optimized(_ids()).logits, model(_ids()).logits)
    (site,) = [s for s in optimized.autokernel.sites() if s.kernel_type == TYPE]
    assert not site.swapped and "probe" in site.reason


def test_verify_swaps_hf_llama_attention_and_blames_a_wrong_kernel(interpreter, repo_root, tmp_path, capsys):
    transformers.LlamaConfig(hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=32, vocab_size=256,
                             use_cache=False).save_pretrained(tmp_path / "cfg")
    kernels = tmp_path / "kernels"
    _bugged(repo_root, tmp_path, "the wrong kv head", f"kernels/01_{TYPE}.py")
    argv = ["--module", "transformers", "--class-name", "AutoModelForCausalLM", "--config", str(tmp_path / "cfg"),
            "--input-shape", "1,16", "--device", "cpu", "--checks", "1", "--no-timing", "--types", TYPE]
    code = verify.main([*argv, "--report", str(tmp_path / "right.json")])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    assert json.loads((tmp_path / "right.json").read_text())["swapped_types"] == [TYPE]
    code = verify.main([*argv, "--kernels", str(kernels), "--report", str(tmp_path / "wrong.json")])
    capsys.readouterr()
    report = json.loads((tmp_path / "wrong.json").read_text())
    assert code == 1 and report["correctness"]["blamed"] == [TYPE]


# ------------------------------------------------------------------------------ profiling
def test_profile_attributes_rope_and_sdpa_of_hf_attention_to_the_type_when_asked():
    model, ids = _tiny_llama(), _ids(batch=1, seq=32)
    asked = profile_model(model, (ids,), "cpu", steps=1, warmup=1, types=[TYPE])["types"]
    plain = profile_model(model, (ids,), "cpu", steps=1, warmup=1)["types"]
    assert TYPE in asked and "flash_attention" not in asked and "matmul" in asked  # the projections stay matmul
    # RoPE on q and k in both layers is rope_attention's now; the table-making LlamaRotaryEmbedding rotates nothing
    # and is other's time either way
    assert "rotary_embedding" not in asked and plain["rotary_embedding"]["calls"] == 4
    assert [s["shape"] for s in asked[TYPE]["shapes"]] == [{"B": 1, "Hq": 4, "Hkv": 2, "S": 32, "D": 32,
                                                            "causal": True}]
    assert asked[TYPE]["calls"] == 2
    assert TYPE not in plain and "flash_attention" in plain


def test_profile_gives_gpt_neox_s_attention_its_rotary_dim():
    """A partial rotary's tables are narrower than the head: the shape carries R, so the extracted kernel is checked
    and timed rotating what the model rotates."""
    asked = profile_model(_tiny_neox(), (_ids(batch=1, seq=32),), "cpu", steps=1, warmup=1, types=[TYPE])["types"]
    assert [s["shape"] for s in asked[TYPE]["shapes"]] == [{"B": 1, "Hq": 2, "Hkv": 2, "S": 32, "D": 64, "R": 16,
                                                            "causal": True}]


def test_profile_gives_glm_s_attention_its_interleaved_pairs():
    """GLM turns pairs (2i, 2i+1) of half of each head: the shape says so, so the extracted kernel is checked and
    timed turning what the model turns."""
    asked = profile_model(_tiny_glm(), (_ids(batch=1, seq=32),), "cpu", steps=1, warmup=1, types=[TYPE])["types"]
    assert [s["shape"] for s in asked[TYPE]["shapes"]] == [{"B": 1, "Hq": 4, "Hkv": 2, "S": 32, "D": 32, "R": 16,
                                                            "interleaved": True, "causal": True}]


def _attention_ops(cls: str, with_rope: bool) -> list[Op]:
    ops = [Op("autokernel.step", "step"),
           Op("autokernel.module#0", "module", parent=0,
              module={"name": "attn", "cls": cls, "input_shape": [1, 64, 256]}),
           Op("autokernel.module#1", "module", parent=1, module={"name": "attn.q_proj", "cls": "Linear",
                                                                  "input_shape": [1, 64, 256]}),
           Op("aten::linear", "op", parent=2, self_us=10.0, shapes=[[1, 64, 256], [256, 256]])]
    if with_rope:
        ops += [Op("modeling_llama.py(127): apply_rotary_pos_emb", "python", parent=1),
                Op("aten::mul", "op", parent=4, self_us=3.0, shapes=[[1, 4, 64, 64], [1, 1, 64, 64]]),
                Op("aten::mul", "op", parent=4, self_us=1.0, shapes=[[1, 1, 64, 64], [1, 1, 64, 64]])]
    ops.append(Op("aten::_scaled_dot_product_flash_attention", "op", parent=1, self_us=20.0,
                  shapes=[[1, 4, 64, 64], [1, 1, 64, 64], [1, 1, 64, 64]], args=[None, None, None, 0.0, True]))
    return ops


def test_attribution_leaves_projections_to_matmul_and_needs_rope():
    groups = attribute(_attention_ops("LlamaAttention", with_rope=True), types=[TYPE])
    time = {g.type: g.time_us for g in groups}
    assert time == {"matmul": 10.0, TYPE: 24.0}
    # an attention without RoPE (GPT-2) is not rope_attention even when asked for
    time = {g.type: g.time_us for g in attribute(_attention_ops("GPT2Attention", with_rope=False), types=[TYPE])}
    assert time == {"matmul": 10.0, "flash_attention": 20.0}


def test_a_sliding_window_shorter_than_the_input_runs_the_original_forward(interpreter, tmp_path):
    """The model's own mask already sends such calls to the original; called without one, the site's window
    check does."""
    torch.manual_seed(0)
    config = transformers.MistralConfig(hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=256,
                                        sliding_window=8)
    model, ids = transformers.MistralForCausalLM(config).eval(), _ids(seq=24)
    with torch.no_grad():
        optimized = _optimize(model, tmp_path / "none", [TYPE])
        torch.testing.assert_close(optimized(ids).logits, model(ids).logits)
        site = dict(optimized.named_modules())["model.layers.0.self_attn"]
        hidden = torch.randn(2, 24, 128)
        tables = model.model.rotary_emb(hidden, torch.arange(24)[None])
        call = dict(hidden_states=hidden, position_embeddings=tables, attention_mask=None)
        torch.testing.assert_close(site(**call)[0], model.model.layers[0].self_attn(**call)[0])
    sites = {s.where: s for s in optimized.autokernel.sites() if s.kernel_type == TYPE}
    assert all(s.calls == 0 for s in sites.values())
    assert sites["model.layers.0.self_attn"].reason == "a sliding window of 8 < 24 positions"


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_keys_rotated_for_the_cache_are_hfs_bit_for_bit(dtype):
    """What the site puts in the KV cache is apply_rotary_pos_emb's K, for 2-D and 3-D tables, each pair made into
    broadcast tables once (eagerly) and never taken for another pair's."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from autokernel.ops.attention_sites import _rotated

    gen = torch.Generator().manual_seed(0)
    k = torch.randn(2, 3, 10, 16, generator=gen).to(dtype)
    for eager in (True, False):
        for batched in (True, False, True):
            angles = torch.rand(2 if batched else 1, 10, 8, generator=gen) * 6
            cos, sin = (torch.cat([f(angles)] * 2, -1).to(dtype) for f in (torch.cos, torch.sin))
            want = apply_rotary_pos_emb(k, k, cos, sin)[1]
            tables = (cos, sin) if batched else (cos[0], sin[0])
            for _ in range(2):  # the second call with the same tables takes them from the memo
                assert torch.equal(_rotated(k, *tables, eager), want)


def _with(source: str, tmp_path, name: str, **config):
    from autokernel.kernelfile import apply_config, import_kernel

    path = tmp_path / f"{name}.py"
    path.write_text(apply_config(source, config) if config else source)
    return import_kernel(path)


@pytest.mark.parametrize("variant", ["rotate_k_first", "fused"])
def test_packed_gqa_computes_each_query_head_s_own_attention(interpreter, repo_root, tmp_path, variant):
    """PACK_GQA: one program takes a kv head's whole group of query heads (BLOCK_M rows = heads x positions); every
    shape of the sweep and the edges (groups 1, 2, 4, 8, causal or not, partial rotary, ragged S) as the reference
    computes it. A packed program that reads its rows' heads wrong is caught."""
    spec = get_spec(TYPE)
    source = (repo_root / "kernels" / f"{TYPE}.py").read_text()
    packed = _with(source, tmp_path, f"packed_{variant}", VARIANT=variant, PACK_GQA=True, BLOCK_M=32)
    bug = ("head = kv * GROUP + (rows // BLOCK_POS).to(tl.int64)", "head = kv * GROUP + (rows % GROUP).to(tl.int64)")
    assert bug[0] in source
    wrong = _with(source.replace(*bug), tmp_path, f"wrong_{variant}", VARIANT=variant, PACK_GQA=True, BLOCK_M=32)
    gen = torch.Generator().manual_seed(0)
    off = []
    for shape in spec.sweep(True) + spec.edges(True):
        inputs = spec.make_inputs(shape, torch.float32, "cpu", gen)
        expected = spec.reference(*inputs)
        torch.testing.assert_close(packed.kernel_fn(*inputs), expected, atol=2e-3, rtol=2e-3, msg=str(shape))
        if shape["Hq"] > shape["Hkv"]:
            off.append(not torch.allclose(wrong.kernel_fn(*inputs), expected, atol=2e-3, rtol=2e-3))
    assert off and all(off)


ORDER_BUGS = {"fold": ("mirror = tl.cdiv(S, BLOCK_POS) - 1 - start_m", "mirror = tl.cdiv(S, BLOCK_POS) - 2 - start_m"),
              "paired": ("rank = tl.where(pid < sms, pid, n_m * n_rows - 1 - (pid - sms))",
                         "rank = tl.where(pid < sms, pid, n_m * n_rows - 2 - (pid - sms))")}
# the planted bugs leave a block unwritten: their output starts as NaN, not as memory that may hold a right answer
# (torch.empty can hand back the block an earlier correct call freed, and the bug then read right in one CI run)
EMPTY_OUT = "out = torch.empty_strided((batch, heads, seq, head_dim), seq_major, dtype=q.dtype, device=q.device)"
NAN_OUT = EMPTY_OUT + ".fill_(float('nan'))"


@pytest.mark.parametrize("order", ["launch", "paired", "fold"])
def test_every_causal_order_computes_each_query_block_once(interpreter, repo_root, tmp_path, order):
    """CAUSAL_ORDER: a program's query blocks (one, its rank among all tiles, or a block and its mirror) cover every
    block once, packed or not, at every shape of the sweep and the edges (odd block counts: the middle block folds
    onto itself); a mirror or a rank one block off leaves a block unwritten and is caught."""
    spec = get_spec(TYPE)
    source = (repo_root / "kernels" / f"{TYPE}.py").read_text()
    gen = torch.Generator().manual_seed(2)
    shapes = [(shape, spec.make_inputs(shape, torch.float32, "cpu", gen))
              for shape in spec.sweep(True) + spec.edges(True)]
    for pack in (False, True):
        module = _with(source, tmp_path, f"{order}_{pack}", CAUSAL_ORDER=order, PACK_GQA=pack, BLOCK_M=32)
        for shape, inputs in shapes:
            got, expected = module.kernel_fn(*inputs), spec.reference(*inputs)
            torch.testing.assert_close(got, expected, atol=2e-3, rtol=2e-3, msg=str(shape))
    if order in ORDER_BUGS:
        assert ORDER_BUGS[order][0] in source and EMPTY_OUT in source
        wrong = _with(source.replace(*ORDER_BUGS[order]).replace(EMPTY_OUT, NAN_OUT), tmp_path, f"wrong_{order}",
                      CAUSAL_ORDER=order, BLOCK_M=32)
        causal = [inputs for shape, inputs in shapes if shape.get("causal", True) and shape["S"] > 64]
        assert causal and any(not torch.allclose(torch.nan_to_num(wrong.kernel_fn(*inputs), nan=1e9),
                                                 spec.reference(*inputs), atol=2e-3, rtol=2e-3) for inputs in causal)


@pytest.mark.parametrize("pack", [False, True])
def test_k_and_v_through_tma_descriptors_compute_the_reference(interpreter, repo_root, tmp_path, monkeypatch, pack):
    """KV_LOADS = "tma": the pre-pass's K rows and V's rows (a strided view, as HF's projections give it) through
    descriptors made on the device, rows past S zero-filled; taken at every shape the GPU's gate lets through."""
    spec = get_spec(TYPE)
    source = (repo_root / "kernels" / f"{TYPE}.py").read_text()
    module = _with(source, tmp_path, f"tma_{pack}", KV_LOADS="tma", PACK_GQA=pack, BLOCK_M=32)
    taken = []
    monkeypatch.setattr(module, "_tma_kv_ok", lambda k, v: taken.append(v.shape[-1]) or v.shape[-1] in (64, 128))
    gen = torch.Generator().manual_seed(1)
    for shape in spec.sweep(True) + spec.edges(True):
        q, k, v, *rest = spec.make_inputs(shape, torch.float32, "cpu", gen)
        v = v.transpose(1, 2).contiguous().transpose(1, 2)  # [B, S, H, D] viewed as [B, H, S, D]
        got = module.kernel_fn(q, k, v, *rest)
        torch.testing.assert_close(got, spec.reference(q, k, v, *rest), atol=2e-3, rtol=2e-3, msg=str(shape))
    assert {64, 128} <= set(taken)


def hopper_args(module):
    """kernel_fn's arguments at a model-like shape with the TMA loads taken (the launches are recorded, not run)."""
    module._tma_kv_ok = lambda k, v: True
    shape = {"B": 1, "Hq": 8, "Hkv": 2, "S": 256, "D": 64, "causal": True}
    return get_spec(TYPE).make_inputs(shape, torch.float16, "cpu", torch.Generator().manual_seed(0))


def hopper_args_d256(module):
    """kernel_fn's arguments at Gemma-2's head dim (256), the TMA gate open as on an H100."""
    module._tma_kv_ok = lambda k, v: True
    shape = {"B": 1, "Hq": 8, "Hkv": 4, "S": 256, "D": 256, "causal": True}
    return get_spec(TYPE).make_inputs(shape, torch.float16, "cpu", torch.Generator().manual_seed(0))


@pytest.mark.slow(15)
def test_the_head_dim_256_defaults_compile_for_hopper_within_its_shared_memory(repo_root):
    """At head dim 256 the file's defaults take K and V through TMA (descriptors made on the device: global
    scratch) and fold the causal blocks, with 64x32 tiles: compiled for sm_90, within an H100's 227 KB per block."""
    import helpers

    path = repo_root / "kernels" / f"{TYPE}.py"
    [[launch]] = helpers.compiled_for(helpers.HOPPER, [(path, {})], "test_rope_attention:hopper_args_d256",
                                      "_rope_attention_kernel")
    assert launch["global_scratch_size"] > 0 and launch["shared"] <= 232448
    assert launch["grid"][:2] == [2, 8]  # 256 positions: 4 query blocks of 64, folded in pairs; 8 query heads


@pytest.mark.slow(15)
def test_the_untimed_switches_compile_for_hopper(repo_root):
    """PACK_GQA, KV_LOADS = "tma" and the causal orders, which the screen tries on an H100, compile for sm_90
    (descriptors made on the device take global scratch)."""
    import helpers

    path = repo_root / "kernels" / f"{TYPE}.py"
    jobs = [(path, {"KV_LOADS": "tma"}), (path, {"KV_LOADS": "tma", "PACK_GQA": True}), (path, {"PACK_GQA": True}),
            (path, {"KV_LOADS": "tma", "CAUSAL_ORDER": "fold"}), (path, {"CAUSAL_ORDER": "paired"})]
    compiled = helpers.compiled_for(helpers.HOPPER, jobs, "test_rope_attention:hopper_args", "_rope_attention_kernel")
    assert [len(launches) for launches in compiled] == [1, 1, 1, 1, 1]
    assert [launches[0]["global_scratch_size"] > 0 for launches in compiled] == [True, True, False, True, False]


def test_a_file_from_before_interleaved_still_runs_where_the_pairs_are_not_asked_for(interpreter, repo_root,
                                                                                    tmp_path):
    """A night's rope_attention winner written before the type took `interleaved` keeps running a rotate-half model
    (the op calls it without the argument, at its default); a model that needs the pairs gets an error naming the
    file, not a wrong result. Any other mismatch of the signature is still refused at load."""
    from autokernel.kernelfile import KernelFileError, lacked_defaults
    from autokernel.ops.customops import KernelCallError

    source = (repo_root / "kernels" / f"{TYPE}.py").read_text()
    old = ("sm_scale=None, interleaved=False):", "sm_scale=None):\n    interleaved = False")
    assert old[0] in source
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / f"{TYPE}_optimized.py").write_text(source.replace(*old))
    with torch.no_grad():
        model, ids = _tiny_llama(), _ids()
        optimized = _optimize(model, kernels, [TYPE])
        torch.testing.assert_close(optimized(ids, use_cache=False).logits, model(ids, use_cache=False).logits,
                                   atol=1e-4, rtol=1e-4)
        assert optimized.autokernel.choices[TYPE].source == "optimized"
        with pytest.raises(KernelCallError, match="extract the type again"):
            _optimize(_tiny_glm(), kernels, [TYPE])(ids, use_cache=False)
    reference = get_spec(TYPE).reference
    assert lacked_defaults(lambda q, k, v, cos, sin, causal=True, sm_scale=None: q, reference) == (False,)
    with pytest.raises(KernelFileError, match="does not match"):
        lacked_defaults(lambda q, k, v, cos, sin, sm_scale=None: q, reference)
