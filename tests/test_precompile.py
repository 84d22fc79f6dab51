"""Compiling ahead of the stages (autokernel/harness/precompile.py): workers make the stages' calls side by side,
each its share, while the harness's process runs the stages, and are stopped when the stages end; nothing they do is
a verdict."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from autokernel.harness import harness, precompile, runner

ROOT = Path(__file__).resolve().parent.parent
RMSNORM = '''"""rmsnorm in torch: right, and fast in the interpreter."""
import torch

KERNEL_TYPE = "rmsnorm"


def kernel_fn(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
'''
TRITON_RMSNORM = '''"""rmsnorm in Triton, one row a program."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rmsnorm"


@triton.jit
def _row(x_ptr, w_ptr, y_ptr, N, eps, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + tl.program_id(0) * N + offs, mask=offs < N, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=offs < N, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / N + eps) * w * SCALE
    tl.store(y_ptr + tl.program_id(0) * N + offs, y.to(y_ptr.dtype.element_ty), mask=offs < N)


def kernel_fn(x, weight, eps=1e-6):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)
    _row[(x2.shape[0],)](x2, weight.contiguous(), y, x2.shape[1], eps, BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.reshape(x.shape)
'''
RIGHT = TRITON_RMSNORM.replace("SCALE", "1.0")
WRONG = TRITON_RMSNORM.replace("SCALE", "1.5")
HANGS = RMSNORM.replace("    xf = x.float()", "    while x.numel() > 0:\n        x = x + 0\n    xf = x.float()")


@pytest.fixture
def kernel(tmp_path):
    def write(text: str, name: str = "kernel.py"):
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    return write


def test_the_workers_share_the_stages_calls_between_them(kernel):
    path = kernel(RMSNORM)
    whole = precompile.make_calls(path, "cpu", seed=1, quick=True, worker=0, of=1)
    shares = [precompile.make_calls(path, "cpu", seed=1, quick=True, worker=w, of=3) for w in range(3)]
    assert whole > 10 and sum(shares) == whole and max(shares) - min(shares) <= 1
    worker = subprocess.run([sys.executable, "-m", "autokernel.harness.precompile", path, "--worker", "1", "--of", "3",
                             "--seed", "1", "--device", "cpu", "--quick"], capture_output=True, text=True, cwd=ROOT)
    assert worker.returncode == 0 and worker.stdout.strip() == f"worker 1 of 3: {shares[1]} calls", worker.stderr


def test_the_workers_still_going_when_the_stages_end_are_stopped(kernel):
    ahead = precompile.start(kernel(HANGS), "cpu", seed=1, quick=True, count=2)
    time.sleep(1)
    line = ahead.stop()
    assert line.startswith("compiling ahead: 2 processes") and "0 finished, 2 stopped when the stages ended" in line
    assert all(proc.poll() is not None for proc in ahead.procs)


@pytest.mark.parametrize("text, verdict", [(RIGHT, ("pass", "PASS")), (WRONG, ("fail", "FAIL"))])
def test_the_verdict_is_the_stages_own(kernel, interpreter, monkeypatch, capsys, text, verdict):
    """The workers' calls are unchecked: a wrong kernel compiled ahead still fails its stages, a right one passes."""
    monkeypatch.setattr(precompile, "workers", lambda: 2)
    result = harness.run(kernel(text), "cpu", quick=True, seed=3, dtype="fp32", timed=False, compile_ahead=True)
    out = capsys.readouterr().out
    assert (result["status"], result["correctness"]) == verdict
    assert out.index("compiling ahead: 2 processes") < out.index("stage 1/5")
    assert "compiling ahead: 2 processes made the stages' calls alongside them" in out
    assert out.rindex("stage ") < out.index("made the stages' calls alongside them")  # stopped after the stages


def test_every_gpu_bench_compiles_ahead():
    """A night's experiments reuse their baselines but meet a cold cache whenever they change a compile-time
    constant: each compiles alongside its stages, as the first bench does."""
    args = lambda device, reuse: runner._harness_args("k.py", device, "o.json", False, "fp16", 1, True, reuse)  # noqa: E731
    assert "--compile-ahead" in args("cuda", False) and "--compile-ahead" in args("cuda", True)
    assert "--compile-ahead" not in args("cpu", False)


def test_the_screens_configurations_are_called_ahead_and_screened_as_before(tmp_path, interpreter, monkeypatch):
    from test_search import SCREENED

    from autokernel.harness import screen

    path = tmp_path / "kernel.py"
    path.write_text(SCREENED)
    configs = [{"BLOCK": 256, "SCALE": 1.0}, {"BLOCK": 512, "SCALE": 1.0}, {"BLOCK": 256, "SCALE": 2.0},
               {"BLOCK": 100, "SCALE": 1.0}]
    shares = [precompile.make_config_calls(str(path), configs, "cpu", "fp16", w, 2) for w in range(2)]
    assert shares == [2, 1]  # the fourth does not compile (a block of 100): the screen's verdict, not the worker's
    monkeypatch.setattr(precompile, "workers", lambda: 2)
    said = []
    ahead = screen.screen(str(path), configs, "cpu", "fp16", seconds=60, progress=said.append, compile_ahead=True)
    assert said[0].startswith("compiling ahead: 2 processes made the configurations' calls")
    assert [r["status"] for r in ahead["results"]] == ["timed", "timed", "wrong", "failed"]


@pytest.mark.gpu
def test_a_first_bench_on_a_cold_cache_compiles_ahead_and_then_finds_its_kernels_compiled(tmp_path, monkeypatch):
    """On a GPU with an empty Triton cache: the workers compile the starter's stage calls alongside the stages, the
    stages pass, and a second bench (the cache now full) passes the same with its sweep quick (its workers, started
    again, find nothing left to compile)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    first = runner.run_bench(ROOT / "kernels" / "rmsnorm.py", device="cuda")
    assert first["status"] == "pass" and "compiling ahead: " in first["log"], first["log"][-2000:]
    again = runner.run_bench(ROOT / "kernels" / "rmsnorm.py", device="cuda", reuse_baselines=True)
    assert again["status"] == "pass" and "compiling ahead: " in again["log"]
    sweep = [s for s in again["stages"] if s["name"] == "shape_sweep"][0]
    assert sweep["seconds"] < 10, again["log"][-2000:]


def test_a_candidate_that_launches_what_the_best_launches_stops_its_workers_and_runs_no_stage(kernel, interpreter,
                                                                                            monkeypatch, capsys):
    """The workers start first (nothing compiles in the harness before them); a candidate found "unchanged" before
    its stages stops them at once."""
    monkeypatch.setattr(precompile, "workers", lambda: 2)
    path = kernel(RIGHT)
    first = harness.run(path, "cpu", quick=True, seed=3, dtype="fp32")
    assert first["status"] == "pass" and first["launch_digest"]
    capsys.readouterr()
    again = harness.run(path, "cpu", quick=True, seed=3, dtype="fp32", same_as=first["launch_digest"],
                        compile_ahead=True)
    out = capsys.readouterr().out
    assert again["status"] == "unchanged" and again["stages"] == [] and "stage 1/5" not in out
    assert out.index("compiling ahead: 2 processes") < out.index("unchanged: ") < out.index("with no stage to run")
