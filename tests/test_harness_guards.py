"""The harness catches each way a kernel can be wrong or cheat, and says which stage and why.

Every candidate below is kernels/rmsnorm.py with one defect planted, run through the real harness in
a child process (CPU mode, Triton's interpreter), forked from the warm launcher the test run shares.
"""

from pathlib import Path

import pytest

from autokernel.harness.runner import run_bench

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("warm_launcher")
STARTER = (ROOT / "tests" / "fixtures" / "honest_rmsnorm.py").read_text()


def planted(tmp_path, old: str, new: str, count: int = 1) -> Path:
    assert STARTER.count(old) >= count, f"the starter no longer contains {old!r}"
    path = tmp_path / "candidate.py"
    path.write_text(STARTER.replace(old, new))
    return path


def bench(path, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("timed", False)
    return run_bench(path, **kw)


# The guards that depend on the device (NaN-filled allocations, the dispatcher watch, a hang, a crash)
# run on the GPU too when there is one.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


LAUNCH = "    return out.view(x.shape)\n"


@pytest.mark.slow
def test_honest_starter_passes_all_five_stages_and_is_timed():
    result = bench(ROOT / "tests" / "fixtures" / "honest_rmsnorm.py", timed=True)
    assert result["status"] == "pass", result["reason"] + result["stderr_tail"]
    assert [s["name"] for s in result["stages"]] == ["smoke", "shape_sweep", "stability", "determinism",
                                                     "edge_cases"]
    assert all(s["passed"] for s in result["stages"])
    assert result["latency_us"] > 0 and result["eager_us"] > 0
    assert "not a performance figure" in result["log"]


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compute_inside_kernel_fn_is_rejected(tmp_path, device):
    path = planted(tmp_path, LAUNCH, "    xf = x.float()\n"
                   "    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight\n")
    result = bench(path, device=device)
    assert result["status"] == "fail" and result["failed_stage"] == "smoke"
    assert "hands the work to PyTorch" in result["reason"] and "aten.pow" in result["reason"]


def test_importing_the_reference_is_rejected(tmp_path):
    path = planted(tmp_path, "import torch\n", "import torch\nimport reference\n")
    result = bench(path)
    assert result["failed_stage"] == "guard" and "imports reference" in result["reason"]


@pytest.mark.parametrize("device", DEVICES)
def test_cached_output_is_rejected(tmp_path, device):
    path = planted(tmp_path, "def kernel_fn(x, weight, eps=1e-6):\n",
                   "_CACHE = {}\n\n\ndef kernel_fn(x, weight, eps=1e-6):\n"
                   "    key = (x.data_ptr(), tuple(x.shape))\n"
                   "    if key in _CACHE:\n        return _CACHE[key].clone()\n")
    path.write_text(path.read_text().replace(LAUNCH, "    _CACHE[key] = out.view(x.shape)\n" + LAUNCH))
    result = bench(path, device=device)
    assert result["failed_stage"] == "smoke"
    assert "refilled with new values" in result["reason"]


@pytest.mark.parametrize("device", DEVICES)
def test_unwritten_output_elements_are_rejected(tmp_path, device):
    # the grid misses the last row: its elements keep whatever the allocator left there
    path = planted(tmp_path, "grid = (triton.cdiv(m, ROWS_PER_PROGRAM),)", "grid = (max(1, m - 1),)")
    result = bench(path, device=device)
    assert result["status"] == "fail"
    assert "NaN where the reference is finite" in result["reason"]


@pytest.mark.parametrize("device", DEVICES)
def test_output_aliasing_an_input_is_rejected(tmp_path, device):
    path = planted(tmp_path, "out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)",
                   "out = x2 if x2.is_contiguous() else torch.empty(x2.shape, dtype=x.dtype, device=x.device)")
    result = bench(path, device=device)
    assert result["failed_stage"] == "smoke" and "shares memory with input 0" in result["reason"]


def test_wrong_values_fail_the_smoke_stage_with_error_sizes(tmp_path):
    path = planted(tmp_path, "(x * rstd * w)", "(x * rstd * w * 1.05)", count=2)
    result = bench(path)
    assert result["failed_stage"] == "smoke"
    for word in ("max_abs", "max_rel", "elements off", "fp32"):
        assert word in result["reason"]


def test_a_dtype_specific_bug_fails_the_shape_sweep(tmp_path):
    # bf16 outputs forget the weight: right in fp32 and fp16, wrong in bf16 only
    path = planted(tmp_path, "w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)",
                   "w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)\n"
                   "                if out_ptr.dtype.element_ty == tl.bfloat16:\n"
                   "                    w = w * 0 + 1")
    result = bench(path)
    assert result["failed_stage"] == "shape_sweep" and "bf16" in result["reason"]


def test_dropping_eps_fails_the_stability_stage(tmp_path):
    path = planted(tmp_path, "/ N + eps)", "/ N)", count=2)
    result = bench(path)
    assert result["failed_stage"] == "stability" and "near_zero" in result["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_order_dependent_results_fail_the_determinism_stage(tmp_path, device):
    # every other call takes the looped variant: another summation order, other rounding. A sum
    # rounded differently changes rstd only now and then (at 16 rows, fp16 and fp32 outputs both came
    # out equal in ~6% of seeds), so the looped variant also multiplies in another order, which
    # changes the fp32 output of every row.
    path = planted(tmp_path, "def kernel_fn(x, weight, eps=1e-6):\n",
                   "_CALLS = [0]\n\n\ndef kernel_fn(x, weight, eps=1e-6):\n"
                   "    _CALLS[0] += 1\n    global VARIANT, CHUNK\n"
                   "    VARIANT, CHUNK = ('looped', 256) if _CALLS[0] % 2 else ('single_pass', 4096)\n")
    looped_store = " " * 20 + "tl.store(out_row + cols, (x * rstd * w)"
    source = path.read_text()
    assert source.count(looped_store) == 1, "the looped variant's store moved"
    path.write_text(source.replace(looped_store, looped_store.replace("x * rstd * w", "x * (rstd * w)")))
    result = bench(path, device=device)
    assert result["failed_stage"] == "determinism" and "differs bitwise" in result["reason"]


@pytest.mark.slow
def test_ignoring_the_row_stride_fails_the_edge_stage(tmp_path):
    path = planted(tmp_path, "x2.stride(0), out.stride(0)", "n, out.stride(0)")
    result = bench(path)
    assert result["failed_stage"] == "edge_cases" and "non-contiguous" in result["reason"]


def test_outputs_of_timed_runs_are_checked():
    # A kernel fast only on inputs it has seen returns a remembered answer during timing.
    import torch

    from autokernel.harness import checking, perf, timing
    from autokernel.registry import get_spec

    spec = get_spec("rmsnorm")
    gen = torch.Generator().manual_seed(0)
    sets = [spec.make_inputs({"M": 8, "N": 64}, torch.float16, "cpu", gen) for _ in range(2)]
    stale = spec.reference(*sets[0])
    timed = timing.Timing(1.0, [1.0], checked=[(sets[0], sets[0], stale.clone()), (sets[1], sets[1], stale)])
    with pytest.raises(checking.CheckFailed, match="output of a timed run"):
        perf._check_timed_outputs(None, spec, sets, timed)


@pytest.mark.slow(10)
@pytest.mark.parametrize("device", DEVICES)
def test_a_hang_is_a_timeout_within_the_limit(tmp_path, device):
    path = planted(tmp_path, "def kernel_fn(x, weight, eps=1e-6):\n",
                   "def kernel_fn(x, weight, eps=1e-6):\n    while True:\n        pass\n")
    # the runner's own kill, not the zygote's: a fresh child starts in ~4 s, then hangs in kernel_fn until the limit
    result = bench(path, device=device, timeout=10, warm=False)
    assert result["status"] == "timeout" and result["wall_s"] < 25 and result["launcher"] == "fresh"


@pytest.mark.slow
def test_a_segfault_is_a_crash_with_its_signal(tmp_path):
    # a store 1 TB past the output: the interpreter's raw memory access kills the child with SIGSEGV
    path = planted(tmp_path, "out_row = out_ptr + row * stride_out", "out_row = out_ptr + row * stride_out + (1 << 40)")
    result = bench(path, warm=False)  # a fresh child's death (tests/test_zygote.py: a forked child's)
    assert result["status"] == "crash" and result["reason"].startswith(
        "the harness process died: killed by SIGSEGV (a segfault")


def test_an_exception_is_a_crash_with_its_error(tmp_path):
    path = planted(tmp_path, "def kernel_fn(x, weight, eps=1e-6):\n",
                   "def kernel_fn(x, weight, eps=1e-6):\n    raise RuntimeError('launcher failed')\n")
    result = bench(path)
    assert result["status"] == "crash" and "kernel_fn raised RuntimeError: launcher failed" in result["reason"]


@pytest.mark.gpu
def test_an_illegal_memory_access_on_the_gpu_is_a_crash_not_a_dead_harness(tmp_path):
    path = planted(tmp_path, "out_row = out_ptr + row * stride_out", "out_row = out_ptr + row * stride_out + (1 << 40)")
    result = bench(path, device="cuda")
    assert result["status"] == "crash" and result["failed_stage"] == "smoke"


def test_the_roofline_guard_rejects_impossible_speed(monkeypatch):
    from autokernel.harness import checking, gpu, perf

    monkeypatch.setattr(gpu, "device_name", lambda device="cuda": "NVIDIA H100 80GB HBM3")
    # 268 MB in 10 us would be 26,800 GB/s on a 3,350 GB/s part
    with pytest.raises(checking.CheckFailed, match="faster than the roofline allows"):
        perf._roofline_guard(10e-6, 268_435_456, 1)
    perf._roofline_guard(100e-6, 268_435_456, 1)  # 2,684 GB/s: possible
