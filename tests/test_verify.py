"""verify.py end to end on the CPU: the shipped models with every starter plugged in, a planted bug
caught and named, the torch.compile path without graph breaks, and the site decisions of swap.py.

Kernels run through Triton's interpreter, so the models are the tiny presets on a few tokens.
"""

import json
import re
import shutil
from types import SimpleNamespace as types_ns

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import SharedForward, import_file, summary_values

import verify
from autokernel import compat
from autokernel.loop import report as loop_report
from autokernel.ops import customops, swap
from autokernel.types import rmsnorm
from autokernel.verify import deploy, endtoend, paired, pruning, verification

MODELS = {  # model file -> (class, input shape, the kernel types that must have run in it)
    "llama": ("LlamaModel", "1,8", {"matmul", "rmsnorm", "fused_mlp", "rotary_embedding", "flash_attention",
                                    "cross_entropy"}),
    "gpt2": ("GPT2Model", "1,8", {"matmul", "layernorm", "flash_attention", "cross_entropy", "linear_gelu"}),
    "bert": ("BertModel", "1,8", {"matmul", "layernorm", "flash_attention"}),
    "custom": ("CustomModel", "2,64", {"matmul", "layernorm", "softmax"}),
}


def run_verify(repo_root, tmp_path, capsys, model, *extra, device="cpu"):
    cls, shape, _ = MODELS[model]
    out = tmp_path / "report.json"
    argv = ["--model", str(repo_root / "models" / f"{model}.py"), "--class-name", cls, "--config", "tiny",
            "--input-shape", shape, "--device", device, "--checks", "1", "--report", str(out), *extra]
    code = verify.main(argv)
    printed = capsys.readouterr()
    report = json.loads(out.read_text()) if out.exists() else None
    return code, report, printed


@pytest.mark.parametrize("model", list(MODELS))
def test_every_shipped_model_verifies_with_all_starters(repo_root, tmp_path, capsys, interpreter, model):
    empty = tmp_path / "no_kernels"
    empty.mkdir()
    code, report, printed = run_verify(repo_root, tmp_path, capsys, model, "--kernels", str(empty), "--no-timing")
    assert code == 0, printed.out + printed.err
    assert report["correctness"]["status"] == "PASS"
    assert report["correctness"]["worst_rel_l2"] < swap.REL_L2_TOLERANCE[torch.float16]
    assert {k["source"] for k in report["kernels"].values()} == {"starter"}
    assert MODELS[model][2] <= set(report["swapped_types"])
    assert summary_values(printed.out)["correctness"] == "PASS"


@pytest.mark.gpu
@pytest.mark.parametrize("model", list(MODELS))
def test_every_shipped_model_verifies_and_compiles_whole_on_the_gpu(repo_root, tmp_path, capsys, model):
    # --keep-all: every starter stays in (on a tiny model the prune would leave most out, as launch-bound)
    code, report, printed = run_verify(repo_root, tmp_path, capsys, model, "--kernels", str(tmp_path), "--compile",
                                       "--keep-all", device="cuda")
    assert code == 0, printed.out + printed.err
    assert MODELS[model][2] <= set(report["swapped_types"])
    assert report["graph"]["graph_breaks"] == 0 and not report["cpu_mode"]
    assert set(report["timing"]) == {"eager", "compile", "optimized", "optimized_compile"}


def test_a_wrong_kernel_is_caught_and_named(repo_root, tmp_path, capsys, interpreter):
    source = (repo_root / "kernels" / "rmsnorm.py").read_text()
    correct = "rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)"
    assert correct in source, "the planted bug no longer fits the starter"
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    # 5% too large: every kernel-level check would catch it, and so must the end-to-end one
    (kernels / "01_rmsnorm_optimized.py").write_text(source.replace(correct, correct + " * 1.05"))
    shutil.copy(repo_root / "kernels" / "matmul.py", kernels / "02_matmul.py")
    code, report, printed = run_verify(repo_root, tmp_path, capsys, "llama", "--kernels", str(kernels),
                                       "--types", "rmsnorm,matmul,rotary_embedding")
    assert code == 1, printed.out + printed.err
    c = report["correctness"]
    assert c["status"] == "FAIL" and c["blamed"] == ["rmsnorm"]
    assert c["blame"]["matmul"]["ok"] and c["blame"]["rotary_embedding"]["ok"]
    assert report["kernels"]["rmsnorm"]["source"] == "optimized"
    assert report["kernels"]["matmul"]["source"] == "extracted"
    assert report["timing"] == {}  # a wrong model is not timed
    assert summary_values(printed.out)["blamed"] == "rmsnorm"


@pytest.mark.slow(16)
def test_compile_path_times_all_four_and_has_no_graph_breaks(repo_root, tmp_path, capsys, interpreter):
    code, report, printed = run_verify(repo_root, tmp_path, capsys, "llama", "--compile",
                                       "--kernels", str(tmp_path))
    assert code == 0, printed.out + printed.err
    assert report["graph"]["graph_breaks"] == 0 and report["graph"]["graphs"] == 1
    assert set(report["timing"]) == {"eager", "compile", "optimized", "optimized_compile"}
    assert all(t["ms"] > 0 for t in report["timing"].values())
    assert report["cpu_mode"] and summary_values(printed.out)["cpu_mode"] == "True"
    assert "(CPU, Triton interpreter: NOT performance figures)" in verify._timing_table(report).title  # as printed
    steps = ["loading the model and placing the kernels", "checking the outputs on 1 input",
             "timing the original and the optimized model in turns", "counting torch.compile's graph breaks"]
    assert list(report["steps_s"])[:4] == steps and all(report["steps_s"][s] > 0 for s in steps)
    said = [line.split("] ", 1)[1] for line in printed.out.splitlines() if re.match(r"\[\d+m\d\ds\] ", line)]
    assert said[:4] == steps  # each step named as it begins, with the time spent so far


def test_bad_input_is_one_clear_error(repo_root, tmp_path, capsys, interpreter):
    code, _, printed = run_verify(repo_root, tmp_path, capsys, "llama", "--types", "rmsnorm,bogus")
    assert code == 2 and "bogus" in printed.err and "Traceback" not in printed.err
    code = verify.main(["--model", str(tmp_path / "nope.py"), "--class-name", "X", "--device", "cpu",
                        "--report", str(tmp_path / "verify.json")])
    assert code == 2 and "model file not found" in capsys.readouterr().err


