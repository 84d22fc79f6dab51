"""What several test modules share: a copy of the project in a fresh git repository, `orchestrate.py run`
on it, the check that its branch matches results.tsv, the process tree of a run, waiting on an event, reading
printed output, importing a file as a module, a kernel file's launches compiled for a GPU target with no device;
the ops torch.compile traces of an optimized HF model, a tiny Gemma-2;
the loop's stand-in harness and repositories (FakeBench), and a chat endpoint on loopback.

Test modules import these from here (tests/ is on sys.path while pytest runs), never from each other.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from autokernel import results
from autokernel.loop.gitlog import GitLog

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ["reference.py", "bench.py", "orchestrate.py", "program.md", ".gitignore", "pyproject.toml",
           "kernel.py", "kernels/rmsnorm.py"]
IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t"}
RUN_LIMIT_S = 300  # one orchestrate.py run in these tests
POLL_S = 0.05  # how often a barrier looks again
TOKEN_IDS = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))  # tiny HF models' input


def import_file(path: Path, name: str):
    """The Python file at `path` as a module named `name` (a script, a model file, a kernel), not put in
    sys.modules."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOPPER = ("cuda", 90, 32)  # the GPU machine's target: compute capability 9.0, 32-thread warps


def compiled_for(target: tuple, jobs: list[tuple], args_of: str, kernels_named: str = "") -> list[list[dict]]:
    """The @triton.jit launches kernel_fn makes, compiled for a GPU target (backend, capability, warp size) on this
    CPU-only machine (Triton's compiler and its bundled ptxas need no device): per job (a kernel file, module
    constants to set first), per launch of a kernel whose name ends with `kernels_named`, its name, metadata
    (global_scratch_size, shared) and grid (a tuple's, else None). The launches are recorded, not run, in one fresh
    Python without the interpreter (a process's @triton.jit functions are all interpreted or none). args_of:
    "module:function" that gives kernel_fn's arguments from the module."""
    code = "import sys, json, helpers; print(json.dumps(helpers._compile_launches(*json.loads(sys.argv[1]))))"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    jobs = [(str(path), setup) for path, setup in jobs]
    done = subprocess.run([sys.executable, "-c", code, json.dumps([list(target), jobs, args_of, kernels_named])],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def _compile_launches(target: list, jobs: list, args_of: str, kernels_named: str) -> list[list[dict]]:
    import importlib

    from autokernel import compat
    from autokernel.kernelfile import import_kernel
    from autokernel.ops import launchers

    where, name = args_of.split(":")
    args_for = getattr(importlib.import_module(where), name)
    found = []
    for kernel_file, setup in jobs:
        module = import_kernel(kernel_file)
        for constant, value in setup.items():
            setattr(module, constant, value)
        launches = []

        def record(kernel, grid, kernel_args, kwargs, launches=launches):
            options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
            bound = dict(zip(kernel.arg_names, compat.launch_arguments(kernel, kernel_args, kwargs)))
            launches.append((kernel, bound, options, grid))

        args = args_for(module)  # before the namespace is copied: it may set module constants too
        launchers.rebound(module.kernel_fn, compat.is_jit_kernel,
                          lambda k, record=record: launchers.Intercepted(k, record))(*args)
        compiled = [(kernel, compat.compile_for(tuple(target), kernel, bound, options), grid)
                    for kernel, bound, options, grid in launches if kernel.__name__.endswith(kernels_named)]
        found.append([{"kernel": kernel.__name__, "global_scratch_size": k.metadata.global_scratch_size,
                       "shared": k.metadata.shared, "grid": list(grid) if isinstance(grid, (tuple, list)) else None}
                      for kernel, k, grid in compiled])
    return found


def starter_source(kernel_type: str, old: str | None = None, new: str | None = None) -> str:
    """The shipped starter kernels/<type>.py, with `old` replaced by `new` (a planted change) if given."""
    source = (ROOT / "kernels" / f"{kernel_type}.py").read_text()
    if old is not None:
        assert old in source, "the planted change no longer fits the starter"
        source = source.replace(old, new)
    return source


def bench_planted(tmp_path: Path, kernel_type: str, old: str, new: str) -> dict:
    """The harness's verdict (CPU, untimed) on the shipped starter with `old` replaced by `new` (a planted bug)."""
    from autokernel.harness.runner import run_bench

    path = tmp_path / f"{kernel_type}.py"
    path.write_text(starter_source(kernel_type, old, new))
    return run_bench(path, device="cpu", timed=False)


def compiled_ops(optimized, model, ids) -> list[str]:
    """The targets of the call_function nodes torch.compile traces of an optimized HF causal LM (whole: fullgraph,
    on a backend that records its graphs), having checked its logits against the original model's."""
    graphs = []

    def backend(gm, example):
        graphs.append(gm)
        return gm.forward

    got = torch.compile(optimized, backend=backend, fullgraph=True)(ids, use_cache=False).logits
    torch.testing.assert_close(got, model(ids, use_cache=False).logits, atol=1e-4, rtol=1e-4)
    return [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]


def tiny_gemma2(implementation: str = "eager"):
    """A seeded two-layer HF Gemma-2: a sliding window on every other layer, soft-capped logits."""
    import transformers

    torch.manual_seed(0)
    config = transformers.Gemma2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                                       sliding_window=8, attn_logit_softcapping=2.0, query_pre_attn_scalar=16,
                                       attn_implementation=implementation)
    return transformers.Gemma2ForCausalLM(config).eval()


