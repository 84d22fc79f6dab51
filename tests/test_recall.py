"""A type whose ratio sits on the prune's margin is decided the same run after run: a reading that agrees with an
earlier run's (within what runs move apart) keeps that run's verdict; one that moved further, another kernel file or
--fresh decides afresh; the report says which verdicts were held, with both figures."""

import json
import random
from pathlib import Path

from test_prune_noise import Made, noisy_host

from autokernel.verify import noise, pruning, recall

IDENTITY = {"class_name": "LlamaForCausalLM", "input_shape": "1,2048", "gpu": "H100"}
KERNELS = {"rmsnorm": "a1", "rope_attention": "b2"}


def run(monkeypatch, tmp_path, seed: int, rmsnorm_cost: float, fresh: bool = False, kernels: dict = KERNELS,
        memory: bool = True):
    """One verify.py run's compiled prune (a run's own Inductor moves rmsnorm's cost): the types it kept, and its
    decisions. Each run reads the verdicts the earlier ones stored under tmp_path, and stores its own."""
    cost = {"compile_graph": {"rmsnorm": rmsnorm_cost, "rope_attention": -1.5}}
    noisy_host(monkeypatch, seed, jitter={"compile_graph": 0.002}, drift=0.05, cost=cost)
    kept = recall.Recall(IDENTITY, kernels, fresh=fresh, root=tmp_path) if memory else None
    decisions = {}
    optimized, _ = pruning.prune(Made([], cost), Made(list(cost["compile_graph"]), cost), lambda seed: (), "cuda",
                                 ["compile_graph"], decisions=decisions, memory=kept)
    if kept is not None:
        kept.save()
    return tuple(optimized.types), decisions


def on_the_margin(seed: int) -> float:
    """rmsnorm's cost in one run: the model 1.6-2.0% faster without it, around the line at 1.6% (margin + spread)."""
    return 0.14 + 0.035 * random.Random(seed).uniform(-1, 1)


def test_a_type_on_the_margin_is_decided_the_same_run_after_run(monkeypatch, tmp_path):
    forgetful = {run(monkeypatch, tmp_path, seed, on_the_margin(seed), memory=False)[0] for seed in range(8)}
    assert len(forgetful) == 2  # without earlier runs' verdicts the seeds fall on both sides of the line
    for first in (0, 1, 2):  # whichever side the first run falls on, the later ones follow it
        root = tmp_path / str(first)
        kept = [run(monkeypatch, root, seed, on_the_margin(seed))[0] for seed in range(first, first + 8)]
        assert len(set(kept)) == 1, kept


def test_a_reading_that_moved_past_the_spread_is_decided_afresh(monkeypatch, tmp_path):
    assert run(monkeypatch, tmp_path, 0, 0.08)[0] == ("rmsnorm", "rope_attention")  # 0.99x: within noise, kept
    kept, decisions = run(monkeypatch, tmp_path, 1, 0.30)  # 0.966x: a real change
    assert kept == ("rope_attention",) and decisions["rmsnorm"]["compile_graph"].get("earlier") is None


def test_another_kernel_file_or_fresh_holds_nothing(monkeypatch, tmp_path):
    low, high = 0.14 - 0.03, 0.14 + 0.03  # one run within noise, the next one just past the line
    assert run(monkeypatch, tmp_path, 0, low)[0] == ("rmsnorm", "rope_attention")
    assert run(monkeypatch, tmp_path, 1, high)[0] == ("rmsnorm", "rope_attention")  # held
    assert run(monkeypatch, tmp_path, 1, high, kernels={**KERNELS, "rmsnorm": "c3"})[0] == ("rope_attention",)
    assert run(monkeypatch, tmp_path / "other", 0, low)[0] == ("rmsnorm", "rope_attention")
    assert run(monkeypatch, tmp_path / "other", 1, high, fresh=True)[0] == ("rope_attention",)


def test_the_report_says_which_verdict_was_held_with_both_figures(monkeypatch, tmp_path):
    run(monkeypatch, tmp_path, 0, 0.11)
    _, decisions = run(monkeypatch, tmp_path, 1, 0.17)
    held = decisions["rmsnorm"]["compile_graph"]
    assert held["outcome"] == noise.WITHIN_NOISE and held["ratio"] < 0.984 < held["earlier"]
    assert f"held from an earlier run ({held['earlier']:.3f}x)" in noise.Verdict(**held).text()
    stored = json.loads(next((tmp_path / "verdicts").glob("*.json")).read_text())["trials"]
    assert stored["rmsnorm against rmsnorm+rope_attention"]["verdicts"]["compile_graph"]["ratio"] == held["earlier"]


def test_a_missing_or_broken_file_decides_afresh_and_a_run_that_decided_nothing_writes_nothing(tmp_path):
    memory = recall.Recall(IDENTITY, KERNELS, root=tmp_path)
    memory.save()
    assert not (tmp_path / "verdicts").exists()
    memory.path.parent.mkdir(parents=True)
    memory.path.write_text("{not json")
    assert recall.Recall(IDENTITY, KERNELS, root=tmp_path).earlier == {}


