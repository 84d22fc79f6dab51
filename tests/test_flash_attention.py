"""flash_attention's variants: grouped K/V heads (grouped-query attention: query head h reads K/V head h // group,
with no copy of K and V), a causal sliding window, a logit soft cap and ALiBi slopes, in the kernel and the harness's
shapes; the
grouped heads also in the profiler's shape and the SDPA site."""

import pytest
import torch
from helpers import bench_planted

import autokernel
from autokernel.profile import attribution
from autokernel.profile.attribution import Op
from autokernel.registry import get_spec

TYPE = "flash_attention"


PACK_BUG = ("head = kv * GROUP + (rows // BLOCK_POS)", "head = kv * GROUP + (rows % GROUP)")  # rows' heads mixed
# planted bugs, each a one-line edit of the starter: (what is replaced, what replaces it)
BUGS = {
    "the wrong kv head": ("kv = (h // GROUP)", "kv = (h % (H // GROUP))"),  # right for one head per group only
    "the window ignored": ("WINDOWED=window > 0", "WINDOWED=False"),
    "the soft cap ignored": ("CAPPED=softcap > 0", "CAPPED=False"),
    "the slopes ignored": ("ALIBI=alibi is not None", "ALIBI=False"),
    "the slope's distance reversed": ("(offs_n[None, :] - offs_m[:, None])", "(offs_m[:, None] - offs_n[None, :])"),
}


FOLD_BUG = ("mirror = tl.cdiv(S, BLOCK_POS) - 1 - start_m", "mirror = tl.cdiv(S, BLOCK_POS) - 2 - start_m")


@pytest.mark.parametrize("order", ["launch", "fold"])
def test_every_causal_order_computes_each_query_block_once(interpreter, repo_root, tmp_path, order):
    """CAUSAL_ORDER "fold" (each program a query block and its mirror) and "launch" give the reference at every shape
    of the sweep and the edges, the variants included (a window, a soft cap, ALiBi), with the grouped heads packed
    into one program or not (PACK_GQA); a mirror one block off leaves a block unwritten and fails the harness."""
    from autokernel.kernelfile import apply_config, import_kernel

    spec, source = get_spec(TYPE), (repo_root / "kernels" / f"{TYPE}.py").read_text()
    gen = torch.Generator().manual_seed(3)
    packed = {"B": 1, "H": 4, "Hkv": 2, "S": 40, "D": 16, "causal": True, "softcap": 2.0, "alibi": True}
    shapes = spec.sweep(True) + spec.edges(True) + [packed]  # grouped heads, ALiBi's slope per packed row
    for pack in (False, True):
        path = tmp_path / f"{order}_{pack}.py"
        path.write_text(apply_config(source, {"CAUSAL_ORDER": order, "BLOCK_M": 16, "BLOCK_N": 16, "PACK_GQA": pack}))
        module = import_kernel(path)
        for shape in shapes:
            inputs = spec.make_inputs(shape, torch.float32, "cpu", gen)
            torch.testing.assert_close(module.kernel_fn(*inputs), spec.reference(*inputs), atol=2e-3, rtol=2e-3,
                                       msg=f"{shape}, PACK_GQA {pack}")
    if order == "fold":
        from autokernel.harness.runner import run_bench
        # the default ("auto") folds the small grids of the harness's CPU shapes: the mirror's bug fails there
        assert bench_planted(tmp_path, TYPE, *FOLD_BUG)["status"] == "fail"
        for chosen, verdict in (("fold", "fail"), ("longest_first", "pass")):  # never folded, the bug never runs
            path.write_text(apply_config(source.replace(*FOLD_BUG), {"CAUSAL_ORDER": chosen, "BLOCK_M": 16,
                                                                      "BLOCK_N": 16}))
            assert run_bench(path, device="cpu", timed=False)["status"] == verdict, chosen


def test_auto_folds_small_causal_grids_and_launches_large_ones_longest_first(repo_root):
    """CAUSAL_ORDER "auto": folded where the grid has at most FOLD_PER_SM programs an SM (an H100: B1 H16 S2048 D128,
    512 programs, 1.30x), longest first above (B2 H32 S2048, 2048 programs: folded 0.75x); never folded without a
    causal mask."""
    from autokernel.kernelfile import import_kernel

    module = import_kernel(repo_root / "kernels" / f"{TYPE}.py")
    assert module.CAUSAL_ORDER == "auto"
    cpu = torch.device("cpu")  # counted as an H100's 132 SMs
    assert module._order(32, True, 16, cpu) == (16, False, True)
    assert module._order(32, True, 64, cpu) == (32, True, False)
    assert module._order(32, False, 16, cpu) == (32, False, False)


