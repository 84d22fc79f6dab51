"""profile.py end to end on the tiny models (CPU time), the attribution rules, the plan's arithmetic,
and profile.py living beside the standard library's `profile` module."""

import json
import math
import subprocess
import sys

import pytest
import torch

from autokernel.models import example_inputs, load_model
from autokernel.profile import attribution, plan
from autokernel.profile.attribution import Op
from autokernel.profile.profiling import profile_model


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # On a shared CPU, two OpenMP threads fighting for a core turn a 50 us matmul into 15 ms.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _profile(repo_root, path, cls, **overrides):
    model = load_model(cls, model_file=str(repo_root / path), config="tiny")
    if overrides:
        model = type(model)("tiny", **overrides).eval()
    return profile_model(model, example_inputs(model, (2, 64), "cpu", torch.float32), "cpu")


EXPECTED = {  # the types each model really runs, and those its time must mostly go to
    "llama": ("models/llama.py", "LlamaModel",
              {"matmul", "fused_mlp", "rmsnorm", "rotary_embedding", "flash_attention"}, {"matmul", "fused_mlp"}),
    # its blocks add the attention output to x right before ln_2: the pair is add_layernorm (swap leaves the block
    # alone: its forward is not HF's statement sequence)
    # and their MLPs' up-projection + GELU (an nn.GELU module after c_fc; F.gelu after BERT's intermediate Linear) is
    # linear_gelu
    "gpt2": ("models/gpt2.py", "GPT2Model", {"matmul", "layernorm", "add_layernorm", "flash_attention", "linear_gelu"},
             {"matmul", "linear_gelu"}),
    "bert": ("models/bert.py", "BertModel", {"matmul", "layernorm", "flash_attention", "linear_gelu"},
             {"matmul", "linear_gelu"}),
}


@pytest.mark.parametrize("name", EXPECTED)
def test_tiny_model_plan_is_consistent(repo_root, name):
    path, cls, types, heavy = EXPECTED[name]
    prof = _profile(repo_root, path, cls)
    the_plan = plan.build_plan(prof)
    assert set(prof["types"]) == types
    shares = sum(e["f"] for e in the_plan["entries"]) + the_plan["other"]["f"]
    assert shares == pytest.approx(1.0, abs=1e-6) and the_plan["covered_f"] <= 1.0
    by_time = sorted(the_plan["entries"], key=lambda e: -e["f"])
    assert by_time[0]["type"] in heavy, by_time  # matmul work dominates these models
    for e in the_plan["entries"]:
        assert e["gain"] == pytest.approx(1 / ((1 - e["f"]) + e["f"] / e["s"]))
        assert e["shapes"], f"{e['type']} recorded no shapes"
    gains = [e["gain"] for e in the_plan["entries"]]
    assert gains == sorted(gains, reverse=True) and [e["rank"] for e in the_plan["entries"]] == list(
        range(1, len(gains) + 1))


def test_llama_shapes_are_the_real_ones(repo_root):
    prof = _profile(repo_root, "models/llama.py", "LlamaModel")
    shapes = {t: [s["shape"] for s in e["shapes"]] for t, e in prof["types"].items()}
    assert {"M": 128, "N": 128} in shapes["rmsnorm"]  # batch*seq rows of width dim
    assert {"T": 128, "H": 128, "I": 352} in shapes["fused_mlp"]
    assert {"B": 2, "H": 4, "S": 64, "D": 32, "causal": True} in shapes["flash_attention"]
    assert {"B": 2, "H": 4, "S": 64, "D": 32} in shapes["rotary_embedding"]  # q heads
    assert {"B": 2, "H": 2, "S": 64, "D": 32} in shapes["rotary_embedding"]  # grouped KV heads
    assert {"M": 128, "N": 512, "K": 128} in shapes["matmul"]  # the LM head
    assert prof["types"]["rmsnorm"]["calls"] == 5 and prof["types"]["fused_mlp"]["calls"] == 2


def test_rmsnorm_as_module_and_as_plain_ops_are_both_found(repo_root):
    prof = _profile(repo_root, "models/llama.py", "LlamaModel", rmsnorm_as_ops=True)
    # 4 norms written as ops inside the blocks, the final one still an RMSNorm module
    assert prof["types"]["rmsnorm"]["calls"] == 5
    assert prof["types"]["rmsnorm"]["shapes"][0]["shape"] == {"M": 128, "N": 128}
    leftover = set(prof["other"]["ops"])
    assert not leftover & {"aten::pow", "aten::mean", "aten::rsqrt", "aten::mul"}, leftover


