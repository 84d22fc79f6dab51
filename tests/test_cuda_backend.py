"""The CUDA C++ backend: kernels/cuda/<type>.py and autokernel/cuda/cuda_build.py.

Without a GPU: every starter's declarations, its device code compiled by nvcc (where nvcc is present),
the build cache and its lock, compiler errors, the "needs a GPU" result, extract.py --backend cuda and
the builtin agent's view of the tunables, the GPU script's tunable variants. With a GPU (marked gpu): every
starter through the harness; the pipelined GEMM against the single-buffered one and torch at ragged sizes;
flash attention's tensor-core and scalar kernels against SDPA on ragged sequences and head dims.
"""

import inspect
import multiprocessing
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import import_file, wait_for

import reference
from autokernel.cuda import cuda_build
from autokernel.harness.runner import run_bench
from autokernel.kernelfile import declarations
from autokernel.loop.agents.builtin import apply_config, tunable_space
from autokernel.profile.extraction import extract
from autokernel.registry import kernel_types

ROOT = Path(__file__).resolve().parent.parent
# the registered types with a CUDA C++ starter: the nine first types have one; a newer type may have only Triton's
TYPES = [t for t in kernel_types() if (ROOT / "kernels" / "cuda" / f"{t}.py").is_file()]
COMPILE_ARCH = "sm_90a"  # what the H100/H200 machines build for
needs_nvcc = pytest.mark.skipif(cuda_build.nvcc_path() is None, reason="nvcc not found: device code not compiled")



def _starter(type_: str):
    return import_file(ROOT / "kernels" / "cuda" / f"{type_}.py", f"_cuda_starter_{type_}")


@pytest.mark.parametrize("type_", TYPES)
def test_starter_declares_what_the_harness_and_the_agent_read(type_, tmp_path, monkeypatch):
    monkeypatch.setenv(cuda_build.CACHE_ENV, str(tmp_path / "cache"))
    source = (ROOT / "kernels" / "cuda" / f"{type_}.py").read_text()
    decl = declarations(source)
    assert decl["KERNEL_TYPE"] == type_ and decl["BACKEND"] == "cuda"
    space, current = tunable_space(source)
    assert space, "the builtin agent finds no TUNABLES"
    for name, values in space.items():
        assert current[name] in values, f"{name} = {current[name]} is not among its TUNABLES"
    module = _starter(type_)  # importing compiles nothing
    assert not (tmp_path / "cache").exists()
    want = list(inspect.signature(getattr(reference, f"{type_}_ref")).parameters)
    assert list(inspect.signature(module.kernel_fn).parameters) == want


@pytest.mark.parametrize("type_", ["rmsnorm", "matmul"])
def test_a_changed_compile_time_tunable_is_a_new_build_and_an_unchanged_one_is_not(type_, tmp_path):
    source = (ROOT / "kernels" / "cuda" / f"{type_}.py").read_text()
    name = {"rmsnorm": "VEC_BYTES", "matmul": "BLOCK_K"}[type_]
    other = next(v for v in tunable_space(source)[0][name] if v != declarations(source)[name])
    again, changed = tmp_path / "again.py", tmp_path / "changed.py"
    again.write_text(source)
    changed.write_text(apply_config(source, {name: other}))
    hashes = [cuda_build.source_hash(import_file(p, f"_h{i}").cuda_source(), "", COMPILE_ARCH)
              for i, p in enumerate([ROOT / "kernels" / "cuda" / f"{type_}.py", again, changed])]
    assert hashes[0] == hashes[1] != hashes[2]
    assert cuda_build.source_hash("x", "", "sm_90a") != cuda_build.source_hash("x", "", "sm_80")


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("type_", TYPES)
def test_device_code_compiles_and_every_kernel_fits_its_launch_bounds_without_spilling(type_):
    """The H200 round failed with 'too many resources requested for launch' (89 registers x 1024 threads): every
    kernel now states __launch_bounds__, so ptxas must fit it, and a fit that spills to local memory shows here."""
    source = _starter(type_).cuda_source()
    kernels = source.count("__global__")
    assert kernels == source.count("__global__ void __launch_bounds__("), "a kernel without __launch_bounds__"
    usage = cuda_build.resource_usage(type_, source, COMPILE_ARCH)
    assert len(usage) >= kernels, sorted(usage)
    for name, use in usage.items():
        assert use["spill_bytes"] == 0, f"{name} spills {use['spill_bytes']} bytes: {use}"
        assert use["registers"] <= 255 and use["smem_bytes"] <= 48 * 1024, f"{name}: {use}"


@needs_nvcc
def test_a_syntax_error_raises_with_the_compilers_message():
    broken = _starter("reduce").cuda_source().replace("const A total =", "const A total = ;", 1)
    with pytest.raises(cuda_build.CudaBuildError) as caught:
        cuda_build.compile_only("reduce", broken, COMPILE_ARCH)
    assert "error" in str(caught.value) and "expected an expression" in str(caught.value)
    assert "reduce.cu" in str(caught.value)