def extracted_for(repo_root, directory, type_, rank, plan) -> str:
    """A starter extracted by extract.py from `plan` (its MODEL_SOURCE names the plan's model)."""
    from autokernel.profile.extraction import extract

    (found,) = extract({**plan, "entries": [{"type": type_, "rank": rank, "shapes": []}]}, 1, "triton", directory,
                       repo_root)
    return found.path.name


def test_kernels_extracted_for_another_model_are_warned_about_one_line_each(repo_root, tmp_path, capsys,
                                                                             interpreter):
    kernels = tmp_path / "kernels"
    llama = {"source": "models/llama.py", "class_name": "LlamaModel", "config": "tiny", "input_shape": [1, 8],
             "dtype": "float16"}
    mine = extracted_for(repo_root, kernels, "rmsnorm", 1, llama)
    gpt2 = extracted_for(repo_root, kernels, "matmul", 2, {**llama, "source": "models/gpt2.py",
                                                          "class_name": "GPT2Model"})
    longer = extracted_for(repo_root, kernels, "rotary_embedding", 3, {**llama, "input_shape": [1, 2048]})
    code, report, printed = run_verify(repo_root, tmp_path, capsys, "llama", "--kernels", str(kernels),
                                       "--types", "rmsnorm,matmul,rotary_embedding", "--no-timing")
    assert code == 0, printed.out + printed.err
    warned = [line for line in printed.out.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 2 and report["origin_warnings"] == warned
    assert gpt2 in warned[0] and "extracted for models/gpt2.py:GPT2Model (config tiny), not for" in warned[0]
    assert longer in warned[1] and "at input 1,2048 fp16, verified at 1,8 fp16" in warned[1]
    assert not any(mine in line for line in warned)  # extracted for this model at this input: nothing to say


def test_a_file_without_model_source_is_checked_against_this_models_plan(repo_root, tmp_path):
    from autokernel.profile.extraction import model_origin, set_model_shapes

    plan = {"source": "models/llama.py", "class_name": "LlamaModel", "config": "tiny", "input_shape": [1, 8],
            "dtype": "float16", "entries": [{"type": "rmsnorm", "shapes": [{"shape": {"M": 8, "N": 128}}]}]}
    older = tmp_path / "01_rmsnorm.py"  # extracted before MODEL_SOURCE existed: its shapes are all it says
    starter = (repo_root / "kernels" / "rmsnorm.py").read_text()
    this_model = model_origin(plan)
    for shapes, warned in (([{"M": 2048, "N": 2048}], True), ([{"M": 8, "N": 128}, {"M": 1, "N": 128}], False)):
        older.write_text(set_model_shapes(starter, shapes))
        lines = endtoend.origin_warnings({"01_rmsnorm.py": older}, this_model, plan)
        assert len(lines) == warned and all("01_rmsnorm.py carries none of the shapes profiled" in x for x in lines)
    older.write_text(set_model_shapes(starter, [{"M": 2048, "N": 2048}]))
    other_plan = {**plan, "source": "models/gpt2.py", "class_name": "GPT2Model"}  # about another model: no yardstick
    assert endtoend.origin_warnings({"01_rmsnorm.py": older}, this_model, other_plan) == []
    assert endtoend.origin_warnings({"rmsnorm.py": repo_root / "kernels" / "rmsnorm.py"}, this_model, plan) == []


def test_the_best_kernel_of_each_type_is_chosen(repo_root, tmp_path):
    starter = (repo_root / "kernels" / "rmsnorm.py").read_text()
    for name in ("01_rmsnorm.py", "01_rmsnorm_optimized.py", "05_rmsnorm_optimized.py"):
        (tmp_path / name).write_text(starter)
    (tmp_path / "03_matmul.py").write_text((repo_root / "kernels" / "matmul.py").read_text())
    (tmp_path / "notes_softmax.py").write_text("x = 1\n")  # no KERNEL_TYPE: not a kernel
    chosen = customops.find_kernels(tmp_path, repo_root / "kernels", ["rmsnorm", "matmul", "softmax"],
                                    deploy.entries())
    assert chosen["rmsnorm"].path.name == "01_rmsnorm_optimized.py" and chosen["rmsnorm"].source == "optimized"
    assert {p.name for p in chosen["rmsnorm"].passed_over} == {"05_rmsnorm_optimized.py", "01_rmsnorm.py"}
    assert chosen["matmul"].source == "extracted"
    assert chosen["softmax"].source == "starter" and chosen["softmax"].path.parent == repo_root / "kernels"


class OffsetRMSNorm(nn.Module):  # (2 + w) * x_hat: named like an RMSNorm, neither LLaMA's nor Gemma's (1 + w)
    def __init__(self, n):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.zeros(n)), 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (2 + self.weight)


class GeluMLP(nn.Module):  # three Linears shaped like SwiGLU, but GELU
    def __init__(self, h, i):
        super().__init__()
        self.gate, self.up = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
        self.down = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down(F.gelu(self.gate(x)) * self.up(x))


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.mlp = OffsetRMSNorm(32), GeluMLP(32, 64)

    def forward(self, x):
        h = self.mlp(self.norm(x))
        q = h.view(1, 2, -1, 16)
        mask = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask) + F.scaled_dot_product_attention(q, q, q)


def test_sites_that_differ_from_the_reference_are_left_alone_with_the_reason(repo_root, interpreter):
    for t in ("rmsnorm", "fused_mlp", "flash_attention"):
        deploy.load_kernels(repo_root / "kernels", [t], repo_root / "kernels")
    toy = Toy().eval()
    optimized = swap.build(toy, ["rmsnorm", "fused_mlp", "flash_attention"])
    x = torch.randn(8, 32)
    with torch.no_grad():
        assert swap.rel_l2(optimized(x), toy(x)) < 1e-4
    sites = {s.what.split("(")[0]: s for s in optimized.sites()}
    assert not sites["OffsetRMSNorm"].swapped and "something else" in sites["OffsetRMSNorm"].reason
    assert not sites["GeluMLP"].swapped and "something else" in sites["GeluMLP"].reason
    sdpa = sites["F.scaled_dot_product_attention"]
    assert sdpa.calls == 1 and sdpa.fallbacks == 1 and "mask" in sdpa.reason
    assert F.scaled_dot_product_attention is customops.original(F, "scaled_dot_product_attention")