def test_manual_attention_shows_softmax_and_batched_matmuls(repo_root):
    prof = _profile(repo_root, "models/gpt2.py", "GPT2Model", sdpa=False)
    assert "softmax" in prof["types"] and "flash_attention" not in prof["types"]
    assert {"M": 512, "N": 64} in [s["shape"] for s in prof["types"]["softmax"]["shapes"]]
    assert {"B": 8, "M": 64, "N": 64, "K": 32} in [s["shape"] for s in prof["types"]["matmul"]["shapes"]]


def _gpu_like_ops():
    """What a GPU profile looks like: kernels attached to the op that launched them."""
    return [
        Op("autokernel.step", "step"),
        Op("autokernel.module#0", "module", parent=0, module={"name": "attn", "cls": "Attention",
                                                               "input_shape": [1, 8, 64]}),
        Op("aten::linear", "op", parent=1, shapes=[[1, 8, 64], [192, 64]]),
        Op("aten::mm", "op", parent=2, self_us=30.0, shapes=[[8, 64], [64, 192]],
           kernels=("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN",)),
        Op("aten::_scaled_dot_product_flash_attention", "op", parent=1, self_us=20.0,
           shapes=[[1, 2, 8, 32], [1, 2, 8, 32], [1, 2, 8, 32]], args=[None, None, None, 0.0, True],
           kernels=("pytorch_flash::flash_fwd_kernel",)),
        Op("my_ext::fused", "op", parent=1, self_us=5.0, kernels=("sm90_xmma_gemm_f16f16_f32",)),
        Op("aten::add", "op", parent=0, self_us=4.0, kernels=("vectorized_elementwise_kernel",)),
    ]


def test_gpu_kernels_are_counted_once_and_recognised():
    ops = _gpu_like_ops()
    groups = {g.anchor: g for g in attribution.attribute(ops)}
    assert sum(g.time_us for g in groups.values()) == 59.0  # every kernel exactly once
    linear, sdpa, ext, add = groups[2], groups[4], groups[5], groups[6]
    assert (linear.type, linear.time_us) == ("matmul", 30.0)  # the nvjet kernel, under linear -> mm
    assert attribution.group_shape(linear, ops) == {"M": 8, "N": 192, "K": 64}
    assert (sdpa.type, sdpa.time_us) == ("flash_attention", 20.0)
    assert attribution.group_shape(sdpa, ops) == {"B": 1, "H": 2, "S": 8, "D": 32, "causal": True}
    assert ext.type == "matmul"  # an op nobody knows, whose kernel is a gemm
    assert (add.type, add.label) == ("other", "aten::add")


def test_gated_mlp_takes_its_matmuls_and_a_gelu_mlp_gives_its_first_and_the_gelu_to_linear_gelu():
    def mlp(cls, act, first="aten::linear"):
        return [Op("autokernel.step", "step"),
                Op("autokernel.module#0", "module", parent=0, module={"name": "mlp", "cls": cls,
                                                                       "input_shape": [4, 16]}),
                Op(first, "op", parent=1, self_us=10.0, shapes=[[4, 16], [40, 16]]),
                Op(act, "op", parent=1, self_us=1.0, shapes=[[4, 40]]),
                Op("aten::mul", "op", parent=1, self_us=1.0)]
    def by_type(ops):
        table = {}
        for g in attribution.attribute(ops):
            table[g.type] = table.get(g.type, 0.0) + g.time_us
        return table
    assert by_type(mlp("LlamaMLP", "aten::silu")) == {"fused_mlp": 12.0}
    assert by_type(mlp("GPT2MLP", "aten::gelu")) == {"linear_gelu": 11.0, "other": 1.0}
    assert by_type(mlp("GPT2MLP", "aten::gelu", first="aten::add")) == {"other": 12.0}  # a GELU after no GEMM


