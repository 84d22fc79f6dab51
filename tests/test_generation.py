"""verify.py --generate: tokens per second of generate() with a static cache, the original against the optimized
model in turns, eagerly and with the forward compiled; the user's model handed back as it was. CPU: the interpreter."""

import pytest
import torch
from helpers import unwrapped

import autokernel
import verify
from autokernel.ops import swap
from autokernel.verify import generation, noise

transformers = pytest.importorskip("transformers")


def _tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.slow(8)
def test_generate_is_timed_in_both_modes_and_the_models_are_given_back(interpreter, tmp_path):
    model = _tiny_llama()
    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        optimized = autokernel.optimize(model, tmp_path / "none", ["rmsnorm", "flash_attention"], verified=None,
                                        quiet=True)
        forward = optimized.forward
        rows = generation.measure(model, optimized, prompt, 3, "cpu", True)
    for mode in ("eager", "compile"):
        r = rows[mode]
        assert "error" not in r, r
        assert r["original_tokens_per_s"] > 0 and r["optimized_tokens_per_s"] > 0 and r["new_tokens"] == 3
        low, high = r["speedup_interval"]
        assert low <= r["speedup"] <= high and 0 <= r["same_tokens"] <= 3
    for m in (model, optimized):  # transformers' compiled decode calls taken off again
        assert "_compiled_call" not in vars(m) and "_last_compile_config" not in vars(m)
    assert "forward" not in vars(model) and optimized.forward is forward
    lines = verify.generation_lines(rows)
    assert len(lines) == 2 and lines[1].startswith("generate (compile, 3 new tokens, static cache): original ")


def test_a_model_without_generate_and_a_failing_mode_are_reported_not_raised():
    plain = torch.nn.Linear(4, 4)
    assert "no generate()" in generation.measure(plain, plain, torch.zeros(1, 4), 3, "cpu", False)["error"]
    model = _tiny_llama()
    rows = generation.measure(model, model, torch.zeros(1, 4), 3, "cpu", False)  # float ids
    assert "error" in rows["eager"]
    assert verify.generation_lines(rows)[0].startswith("generate (eager): not timed: ")


@pytest.mark.slow(15)
def test_verify_reports_generation_beside_the_forward(tmp_path, capsys, interpreter):
    import json

    _tiny_llama().config.save_pretrained(tmp_path / "cfg")
    out = tmp_path / "report.json"
    code = verify.main(["--module", "transformers", "--class-name", "AutoModelForCausalLM", "--config",
                        str(tmp_path / "cfg"), "--input-shape", "1,16", "--device", "cpu", "--checks", "1",
                        "--types", "rmsnorm,decode_attention", "--generate", "2", "--report", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    report = json.loads(out.read_text())
    assert report["generation"]["eager"]["new_tokens"] == 2 and "compile" not in report["generation"]
    assert "generate (eager, 2 new tokens, static cache): original " in printed.out
    # the decode steps' kernel, which no forward runs, is timed in generation as optimize() deploys it
    assert report["generation"]["eager"]["kernel_types"] == ["decode_attention", "rmsnorm"]
    assert "decode_attention" not in report["swapped_types"] \
        and "its kernels: decode_attention, rmsnorm" in unwrapped(printed.out)
    assert verify.main(["--module", "transformers", "--class-name", "AutoModelForCausalLM", "--config",
                        str(tmp_path / "cfg"), "--generate", "-1"]) == 2  # a one-line error, before any load
    assert "--generate" in capsys.readouterr().err


def test_types_no_forward_runs_are_decided_on_generation(monkeypatch):
    """decode_attention runs in no forward, so the forward's prune never weighs it: generation does, with and without
    it in turns, and leaves it out where generate() runs faster without it (a type that ran nowhere stays)."""
    kept = swap.build(torch.nn.Linear(2, 2), [])
    rows = {"eager": {"outcome": noise.WITHIN_NOISE, "kernel_types": ["decode_attention", "rmsnorm"]},
            "compile_graph": {"outcome": noise.FASTER, "speedup": 0.95, "speedup_interval": [0.94, 0.96]}}
    timed, built = [], []
    monkeypatch.setattr(swap, "build", lambda model, types, traced=None, graphed=None:
                        built.append((types, traced)) or kept)
    monkeypatch.setattr(generation, "measure", lambda without, with_, *a: timed.append((without, with_)) or rows)
    eagerly, traced = generation.decide(kept.model, kept, ["decode_attention", "layernorm"], None, 4, "cuda", True)
    assert built == [(["decode_attention", "layernorm"],) * 2]  # the kept types (none here) with the candidates
    assert timed[0][0] is kept.module()  # against the kept types alone
    assert eagerly == {} and list(traced) == ["decode_attention"]  # layernorm ran nowhere: it stays
    assert traced["decode_attention"].startswith("generate() runs faster without it in compile_graph mode (0.950x")


@pytest.mark.parametrize("jitter, rounds", [(0.0, 1), (0.3, generation.ROUNDS)])
def test_a_close_generation_verdict_gets_more_rounds_of_turns(monkeypatch, jitter, rounds):
    """Five compiled generate()s read 0.945x with an interval of 0.73-1.01: a close call gets more rounds, up to
    ROUNDS; a clear one (a steady 10% gain) stops after the first."""
    import random

    from autokernel.harness import timing

    rng, calls = random.Random(0), []

    def time_turns(fns, sets, device, turns, latency=False):
        calls.append(turns)
        return {name: [(1000.0 if name == "original" else 900.0) * (1 + jitter * rng.uniform(-1, 1))
                       for _ in range(turns)] for name in fns}

    monkeypatch.setattr(timing, "time_turns", time_turns)
    samples, v = generation._timed_in_rounds({"original": None, "optimized": None}, torch.zeros(1, 4), "cuda")
    assert calls == [generation.TURNS] * rounds and len(samples["original"]) == generation.TURNS * rounds
    assert (v.outcome == noise.SLOWER) == (jitter == 0.0)  # slower without the kernels: a clear gain
