"""A warm launcher ("zygote") for the harness's child processes.

Starting `python -m autokernel.harness.harness` costs seconds per experiment before any kernel runs: importing
torch, triton and the harness (seconds, more where every import compiles bytecode). The
zygote is a long-lived process that does those imports once, never touches CUDA (a child forked from a
process holding a CUDA context cannot use the GPU), and on each request forks a child that runs exactly
what `python -m autokernel.harness.harness ARGS` runs: in its own session (so the parent can kill its whole
process group), with the request's stdout/stderr pipes, environment and working directory. The kernel
file is imported in the child, fresh each time; whatever the zygote holds is shared copy-on-write only.

The parent (autokernel.harness.runner) talks to the zygote over a Unix socket pair; the pipes travel as file
descriptors. The zygote forks, replies with the child's pid, and reports its exit status when it ends;
it kills the child's group when asked, or when the parent goes away (and then exits itself). Anything
wrong with the zygote is a ZygoteError, and the runner falls back to a fresh process.

A zygote serves requests whose environment equals the one it was started with (variables such as
TRITON_INTERPRET, CUDA_VISIBLE_DEVICES or PYTHONPYCACHEPREFIX are read at import), and only while the
repository files it imported are unchanged on disk (else it would run stale harness code).
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from autokernel.harness.processes import signal_group

# Imported once in the zygote. The interpreter's module only in CPU mode (TRITON_INTERPRET=1).
# torch._inductor.config: torch.use_deterministic_algorithms (the harness's guards) imports it, and with
# it torch._dynamo: a large share of every child's start, spent once here instead.
PRELOAD = ("torch", "triton", "triton.language", "torch._inductor.config", "autokernel.registry",
           "autokernel.harness.harness", "autokernel.harness.perf")
PRELOAD_INTERPRETER = ("triton.runtime.interpreter",)
READY_TIMEOUT_S = 300  # the zygote's imports; a cold GPU image compiling bytecode takes a minute or more
REPLY_TIMEOUT_S = 20  # from a request to the forked child's pid (a fork takes milliseconds)
KILL_TIMEOUT_S = 20  # from asking for a kill to the zygote reporting the child reaped
STOP_TIMEOUT_S = 5  # for the zygote to exit once its socket is closed, before it is killed
MAX_MESSAGE_BYTES = 1 << 20  # one request: argv, environment (a few KB), working directory
# Variables that may differ between the zygote and a request (any other difference starts a new zygote:
# which variables a library reads at import is unknowable). pytest renames the test phase in its own.
PER_REQUEST_VARS = frozenset({"AUTOKERNEL_LAUNCHED_AT", "PYTEST_CURRENT_TEST"})
STDERR_TAIL_CHARS = 2000
# of the zygote's own error output, quoted when it fails to start
HARNESS_MODULE_COMMAND = ["-m", "autokernel.harness.harness"]


class ZygoteError(Exception):
    """The zygote is missing, dead, stale or misbehaving: use a fresh process instead."""


class StaleZygote(ZygoteError):
    """A repository file the zygote imported has changed on disk since: start a new one."""


def supported() -> bool:
    """Forking needs Linux-style fork and file descriptors passed over Unix sockets."""
    return hasattr(os, "fork") and hasattr(socket, "send_fds") and hasattr(socket, "AF_UNIX")


# ================================================================================= the zygote process
def _preload() -> dict:
    """Import the harness's heavy dependencies; the hello message (or an error for the parent)."""
    start = time.perf_counter()
    from autokernel import compat

    names = PRELOAD + (PRELOAD_INTERPRETER if compat.interpreting() else ())
    for name in names:
        __import__(name)
    unsafe = _fork_hazard(cuda=not compat.interpreting())
    if unsafe:
        return {"error": f"{unsafe} after importing the harness; forking from here is unsafe"}
    return {"ready": True, "pid": os.getpid(), "import_s": round(time.perf_counter() - start, 2),
            "files": _repo_files(Path.cwd())}


def _fork_hazard(cuda: bool) -> str | None:
    """Why a forked child could not be trusted, if it could not. A Python thread may hold a lock that
    the child would wait on forever; CUDA does not survive fork once the driver is initialized (a
    torch.cuda.is_available() at import is enough), which only a forked child trying it can tell."""
    import torch

    if threading.active_count() > 1:
        return f"{threading.active_count() - 1} Python thread(s) are running"
    if torch.cuda.is_initialized():
        return "CUDA is initialized"
    if cuda and _libcuda_loaded() and not _cuda_works_in_a_fork():
        return "a forked child cannot use CUDA (the driver was initialized during the imports)"
    return None