def test_plan_uses_measured_speedups_when_there_are_some(tmp_path):
    prof = {"total_us": 100.0, "types": {
        "rmsnorm": {"time_us": 10.0, "share": 0.1, "calls": 1, "shapes": []},
        "matmul": {"time_us": 60.0, "share": 0.6, "calls": 1, "shapes": []}},
        "other": {"time_us": 30.0, "share": 0.3, "ops": {}}}
    starters = tmp_path / "starters.json"
    starters.write_text(json.dumps({"matmul": {"speedup_vs_pytorch": 1.25}}))
    the_plan = plan.build_plan(prof, plan.load_speedups(starters), source=str(starters))
    first, second = the_plan["entries"]
    assert (first["type"], first["s"], first["s_source"].startswith("measured")) == ("matmul", 1.25, True)
    assert (second["type"], second["s"], second["s_source"]) == ("rmsnorm", plan.default_speedup("rmsnorm"),
                                                                 "default")
    assert first["gain"] == pytest.approx(1 / (0.4 + 0.6 / 1.25))
    assert the_plan["amdahl_ceiling"] == pytest.approx(1 / 0.3)
    assert the_plan["combined_gain"] == pytest.approx(1 / (0.3 + 0.6 / 1.25 + 0.1 / 2.0))
    assert math.isclose(plan.amdahl_gain(0.5, 2.0), 4 / 3)


def test_a_compiled_deploy_plan_ranks_the_types_by_their_time_under_torch_compile(tmp_path):
    """profile.py --deploy compile_graph (issue 35): each type's time is the compiled forward's regions it covers and
    its s the starter over the reference compiled; a type the compiled kernels beat ranks after the ones that gain,
    by its time there, however much it gains eagerly."""
    region = lambda name, t, us: {"name": name, "type": t, "time_us": us, "calls": 2.0}  # noqa: E731
    prof = {"total_us": 200.0, "types": {
        "rmsnorm": {"time_us": 50.0, "share": 0.25, "calls": 4, "shapes": [{"shape": {"rows": 64}}]},
        "fused_mlp": {"time_us": 100.0, "share": 0.5, "calls": 2, "shapes": []},
        "matmul": {"time_us": 20.0, "share": 0.1, "calls": 2, "shapes": []},
        "softmax": {"time_us": 1.0, "share": 0.005, "calls": 2, "shapes": []}},
        "other": {"time_us": 30.0, "share": 0.15, "ops": {}},
        "regions": {"total_us": 100.0, "regions": [
            region("triton_red_fused_mean_pow_rsqrt_0", "rmsnorm", 5.0), region("extern aten::mm a", "fused_mlp", 40.0),
            region("triton_poi_fused_mul_silu_1", "fused_mlp", 6.0), region("extern aten::mm b", "matmul", 20.0),
            region("triton_poi_fused_cat_2", None, 29.0)]}}
    starters = tmp_path / "starters.json"
    starters.write_text(json.dumps({"rmsnorm": {"speedup_vs_pytorch": 12.5, "speedup_vs_compile": 0.99},
                                    "fused_mlp": {"speedup_vs_pytorch": 1.09, "speedup_vs_compile": 1.06}}))
    eager = plan.build_plan(prof, plan.load_speedups(starters), source=str(starters))
    assert [e["type"] for e in eager["entries"]][0] == "rmsnorm" and eager["deploy"] == "eager"
    compiled = plan.build_plan(prof, plan.load_speedups(starters, "compile_graph"), source=str(starters),
                               deploy="compile_graph")
    by_type = {e["type"]: e for e in compiled["entries"]}
    assert [e["type"] for e in compiled["entries"]] == ["fused_mlp", "matmul", "rmsnorm", "softmax"]
    assert by_type["softmax"]["f"] == 0.0  # Inductor fused it away: still in the plan, last
    assert by_type["fused_mlp"]["f"] == pytest.approx(0.46) and by_type["fused_mlp"]["s"] == 1.06
    assert by_type["rmsnorm"]["f"] == pytest.approx(0.05) and by_type["rmsnorm"]["gain"] < 1.0
    assert by_type["rmsnorm"]["shapes"] == [{"shape": {"rows": 64}}]  # extract makes its inputs from the eager ones
    assert by_type["rmsnorm"]["f_eager"] == 0.25 and "f_eager" not in eager["entries"][0]
    assert compiled["total_us"] == 100.0 and compiled["other"]["f"] == pytest.approx(0.29)  # 100 - 71 us typed
    assert compiled["other"]["ops"] == {"triton_poi_fused_cat_2": 29.0} and compiled["deploy"] == "compile_graph"
    with pytest.raises(plan.PlanError, match="under torch.compile"):
        plan.build_plan({**prof, "regions": None}, deploy="compile")


