"""A crash verdict names its cause in one line (autokernel/harness/crash.py): out of memory with the sizes, the
signal that killed the child (SIGSEGV: a segfault), or the exception's type and message; never an empty reason."""

import json

import pytest
import torch

import bench
from autokernel import results
from autokernel.harness import crash, harness, runner

# what a CUDA allocation beyond the GPU raises (torch 2.x's message), as the child's traceback ends with it
CUDA_OOM = ("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
            "1.06 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the "
            "allocated memory 76.50 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but unallocated.")
TRACEBACK = f"""Traceback (most recent call last):
  File "/repo/autokernel/harness/harness.py", line 371, in main
    result = run(args.kernel, args.device, args.quick, seed, args.dtype, timed=not args.no_timing,
  File "/repo/autokernel/harness/perf.py", line 60, in measure
    out = fn(*inputs)
torch.OutOfMemoryError: {CUDA_OOM}
"""
OOM_KERNEL = '''"""A kernel that asks for more memory than any machine has."""

import torch

KERNEL_TYPE = "softmax"


def kernel_fn(x):
    torch.empty(2**62, dtype=torch.uint8, device=x.device)
    return torch.empty_like(x)
'''
SEGFAULT_KERNEL = '''"""A kernel that kills its own process with SIGSEGV (the static check refuses os: unguarded)."""

import os
import signal

import torch

KERNEL_TYPE = "softmax"


def kernel_fn(x):
    os.kill(os.getpid(), signal.SIGSEGV)
    return torch.empty_like(x)
'''
GPU_OOM_LINE = ("out of memory on the GPU (torch.OutOfMemoryError): tried to allocate 20.00 GiB, 1.06 GiB free of "
                "79.19 GiB")


def first_line(text: str) -> str:
    return text.strip().splitlines()[0]


@pytest.mark.usefixtures("warm_launcher")
def test_a_kernel_that_runs_out_of_memory_is_a_crash_naming_it_with_the_sizes(tmp_path, monkeypatch, capsys):
    (tmp_path / "oom.py").write_text(OOM_KERNEL)
    monkeypatch.chdir(tmp_path)
    assert bench.main(["oom.py", "--device", "cpu", "--quick", "--json", "out.json"]) == 1
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["status"] == "crash" and result["failed_stage"] == "smoke"
    reason = first_line(result["reason"])
    assert "kernel_fn ran out of memory on the host (RuntimeError): tried to allocate 4.0 EiB" in reason
    (row,) = results.read_rows(tmp_path / "results.tsv")
    assert row["status"] == "crash" and row["description"] == reason


@pytest.mark.usefixtures("warm_launcher", "unguarded")
def test_a_segfault_is_a_crash_naming_the_signal(tmp_path):
    (tmp_path / "segv.py").write_text(SEGFAULT_KERNEL)
    result = runner.run_bench(tmp_path / "segv.py", device="cpu", quick=True, timeout=120)
    assert result["status"] == "crash"
    assert first_line(result["reason"]) == ("the harness process died: killed by SIGSEGV (a segfault: an invalid "
                                            "memory access)")


def test_a_child_that_died_of_an_exception_is_named_by_its_traceback(tmp_path):
    # the verdict the issue saw, "the harness process died (exit code 1):" with nothing after it, now names the cause
    verdict = runner._read_result(str(tmp_path / "none.json"), 1, False, 60, TRACEBACK.splitlines(True), b"")
    assert verdict["status"] == "crash"
    assert first_line(verdict["reason"]) == f"the harness process died: exit code 1: {GPU_OOM_LINE}"
    assert "Traceback" in verdict["reason"]  # the tail still follows, below the one line
    assert crash.death_cause(-9, "") == "killed by SIGKILL (killed from outside: the system's out-of-memory " \
                                        "killer, or by hand)"
    assert crash.death_cause(3, "") == "exit code 3, and no exception in its error output"
    chained = TRACEBACK + "\nDuring handling of the above exception, another exception occurred:\n\n" \
        "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nValueError: bad block size\n  more\n"
    assert crash.death_cause(1, chained) == "exit code 1: ValueError: bad block size"


class _PassingHarness:
    """Stands in for harness.Harness: every stage passes, and then the timing runs."""
    stage = "timing"

    def run_stages(self):
        return [harness.StageResult(name, True, 1) for name in harness.STAGES]

    def check_integrity(self, when, ignore_threads=False):
        pass


@pytest.mark.parametrize("raised, says", [
    (torch.OutOfMemoryError(CUDA_OOM), f"timing: {GPU_OOM_LINE}"),
    (ValueError("BLOCK must be a power of two\nsecond line"), "timing: ValueError: BLOCK must be a power of two"),
    # a first line that only introduces the cause ("compiling ... failed:") keeps the line it introduces
    (RuntimeError("compiling ak_reduce for sm_90a failed:\n\nreduce.cu(12): error: expected an expression\n(log)"),
     "timing: RuntimeError: compiling ak_reduce for sm_90a failed: reduce.cu(12): error: expected an expression"),
])
def test_what_the_kernel_raises_in_the_timing_is_a_crash_naming_it(monkeypatch, raised, says):
    # outside a checked call (the timing, the model's shapes) an exception once killed the child with exit code 1
    def timing(*args, **kwargs):
        raise raised

    monkeypatch.setattr(harness, "_timing", timing)
    result = {"status": "crash", "correctness": "FAIL", "failed_stage": None, "reason": "", "stages": []}
    verdict = harness._check_and_time(_PassingHarness(), None, result, torch.float16, False, None)
    assert verdict["status"] == "crash" and verdict["failed_stage"] == "timing" and verdict["reason"] == says
