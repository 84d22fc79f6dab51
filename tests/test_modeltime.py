"""The time in the model through the real harness, on the CPU (Triton's interpreter): every model shape
timed and weighted by its calls, the host's cost beside it, labelled as no performance figure.
The GPU path (CUDA-graph replay) runs under the `gpu` marker."""

import os
from pathlib import Path

import pytest
import torch

from autokernel import results
from autokernel.harness import modeltime, timing
from autokernel.harness.runner import run_bench
from autokernel.profile.extraction import set_model_shapes
from autokernel.registry import get_spec

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [{"M": 16, "N": 64}, {"M": 4, "N": 40}]


def extracted_rmsnorm(tmp_path, calls) -> Path:
    path = tmp_path / "01_rmsnorm.py"
    path.write_text(set_model_shapes((ROOT / "kernels" / "rmsnorm.py").read_text(), SHAPES, "shapes of a test",
                                     calls))
    return path


def bench(kernel: Path) -> dict:
    """What `bench.py KERNEL --device cpu --quick --seed 1 --json` writes (the harness, forked warm)."""
    r = run_bench(kernel, device="cpu", quick=True, seed=1)
    assert r["correctness"] == "PASS", r["log"][-2000:] + r["stderr_tail"]
    return r


@pytest.mark.slow
@pytest.mark.usefixtures("warm_launcher")
def test_every_model_shape_is_timed_and_weighted_by_its_calls(tmp_path):
    r = bench(extracted_rmsnorm(tmp_path, [7, 3]))
    shapes = r["model_shapes"]
    assert [s["shape"] for s in shapes] == SHAPES and [s["calls"] for s in shapes] == [7, 3]
    assert [s["arg_shapes"] for s in shapes] == [[[16, 64], [64]], [[4, 40], [40]]]
    assert r["model_us"] == pytest.approx(7 * shapes[0]["us"] + 3 * shapes[1]["us"])
    assert r["model_eager_us"] == pytest.approx(7 * shapes[0]["eager_us"] + 3 * shapes[1]["eager_us"])
    assert r["model_host_us"] == pytest.approx(7 * shapes[0]["host_us"] + 3 * shapes[1]["host_us"])
    assert r["host_us"] == pytest.approx(r["model_host_us"] / 10)
    assert r["model_timing"] == "cpu_host_clock" and r["model_compile_us"] is None  # not a performance figure
    assert results.objective_us(r) == r["model_us"] != r["latency_us"]


@pytest.mark.slow
@pytest.mark.usefixtures("warm_launcher")
def test_a_kernel_without_model_shapes_keeps_todays_result(tmp_path):
    kernel = tmp_path / "rmsnorm.py"
    kernel.write_text((ROOT / "kernels" / "rmsnorm.py").read_text())
    r = bench(kernel)
    assert "model_us" not in r and results.objective_us(r) == r["latency_us"]


def test_weights_and_host_cost_on_the_cpu():
    class Module:
        MODEL_SHAPES = SHAPES
        MODEL_CALLS = [5]  # not one per shape: every shape once

    assert modeltime.weighted_shapes(Module, SHAPES) == [(SHAPES[0], 1), (SHAPES[1], 1)]
    Module.MODEL_CALLS = [5, 2]
    assert modeltime.weighted_shapes(Module, SHAPES[1:]) == [(SHAPES[1], 2)]  # the harness dropped one
    calls = []
    assert timing.host_cost_us(lambda: calls.append(1), (), "cpu") > 0
    assert len(calls) == timing.CPU_HOST_CALLS


def test_a_kernel_that_writes_its_inputs_fails_the_model_timing():
    """The oracle sees copies of the inputs taken before the call, so a kernel that overwrites its input
    with something its output matches is caught, not scored (the honest path: the tests above)."""
    spec = get_spec("rmsnorm")
    gen = torch.Generator().manual_seed(0)
    make = lambda: spec.make_inputs(SHAPES[1], torch.float32, "cpu", gen)

    def writer(x, weight, eps=1e-6):
        x.zero_()
        return torch.zeros_like(x)

    with pytest.raises(Exception, match="modified its input 0"):
        modeltime.time_shape(writer, spec, make, SHAPES[1], 1, torch.float32, "cpu", reuse=True)