def test_a_plan_made_on_a_gpu_holds_each_types_roofline_for_its_calls(monkeypatch):
    """profile.py on a GPU (issue 35): each entry and rival gets floor_us, the roofline's time for the calls its
    shapes make in one forward, which the night's budget holds the model's time against; a region (no spec yet) or a
    shape the type's formulas cannot read gets none."""
    from autokernel.harness import gpu

    monkeypatch.setattr(gpu, "ceilings", lambda measure=False: gpu.Ceilings("test GPU", 3350, 989, 67, "datasheet"))
    norm = {"shape": {"M": 2048, "N": 2048}, "calls": 3}
    the_plan = {"entries": [{"type": "rmsnorm", "shapes": [norm]},
                            {"type": "region/fused_add_native_layer_norm_0_abc", "shapes": [norm]},
                            {"type": "rmsnorm", "shapes": [{"shape": {"rows": 64}, "calls": 1}]}],
                "rivals": [{"type": "rmsnorm", "shapes": [{**norm, "calls": 1}]}]}
    plan.add_floors(the_plan, torch.float16)
    one_call = (2 * 2048 * 2048 + 2048) * 2 / 3350e9 * 1e6  # read and write the rows, read the weight, at 3350 GB/s
    assert the_plan["entries"][0]["floor_us"] == pytest.approx(3 * one_call)
    assert the_plan["rivals"][0]["floor_us"] == pytest.approx(one_call)
    assert "floor_us" not in the_plan["entries"][1] and "floor_us" not in the_plan["entries"][2]
    assert the_plan["ceilings"] == {"source": "datasheet", "bandwidth_gb_s": 3350, "fp16_tflops": 989}


def test_a_plan_with_its_rooflines_ranks_the_types_by_what_a_night_could_save():
    """Issue 35: the night spends where share x distance to the roofline is largest, so extract.py's top N is taken by
    that room too. Qwen3-0.6B's plan (compiled, 1x2048, an H200): ranked by gain its top 4 held add_rmsnorm (1.9% of
    the forward, 1.6x from its roofline) and left out the matmul type (14.1%, s 0.96 against cuBLAS)."""
    qwen3 = [  # type, f, s, time_us, floor_us
        ("rope_attention", 0.388, 1.043, 3544.6, 602.8), ("linear_cross_entropy", 0.138, 1.104, 1264.8, 800.1),
        ("fused_mlp", 0.218, 1.064, 1996.1, 1356.3), ("add_rmsnorm", 0.019, 1.012, 176.8, 113.0),
        ("matmul", 0.141, 0.959, 1288.9, 904.2), ("rmsnorm", 0.018, 0.996, 166.7, 228.0)]
    entries = [{"type": t, "f": f, "s": s, "gain": plan.amdahl_gain(f, s), "time_us": us, "floor_us": floor}
               for t, f, s, us, floor in qwen3]
    entries.sort(key=plan._rank_key)
    for rank, e in enumerate(entries, start=1):
        e["rank"] = rank
    assert {e["type"] for e in entries[:4]} == {"rope_attention", "linear_cross_entropy", "fused_mlp", "add_rmsnorm"}
    the_plan = {"entries": entries}
    plan.rank_by_room(the_plan)
    ranked = [e["type"] for e in the_plan["entries"]]
    assert ranked == ["rope_attention", "fused_mlp", "matmul", "linear_cross_entropy", "add_rmsnorm", "rmsnorm"]
    assert [e["rank"] for e in the_plan["entries"]] == [1, 2, 3, 4, 5, 6]
    by_type = {e["type"]: e for e in the_plan["entries"]}
    assert by_type["matmul"]["room"] == pytest.approx(0.141 * (1 - 904.2 / 1288.9))  # s < 1: all of its time left
    assert by_type["rope_attention"]["room"] == pytest.approx(0.388 * (1 / 1.043 - 602.8 / 3544.6))
    assert by_type["rmsnorm"]["room"] == pytest.approx(0.018 * 0.05)  # past its roofline: the noise floor alone
    cpu = [{"type": t, "f": f, "s": s, "gain": plan.amdahl_gain(f, s), "time_us": us, "rank": i}
           for i, (t, f, s, us, _) in enumerate(qwen3, start=1)]
    plan.rank_by_room({"entries": cpu})  # no floors (a plan profiled on the CPU): its ranking stands
    assert [e["rank"] for e in cpu] == [1, 2, 3, 4, 5, 6] and not any("room" in e for e in cpu)