def test_a_norm_computed_inline_is_reported_unused_and_its_module_still_reads(repo_root, interpreter):
    llama = import_file(repo_root / "models" / "llama.py", "llama_for_verify")
    model = llama.LlamaModel("tiny", rmsnorm_as_ops=True).eval()  # blocks read norm.weight, norm.eps inline
    deploy.load_kernels(repo_root / "kernels", ["rmsnorm"], repo_root / "kernels")
    optimized = swap.build(model, ["rmsnorm"])
    assert type(model.norm) is llama.RMSNorm and type(optimized.model.norm) is rmsnorm.KernelRMSNorm  # a copy
    assert optimized.model.norm.weight is model.norm.weight  # over the same weights
    ids = torch.randint(0, model.config.vocab_size, (1, 8))
    with torch.no_grad():
        assert swap.rel_l2(optimized(ids), model(ids)) < swap.REL_L2_TOLERANCE[torch.float32]
    calls = {s.where: s.calls for s in optimized.sites()}
    assert calls["norm"] == 1 and calls["layers.0.attn_norm"] == 0 and calls["layers.1.mlp_norm"] == 0


def test_a_kernel_that_raises_is_a_fail_naming_it(repo_root, tmp_path, capsys, interpreter):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    source = (repo_root / "kernels" / "softmax.py").read_text()
    planted = source.replace("def kernel_fn(x):\n", "def kernel_fn(x):\n    raise IndexError('planted')\n")
    assert planted != source
    (kernels / "softmax_optimized.py").write_text(planted)
    code, report, printed = run_verify(repo_root, tmp_path, capsys, "custom", "--kernels", str(kernels),
                                       "--types", "softmax")
    assert code == 1, printed.out + printed.err
    assert report["correctness"]["blamed"] == ["softmax"]
    assert "softmax_optimized.py" in report["correctness"]["reason"] and "planted" in report["correctness"]["reason"]
    # the patches are undone
    assert F.softmax is customops.original(F, "softmax") and torch.softmax is customops.original(torch, "softmax")


def test_a_kernel_asked_for_a_gradient_is_an_error_not_a_silent_zero(repo_root, interpreter):
    deploy.load_kernels(repo_root / "kernels", ["rmsnorm"], repo_root / "kernels")
    call = customops.op("rmsnorm")
    x, w = torch.randn(4, 64), torch.rand(64) + 0.5
    with torch.no_grad():  # the kernel itself, no dispatch
        assert swap.rel_l2(call(x, w, 1e-6), F.rms_norm(x, (64,), w, 1e-6)) < swap.REL_L2_TOLERANCE[torch.float32]
    x.requires_grad_()  # through the op, which has no backward
    with pytest.raises(RuntimeError, match="no autograd formula"):
        call(x, w, 1e-6).sum().backward()


class Functional(nn.Module):  # norms and softmax written as torch functions, some in forms the kernels do not take
    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(32)), nn.Parameter(torch.randn(32))

    def forward(self, x):
        norms = F.rms_norm(x, (32,), self.w, 1e-5) + F.layer_norm(x, (32,), self.w, self.b) + F.layer_norm(x, (32,))
        whole = F.layer_norm(x, (8, 32))  # over two dims: left alone
        return norms + whole + torch.softmax(x, dim=0) + F.softmax(x, -1, dtype=torch.float32)


def test_functional_forms_are_swapped_where_they_fit(repo_root, interpreter):
    for t in ("rmsnorm", "layernorm", "softmax"):
        deploy.load_kernels(repo_root / "kernels", [t], repo_root / "kernels")
    model, x = Functional(), torch.randn(8, 32)
    optimized = swap.build(model, ["rmsnorm", "layernorm", "softmax"])
    with torch.no_grad():
        assert swap.rel_l2(optimized(x), model(x)) < swap.REL_L2_TOLERANCE[torch.float32]
    calls = {}
    for s in optimized.sites():
        calls.setdefault(s.what, []).append((s.calls, s.fallbacks))
    assert sorted(calls["F.layer_norm"]) == [(0, 1), (2, 0)] and calls["F.rms_norm"] == [(1, 0)]
    assert calls["torch.softmax"] == [(0, 1)] and calls["F.softmax"] == [(1, 0)]