@pytest.mark.gpu
def test_graph_replay_catches_a_kernel_that_does_nothing_while_captured():
    spec = get_spec("rmsnorm")
    gen = torch.Generator(device="cuda").manual_seed(0)
    make = lambda: spec.make_inputs(SHAPES[0], torch.float16, "cuda", gen)
    first = make()
    cached = spec.reference(*first)

    def lazy(x, weight, eps=1e-6):  # right on the first inputs, and launches nothing afterwards
        return cached

    with pytest.raises(Exception, match="fresh inputs|timed replay"):
        modeltime.time_shape(lazy, spec, make, SHAPES[0], 1, torch.float16, "cuda", reuse=True)
    honest = modeltime.time_shape(spec.reference, spec, make, SHAPES[0], 1, torch.float16, "cuda", reuse=True)
    assert honest.graphed and honest.us > 0 and honest.host_us > 0


def test_time_turns_runs_each_function_once_per_turn_in_alternating_order():
    order = []

    def work(name, n):
        def run(x):
            order.append(name)
            return sum(range(n)) + x
        return run

    samples = timing.time_turns({"light": work("light", 10), "heavy": work("heavy", 200_000)}, [(1,), (2,)],
                                "cpu", turns=6)
    assert order[2:] == ["light", "heavy", "heavy", "light"] * 3  # after one warm-up run of each
    assert [len(s) for s in samples.values()] == [6, 6]
    assert all(h > l for h, l in zip(samples["heavy"], samples["light"]))  # turn by turn, the heavier one


@pytest.mark.gpu
def test_a_call_whose_host_cost_exceeds_its_gpu_time_is_timed_at_its_gpu_time():
    """A 64 KB add behind 300 us of host work (a slow Python launcher): the events must not see the host."""
    import time

    x = torch.zeros(16384, device="cuda")

    def slow_launcher(a):
        end = time.perf_counter() + 300e-6
        while time.perf_counter() < end:
            pass
        return a.add_(1)

    gpu_only = timing.time_gpu(lambda a: a.add_(1), [(x,)]).median_us
    assert timing.time_gpu(slow_launcher, [(x,)]).median_us < gpu_only + 30
    turns = timing.time_turns({"slow": slow_launcher, "fast": lambda a: a.add_(1)}, [(x,)], "cuda", turns=20)
    assert sorted(turns["slow"])[10] < gpu_only + 30


@pytest.mark.gpu
def test_the_l2_flushes_charge_a_small_copy_as_they_say():
    """A 16 MB copy (its source and destination fit an H100's 50 MB L2): the dirty flush charges it the write-back
    of lines it never touched, the clean one does not, with no flush it reads its source from the L2, and with its
    source written again after the dirty flush ("inputs") it reads it from there too."""
    src, dst = torch.randn(2 * 2**20, device="cuda"), torch.empty(2 * 2**20, device="cuda")
    source_again = lambda args: timing.rewrite(args[:1])  # noqa: E731
    us = {flush: timing.time_gpu(lambda a, b: b.copy_(a), [(src, dst)], reps=200, flush=flush,
                                 before=source_again if flush == "inputs" else None).median_us
          for flush in timing.FLUSHES}
    assert us["none"] < us["clean"] < us["dirty"] and us["inputs"] < us["dirty"], us


@pytest.mark.slow(8)
def test_a_run_says_which_l2_flush_timed_it_and_the_environment_picks_it(tmp_path, monkeypatch):
    """AUTOKERNEL_L2_FLUSH sets the flush before each timed run at the model's shapes for a whole run (a night's
    benches and screens inherit it), and each result says which it was, so figures of two regimes are not mixed."""
    kernel = extracted_rmsnorm(tmp_path, [1, 1])
    monkeypatch.setenv("AUTOKERNEL_L2_FLUSH", "inputs")
    r = run_bench(kernel, device="cpu", quick=True, seed=1, warm=False)
    assert r["correctness"] == "PASS" and r["model_l2_flush"] == "inputs"
    monkeypatch.setenv("AUTOKERNEL_L2_FLUSH", "dirtyy")
    r = run_bench(kernel, device="cpu", quick=True, seed=1, warm=False)
    assert r["status"] == "crash" and "AUTOKERNEL_L2_FLUSH='dirtyy'" in r["reason"] + r["stderr_tail"]