def test_the_compilers_diagnostic_comes_before_the_build_tools_lines_that_mention_an_error():
    # torch's load_inline log as ninja writes it: its "Error building extension" line quotes the whole nvcc
    # command, and a verdict keeps one line of the message, which must be the diagnostic
    log = ("Error building extension 'ak_reduce': [1/3] /usr/local/cuda/bin/nvcc -DTORCH -c /c/cuda.cu -o cuda.o\n"
           "FAILED: cuda.o\n/usr/local/cuda/bin/nvcc -DTORCH -c /c/cuda.cu -o cuda.o\n"
           "/c/cuda.cu(12): error: expected an expression\n\n1 error detected in the compilation of \"/c/cuda.cu\".\n"
           "ninja: build stopped: subcommand failed.\n")
    lines = cuda_build.compiler_errors(log).splitlines()
    assert lines[0] == "/c/cuda.cu(12): error: expected an expression"
    assert not any(line.startswith("/usr/local/cuda/bin/nvcc") for line in lines)

def _fake_build(build_dir: str, counter: str):
    """One of two processes building the same source. This one, forked, notes each time it finds the build
    lock held; the builder (whichever process got the lock) finishes only once the other has found it held,
    so the second process surely arrives mid-build."""
    waited = Path(counter + ".waited")
    flock = cuda_build.fcntl.flock

    def noting_flock(fd, operation):
        try:
            return flock(fd, operation)
        except BlockingIOError:
            waited.touch()
            raise

    cuda_build.fcntl.flock = noting_flock  # in this forked process only

    def builder(directory: Path) -> Path:
        with open(counter, "a") as f:
            f.write("build\n")
        wait_for(waited.exists, 30, "the other process to find the build lock held")
        lib = directory / "lib.so"
        lib.write_text("whole library")
        return lib
    lib = cuda_build.cached_build(Path(build_dir), builder)
    assert lib.read_text() == "whole library"


def test_concurrent_builds_of_one_source_build_once_and_leave_a_whole_cache(tmp_path):
    build_dir, counter = tmp_path / "ak_x_0123", tmp_path / "count"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_fake_build, args=(str(build_dir), str(counter))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert (tmp_path / "count.waited").exists()  # one process found the lock held while the other built
    assert counter.read_text() == "build\n"  # the second process waited for the first and reused its build
    assert (build_dir / "built.json").is_file() and (build_dir / "lib.so").read_text() == "whole library"


def test_a_build_killed_halfway_is_redone_and_a_held_lock_times_out(tmp_path):
    build_dir = tmp_path / "ak_y_4567"
    build_dir.mkdir()
    (build_dir / "lib.so").write_text("half")  # no built.json: a killed build
    (build_dir / "lock").write_text("")  # torch's stale FileBaton, which would hang load_inline

    def builder(directory: Path) -> Path:
        (directory / "lib.so").write_text("whole")
        return directory / "lib.so"

    lib = cuda_build.cached_build(build_dir, builder)
    assert lib.read_text() == "whole" and not (build_dir / "lock").exists()
    with cuda_build.file_lock(tmp_path / "held.lock"):
        ctx = multiprocessing.get_context("fork")
        waiter = ctx.Process(target=_hold_expecting_timeout, args=(str(tmp_path / "held.lock"),))
        waiter.start()
        waiter.join(30)
    assert waiter.exitcode == 0


def _hold_expecting_timeout(path: str):
    try:
        with cuda_build.file_lock(Path(path), timeout_s=0.5):
            sys.exit(1)
    except cuda_build.CudaBuildError as e:
        sys.exit(0 if "held for over" in str(e) else 2)