def sites_of(optimized, kernel_type: str) -> dict:
    """autokernel.optimize's sites of one kernel type, by where they are in the model."""
    return {s.where: s for s in optimized.autokernel.sites() if s.kernel_type == kernel_type}


def copy_project(tmp_path, files=PROJECT, extra=None) -> tuple:
    """(repo, env): the project's `files` (+ `extra`, destination -> source) in a fresh git repository,
    and an environment with no git identity: the loop must commit without one."""
    repo = tmp_path / "repo"
    for dest, src in [(name, name) for name in dict.fromkeys(files)] + list((extra or {}).items()):
        (repo / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / src, repo / dest)
    for package in ("autokernel", "kernelbench"):  # the registry imports kernelbench: this tree's, not an install's
        shutil.copytree(ROOT / package, repo / package, ignore=shutil.ignore_patterns("__pycache__"))
    home = tmp_path / "home"  # no ~/.gitconfig
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}
    env.pop("TRITON_INTERPRET", None)
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", *cmd], cwd=repo, env={**env, **IDENTITY}, check=True)
    return repo, env


def orchestrate(repo, env, *args, background=False):
    """`python orchestrate.py run` on the CPU (--quick, tag t) in `repo`, as a user runs it."""
    cmd = [sys.executable, "orchestrate.py", "run", "--device", "cpu", "--quick", "--tag", "t", *args]
    if background:
        return subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S)


def check_git_matches_results(repo) -> list[dict]:
    """Kept rows are exactly the branch's commits after init; nothing else is on the branch."""
    rows = results.read_rows(repo / "results.tsv")
    lines = (repo / "results.tsv").read_text().splitlines()
    assert len(lines) == len(rows) + 1  # every line a whole row
    assert len({r["experiment"] for r in rows}) == len(rows)
    git = GitLog(repo)
    branch = [sha for sha, _ in git.log("main..autokernel/t")]  # newest first
    kept = [r["commit"] for r in rows if r["status"] in ("baseline", "keep")]
    assert branch == kept[::-1]
    for r in rows:
        if r["status"] not in ("baseline", "keep") and r["commit"]:
            assert not git.is_ancestor(r["commit"], "autokernel/t")
    assert git.changes() == {} and git.branch() == "autokernel/t"
    return rows


# ------------------------------------------------------------------------------------------ processes
def descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):  # the task ended meanwhile
            continue
        for child in children:
            found += [int(child)] + descendants(int(child))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return 0


def started_in(log: str) -> float:
    """The seconds a bench's harness took to start, from its log: under a second when forked warm."""
    return float(log.split("(started in ", 1)[1].split(" s)", 1)[0])


def harness_children(pid: int) -> list[int]:
    """The harness processes benching under `pid` (a loop, a worker): forked by its warm launcher (a child
    of the zygote, whose command line it shares) or started fresh (`-m autokernel.harness.harness`)."""
    return [p for p in descendants(pid)
            if "autokernel.harness.harness" in _cmdline(p) or "autokernel.harness.zygote" in _cmdline(_parent(p))]