def test_the_plans_roofline_is_the_gpus_measured_one_and_the_datasheets_when_the_model_leaves_no_room(monkeypatch):
    """add_floors asks for the measured ceilings (a large copy and matmul, cached for the harness): an H100's
    datasheet rate put fused_mlp at 66% of a roofline no GEMM reaches. Out of memory there, the datasheet's."""
    from autokernel.harness import gpu

    measured = gpu.Ceilings("test GPU", 3000, 750, 67, "measured")
    datasheet = gpu.Ceilings("test GPU", 3350, 989, 67, "datasheet")
    asked = []

    def ceilings(measure=False):
        asked.append(measure)
        return measured if measure else datasheet
    monkeypatch.setattr(gpu, "ceilings", ceilings)
    mlp = {"shape": {"T": 2048, "H": 2048, "I": 5632}, "calls": 22}
    the_plan = {"entries": [{"type": "fused_mlp", "shapes": [mlp]}]}
    plan.add_floors(the_plan, torch.float16)
    flops = 3 * 2 * 2048 * 2048 * 5632
    assert asked == [True] and the_plan["ceilings"]["source"] == "measured"
    assert the_plan["entries"][0]["floor_us"] == pytest.approx(22 * flops / 750e12 * 1e6)

    def out_of_memory(measure=False):
        if measure:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return datasheet
    monkeypatch.setattr(gpu, "ceilings", out_of_memory)
    plan.add_floors(the_plan, torch.float16)
    assert the_plan["ceilings"]["source"] == "datasheet"
    assert the_plan["entries"][0]["floor_us"] == pytest.approx(22 * flops / 989e12 * 1e6)