def _libcuda_loaded() -> bool:
    try:
        with open("/proc/self/maps") as f:
            return any("libcuda.so" in line for line in f)
    except OSError:
        return True  # cannot tell: let the probe decide


def _cuda_works_in_a_fork() -> bool:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            torch.ones(1, device="cuda").add_(1)
            torch.cuda.synchronize()
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _repo_files(root: Path) -> dict:
    """sha256 of every module file the zygote imported from the repository (the parent rechecks them
    before each request), less installed packages (a virtual environment inside the repository)."""
    root = root.resolve()
    found = {}
    for module in list(sys.modules.values()):
        path = Path(getattr(module, "__file__", None) or "/")  # torch._classes' is a bare "_classes.py"
        path = path.resolve() if path.is_absolute() else Path("/")
        if path.suffix == ".py" and path.is_relative_to(root) and \
                not {"site-packages", "dist-packages"} & set(path.parts):
            found[str(path)] = _sha256(path)
    return found


def _sha256(path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _send(sock: socket.socket, message: dict, fds=()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def serve(sock: socket.socket) -> dict | None:
    """Answer requests until the parent goes away (returns None). Returns the request in a forked
    child, whose stdio, session, environment and working directory are then set up."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE_BYTES, 3)  # stdout, stderr, the result key
        except OSError:
            return None
        if not data:
            return None
        request = json.loads(data)
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            # Python 3.12 warns about forking a multi-threaded process: the only other threads here are
            # OpenBLAS's pool (started by importing numpy), which re-creates itself in the child.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            sock.close()
            _become_child(request, fds)
            return request
        for fd in fds:
            os.close(fd)  # the child's copies only: the parent's pumps see EOF when the child ends
        _send(sock, {"pid": pid})
        if not _supervise(sock, pid):
            return None


def _become_child(request: dict, fds: list) -> None:
    os.setsid()  # its own process group: a timeout kills the child and all it started
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds[:2]:
        os.close(fd)
    if len(fds) > 2:  # the pipe holding the result key (autokernel.harness.channel) stays open for the harness
        request["args"] = [*request["args"], "--key-fd", str(fds[2])]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS
        sys.modules["numpy"].random.seed()


def _supervise(sock: socket.socket, pid: int) -> bool:
    """Wait for the child, killing its group when asked. False when the parent went away."""
    try:
        pidfd = os.pidfd_open(pid)  # readable when the child exits (Linux 5.3+); else poll for it
    except (AttributeError, OSError):
        pidfd = None
    parent_here = True
    while True:
        ready, _, _ = select.select([sock] + ([pidfd] if pidfd is not None else []), [], [],
                                    None if pidfd is not None else 0.05)
        if sock in ready:
            message = sock.recv(MAX_MESSAGE_BYTES)
            if not message:
                parent_here = False
            if not message or json.loads(message).get("op") == "kill":
                signal_group(pid)  # not reaped yet, so the pid cannot have been reused
        done, status = os.waitpid(pid, 0 if pidfd in ready else os.WNOHANG)
        if done:
            break
    if pidfd is not None:
        os.close(pidfd)
    if parent_here:
        _send(sock, {"exit": os.waitstatus_to_exitcode(status)})
    return parent_here


def _run_harness(request: dict) -> int:
    """In the forked child: what `python -m autokernel.harness.harness ARGS` runs (or the script the runner's
    HARNESS_COMMAND names instead, as `python SCRIPT ARGS` would run it)."""
    from autokernel.harness import harness

    command = request.get("command", HARNESS_MODULE_COMMAND)
    if command == HARNESS_MODULE_COMMAND:
        sys.argv = [harness.__file__, *request["args"]]
        return harness.main(request["args"])
    sys.argv = [command[0], *request["args"]]
    try:
        runpy.run_path(command[0], run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m autokernel.harness.zygote FD  (started by autokernel.harness.runner, not by hand: "
              "FD is one end of a Unix socket pair)", file=sys.stderr)
        return 2
    sock = socket.socket(fileno=int(argv[0]))
    hello = _preload()
    _send(sock, hello)
    if "error" in hello:
        return 1
    request = serve(sock)
    return 0 if request is None else _run_harness(request)


# ================================================================================= the parent's side
class Zygote:
    """The parent's handle on one zygote process. One request at a time (see `lock`)."""

    def __init__(self, env: dict, cwd: str | Path):
        self.env = {k: v for k, v in env.items() if k not in PER_REQUEST_VARS}
        self.cwd = str(cwd)
        self.lock = threading.Lock()
        self.hello: dict | None = None
        self.dead: str | None = None  # why it is unusable
        self.errlog = tempfile.TemporaryFile(mode="w+", prefix="autokernel-zygote-")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = mine
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "autokernel.harness.zygote", str(theirs.fileno())],
                                         cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=self.errlog, pass_fds=[theirs.fileno()],
                                         start_new_session=True)  # a Ctrl-C reaches the parent, which kills it
        except OSError as e:
            mine.close()
            self.errlog.close()
            raise ZygoteError(f"cannot start it: {e}") from e
        finally:
            theirs.close()

    def matches(self, env: dict, cwd: str | Path) -> bool:
        return str(cwd) == self.cwd and {k: v for k, v in env.items() if k not in PER_REQUEST_VARS} == self.env

    def ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait for the zygote's imports; ZygoteError if it failed, died, or its files changed since."""
        if self.dead:
            raise ZygoteError(self.dead)
        if self.hello is None:
            hello = self._recv(timeout, "to import torch, triton and the harness")
            if "error" in hello:
                self._fail(hello["error"])
            self.hello = hello
        changed = [p for p, digest in self.hello["files"].items() if _sha256(p) != digest]
        if changed:
            self._fail(f"{Path(changed[0]).name} changed since it started (stale harness code)", StaleZygote)

    def launch(self, args: list, env: dict, cwd: str | Path, key_fd: int | None = None,
               command: list | None = None) -> Child:
        """Fork a harness child with ARGS; its stdout and stderr come back as pipes. key_fd, the read end
        of a pipe holding the result key, reaches the child as `--key-fd`; command is what the child runs
        (`-m autokernel.harness.harness`, or a script path)."""
        self.ready()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        request = {"args": list(args), "env": env, "cwd": str(cwd), "command": command or HARNESS_MODULE_COMMAND}
        try:
            try:
                _send(self.sock, request,
                      [out_w, err_w] + ([key_fd] if key_fd is not None else []))
            except OSError as e:
                self._fail(f"cannot reach it ({e})")
            finally:
                os.close(out_w)  # the zygote holds its own copies now
                os.close(err_w)
            reply = self._recv(REPLY_TIMEOUT_S, "to fork")
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        return Child(self, reply["pid"], out_r, err_r)

    def _recv(self, timeout: float | None, what: str) -> dict:
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            self._fail(f"no answer within {timeout:.0f} s {what}")
        try:
            data = self.sock.recv(MAX_MESSAGE_BYTES)
        except OSError as e:
            data = b""
            self._fail(f"lost ({e})")
        if not data:
            self._fail(f"exited ({self._exit_reason()})")
        try:
            return json.loads(data)
        except ValueError:
            self._fail(f"sent a garbled message {data[:80]!r}")

    def _exit_reason(self) -> str:
        try:
            code = self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return "closed its socket"
        self.errlog.seek(0)
        tail = self.errlog.read()[-STDERR_TAIL_CHARS:].strip().splitlines()
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return how + (f": {tail[-1]}" if tail else "")

    def _fail(self, why: str, error=ZygoteError):
        self.dead = self.dead or why
        self.stop()
        raise error(why)

    def alive(self) -> bool:
        return self.dead is None and self.proc.poll() is None

    def stop(self) -> None:
        """Close the socket (the zygote kills a child in flight and exits), then make sure it is gone."""
        self.dead = self.dead or "stopped"
        self.sock.close()
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.errlog.close()