def test_a_cache_that_cannot_be_written_is_a_warning_not_a_failure(monkeypatch, tmp_path):
    (tmp_path / "a file").write_text("")
    memory = recall.Recall(IDENTITY, KERNELS, root=tmp_path / "a file")
    memory.now["rmsnorm against rmsnorm"] = {"kernels": {}, "verdicts": {}}
    assert "not stored for the next run" in memory.save()


def test_the_cache_is_where_the_environment_puts_it(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOKERNEL_CACHE", str(tmp_path / "ak"))
    assert recall.Recall(IDENTITY, KERNELS).path.parent == tmp_path / "ak" / "verdicts"
    monkeypatch.delenv("AUTOKERNEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert recall.cache_dir() == tmp_path / "xdg" / "autokernel"


def test_a_run_is_known_by_its_model_s_config_contents_and_its_kernel_files(monkeypatch, tmp_path):
    """verify.py's memory: the same request finds the same verdicts; another config (a file of the folder changed)
    or another input shape finds none; a kernel file's edit is told apart by its digest; weights are not read."""
    import torch

    from autokernel.harness import gpu
    from autokernel.ops.customops import KernelChoice
    from autokernel.verify import verification

    monkeypatch.setattr(gpu, "device_name", lambda device="cuda": "H100")
    monkeypatch.setattr(torch, "__version__", "2.11.0")
    config, kernel = tmp_path / "model", tmp_path / "rmsnorm.py"
    config.mkdir()
    (config / "config.json").write_text('{"hidden_size": 64}')
    (config / "model.safetensors").write_bytes(b"\0" * (recall.LARGE + 1))
    kernel.write_text("# v1")
    choices = {"rmsnorm": KernelChoice("rmsnorm", kernel, "starter")}

    def memory(**changes):
        request = verification.Request(**{"class_name": "AutoModelForCausalLM", "module": "transformers",
                                          "config": str(config), "input_shape": "1,2048", **changes})
        return verification._memory(request, choices, "compile_graph")
    first = memory()
    assert memory().path == first.path and memory(input_shape="1,4096").path != first.path
    monkeypatch.setattr(Path, "read_bytes", _refuse_large(Path.read_bytes))
    (config / "config.json").write_text('{"hidden_size": 128}')
    assert memory().path != first.path  # the large file was counted by its size, never read
    kernel.write_text("# v2")
    assert memory().kernels["rmsnorm"] != first.kernels["rmsnorm"]
    assert memory(fresh=True).earlier == {}
    model = tmp_path / "my_model.py"
    model.write_text("class Net: pass")
    edited = memory(module=None, model=str(model)).path
    model.write_text("class Net: x = 1")
    assert memory(module=None, model=str(model)).path != edited  # the user's model file, by its contents


def _refuse_large(read_bytes):
    def read(path):
        assert path.stat().st_size <= recall.LARGE, f"read {path}"
        return read_bytes(path)
    return read


def test_a_figure_on_a_line_gives_the_answer_of_the_run_whose_readings_it_overlaps(tmp_path):
    """Recall.side_of (the prune's device share against pruning.DEVICE_BOUND): a run whose readings overlap the
    stored ones takes their answer, whichever side its own median falls on, and keeps them as the anchor; readings
    clear of them decide afresh; --fresh holds nothing."""
    def answer(readings, root=tmp_path, fresh=False):
        memory = recall.Recall(IDENTITY, KERNELS, fresh=fresh, root=root)
        above = memory.side_of("device-bound", readings, 0.9)
        memory.save()
        return above
    assert answer([0.90, 0.91, 0.92])
    assert answer([0.88, 0.89, 0.905])  # median under the line, held
    assert answer([0.87, 0.89, 0.90])  # still overlaps the anchor (0.90-0.92), not the last run's readings
    assert not answer([0.86, 0.87, 0.88])  # clear of the anchor: afresh
    assert answer([0.90, 0.91, 0.92], root=tmp_path / "other")
    assert not answer([0.88, 0.89, 0.905], root=tmp_path / "other", fresh=True)


def test_a_trial_timed_again_in_eager_mode_alone_keeps_its_graphed_reading_too(tmp_path):
    """pruning._eager_alone times the eager side's trials again in eager mode alone: the stored trial keeps the graph
    reading of the first timing beside the eager reading of the second, so the next run holds both."""
    memory = recall.Recall(IDENTITY, KERNELS, root=tmp_path)
    verdict = lambda ratio, outcome: noise.Verdict(10.0 * ratio, 10.0, ratio, ratio - 0.01, ratio + 0.01, 40, outcome)
    memory.hold(["rmsnorm"], ["rmsnorm"], {"eager": verdict(0.95, noise.FASTER), "graph": verdict(1.05, noise.SLOWER)},
                ["eager", "graph"])
    memory.hold(["rmsnorm"], ["rmsnorm"], {"eager": verdict(0.94, noise.FASTER)}, ["eager"])
    memory.save()
    stored = recall.Recall(IDENTITY, KERNELS, root=tmp_path).earlier["rmsnorm against rmsnorm"]["verdicts"]
    assert stored["eager"]["ratio"] == 0.94 and stored["graph"]["ratio"] == 1.05