def _run(repo_root, *args, cwd=None):
    return subprocess.run([sys.executable, *args], cwd=cwd or repo_root, capture_output=True, text=True,
                          timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


@pytest.mark.slow
def test_profile_cli_writes_profile_and_plan(repo_root, tmp_path):
    r = _run(repo_root, "profile.py", "--model", "models/bert.py", "--class-name", "BertModel", "--config", "tiny",
             "--input-shape", "2,32", "--dtype", "float32", "--device", "cpu", "--output-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "CPU mode" in r.stdout and "Amdahl ceiling" in r.stdout
    caveat = next(line for line in r.stdout.splitlines() if line.startswith("CPU mode: each share f"))
    assert "speedups s measured on a GPU" in caveat and "applied to these CPU shares" in caveat
    the_plan = json.loads((tmp_path / "plan.json").read_text())
    assert the_plan["cpu_mode"] and the_plan["input_shape"] == [2, 32] and the_plan["entries"]
    assert set(json.loads((tmp_path / "profile.json").read_text())["types"]) == {e["type"] for e in
                                                                                 the_plan["entries"]}


@pytest.mark.parametrize("args,message", [
    (["--model", "models/nope.py", "--class-name", "X"], "model file not found: models/nope.py"),
    (["--model", "models/llama.py", "--class-name", "Llama"], "no class 'Llama'"),
    (["--model", "models/llama.py", "--class-name", "LlamaModel", "--input-shape", "1,abc"], "bad input shape"),
    (["--model", "models/llama.py", "--class-name", "LlamaModel", "--dtype", "float8"], "unknown dtype 'float8'"),
    pytest.param(["--model", "models/llama.py", "--class-name", "LlamaModel", "--config", "tiny", "--input-shape",
                  "1,9999"], "at most 512", marks=pytest.mark.slow),  # builds the model first
    pytest.param(["--module", "not_a_package", "--class-name", "AutoModel"], "cannot import not_a_package",
                 marks=pytest.mark.slow),  # looks through the installed packages
])
def test_profile_cli_bad_input_is_one_clear_line(repo_root, tmp_path, args, message):
    r = _run(repo_root, "profile.py", *args, "--device", "cpu", "--output-dir", str(tmp_path))
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


SHADOW_CHECKS = {
    "cprofile": "import cProfile, pstats, io; p = cProfile.Profile(); p.runcall(sum, [1, 2]); "
                "pstats.Stats(p, stream=io.StringIO()); cProfile.run('1')",
    "stdlib_api": "import profile, sysconfig; assert profile.__file__.startswith(sysconfig.get_paths()['stdlib']); "
                  "profile.Profile; profile.run('1')",
    "torch_compile": "import torch; f = torch.compile(lambda x: x * 2 + 1, backend='eager'); "
                     "assert f(torch.ones(3)).tolist() == [3.0, 3.0, 3.0]",
}


@pytest.mark.parametrize("check", [pytest.param(c, marks=pytest.mark.slow) if c == "torch_compile" else c
                                   for c in SHADOW_CHECKS])
def test_profile_py_does_not_break_the_stdlib_profile_module(repo_root, check):
    r = _run(repo_root, "-c", SHADOW_CHECKS[check])  # from the repository root, where profile.py shadows
    assert r.returncode == 0, r.stderr


def test_cprofile_can_profile_a_script_in_the_repo_root(repo_root):
    r = _run(repo_root, "-m", "cProfile", "-s", "cumtime", "extract.py", "--help")
    assert r.returncode == 0 and "function calls" in r.stdout, r.stderr


def test_device_time_counts_kernels_not_the_shadows_of_profiler_ranges():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from autokernel.profile.profiling import device_time_us

    def event(name, us, device=DeviceType.CUDA, annotation=False):
        return SimpleNamespace(name=name, device_type=device, is_user_annotation=annotation,
                               time_range=SimpleNamespace(elapsed_us=lambda: us))

    events = [
        event("aten::mm", 500.0, device=DeviceType.CPU),
        event("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", 30.0),
        event("triton_red_fused_mean_pow_0", 5.0),
        event("Memcpy HtoD (Pageable -> Device)", 2.0),
        event("ProfilerStep#3", 1600.0),
        event("autokernel.module#12", 400.0),
        event("LlamaAttention", 300.0, annotation=True),
    ]
    assert device_time_us(events) == 37.0


@pytest.mark.slow
def test_a_huggingface_llama_is_profiled_by_module_and_function(repo_root, tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=256).save_pretrained(tmp_path / "cfg")
    args = ("profile.py", "--module", "transformers", "--class-name", "AutoModelForCausalLM", "--config",
            str(tmp_path / "cfg"), "--input-shape", "1,32", "--dtype", "float32", "--device", "cpu", "--output-dir",
            str(tmp_path))
    r = _run(repo_root, *args)
    assert r.returncode == 0, r.stderr
    found = {e["type"] for e in json.loads((tmp_path / "plan.json").read_text())["entries"]}
    # by default what optimize() swaps in: LlamaAttention's RoPE, repeat_kv and SDPA as one rope_attention call;
    # LlamaRotaryEmbedding, which computes the tables and rotates nothing, is other's time
    assert {"rmsnorm", "fused_mlp", "rope_attention"} <= found and not {"flash_attention", "rotary_embedding"} & found
    # whose time it takes, as the types without it have it (verify's prune may put them in its place): its rivals
    rivals = json.loads((tmp_path / "plan.json").read_text())["rivals"]
    assert {v["type"] for v in rivals} == {"flash_attention", "rotary_embedding"}
    assert "rivals of rope_attention" in r.stdout
    assert all(v["rival_of"] == ["rope_attention"] and v["f"] > 0 and v["shapes"] for v in rivals)
    x = _run(repo_root, "extract.py", "--plan", str(tmp_path / "plan.json"), "--top", "1", "--output-dir",
             str(tmp_path / "k"))
    assert x.returncode == 0, x.stderr
    assert {p.name.split("_", 1)[1] for p in (tmp_path / "k").glob("*.py")} == {
        "rope_attention.py", "flash_attention.py", "rotary_embedding.py"}  # the night works on all three
    other = json.loads((tmp_path / "plan.json").read_text())["other"]
    assert "LlamaRotaryEmbedding" in json.dumps(other)
    r = _run(repo_root, *args, "--types", "rotary_embedding")  # the opt-in types chosen: none of rope_attention
    assert r.returncode == 0, r.stderr
    found = {e["type"] for e in json.loads((tmp_path / "plan.json").read_text())["entries"]}
    # LlamaRMSNorm (a module), apply_rotary_pos_emb (a function), the SwiGLU LlamaMLP, SDPA attention
    assert {"rmsnorm", "rotary_embedding", "fused_mlp", "flash_attention"} <= found
    rotary = json.loads((tmp_path / "profile.json").read_text())["types"]["rotary_embedding"]["shapes"]
    assert sorted((tuple(s["shape"].values()), s["calls"]) for s in rotary) == [((1, 2, 32, 16), 2),
                                                                               ((1, 4, 32, 16), 2)]  # k, q


# ------------------------------------------------------------------------------ rotary shapes, HF style
def rotate_half(x):
    """As transformers' modeling_llama writes it."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class GQAAttention(torch.nn.Module):
    """transformers' LlamaAttention, reduced: q with HEADS heads, k and v with KV_HEADS, RoPE on both."""

    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = torch.nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k_proj = torch.nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = torch.nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class GQAModel(torch.nn.Module):
    def __init__(self, dim=64, heads=4, kv_heads=2, layers=3):
        super().__init__()
        self.layers = torch.nn.ModuleList(GQAAttention(dim, heads, kv_heads) for _ in range(layers))
        self.head_dim = dim // heads

    def forward(self, x):
        angles = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * torch.ones(self.head_dim)
        cos, sin = angles.cos()[None], angles.sin()[None]  # [batch, seq, head_dim], as HF's rotary module gives
        for layer in self.layers:
            x = x + layer(x, cos, sin)
        return x


def test_hf_style_rotary_reads_the_q_and_k_shapes_with_their_call_counts():
    prof = profile_model(GQAModel().eval(), (torch.randn(1, 32, 64),), "cpu")
    rotary = prof["types"]["rotary_embedding"]
    found = sorted((tuple(s["shape"].values()), s["calls"]) for s in rotary["shapes"])
    assert found == [((1, 2, 32, 16), 3), ((1, 4, 32, 16), 3)]  # k: 2 KV heads, q: 4 heads; full head_dim
    assert rotary["calls"] == 6


def test_rotary_shape_is_the_whole_tensor_when_only_its_halves_take_time():
    # models/llama.py's apply_rotary on a GPU: the slices are views (no kernel, no time); the muls that
    # take time see the halves and a [seq, head_dim / 2] table, the slices see the whole x
    x, half, table = [2, 4, 64, 32], [2, 4, 64, 16], [64, 16]
    ops = [Op("autokernel.step", "step"),
           Op("llama.py(92): apply_rotary", "python", parent=0),
           Op("aten::slice", "op", parent=1, shapes=[x, [], [], [], []]),
           Op("aten::slice", "op", parent=1, shapes=[x, [], [], [], []]),
           Op("aten::mul", "op", parent=1, self_us=2.0, shapes=[half, table]),
           Op("aten::mul", "op", parent=1, self_us=2.0, shapes=[half, table]),
           Op("aten::cat", "op", parent=1, self_us=3.0, shapes=[[half, half], []])]
    groups = attribution.attribute(ops)
    assert [attribution.group_shape(g, ops) for g in groups] == [{"B": 2, "H": 4, "S": 64, "D": 32}]
    assert groups[0].time_us == 7.0


def test_the_opt_in_types_are_those_optimize_would_place_in_the_model(repo_root):
    """rope_attention's rule applies where its sites' probes pass (an HF Llama's attention, a Qwen3's with its
    per-head q/k norms), not in the shipped LlamaModel (its attention is no HF module) nor in an OLMo2 (q and k
    normalized whole before RoPE: the probe fails); the probe leaves the installed kernels as it found them."""
    transformers = pytest.importorskip("transformers")
    from autokernel.models import load_model
    from autokernel.ops import customops
    from autokernel.profile.deployed import opt_in_types

    before = customops.installed(["rope_attention"]) if customops.is_installed("rope_attention") else None
    hf = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=128)
    torch.manual_seed(0)
    assert opt_in_types(transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf)).eval()) == ["rope_attention"]
    assert opt_in_types(transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**hf, head_dim=16)).eval()) == [
        "rope_attention"]
    assert opt_in_types(transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**hf)).eval()) == []
    shipped = load_model("LlamaModel", model_file=str(repo_root / "models" / "llama.py"), config="tiny",
                         device="cpu", dtype=torch.float32)
    assert opt_in_types(shipped) == []
    after = customops.installed(["rope_attention"]) if customops.is_installed("rope_attention") else None
    assert after == before  # what the probes stood in for is gone, what was installed before is back