@pytest.mark.skipif(torch.version.cuda is not None, reason="this torch can build CUDA extensions")
def test_building_with_a_cpu_torch_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv(cuda_build.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(cuda_build.ARCH_ENV, COMPILE_ARCH)
    with pytest.raises(cuda_build.CudaBuildError, match="CPU build"):
        cuda_build.load("reduce", _starter("reduce").cuda_source(), _starter("reduce").PROTOTYPES)


def test_inputs_the_launchers_cannot_take_are_refused_not_converted():
    with pytest.raises(TypeError, match="float64"):
        cuda_build.dtype_code(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(TypeError, match="one dtype"):
        cuda_build.check_dtypes(torch.zeros(2, dtype=torch.float16), torch.zeros(2))
    assert cuda_build.binding_source(["void f_launch(int a, int64_t b)"]).count('m.def("f_launch", &f_launch)') == 1


@pytest.mark.slow
def test_a_cuda_kernel_benched_on_the_cpu_is_a_clear_needs_a_gpu_result(tmp_path, warm_launcher):
    result = run_bench(ROOT / "kernels" / "cuda" / "softmax.py", device="cpu", timed=False, timeout=120)
    assert result["status"] == "fail" and result["failed_stage"] == "device"
    assert result["reason"].startswith("needs a GPU: softmax.py is a CUDA C++ kernel")
    out = subprocess.run([sys.executable, "bench.py", "kernels/cuda/softmax.py", "--device", "cpu", "--no-log"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "correctness: FAIL (device: needs a GPU" in out.stdout


def test_extract_with_the_cuda_backend_writes_cuda_starters_with_the_models_shapes(tmp_path):
    plan = {"model": "TinyModel", "input_shape": [2, 64], "dtype": "float16", "entries": [
        {"type": "rmsnorm", "rank": 1, "f": 0.3, "shapes": [{"shape": {"M": 128, "N": 768}, "time_us": 5.0}]},
        {"type": "matmul", "rank": 2, "f": 0.2, "shapes": [{"shape": {"M": 128, "N": 3072, "K": 768}}]}]}
    written = extract(plan, top=2, backend="cuda", out_dir=tmp_path, root=ROOT)
    assert [w.path.name for w in written] == ["01_rmsnorm.py", "02_matmul.py"]
    decl = declarations(written[1].path.read_text())
    assert decl["BACKEND"] == "cuda" and decl["MODEL_SHAPES"] == [{"M": 128, "N": 3072, "K": 768}]
    assert "CUDA_SRC" in written[0].path.read_text()


def _gpu_script():
    return import_file(ROOT / "scripts" / "gpu_cuda.py", "_gpu_cuda_script")


def test_the_gpu_scripts_variants_change_real_tunables_and_bad_ones_are_refused(tmp_path):
    script = _gpu_script()
    files = script.write_variants(list(script.VARIANTS), script.VARIANTS, tmp_path)
    for type_, pairs in files.items():
        assert pairs[0] == ({}, ROOT / "kernels" / "cuda" / f"{type_}.py")
        for config, path in pairs[1:]:
            decl = declarations(path.read_text())
            assert all(decl[name] == value for name, value in config.items()), (type_, config)
    assert script.parse_variants(["matmul:STAGES=4,BLOCK_K=64"]) == {"matmul": [{"STAGES": 4, "BLOCK_K": 64}]}
    for bad in ["matmul:STAGES", "nope:X=1", "matmul"]:
        with pytest.raises(ValueError):
            script.parse_variants([bad])
    with pytest.raises(ValueError, match="no tunables"):
        script.write_variants(["matmul"], {"matmul": [{"NOT_A_TUNABLE": 1}]}, tmp_path)


# ------------------------------------------------------------------------------------------ GPU only
@pytest.mark.gpu
@pytest.mark.parametrize("type_", TYPES)
def test_every_cuda_starter_passes_the_five_stages_on_a_gpu(type_):
    result = run_bench(ROOT / "kernels" / "cuda" / f"{type_}.py", device="cuda", timed=False)
    assert result["status"] == "pass", f"{result['status']} at {result.get('failed_stage')}: {result['reason']}"


@pytest.mark.gpu
def test_a_kernel_that_does_not_compile_is_a_crash_row_with_the_compilers_message(tmp_path):
    source = (ROOT / "kernels" / "cuda" / "reduce.py").read_text()
    broken = tmp_path / "broken_reduce.py"
    broken.write_text(source.replace("const A total =", "const A total = ;", 1))
    result = run_bench(broken, device="cuda", timed=False, timeout=240)
    assert result["status"] == "crash" and "CudaBuildError" in result["reason"]
    assert "expected an expression" in result["reason"]


def _reload(type_: str, **tunables):
    """A fresh module of a starter with some tunables changed (its own build)."""
    source = (ROOT / "kernels" / "cuda" / f"{type_}.py").read_text()
    path = Path(tempfile.mkdtemp(prefix="ak-cuda-test-")) / f"{type_}.py"
    path.write_text(apply_config(source, tunables))
    return import_file(path, f"_{type_}_{'_'.join(f'{k}{v}' for k, v in tunables.items())}")


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [0, 2, 3])
def test_the_pipelined_and_the_single_buffered_gemm_agree_with_torch_at_ragged_edges(stages):
    module = _reload("matmul", STAGES=stages)
    for m, n, k in [(1, 8, 8), (130, 264, 72), (257, 136, 1000), (64, 128, 32)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        for b in (torch.randn(k, n, device="cuda", dtype=torch.float16),
                  torch.randn(n, k, device="cuda", dtype=torch.float16).t()):  # nn.Linear's weight, transposed
            want = (a.float() @ b.float())
            torch.testing.assert_close(module.kernel_fn(a, b).float(), want, atol=0.05 * k ** 0.5, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("tensor_cores", [0, 1])
def test_flash_attention_tensor_cores_and_scalar_agree_with_sdpa_on_ragged_sequences(tensor_cores):
    module = _reload("flash_attention", TENSOR_CORES=tensor_cores)
    for dtype in (torch.float16, torch.bfloat16):
        for seq, dim, causal in [(1, 64, True), (100, 128, True), (257, 64, False), (130, 80, True)]:
            q, k, v = (torch.randn(2, 3, seq, dim, device="cuda", dtype=dtype) for _ in range(3))
            want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            got = module.kernel_fn(q, k, v, causal=causal)
            torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