def wait_for(condition, limit_s: float, what: str, alive=None):
    """Poll condition() until it returns something true (returned), for at most limit_s seconds: a barrier
    on an event (a file, a process, a line), never a sleep of a guessed length. `alive`, a Popen, ends the
    wait early when it exits."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and (alive is None or alive.poll() is None):
        found = condition()
        if found:
            return found
        time.sleep(POLL_S)
    found = condition()
    if found:
        return found
    raise AssertionError(f"timed out after {limit_s:.0f} s waiting for {what}")


def unwrapped(text: str) -> str:
    """Output printed through rich with every run of whitespace made one space: a line that a narrow
    console wrapped reads as it was written (for phrases that no --json or key: value line carries)."""
    return " ".join(text.split())


def summary_values(stdout: str) -> dict:
    """The greppable `key: value` lines a script prints after its last `---` line."""
    block = stdout.rsplit("\n---\n", 1)[1]
    return dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)


# ------------------------------------------------------------------------- the loop with a stand-in harness
FAKE_KERNEL = '''"""A stand-in kernel: the fake bench reports LATENCY as its latency."""
KERNEL_TYPE = "rmsnorm"
LATENCY = 100  # us, as the fake bench reports it
BLOCK = 64  # does nothing

TUNABLES = {"LATENCY": [120, 100, 90, 80], "BLOCK": [32, 64]}


def kernel_fn(x, weight, eps=1e-6):
    return x
'''
NO_IDENTITY = {"HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}


class FakeBench:
    def __init__(self, hook=None):
        self.calls, self.hook = 0, hook

    def __call__(self, path, **options):
        self.calls += 1
        if self.hook:
            self.hook(self.calls)
        text = Path(path).read_text()
        try:
            ast.parse(text)
        except SyntaxError as e:
            return {"status": "crash", "correctness": "FAIL", "reason": f"SyntaxError: {e}", "log": "crash"}
        latency = float(re.search(r"^LATENCY = (\d+)", text, re.M).group(1))
        return {"status": "pass", "correctness": "PASS", "latency_us": latency, "noise_pct": 0.5,
                "speedup_vs_pytorch": 100.0 / latency, "pct_peak": None, "gpu": "fake",
                "log": f"---\nlatency_us: {latency}\n"}


def git_env(monkeypatch):
    for key, value in NO_IDENTITY.items():  # a machine where git has no identity configured
        monkeypatch.setenv(key, value)


def make_repo(path: Path, files: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", *cmd], cwd=path, env=env, check=True)
    return path


def repo_files() -> dict:
    """The files of a test repository: what the loop needs, and the fake kernel."""
    files = {name: (ROOT / name).read_text() for name in ("reference.py", "program.md", ".gitignore")}
    return {**files, "kernel.py": "# the kernel under optimization\n", "kernels/fake.py": FAKE_KERNEL}


def rows(repo):
    return results.read_rows(repo / "results.tsv")


class Lines:
    """A ui that keeps what the loop says, as plain strings."""

    def __init__(self):
        self.lines = []

    def print(self, text):
        self.lines.append(text)

    def status(self, text):
        pass


# ------------------------------------------------------------------------------ openai agent over HTTP
class ChatServer:
    """A chat-completions endpoint on loopback answering from a script of (status, content) pairs."""

    def __init__(self, replies):
        self.replies, self.requests = list(replies), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                        "body": body})
                status, content = server.replies.pop(0)
                payload = ({"id": "x", "object": "chat.completion", "model": body["model"],
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": content}}]}
                           if status == 200 else {"error": {"message": content}})
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class SharedForward(torch.nn.Module):  # kernel sets as swap.build makes them: one forward's code, a module tree each
    def __init__(self, types):
        super().__init__()
        self.types = list(types)

    def swapped_types(self):
        return list(self.types)

    def module(self):
        return self

    def forward(self, x):
        for kernel_type in self.types:  # typeK's K + 1 ops: a graph of its own for each set, the original's output
            for _ in range(int(kernel_type.removeprefix("type")) + 1):
                x = x * 2 / 2
        return x.abs()


def every_argument(kernel_fn, inputs) -> tuple:
    """The inputs with kernel_fn's defaults after them: an op's schema asks for every argument, as a site passes."""
    bound = inspect.signature(kernel_fn).bind(*inputs)
    bound.apply_defaults()
    return tuple(bound.arguments.values())