@pytest.mark.slow(25)
def test_the_default_plan_holds_the_types_optimize_swaps_into_the_model(repo_root, tmp_path):
    """What the night works on is what deploy puts in (issue 35): the plan of the shipped LLaMA and of an HF Llama
    config holds exactly the types optimize() swaps into that model, the fused and opt-in ones included."""
    transformers = pytest.importorskip("transformers")
    from autokernel.verify.deploy import optimize

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128)
    config.save_pretrained(tmp_path / "hf")
    phi3 = transformers.Phi3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, pad_token_id=0, bos_token_id=0,
                                   eos_token_id=0, partial_rotary_factor=0.5)
    phi3.save_pretrained(tmp_path / "phi3")  # qkv_proj and gate_up_proj: one Linear each
    torch.manual_seed(0)
    hf, hf_phi3 = (transformers.AutoModelForCausalLM.from_config(c).eval() for c in (config, phi3))
    shipped = load_model("LlamaModel", model_file=str(repo_root / "models" / "llama.py"), config="tiny")
    hf_args = ["--module", "transformers", "--class-name", "AutoModelForCausalLM", "--config"]
    cases = [(hf, [*hf_args, str(tmp_path / "hf")], (1, 32)), (hf_phi3, [*hf_args, str(tmp_path / "phi3")], (1, 32)),
             (shipped, ["--model", "models/llama.py", "--class-name", "LlamaModel", "--config", "tiny"], (1, 64))]
    for model, args, shape in cases:
        r = _run(repo_root, "profile.py", *args, "--input-shape", ",".join(map(str, shape)), "--device", "cpu",
                 "--dtype", "float32", "--output-dir", str(tmp_path / "out"))
        assert r.returncode == 0, r.stderr
        entries = json.loads((tmp_path / "out" / "plan.json").read_text())["entries"]
        planned = sorted(e["type"] for e in entries)
        optimized = optimize(model, verified=None, quiet=True)
        with torch.no_grad():
            optimized(torch.randint(0, 100, shape))
        assert planned == sorted(optimized.autokernel.swapped_types())
        assert {"add_rmsnorm", "rope_attention", "fused_mlp"} <= set(planned) or model is shipped
        if model is hf_phi3:  # gate_up_proj's 2I outputs run in the kernel as two projections of I
            assert next(e for e in entries if e["type"] == "fused_mlp")["shapes"][0]["shape"]["I"] == 96