def test_auto_takes_tma_for_large_calls_only_where_the_grid_is_not_folded(repo_root, monkeypatch):
    """VARIANT "auto" on a GPU where TMA applies: a large causal call whose grid is folded runs the pointer loop (an
    H100, D 128: "split" 1.17-1.22x faster there, B1 H8 S8192 and B1 H32 S2048, 1024 programs), a large grid and a
    large non-causal call take TMA, a small call never does; "tma" takes it wherever it applies."""
    from autokernel.kernelfile import import_kernel

    module = import_kernel(repo_root / "kernels" / f"{TYPE}.py")
    monkeypatch.setattr(module, "_tma_applies", lambda *args: True)

    def takes_tma(batch, heads, seq, causal=True):
        q = torch.empty(batch, heads, seq, 128, device="meta", dtype=torch.float16)  # counted as an H100's 132 SMs
        return module._use_tma(q, q, q, causal, 64, 0.09)

    assert module.VARIANT == "auto"
    assert not takes_tma(1, 8, 8192) and not takes_tma(1, 32, 2048)  # 1024 programs: folded
    assert takes_tma(1, 32, 8192) and takes_tma(2, 32, 2048)  # 4096 and 2048 programs: longest first
    assert takes_tma(1, 8, 8192, causal=False)
    assert not takes_tma(1, 8, 1024)  # 2^31 FLOPs: the launch's host descriptors cost more than TMA saves
    monkeypatch.setattr(module, "VARIANT", "tma")
    assert takes_tma(1, 8, 8192) and takes_tma(1, 8, 1024)


def test_the_small_shapes_cover_grouped_heads_a_window_a_soft_cap_and_alibi():
    shapes = get_spec(TYPE).small_shapes
    assert any(s.get("Hkv", s["H"]) < s["H"] for s in shapes)
    assert any(s.get("window") for s in shapes) and any(s.get("softcap") for s in shapes)
    assert {s["causal"] for s in shapes if s.get("alibi")} == {True, False}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_kernel_that_gets_a_variant_wrong_fails_the_harness(tmp_path, bug):
    result = bench_planted(tmp_path, TYPE, *BUGS[bug])
    assert result["status"] == "fail" and result["failed_stage"] in ("smoke", "shape_sweep")


def test_packed_grouped_heads_with_a_rows_head_wrong_fail_the_harness(tmp_path):
    """PACK_GQA on (the screen's choice, not the default): a packed row given another query head of its group fails
    the harness's stages, as any variant's bug does."""
    from autokernel.harness.runner import run_bench
    from autokernel.kernelfile import apply_config

    path = tmp_path / f"{TYPE}.py"
    source = (autokernel.compat.ROOT / "kernels" / f"{TYPE}.py").read_text()
    assert PACK_BUG[0] in source
    path.write_text(apply_config(source, {"PACK_GQA": True}))
    assert run_bench(path, device="cpu", timed=False)["status"] == "pass"
    path.write_text(apply_config(source.replace(*PACK_BUG), {"PACK_GQA": True}))
    result = run_bench(path, device="cpu", timed=False)
    assert result["status"] == "fail" and result["failed_stage"] in ("smoke", "shape_sweep", "edge_cases")


def test_the_flex_attention_baseline_computes_each_variant_as_the_reference_does():
    """shape_table's flex_attention column (torch's flex_attention with the variant's soft cap and mask): checked
    here eagerly, on the CPU, on every small and small edge shape: windows, soft caps, grouped heads."""
    flex_attention = pytest.importorskip("torch.nn.attention.flex_attention").flex_attention
    from autokernel import compat
    from autokernel.types.flash_attention import flex_attention_call

    limit = compat.recompile_limit_option()  # the baseline raises dynamo's limit for its compiles: put back after
    with torch._dynamo.config.patch(**{limit: getattr(torch._dynamo.config, limit)}):
        spec = get_spec(TYPE)
        assert "flex_attention" in spec.extra_baselines(None)
    for shape in spec.small_shapes + spec.small_edge_shapes:
        inputs = spec.make_inputs(shape, torch.float32, "cpu", torch.Generator().manual_seed(0))
        got = flex_attention_call(flex_attention, *inputs)
        torch.testing.assert_close(got, spec.reference(*inputs), atol=1e-5, rtol=1e-4, msg=str(shape))


def test_the_profiler_records_the_grouped_heads_of_an_sdpa_call():
    ops = [Op("autokernel.step", "step"),
           Op("aten::_scaled_dot_product_flash_attention", "op", parent=0, self_us=20.0,
              shapes=[[1, 32, 64, 64], [1, 4, 64, 64], [1, 4, 64, 64]], args=[None, None, None, 0.0, True],
              kernels=("pytorch_flash::flash_fwd_kernel",))]
    sdpa = next(g for g in attribution.attribute(ops) if g.type == TYPE)
    assert attribution.group_shape(sdpa, ops) == {"B": 1, "H": 32, "Hkv": 4, "S": 64, "D": 64, "causal": True}


def test_the_sdpa_site_of_a_grouped_query_llama_runs_the_kernel_on_the_grouped_heads(interpreter, tmp_path,
                                                                                     monkeypatch):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                                      num_key_value_heads=2, vocab_size=256)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        optimized = autokernel.optimize(model, tmp_path / "none", [TYPE], verified=None, quiet=True)
        copies = []
        repeat = torch.Tensor.repeat_interleave
        monkeypatch.setattr(torch.Tensor, "repeat_interleave", lambda t, *a, **k: copies.append(t.shape) or repeat(
            t, *a, **k))
        got = optimized(ids, use_cache=False).logits
        monkeypatch.undo()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    sites = [s for s in optimized.autokernel.sites() if s.kernel_type == TYPE]
    assert sites and all(s.calls == 2 and not s.fallbacks for s in sites)
    assert not copies  # the K/V heads as the model grouped them, not copied to one per query head