@pytest.mark.slow(10)
def test_l2_regimes_ranks_a_kernels_configurations_under_every_flush(tmp_path):
    """scripts/l2_regimes.py on the CPU (the interpreter: the path, not the figures): each configuration drawn from
    the file's TUNABLES, its own first, timed in the model under every flush."""
    import json
    import subprocess
    import sys

    kernel = extracted_rmsnorm(tmp_path, [2, 1])
    r = subprocess.run([sys.executable, "scripts/l2_regimes.py", str(kernel), "--configs", "3", "--out",
                        str(tmp_path / "l2.json")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    figures = json.loads((tmp_path / "l2.json").read_text())[str(kernel)]
    assert list(figures["regimes"]) == list(timing.FLUSHES) and len(figures["configs"]) == 3
    assert all(len(got["configs"]) == 3 and all(us > 0 for us in got["configs"]) for got in figures["regimes"].values())
    from autokernel.kernelfile import tunable_space

    assert figures["configs"][0] == tunable_space(kernel.read_text())[1]  # the file's own configuration first
    assert "01_rmsnorm.py: us in the model a forward (rank)" in r.stdout


def test_the_roofline_guard_counts_only_what_the_l2_cannot_hold_where_it_holds_the_inputs(monkeypatch):
    """The guard against a time below the physical floor (a kernel not doing its work) holds every byte to DRAM's
    bandwidth after a flush; where the L2 may hold the inputs ("inputs", "none") a legitimate call beats that floor,
    so only what the L2 cannot hold counts, and a call on more data than the L2 still has a floor."""
    class Properties:
        L2_cache_size = 50 * 2**20

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Properties())
    for flush, floor_bytes in (("dirty", 120 * 2**20), ("clean", 120 * 2**20), ("inputs", 70 * 2**20),
                               ("none", 70 * 2**20)):
        monkeypatch.setattr(modeltime, "L2_FLUSH", flush)
        assert modeltime._from_dram(120 * 2**20) == floor_bytes
    assert modeltime._from_dram(16 * 2**20) == 0


def test_the_model_shapes_are_timed_on_the_layout_the_model_s_sites_pass(tmp_path, monkeypatch):
    """rope_attention's sites pass q, k and v as views of the [B, S, H, D] projections (Qwen3-0.6B on an H200: the
    harness timed contiguous tensors at 57 us a call, and the model ran 1.108x faster with the rivals in its place):
    the time at the model's shapes and the screen take them so; a type without a model layout keeps make_inputs'."""
    from autokernel.harness import harness, screen

    class Made(Exception):
        """Carries the inputs the model timing would time."""

    def capture(fn, spec, make_inputs, *args, **kwargs):
        raise Made(make_inputs())
    monkeypatch.setattr(modeltime, "time_shape", capture)
    shape = {"B": 1, "Hq": 4, "Hkv": 2, "S": 16, "D": 16, "causal": True}
    path = tmp_path / "01_rope_attention.py"
    path.write_text(set_model_shapes((ROOT / "kernels" / "rope_attention.py").read_text(), [shape], "a test", [3]))
    module, spec, _ = harness._load(str(path), "cpu")
    runner = harness.Harness(module, spec, "cpu", quick=True, seed=0)
    with pytest.raises(Made) as made:
        modeltime.measure_model(runner, module, torch.float32, reuse_baselines=False)
    screened = screen._Screen(str(path), "cpu", torch.float32).inputs[0][0]
    for inputs in (made.value.args[0], screened):
        q, k, v, cos, sin = inputs[:5]
        assert all(not t.is_contiguous() and t.transpose(1, 2).is_contiguous() for t in (q, k, v))
        assert q.shape == (1, 4, 16, 16) and k.shape == v.shape == (1, 2, 16, 16) and cos.shape == (1, 16, 16)
    flash = get_spec("flash_attention")  # HF hands SDPA q and k fresh from RoPE, v a view of its projection
    q, k, v = flash.model_layout(flash.make_inputs({**shape, "H": 4}, torch.float32, "cpu", torch.Generator()))[:3]
    assert q.is_contiguous() and k.is_contiguous() and not v.is_contiguous() and v.transpose(1, 2).is_contiguous()
    rmsnorm = extracted_rmsnorm(tmp_path, [7, 3])
    module, spec, _ = harness._load(str(rmsnorm), "cpu")
    with pytest.raises(Made) as made:
        modeltime.measure_model(harness.Harness(module, spec, "cpu", quick=True, seed=0), module, torch.float32, False)
    assert spec.model_layout is None and all(t.is_contiguous() for t in made.value.args[0][:2])
