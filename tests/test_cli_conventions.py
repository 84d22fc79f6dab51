"""The five scripts' shared conventions (autokernel/cli.py), as a user meets them on a CPU: bad input is
one line `<script>: error: ...` on stderr and exit code 2, --debug shows the traceback, and every
--help shows its defaults. Each case fails before a model is loaded or a kernel is run."""

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autokernel.cli import HelpFormatter

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ("bench.py", "extract.py", "profile.py", "verify.py", "orchestrate.py")
LLAMA = str(ROOT / "models" / "llama.py")
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # "a GPU asked for where there is none", on any machine


def run_script(script, *args, cwd):
    return subprocess.run([sys.executable, str(ROOT / script), *args], cwd=cwd, env=NO_GPU,
                          capture_output=True, text=True, timeout=120)


BAD_INPUT = [  # (script, arguments, what the line names)
    ("bench.py", ["--device", "gpu"], "invalid choice: 'gpu'"),
    ("bench.py", ["--quick", "--bogus"], "unrecognized arguments: --bogus"),
    ("bench.py", ["nowhere.py"], "kernel file not found: nowhere.py"),
    ("bench.py", [str(ROOT / "kernel.py"), "--dtype", "fp8"], "unknown dtype 'fp8'"),
    ("bench.py", [str(ROOT / "kernel.py"), "--device", "cuda", "--no-log"], "no CUDA GPU is visible"),
    ("extract.py", ["--backend", "ptx"], "invalid choice: 'ptx'"),
    ("extract.py", ["--top", "0"], "--top must be at least 1"),
    ("extract.py", ["--plan", "nowhere.json"], "plan not found: nowhere.json"),
    ("profile.py", ["--class-name", "X"], "give either --model FILE or --module PACKAGE"),
    ("profile.py", ["--model", "nowhere.py", "--class-name", "X"], "model file not found: nowhere.py"),
    ("profile.py", ["--model", LLAMA, "--class-name", "LlamaModel", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    ("profile.py", ["--model", LLAMA, "--class-name", "LlamaModel", "--device", "cuda"], "no CUDA GPU is visible"),
    ("verify.py", ["--model", LLAMA, "--class-name", "LlamaModel", "--device", "tpu"], "invalid choice: 'tpu'"),
    ("verify.py", ["--model", "nowhere.py", "--class-name", "X"], "model file not found: nowhere.py"),
    ("verify.py", ["--model", LLAMA, "--class-name", "LlamaModel", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    ("verify.py", ["--model", LLAMA, "--class-name", "LlamaModel", "--device", "cuda"], "no CUDA GPU is visible"),
    ("verify.py", ["--model", LLAMA, "--class-name", "LlamaModel", "--config", "tiny", "--input-shape", "1,8",
                   "--device", "cpu", "--types", "bogus", "--report", "v.json"], "kernel type(s) bogus"),
    ("verify.py", ["--model", LLAMA, "--class-name", "LlamaModel", "--checks", "0", "--report", "v.json"],
     "--checks must be at least 1"),
    ("verify.py", ["--model", LLAMA, "--class-name", "LlamaModel", "--export", "out", "--package-name", "my-kernels",
                   "--report", "v.json"], "--package-name 'my-kernels' is not a Python identifier"),
    ("bench.py", [str(ROOT / "kernel.py"), "--timeout", "-1"], "--timeout must be more than 0"),
    ("bench.py", [str(ROOT / "kernel.py"), "--json", "nowhere/out.json"], "--json nowhere/out.json: no such directory"),
    ("orchestrate.py", ["run", "--device", "gpu"], "invalid choice: 'gpu'"),
    ("orchestrate.py", ["--repo", ".", "run", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    ("orchestrate.py", ["--repo", ".", "run", "--kernel", "nowhere.py", "--device", "cpu"],
     "kernel file not found"),
]


@pytest.mark.parametrize("script, args, message", BAD_INPUT, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, script, args, message):
    r = run_script(script, *args, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert re.match(rf"{re.escape(script)}( \w+)?: error: ", lines[0]) and message in lines[0], lines[0]
    assert not (tmp_path / "results.tsv").exists()


def test_orchestrate_run_without_a_gpu_stops_before_any_branch_or_commit(tmp_path):
    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    git("init", "-q", "-b", "main")
    (tmp_path / "kernel.py").write_text("KERNEL_TYPE = 'rmsnorm'\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    head = git("rev-parse", "HEAD")
    r = run_script("orchestrate.py", "--repo", str(tmp_path), "run", "--kernel", "kernel.py", "--device", "cuda",
                   cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("orchestrate.py: error: --device cuda"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert git("rev-parse", "HEAD") == head and git("branch", "--list").split() == ["*", "main"]
    assert not (tmp_path / "results.tsv").exists()


@pytest.mark.parametrize("args", [["--debug", "run", "--dtype", "fp8"], ["run", "--dtype", "fp8", "--debug"]])
def test_debug_shows_the_traceback(tmp_path, args):
    r = run_script("orchestrate.py", "--repo", ".", *args, cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr and "UsageError: unknown dtype 'fp8'" in r.stderr
    r = run_script("extract.py", "--plan", "nowhere.json", "--debug", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr and "plan not found" in r.stderr


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"_cli_{name[:-3]}", ROOT / name)  # not as `profile`
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parsers(parser):
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from parsers(sub)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_help_shows_its_defaults_and_the_shared_spellings(tmp_path, script):
    r = run_script(script, "--help", cwd=tmp_path)
    assert r.returncode == 0 and "--debug" in r.stdout
    for prog, parser in parsers(load_script(script).build_parser()):
        formatter = HelpFormatter(prog)
        for action in parser._actions:
            default = action.default
            if any(default is v for v in (None, False, argparse.SUPPRESS)) or default == "" or action.help is None:
                continue
            assert "default" in formatter._get_help_string(action), (prog, action.dest)
        helps = {a.dest: a for a in parser._actions}
        if "device" in helps:
            assert helps["device"].choices == ("auto", "cpu", "cuda") and helps["device"].default == "auto"
        if "dtype" in helps:
            assert "fp16 | bf16 | fp32" in helps["dtype"].help


def test_orchestrate_run_help_shows_the_loop_defaults(tmp_path):
    text = " ".join(run_script("orchestrate.py", "run", "--help", cwd=tmp_path).stdout.split())
    for shown in ("(default: builtin)", "(default: 5)", "(default: 2.0)", "(default: 1.0)",
                  "(default 120 on a GPU, 600 on the CPU)", "(default auto)", "(default fp16)"):
        assert shown in text


PROFILE = ["--model", LLAMA, "--class-name", "LlamaModel", "--config", "tiny", "--input-shape", "1,8", "--device",
           "cpu"]


@pytest.mark.parametrize("args, message", [
    (["--types", "softmaxx,softmaxx"], "--types: unknown kernel type(s) softmaxx; known: "),
    (["--steps", "0"], "--steps must be more than 0, got 0"),
])
def test_profile_with_bad_input_keeps_the_plan_extract_recorded(tmp_path, args, message):
    out = tmp_path / "workspace"
    out.mkdir()
    plan = {"source": LLAMA, "class_name": "LlamaModel", "entries": [
        {"type": "rmsnorm", "rank": 1, "f": 0.2, "kernel_file": "workspace/kernels/01_rmsnorm.py"}]}
    (out / "plan.json").write_text(json.dumps(plan, indent=2))
    (out / "profile.json").write_text("{}\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    r = run_script("profile.py", *PROFILE, "--output-dir", str(out), *args, cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("profile.py: error: "), r.stderr
    assert message in lines[0] and lines[0].count("softmaxx") <= 1  # each bad type named once
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # byte for byte, and nothing new


def test_verify_names_a_bad_type_once_and_keeps_its_last_report(tmp_path):
    report = tmp_path / "verify.json"
    report.write_text('{"kept": true}\n')
    r = run_script("verify.py", *PROFILE, "--types", "rmsnorm,softmaxx,softmaxx", "--report", str(report),
                   cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].count("softmaxx") == 1, r.stderr
    assert report.read_text() == '{"kept": true}\n'
