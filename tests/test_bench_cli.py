"""bench.py as a user runs it: exit codes, the summary block, results.tsv rows, clear errors on bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import bench
from autokernel import results

ROOT = Path(__file__).resolve().parent.parent
STARTER = (ROOT / "tests" / "fixtures" / "honest_rmsnorm.py").read_text()


def run_bench_py(cwd, *args):
    return subprocess.run([sys.executable, str(ROOT / "bench.py"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow(15)
@pytest.mark.usefixtures("warm_launcher")
def test_a_correct_kernel_exits_0_prints_key_values_and_logs_one_row(tmp_path, monkeypatch):
    (tmp_path / "kernel.py").write_text(STARTER)
    first = run_bench_py(tmp_path, "--device", "cpu", "--quick", "--json", "out.json", "--tag", "t1")
    assert first.returncode == 0, first.stdout + first.stderr
    summary = first.stdout.split("\n---\n", 1)[1]
    values = dict(line.split(": ", 1) for line in summary.splitlines() if ": " in line)
    assert values["correctness"] == "PASS" and values["kernel_type"] == "rmsnorm"
    for key in ("latency_us", "throughput_tflops", "bandwidth_gb_s", "pct_peak", "speedup_vs_pytorch",
                "speedup_vs_compile"):
        assert key in values
    assert json.loads((tmp_path / "out.json").read_text())["status"] == "pass"

    monkeypatch.chdir(tmp_path)  # the second run through bench.py's main here, forked from the warm launcher
    assert bench.main(["--device", "cpu", "--quick"]) == 0
    text = (tmp_path / "results.tsv").read_text()
    assert text.count("experiment\ttimestamp") == 1  # header once
    assert all(len(line.split("\t")) == len(results.COLUMNS) for line in text.splitlines())
    rows = results.read_rows(tmp_path / "results.tsv")
    assert [r["experiment"] for r in rows] == ["1", "2"]
    assert rows[0]["status"] == "pass" and rows[0]["correctness"] == "PASS" and rows[0]["tag"] == "t1"
    assert float(rows[0]["latency_us"]) > 0


def test_a_missing_kernel_file_is_one_clear_error_and_no_row(tmp_path):
    proc = run_bench_py(tmp_path, "nowhere.py", "--device", "cpu")
    assert proc.returncode == 2
    assert "kernel file not found: nowhere.py" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "results.tsv").exists()


@pytest.mark.parametrize("source, message", [
    (STARTER.replace("def kernel_fn(x, weight, eps=1e-6):", "def kernel_fn(x, weight, eps=1e-6)"),
     "syntax error in candidate.py line"),
    (STARTER.replace("def kernel_fn(x, weight, eps=1e-6):", "def kernel_fn(x, w, eps=1e-6):"),
     "kernel_fn(x, w, eps) does not match rmsnorm_ref(x, weight, eps)"),
    (STARTER.replace("import torch\n", "import torch\nimport triton.not_a_module\n", 1),
     "ModuleNotFoundError"),
])
@pytest.mark.usefixtures("warm_launcher")
def test_bad_kernel_files_are_a_crash_row_with_the_reason(tmp_path, monkeypatch, capsys, source, message):
    # bench.py's main in this process (the test above runs the script itself): its harness child forks from
    # the run's warm launcher instead of starting a fresh Python for each file
    (tmp_path / "candidate.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    assert bench.main(["candidate.py", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert message in out
    assert "correctness: FAIL (crash:" in out
    (row,) = results.read_rows(tmp_path / "results.tsv")
    assert row["status"] == "crash" and row["correctness"] == "FAIL"


@pytest.mark.parametrize("source, message", [
    (STARTER.replace('KERNEL_TYPE = "rmsnorm"', ""), 'does not declare KERNEL_TYPE = "<type>"'),
    (STARTER.replace('KERNEL_TYPE = "rmsnorm"', 'KERNEL_TYPE = "rmsnrom"'), "unknown kernel type 'rmsnrom'"),
])
@pytest.mark.usefixtures("warm_launcher")
def test_a_file_of_no_known_type_is_bad_input_exit_2_and_no_row(tmp_path, monkeypatch, capsys, source, message):
    # nothing to bench it against: not an experiment (the type is known only once the file is imported, in the
    # child, since a file may register a type of its own)
    (tmp_path / "candidate.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    assert bench.main(["candidate.py", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench.py: error: ") and message in err[0]
    assert err[0].count("rmsnrom") <= 1
    assert not (tmp_path / "results.tsv").exists()


@pytest.mark.parametrize("args, message", [(["--timeout", "0"], "--timeout must be more than 0"),
                                           (["--types", "softmax"], "--types chooses the kernel types of --suite")])
def test_bad_options_are_exit_2_and_no_row(tmp_path, monkeypatch, capsys, args, message):
    (tmp_path / "kernel.py").write_text(STARTER)
    monkeypatch.chdir(tmp_path)
    assert bench.main(["--device", "cpu", *args]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "results.tsv").exists()


def test_asking_for_a_gpu_that_is_not_there_is_a_clear_error(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    (tmp_path / "kernel.py").write_text(STARTER)
    proc = run_bench_py(tmp_path, "--device", "cuda")
    assert proc.returncode == 2 and "no CUDA GPU is visible" in proc.stderr


def test_help_explains_the_command():
    proc = subprocess.run([sys.executable, str(ROOT / "bench.py"), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    for flag in ("--quick", "--device", "--json", "--timeout", "--no-log"):
        assert flag in proc.stdout