@pytest.mark.slow(10)
def test_profile_deploy_compile_ranks_an_hf_llama_by_its_compiled_forward(repo_root, tmp_path):
    """The plan of `profile.py --deploy compile --with-loss`: the compiled forward's time, shared among the types as
    deploy places them (the MLP's GEMMs fused_mlp's, the head and its loss linear_cross_entropy's), the rest other."""
    transformers = pytest.importorskip("transformers")
    transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=128).save_pretrained(tmp_path / "hf")
    r = _run(repo_root, "profile.py", "--module", "transformers", "--class-name", "AutoModelForCausalLM", "--config",
             str(tmp_path / "hf"), "--input-shape", "1,64", "--device", "cpu", "--dtype", "float32", "--deploy",
             "compile", "--with-loss", "--output-dir", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "under torch.compile (--deploy compile)" in r.stdout and "eager f" in r.stdout
    the_plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    found = json.loads((tmp_path / "out" / "profile.json").read_text())["regions"]
    assert the_plan["deploy"] == "compile" and the_plan["total_us"] == pytest.approx(found["total_us"])
    mlp = next(e for e in the_plan["entries"] if e["type"] == "fused_mlp")  # its GEMMs and its silu * up
    assert mlp["time_us"] == pytest.approx(sum(x["time_us"] for x in found["regions"] if x["type"] == "fused_mlp"))
    assert sum(1 for x in found["regions"] if x["type"] == "fused_mlp" and x["kind"] == "extern") >= 2
    head = next(e for e in the_plan["entries"] if e["type"] == "linear_cross_entropy")  # the loss compiled too
    assert head["f"] > 0 and any(x["type"] == "linear_cross_entropy" and x["kind"] == "fused" for x in found["regions"])
    assert sum(e["f"] for e in the_plan["entries"]) + the_plan["other"]["f"] == pytest.approx(1.0, abs=1e-6)
    # rope_attention's rivals: the compiled attention is flash_attention's without it, timed as its region is
    rival = next(r for r in the_plan["rivals"] if r["type"] == "flash_attention")
    sdpa = [x for x in found["regions"] if x.get("rival") == "flash_attention"]
    assert rival["rival_of"] == ["rope_attention"] and sdpa and all(x["type"] == "rope_attention" for x in sdpa)
    assert rival["time_us"] == pytest.approx(sum(x["time_us"] for x in sdpa)) and rival["shapes"]
    bad = _run(repo_root, "profile.py", "--model", "models/llama.py", "--class-name", "LlamaModel", "--deploy", "jit")
    assert bad.returncode == 2 and "invalid choice: 'jit'" in bad.stderr