def test_a_huggingface_llama_verifies_with_the_starters(tmp_path, capsys, interpreter):
    transformers = pytest.importorskip("transformers")
    transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=256).save_pretrained(tmp_path / "cfg")
    out = tmp_path / "report.json"
    code = verify.main(["--module", "transformers", "--class-name", "AutoModelForCausalLM", "--config",
                        str(tmp_path / "cfg"), "--input-shape", "1,16", "--device", "cpu", "--checks", "1",
                        "--no-timing", "--report", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    report = json.loads(out.read_text())
    assert {"rmsnorm", "matmul", "fused_mlp"} <= set(report["swapped_types"])


class Candidate:  # a stand-in for swap.Optimized whose end-to-end time is made up from its types
    COST_MS = {"rmsnorm": -2.0, "matmul": +1.5, "rotary_embedding": -0.5, "fused_mlp": +0.05}  # vs PyTorch

    def __init__(self, types):
        self.types = list(types)

    def swapped_types(self):
        return list(self.types)

    def module(self):
        return self


def fake_time_fn(candidate, sets, device, keep_outputs=False, latency=False):
    from autokernel.harness import timing

    ms = 10.0 + sum(Candidate.COST_MS[t] for t in candidate.types)
    return timing.Timing(ms * 1e3, [ms * 1e3])


def fake_time_turns(fns, sets, device, turns, latency=False):
    return {name: fake_time_fn(fn, sets, device).samples_us * turns for name, fn in fns.items()}


def test_prune_leaves_out_only_the_types_the_model_is_faster_without(monkeypatch):
    """The greedy prune on made-up end-to-end times: a kernel that costs time goes, the others stay."""
    from autokernel.harness import timing

    monkeypatch.setattr(swap, "build", lambda model, types: Candidate(types))
    monkeypatch.setattr(timing, "time_fn", fake_time_fn)
    monkeypatch.setattr(timing, "time_turns", fake_time_turns)
    monkeypatch.setattr(endtoend, "wrong_output", lambda fn, model, args: None)  # made-up models, right by fiat
    lines = []
    optimized, dropped = pruning.prune(Candidate([]), Candidate(Candidate.COST_MS), lambda seed: (), "cuda",
                                        progress=lines.append)
    # fused_mlp costs 0.05 ms of ~7.5: under the 1% margin, so it stays (noise is not a reason)
    assert optimized.types == ["rmsnorm", "rotary_embedding", "fused_mlp"]
    assert list(dropped) == ["matmul"] and "faster without it in eager mode" in dropped["matmul"]
    assert [line.split(": ")[1].split()[:2] for line in lines[:-1]] == [  # each verdict said as it falls
        ["rmsnorm", "kept"], ["matmul", "left"], ["rotary_embedding", "kept"], ["fused_mlp", "kept"]]
    assert "kept: the model is not faster without it (eager 11.050 ms without, 9.050 with (1.221x" in lines[0]
    assert lines[-1].startswith("prune (eager): rmsnorm, rotary_embedding, fused_mlp kept: together not slower")


def test_every_trial_is_timed_in_turns_with_the_model_it_would_replace(monkeypatch):
    """A host whose separate timings jump (a compiled Qwen2 without graphs read 15.3 and 7.9 ms in two windows a
    second apart; the first timing of a prune 19-33% slower than the next) decides nothing: no model is timed
    alone, each trial runs in turns with the set it would replace, and the kernel that helps stays, the one
    that costs goes, however the host jumps between pairs."""
    from autokernel.harness import timing

    monkeypatch.setattr(swap, "build", lambda model, types: Candidate(types))
    monkeypatch.setattr(timing, "time_fn", lambda *a, **kw: pytest.fail("a model was timed alone"))
    turns = []

    def jumping_time_turns(fns, sets, device, n, latency=False):  # each pair on a host 1.5x slower than the last
        turns.append(sorted(fn.types for fn in fns.values()))
        return {name: [us * 1.5 ** len(turns) for us in samples]
                for name, samples in fake_time_turns(fns, sets, device, n).items()}

    monkeypatch.setattr(timing, "time_turns", jumping_time_turns)
    monkeypatch.setattr(endtoend, "wrong_output", lambda fn, model, args: None)
    optimized, dropped = pruning.prune(Candidate([]), Candidate(["rmsnorm", "matmul"]), lambda seed: (), "cuda")
    assert optimized.types == ["rmsnorm"] and list(dropped) == ["matmul"]
    pairs = [t for i, t in enumerate(turns) if i % 2]  # each pair's probe turn first, then its timed turns
    assert pairs == [[["matmul"], ["rmsnorm", "matmul"]], [["rmsnorm"], ["rmsnorm", "matmul"]], [[], ["rmsnorm"]]]


def test_kernels_that_each_lean_out_inside_the_noise_are_tried_out_together(monkeypatch):
    """Two kernels each 0.8% slower than PyTorch (under the margin: neither trial drops one) make the model 1.6%
    slower together: the joint trial of those that leaned out sends both away, and says so."""
    from autokernel.harness import timing

    monkeypatch.setattr(swap, "build", lambda model, types: Candidate(types))

    def fair_time_turns(fns, sets, device, n, latency=False):
        return {name: [(10.0 + 0.08 * len(fn.types)) * 1e3] * n for name, fn in fns.items()}

    monkeypatch.setattr(timing, "time_turns", fair_time_turns)
    monkeypatch.setattr(endtoend, "wrong_output", lambda fn, model, args: None)
    lines, decisions = [], {}
    optimized, dropped = pruning.prune(Candidate([]), Candidate(["rmsnorm", "matmul"]), lambda seed: (), "cuda",
                                       progress=lines.append, decisions=decisions)
    assert [line.split(": ")[1].split()[:2] for line in lines[:2]] == [["rmsnorm", "kept"], ["matmul", "kept"]]
    assert lines[-1].startswith("prune (eager): rmsnorm, matmul left out together: the model is faster without")
    assert optimized.types == [] and dropped["matmul"].startswith("left out with rmsnorm: the model is faster")
    shown = verification.decision_lines({"eager": decisions})
    assert "decided in eager: rmsnorm left out with the others of rmsnorm+matmul, not alone" in shown[0]
    assert shown[2].startswith("decided in eager: rmsnorm+matmul left out: eager 10.000 ms without, 10.160 with")


def test_the_prune_weighs_what_it_keeps_against_the_original_in_turns(monkeypatch):
    """Four kernels that cost nothing beside each other but 1.6% together against PyTorch (a cost any one of them
    brings, once): no trial without one of them, alone or with others, sees it; the prune's last step, the kept set
    in turns with the original, sends every kernel away and says so."""
    from autokernel.harness import timing

    monkeypatch.setattr(swap, "build", lambda model, types: Candidate(types))
    monkeypatch.setattr(timing, "time_fn", lambda *a, **kw: pytest.fail("a model was timed alone"))
    turns = []

    def fair_time_turns(fns, sets, device, n, latency=False):
        turns.append(sorted(fns))
        return {name: [(10.0 + 0.16 * bool(fn.types)) * 1e3] * n for name, fn in fns.items()}

    monkeypatch.setattr(timing, "time_turns", fair_time_turns)
    monkeypatch.setattr(endtoend, "wrong_output", lambda fn, model, args: None)
    lines, types = [], ["rmsnorm", "matmul", "softmax", "layernorm"]
    optimized, dropped = pruning.prune(Candidate([]), Candidate(types), lambda seed: (), "cuda", progress=lines.append)
    assert turns and all(names == ["with", "without"] for names in turns)
    assert [line.split(": ")[1].split()[:2] for line in lines[:4]] == [[t, "kept"] for t in types]
    assert lines[-1].startswith("prune (eager): rmsnorm, matmul, softmax, layernorm left out too: together the "
                                "kernels lose")
    assert optimized.types == [] and "together the kernels lose in eager mode" in dropped["matmul"]
    assert "(original 10.000 ms vs 10.160 ms, 0.984x" in dropped["rmsnorm"]


def test_prune_times_in_the_deploy_mode_and_drops_what_loses_there(monkeypatch):
    """Under torch.compile the rmsnorm kernel loses (compile fuses the norm into its neighbours): the prune,
    timing the compiled model, leaves it out, and says which mode decided."""
    compiled_cost = {"rmsnorm": +0.8, "matmul": -1.0}
    compiled = []

    def fake_compile(fn, backend=None, mode=None):
        compiled.append(fn.types)
        return _Costed(fn.types, compiled_cost)

    made_up_compile(monkeypatch, fake_compile)
    optimized, dropped = pruning.prune(Candidate([]), Candidate(["rmsnorm", "matmul"]), lambda seed: (), "cuda",
                                        modes="compile")
    assert optimized.types == ["matmul"] and list(dropped) == ["rmsnorm"]
    assert "compile mode" in dropped["rmsnorm"] and ["rmsnorm", "matmul"] in compiled
    with pytest.raises(ValueError, match="deploy mode"):
        pruning.prune(None, Candidate([]), lambda seed: (), "cuda", modes="turbo")


def test_an_eager_and_a_compiled_mode_each_keep_the_types_that_win_there(monkeypatch):
    """Deployed eagerly and under torch.compile, the rmsnorm kernel wins eagerly (it saves launches) and loses
    compiled (Inductor fuses the norm into its neighbours), the matmul kernel the other way round: each mode keeps
    its own, and the model runs rmsnorm eagerly and matmul where torch.compile traces it."""
    made_up_compile(monkeypatch, lambda fn, backend=None, mode=None: _Costed(fn.types, {"rmsnorm": +0.8,
                                                                                          "matmul": -1.0}))
    monkeypatch.setattr(Candidate, "ms", property(lambda c: 10.0 + sum({"rmsnorm": -2.0, "matmul": +1.5}[t]
                                                                       for t in c.types)), raising=False)
    built = []
    monkeypatch.setattr(swap, "build", lambda model, types, traced=None, graphed=None:
                        built.append((types, traced)) or Candidate(types))
    optimized, dropped, dropped_traced = pruning.prune_deployed(Candidate([]), Candidate(["rmsnorm", "matmul"]),
                                                                 lambda seed: (), "cuda", ["eager", "compile"])
    assert list(dropped) == ["matmul"] and "in eager mode" in dropped["matmul"]
    assert list(dropped_traced) == ["rmsnorm"] and "in compile mode" in dropped_traced["rmsnorm"]
    assert built[-1] == (["rmsnorm"], ["matmul"])
    optimized, dropped, dropped_traced = pruning.prune_deployed(Candidate([]), Candidate(["rmsnorm", "matmul"]),
                                                                 lambda seed: (), "cuda", ["compile"])
    assert optimized.types == ["matmul"] and dropped is dropped_traced  # one side decides both


def test_a_kernel_that_loses_in_one_of_the_modes_of_a_side_is_left_out(monkeypatch):
    """compile and compile_graph run the same traced kernels: the matmul kernel takes the GPU time it saves replayed
    from a CUDA graph and loses 5% without one (its host cost), so the model would be slower in a mode it runs in: it
    is left out, said in which mode; the rmsnorm kernel, faster in both, stays. Both modes are timed on one compile
    per trial."""
    from autokernel.harness import timing

    costs = {"compile": {"rmsnorm": -1.0, "matmul": +0.5}, "compile_graph": {"rmsnorm": -1.0, "matmul": 0.0}}
    compiled = []

    def fake_compile(fn, backend=None, mode=None):
        compiled.append(fn.types)
        return _Costed(fn.types, costs["compile"])

    made_up_compile(monkeypatch, fake_compile)
    monkeypatch.setattr(timing, "cuda_graphed", lambda fn, example, **kw: _Costed(fn.types, costs["compile_graph"]))
    optimized, dropped = pruning.prune(Candidate([]), Candidate(["rmsnorm", "matmul"]), lambda seed: (), "cuda",
                                        modes=["compile", "compile_graph"])
    assert optimized.types == ["rmsnorm"] and list(dropped) == ["matmul"]
    assert "faster without it in compile mode (9.000 ms without, 9.500 with (0.947x" in dropped["matmul"]
    # one compile for both modes, and each model compiled once: the full set, timed in turns with both trials, and
    # the set kept at the end, timed with the original, were each compiled for the first pair they ran in
    assert sorted(compiled) == [[], ["matmul"], ["rmsnorm"], ["rmsnorm", "matmul"]]
    with pytest.raises(ValueError, match="one side"):
        pruning.prune(None, Candidate([]), lambda seed: (), "cuda", modes=["eager", "compile"])


def test_a_compiled_prune_compiles_each_model_once_however_many_types(monkeypatch):
    """Ten types: each trial's model and the original are compiled once, and the kept set is not compiled again for
    the next trial. The models share their forward's code, so they outnumber dynamo's recompile limit (8), past which
    a model would run uncompiled and be timed as if it were compiled: the prune makes room for all of them."""
    from autokernel.harness import timing

    graphs = []
    monkeypatch.setattr(endtoend, "backend_for", lambda device: lambda gm, example: graphs.append(gm) or gm.forward)
    monkeypatch.setattr(swap, "build", lambda model, types: SharedForward(types))

    def calling_time_turns(fns, sets, device, turns, latency=False):  # every type helps: all are kept
        ms = {name: fn(*sets[0]) is not None and 10.0 - 0.5 * len(fn.types) for name, fn in fns.items()}
        return {name: [ms[name] * 1e3] * turns for name in fns}

    monkeypatch.setattr(timing, "time_turns", calling_time_turns)
    types, option = [f"type{i}" for i in range(10)], compat.recompile_limit_option()
    limit = getattr(torch._dynamo.config, option)
    torch._dynamo.reset()
    with torch.no_grad():
        optimized, dropped = pruning.prune(SharedForward([]), SharedForward(types), lambda seed: (torch.ones(4),),
                                            "cpu", modes="compile")
    assert optimized.types == types and not dropped
    assert len(graphs) == 1 + len(types) + 1  # the full set, each trial, the original: every one compiled, once
    assert getattr(torch._dynamo.config, option) == limit  # the user's again


def test_a_mode_that_fails_is_reported_and_its_kernel_left_out(monkeypatch):
    """A type under which the model fails to compile is left out by a prune in compile mode, with the error;
    the timing reports the failing row and still times the others."""

    def fake_compile(fn, backend=None, mode=None):
        if "matmul" in fn.types:
            raise RuntimeError("inductor could not lower the matmul kernel")
        return _Costed(fn.types, {"rmsnorm": -1.0})

    made_up_compile(monkeypatch, fake_compile)
    optimized, dropped = pruning.prune(Candidate([]), Candidate(["matmul", "rmsnorm"]), lambda seed: (), "cuda",
                                        modes="compile")
    assert optimized.types == ["rmsnorm"] and "fails in compile mode" in dropped["matmul"]
    assert "could not lower" in dropped["matmul"]

    monkeypatch.setattr(Candidate, "ms", 10.0, raising=False)  # eager rows: the candidate itself is timed
    rows, errors = endtoend.time_models(Candidate([]), Candidate(["matmul"]), lambda seed: (), "cuda",
                                        with_compile=True)
    assert set(rows) == {"eager", "compile", "optimized"} and list(errors) == ["optimized_compile"]
    assert rows["optimized"]["speedup_vs_eager"] == 1.0 and "could not lower" in errors["optimized_compile"]


def test_a_mode_that_computes_something_else_is_left_out_and_not_timed(monkeypatch):
    """Under torch.compile the matmul kernel's output is lost (as Inductor lost a kernel's writes through a
    TMA descriptor): however fast, the prune leaves it out and the timing reports the row instead of timing it."""
    made_up_compile(monkeypatch, lambda fn, backend=None, mode=None: _Costed(fn.types, {"matmul": -5.0,
                                                                                           "rmsnorm": -1.0}))
    monkeypatch.setattr(endtoend, "wrong_output", lambda fn, model, args: "wrong output in this mode (relative L2 "
                        "error 1, tolerance 0.01)" if "matmul" in getattr(fn, "types", ()) else None)
    optimized, dropped = pruning.prune(Candidate([]), Candidate(["matmul", "rmsnorm"]), lambda seed: (), "cuda",
                                        modes="compile")
    assert optimized.types == ["rmsnorm"] and "wrong output in this mode" in dropped["matmul"]
    monkeypatch.setattr(Candidate, "ms", 10.0, raising=False)
    rows, errors = endtoend.time_models(Candidate([]), Candidate(["matmul"]), lambda seed: (), "cuda",
                                        with_compile=True)
    assert "optimized_compile" not in rows and "wrong output" in errors["optimized_compile"]


def test_each_mode_times_the_original_and_the_optimized_model_in_turns(monkeypatch):
    """A host that slows down for a while must slow both sides of a row pair alike: each mode's pair is one
    time_turns call, the modes without torch.compile first."""
    from autokernel.harness import timing

    made_up_compile(monkeypatch, lambda fn, backend=None, mode=None: _Costed(fn.types, {"matmul": -1.0}))
    monkeypatch.setattr(Candidate, "ms", 10.0, raising=False)
    calls = []
    monkeypatch.setattr(timing, "time_turns", lambda fns, sets, device, turns, **kw: calls.append(list(fns)) or {
        name: [fn.ms * 1e3] * turns for name, fn in fns.items()})
    rows, errors = endtoend.time_models(Candidate([]), Candidate(["matmul"]), lambda seed: (), "cpu",
                                        with_compile=True)
    assert calls == [["eager", "optimized"], ["compile", "optimized_compile"]] and not errors
    assert rows["optimized_compile"]["speedup_vs_compile"] == 10.0 / 9.0


def made_up_compile(monkeypatch, fake_compile):
    """Candidates built by swap.build, compiled by fake_compile, timed by the .ms it gives them."""
    from autokernel.harness import timing

    monkeypatch.setattr(swap, "build", lambda model, types: Candidate(types))
    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: None)
    monkeypatch.setattr(timing, "time_fn", lambda fn, sets, device, **kw: timing.Timing(fn.ms * 1e3, [fn.ms * 1e3]))
    monkeypatch.setattr(timing, "time_turns", lambda fns, sets, device, turns, **kw: {
        name: [fn.ms * 1e3] * turns for name, fn in fns.items()})
    monkeypatch.setattr(endtoend, "wrong_output", lambda fn, model, args: None)  # made-up models, right by fiat


class _Costed:  # what torch.compile made of a candidate: its time under compile
    def __init__(self, types, cost):
        self.types, self.ms = list(types), 10.0 + sum(cost[t] for t in types)


def test_verify_reports_the_prune_mode_and_writes_its_report(repo_root, tmp_path, capsys, interpreter):
    code, report, printed = run_verify(repo_root, tmp_path, capsys, "custom", "--kernels", str(tmp_path),
                                       "--types", "softmax", "--no-timing", "--compile")
    assert code == 0, printed.out + printed.err
    # no GPU: no prune; with --compile, the eager and the compiled mode would each decide their types
    assert report["prune"] == {"mode": "eager,compile", "decided": False, "left_out": {}, "left_out_compiled": {},
                               "left_out_eagerly": {}, "split": True, "decisions": {}}
    assert report["compiled_types"] == report["swapped_types"] == ["softmax"]
    parse = lambda *flags: verify.build_parser().parse_args(["--model", "m.py", "--class-name", "M", *flags])
    assert verification.deploy_mode(parse("--cuda-graph")) == "eager,graph"
    assert verification.deploy_mode(parse("--cuda-graph", "--compile")) == "eager,graph,compile,compile_graph"
    assert verification.deploy_mode(parse("--deploy", "eager", "--compile")) == "eager"
    assert verification.deploy_mode(parse("--deploy", " compile_graph,graph")) == "graph,compile_graph"
    for wrong in ("turbo", "eager,eager", ""):
        with pytest.raises(SystemExit):
            parse("--deploy", wrong)
    assert "each mode once" in capsys.readouterr().err
    assert parse().report == repo_root / "workspace" / "verify.json"  # where the morning report reads it


def test_the_gpu_scripts_summarize_a_report_in_a_few_lines(repo_root, tmp_path, capsys, interpreter):
    code, report, printed = run_verify(repo_root, tmp_path, capsys, "custom", "--types", "softmax", "--no-timing")
    assert code == 0, printed.out + printed.err
    report["timing"] = {"compile": {"ms": 2.0}, "optimized_compile": {"ms": 1.6, "speedup_vs_compile": 1.25},
                        "optimized": {"ms": 3.0, "speedup_vs_eager": 1.1}}
    report["sites"].append({"where": "blocks.0.attn", "kernel_type": "softmax", "swapped": False, "calls": 0,
                            "reason": "a mask the kernel does not take"})
    (tmp_path / "verify_custom.json").write_text(json.dumps(report))
    summary = import_file(repo_root / "scripts" / "verify_summary.py", "verify_summary")
    assert summary.main([str(tmp_path / "verify_custom.json"), "--sites", "softmax", "--targets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "verify_custom: correctness PASS, kept softmax, prune in eager left out none"
    assert lines[2].split() == ["optimized_compile", "1.60", "ms", "compile", "1.25x"]
    assert "site blocks.0.attn: swapped False, calls 0, a mask the kernel does not take" in lines[-2]
    assert "optimized vs eager 1.10x (MISSED >= 1.3)" in lines[-1]
    assert "optimized_compile vs compile 1.25x (met >= 1.0, the prune did not time compile)" in lines[-1]
    report["prune"]["mode"] = "eager,compile"
    (tmp_path / "verify_custom.json").write_text(json.dumps(report))
    assert summary.main([str(tmp_path / "verify_custom.json"), "--targets"]) == 0
    assert "optimized_compile vs compile 1.25x (met >= 1.0)  " in capsys.readouterr().out
    assert summary.main([str(tmp_path / "missing.json")]) == 1


def test_the_summary_gives_each_deploy_mode_s_speedup(repo_root, tmp_path, capsys, interpreter):
    """One greppable line per mode's speedup over the original in that mode: the compiled, graphed one included
    (the mode the compiled side is decided in), not only the host-bound compiled row."""
    code, report, printed = run_verify(repo_root, tmp_path, capsys, "custom", "--types", "softmax", "--no-timing")
    assert code == 0, printed.out + printed.err
    report["timing"] = {"optimized_compile": {"ms": 1.6, "speedup_vs_compile": 1.25},
                        "optimized_graph": {"ms": 1.0, "speedup_vs_eager": 1.5},
                        "optimized_compile_graph": {"ms": 0.8, "speedup_vs_compile": 1.3}}
    got = verify.summary(report)
    assert (got["compiled_speedup_vs_compile"], got["graph_speedup_vs_eager"],
            got["compiled_graph_speedup_vs_compile_graph"]) == (1.25, 1.5, 1.3)


# ------------------------------------------------------------------------------ --against: two kernel sets in turns
def against_kernels(repo_root, tmp_path, extracted_factor: str = ""):
    """A kernels directory as the loop leaves it: the extracted rmsnorm (optionally made wrong by a factor) and
    the loop's winner (the same kernel, one tunable changed)."""
    source = (repo_root / "kernels" / "rmsnorm.py").read_text()
    correct = "rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)"
    assert correct in source, "the planted change no longer fits the starter"
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "01_rmsnorm.py").write_text(source.replace(correct, correct + extracted_factor))
    (kernels / "01_rmsnorm_optimized.py").write_text(source.replace(correct, correct + " * 1.0"))
    return kernels


def test_against_times_the_loops_kernels_in_turns_with_the_ones_it_began_from(repo_root, tmp_path, capsys,
                                                                              interpreter):
    kernels = against_kernels(repo_root, tmp_path)
    code, report, printed = run_verify(repo_root, tmp_path, capsys, "llama", "--kernels", str(kernels),
                                       "--types", "rmsnorm", "--against", "extracted")
    assert code == 0, printed.out + printed.err
    assert report["kernels"]["rmsnorm"]["path"].endswith("01_rmsnorm_optimized.py")
    a = report["against"]
    assert a["kernels"]["rmsnorm"].endswith("01_rmsnorm.py") and a["differs"] == ["rmsnorm"]
    assert a["rounds"] == paired.CPU_PAIRED_ROUNDS and a["ms"] > 0 and a["against_ms"] > 0
    assert a["verdict"] in ("faster", "slower", "no measurable difference")
    summary = dict(line.split(": ", 1) for line in printed.out.split("\n---\n", 1)[1].splitlines() if ": " in line)
    assert summary["against_verdict"] == a["verdict"]
    # the loop kept nothing: its _optimized copy is the extracted source again, so nothing to compare, and said so
    (kernels / "01_rmsnorm_optimized.py").write_text((kernels / "01_rmsnorm.py").read_text())
    code, report, _ = run_verify(repo_root, tmp_path, capsys, "llama", "--kernels", str(kernels),
                                 "--types", "rmsnorm", "--against", "extracted")
    assert report["against"]["differs"] == [] and "nothing to compare" in report["against"]["note"]


def test_against_swaps_the_types_of_every_kept_set(monkeypatch, tmp_path):
    """A type kept only in CUDA graphs (left out of eager calls) or only under torch.compile is still one of the
    kernels compared: its file is the other side's too, not this run's on both sides."""
    sets = {"types": ["rmsnorm"], "traced": ["rmsnorm", "matmul"], "graphed": ["rmsnorm", "rope_attention"]}
    optimized = types_ns(types=sets["types"], traced_types=lambda: sets["traced"],
                         graphed_types=lambda: sets["graphed"], module=lambda: None)
    loaded, files = [], {}
    for t in ("rmsnorm", "matmul", "rope_attention"):
        files[t] = tmp_path / f"{t}.py"
        files[t].write_text(f"# this run's {t}")
        (tmp_path / f"{t}_theirs.py").write_text(f"# the other {t}")
    monkeypatch.setattr(customops, "installed", lambda types: list(types))
    monkeypatch.setattr(customops, "reinstall", lambda snapshot: None)
    monkeypatch.setattr(deploy, "load_kernels", lambda where, types, starters, winners: loaded.append(types) or
                        {t: types_ns(path=tmp_path / f"{t}_theirs.py") for t in types})
    monkeypatch.setattr(paired, "paired", lambda *a: {"verdict": "faster"})
    request = verify.build_parser().parse_args(["--model", "m.py", "--class-name", "M", "--kernels", str(tmp_path),
                                                "--against", "extracted", "--compile", "--cuda-graph"])
    result = verification._time_against(request, None, optimized, {t: types_ns(path=p) for t, p in files.items()},
                                        None, "cuda")
    assert loaded == [["rmsnorm", "matmul", "rope_attention"]] and result["differs"] == loaded[0]


def test_against_a_wrong_kernel_is_an_error_not_a_verdict(repo_root, tmp_path, capsys, interpreter):
    kernels = against_kernels(repo_root, tmp_path, extracted_factor=" * 1.05")
    code, report, printed = run_verify(repo_root, tmp_path, capsys, "llama", "--kernels", str(kernels),
                                       "--types", "rmsnorm", "--against", "extracted")
    assert code == 0, printed.out + printed.err  # this run's kernels are right; the other side is not timed
    assert "verdict" not in report["against"] and "wrong output" in report["against"]["error"]
    # and the model as verified still runs this run's kernel
    assert customops._LABELS["rmsnorm"].endswith("01_rmsnorm_optimized.py")


@pytest.mark.slow(20)
def test_against_under_torch_compile_compiles_each_side_with_its_own_kernels(repo_root, tmp_path, capsys,
                                                                            interpreter):
    """Deployed under torch.compile (profile.py --deploy compile_graph; the report's verify runs --deploy), the two
    kernel sets are also compared compiled, each compiled with its own kernels installed: a wrong extracted kernel is
    caught there too, so the compiled side really ran it."""
    kernels = against_kernels(repo_root, tmp_path)
    flags = ("--kernels", str(kernels), "--types", "rmsnorm", "--against", "extracted", "--compile", "--deploy",
             "compile")
    code, report, printed = run_verify(repo_root, tmp_path, capsys, "llama", *flags)
    assert code == 0, printed.out + printed.err
    compiled = report["against"]["compiled"]
    assert compiled["mode"] == "compile" and compiled["verdict"] in ("faster", "slower", "no measurable difference")
    assert "timed in turns under torch.compile" in "\n".join(loop_report.estimate_lines(1.1, {**report,
                                                                                                "written": "x"}, None))
    summary = dict(line.split(": ", 1) for line in printed.out.split("\n---\n", 1)[1].splitlines() if ": " in line)
    assert float(summary["against_compiled_speedup"]) == pytest.approx(compiled["speedup"], rel=1e-3)
    (tmp_path / "wrong").mkdir()
    wrong = against_kernels(repo_root, tmp_path / "wrong", extracted_factor=" * 1.05") / "01_rmsnorm.py"
    (kernels / "01_rmsnorm.py").write_text(wrong.read_text())
    code, report, _ = run_verify(repo_root, tmp_path, capsys, "llama", *flags)
    assert "wrong output" in report["against"]["error"] and "wrong output" in report["against"]["compiled"]["error"]


def test_against_names_a_bad_directory_in_one_line(repo_root, tmp_path, capsys, interpreter):
    code, _, printed = run_verify(repo_root, tmp_path, capsys, "llama", "--against", str(tmp_path / "nowhere"))
    assert code == 2 and "--against" in printed.err and len(printed.err.strip().splitlines()) == 1


def test_the_paired_verdict_needs_more_wins_than_a_coin_gives():
    base = [10.0 + 0.05 * ((7 * i) % 5) for i in range(30)]  # drift between rounds, larger than the difference
    faster = endtoend.paired_verdict([t - 0.02 for t in base], base)
    assert faster["verdict"] == "faster" and faster["won_rounds"] == 30 and faster["speedup"] > 1
    assert endtoend.paired_verdict(base, [t - 0.02 for t in base])["verdict"] == "slower"
    coin = [t + (0.02 if i % 2 else -0.02) for i, t in enumerate(base)]  # won every other round
    assert endtoend.paired_verdict(coin, base)["verdict"] == "no measurable difference"
    few = endtoend.paired_verdict([9.0, 9.0, 9.0], [10.0, 10.0, 10.0])  # 3 of 3: p = 0.25, not enough rounds
    assert few["verdict"] == "no measurable difference" and few["p_value"] == pytest.approx(0.25)


def test_verification_is_a_library_call_that_returns_the_report(repo_root, tmp_path, interpreter):
    """What verify.py prints, from Python without its parser: a wrong kernel is still caught and blamed."""
    cls, shape, _ = MODELS["llama"]
    kernels = against_kernels(repo_root, tmp_path, extracted_factor=" * 1.05")  # 01_rmsnorm.py is wrong
    (kernels / "01_rmsnorm_optimized.py").unlink()
    request = verification.Request(class_name=cls, model=str(repo_root / "models" / "llama.py"), config="tiny",
                                   input_shape=shape, device="cpu", checks=1, kernels=kernels, types="rmsnorm",
                                   no_timing=True, command="from a test")
    report = verification.verify(request)
    assert report["correctness"]["status"] == "FAIL" and report["correctness"]["blamed"] == ["rmsnorm"]
    assert report["kernels"]["rmsnorm"]["path"].endswith("01_rmsnorm.py") and report["command"] == "from a test"


def test_outputs_are_compared_a_slice_at_a_time_with_a_whole_comparisons_errors(monkeypatch):
    """Long logits over a large vocabulary do not fit twice in float64: the check reads them a slice at a time."""
    from autokernel.verify import correctness

    monkeypatch.setattr(correctness, "COMPARE_SLICE", 7)
    ref = torch.randn(5, 13, dtype=torch.float16)
    out = ref + (1e-2 * torch.randn(5, 13)).half()
    r = endtoend.compare_outputs((out, None), (ref, None), 5e-2)
    diff = (out.double() - ref.double()).abs()
    assert r["rel_l2"] == pytest.approx(swap.rel_l2(out, ref), rel=1e-9) and r["ok"]
    assert r["max_abs"] == float(diff.max()) and r["max_rel"] == float(diff.max()) / float(ref.double().abs().max())
    out[3, 11] = float("nan")
    r = endtoend.compare_outputs((out, None), (ref, None), 5e-2)
    assert r["nonfinite"] == 1 and r["rel_l2"] == float("inf") and not r["ok"] and r["max_abs"] == float("inf")