class Child:
    """A forked harness child, as the runner sees it: like a subprocess.Popen started in a new session."""

    def __init__(self, zygote: Zygote, pid: int, out_fd: int, err_fd: int):
        self.zygote = zygote
        self.pid = pid
        self.stdout = open(out_fd, errors="replace")
        self.stderr = open(err_fd, errors="replace")
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (negative: killed by that signal); subprocess.TimeoutExpired after `timeout`."""
        if self.returncode is None:
            if self.zygote.sock.fileno() < 0:  # stopped meanwhile (replaced from another thread)
                signal_group(self.pid)
                raise ZygoteError("stopped while its child ran")
            ready, _, _ = select.select([self.zygote.sock], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(f"harness child {self.pid}", timeout)
            try:
                self.returncode = self.zygote._recv(0, "")["exit"]
            except ZygoteError:
                signal_group(self.pid)  # orphaned by the zygote's death: nobody else will stop it
                raise
        return self.returncode

    def kill_group(self) -> None:
        """SIGKILL to the child's process group, through the zygote (which has not reaped it yet)."""
        if self.returncode is not None:
            return
        try:
            self.zygote.sock.send(json.dumps({"op": "kill"}).encode())
            self.wait(KILL_TIMEOUT_S)
        except (OSError, ZygoteError, subprocess.TimeoutExpired):
            signal_group(self.pid)  # the zygote is broken: kill the group from here
            self.zygote.dead = self.zygote.dead or "did not report a killed child"
            self.returncode = -signal.SIGKILL


if __name__ == "__main__":
    sys.exit(main())
