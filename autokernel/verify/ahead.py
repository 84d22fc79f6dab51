"""Compiling ahead: helper processes compile the models a compiled prune will time next, while this one times.

A compiled prune spends most of its wall time compiling (Gemma-2 2B at 1x8192: 193 s of its 240 s on an H100, every
compile cold), one model at a time, while the GPU waits; and it knows which models come next: the kept set without
each type still to try, cut to the trials' depths, then the original and the kept set whole. Inductor keeps what it
compiles in its on-disk cache (the FX graph cache, keyed by the traced graph and its inputs' shapes, not their
values), so a model compiled once in another process compiles again here from the cache, in a fraction of the time
(Qwen3-0.6B's whole compile: 84 s cold, 14 s from the cache). Each helper loads the model as verify.py did (the same
kernel files, the same sites), and compiles each model it is handed without running it: its backend stores
Inductor's code and hands dynamo a graph that raises.

The prune tells the plan (Trials.plan_ahead) at each step, in the order it will compile; a new plan replaces the old
one, and what is compiled stays compiled. Each helper is handed the plan's first model no helper has begun as it
finishes the last: two helpers (verify's default where the host and the GPU have room) compile a whole model (the
last check's, ~25 s cold) and the next trial's copies side by side. Before compiling a model the prune waits for the
helper compiling that one now (wait()), and runs each graph it compiled first with the helpers stopped (quiet()),
where Inductor autotunes its kernels by timing them; the helpers run at a lower priority (NICE). They only ever warm
the cache: when one fails, lags or dies, the prune compiles as before. On by default with verify.py --compile
(--no-compile-ahead: off); docs/deploy-and-prune.md, "Compiling ahead".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from autokernel import compat
from autokernel.compat import ROOT

__all__ = ["Ahead", "jobs", "kernel_set", "quiet", "started", "wait", "wanted", "weights_bytes", "weights_to_load"]

WAIT_S = 240.0  # the longest the prune waits for a model the helper is compiling (a whole 2B model: ~30 s cold)
NICE = 10  # the helpers' priority, and their compile workers' (who inherit it): below the prune's
COMPILE_SHARE = 2  # the helpers' Inductor compile workers, together: this part of the CPUs (the prune compiles too)
HELPERS = 2  # verify's helpers: at most this many, one per 4 CPUs
MEMORY_SHARE = 0.25  # each loads the weights again: all their copies at most this part of the free memory


class Ahead:
    """The helpers, from the prune's side: plan() what comes next, wait() for a model one of them is compiling. Each
    helper is handed one model at a time, the plan's first that none has begun, as it finishes the last."""

    def __init__(self, request, backend: str, helpers: int = 1):
        """request: verify's Request, for each helper to load the model as verify() did (verification.loaded);
        helpers: how many processes compile side by side (a cold whole model takes one of them half a minute, while
        the other goes on with the prune's next copies)."""
        child_env = dict(os.environ)
        workers = max(1, (os.cpu_count() or 2) // (COMPILE_SHARE * helpers))
        child_env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(workers))
        # each a process group of its own (its compile workers with it), stopped as one by held(); in this session,
        # so that the kernel hangs up on it, stopped or not, if the prune dies
        self.procs = [subprocess.Popen([sys.executable, "-m", "autokernel.verify.ahead", backend],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       text=True, cwd=ROOT, env=child_env, process_group=0) for _ in range(helpers)]
        for proc in self.procs:  # the prune's own thread first on a busy host: it launches what it times
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, proc.pid, NICE)
        self._holds = 0
        self.state: dict[str, str] = {}  # job's key -> "start", "done", "failed" or "stopped" (by close())
        self.jobs: list[tuple[list[str], int | None]] = []  # the plan last made: (types, depth)
        self.taken: set[str] = set()  # the models the prune compiled: never planned again
        self.busy: list[str | None] = [None] * helpers  # the key each helper compiles now
        self.gone: set[int] = set()  # the helpers that exited
        self.waited = 0.0  # seconds the prune spent in wait()
        self.failures: dict[str, str] = {}  # job's key -> why the helper failed to compile it
        self.began, self.timeline = time.monotonic(), []  # "12.3 s done KEY": the helpers' jobs and the prune's waits
        self.changed = threading.Condition()
        message = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(request).items()}
        for helper in range(helpers):
            self._send(helper, message)
            threading.Thread(target=self._listen, args=(helper,), daemon=True, name=f"ahead-listener-{helper}").start()

    def plan(self, jobs: Iterable[tuple[Iterable[str], int | None]]) -> None:
        """The models the prune compiles next, in order: (kernel types, in the order the prune builds them with, and
        the blocks of the cut copy, or None: whole)."""
        with self.changed:
            self.jobs = [(list(types), depth) for types, depth in jobs
                         if job_key(types, depth) not in self.taken]
            self._hand_out()

    def wait(self, types: Iterable[str], depth: int | None) -> None:
        """Return once no helper is compiling this model, at most WAIT_S: compiled (the prune's compile reads the
        cache), failed, or never begun (the prune compiles it, and it leaves the helpers' plan)."""
        key = job_key(types, depth)
        with self.changed:
            self.taken.add(key)
            found = self.state.get(key)
            how = found or "not begun by the helper"
            if found is None:
                self.plan(self.jobs)
            elif found == "start":
                began = time.monotonic()
                self.changed.wait_for(lambda: self.state.get(key) != "start", WAIT_S)
                waited = time.monotonic() - began
                self.waited += waited
                how += f", waited {waited:.1f} s"
            self._event(f"prune-compiles {key} ({how})")

    @contextlib.contextmanager
    def held(self):
        """The helpers and their compile workers stopped (SIGSTOP) for the duration, nested or not: the first run of
        a graph compiled here autotunes Inductor's kernels by timing them, one launch at a time, and a host busy
        compiling can make a slower config read faster (quiet())."""
        self._holds += 1
        if self._holds == 1:
            self._signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self._holds -= 1
            if self._holds == 0:
                self._signal(signal.SIGCONT)

    def close(self) -> None:
        """Hang up on the helpers, and stop what is left of their process groups (compile workers): a helper still
        compiling at once (what it compiles, nobody waits for: the rows would wait up to 5 s for it), an idle one
        once it has read the end of its input, within 5 s. A worker that outlived the prune would hold the GPU and
        Inductor's locks in the next run."""
        with self.changed:
            busy = [proc for proc, key in zip(self.procs, self.busy) if key is not None]
            for helper, key in enumerate(self.busy):  # stopped, not failed: nothing wrong with it
                if key is not None:
                    self.state[key], self.busy[helper] = "stopped", None
                    self._event(f"stopped {key}")
        for proc in self.procs:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        deadline = time.monotonic() + 5
        for proc in self.procs:
            if proc not in busy:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        self._signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()

    def _hand_out(self) -> None:
        """Each idle helper its next model: the plan's first that none has begun (self.changed held)."""
        pending = [job for job in self.jobs if job_key(*job) not in self.state]
        for helper, key in enumerate(self.busy):
            if key is None and helper not in self.gone and pending:
                job = pending.pop(0)
                key = job_key(*job)
                self.busy[helper], self.state[key] = key, "start"
                self._event(f"start {key}")
                self._send(helper, {"types": job[0], "depth": job[1]})

    def _signal(self, sig) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):  # gone: nothing to stop
                pass

    def _event(self, what: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.began:.1f} s {what}")

    def _send(self, helper: int, message) -> None:
        try:
            self.procs[helper].stdin.write(json.dumps(message) + "\n")
            self.procs[helper].stdin.flush()
        except (OSError, ValueError):  # the helper is gone: its listener ends its job
            pass

    def _listen(self, helper: int) -> None:
        for line in self.procs[helper].stdout:
            word, _, rest = line.rstrip("\n").partition(" ")
            key, _, why = rest.partition(" ")
            with self.changed:
                self._ended(helper, key, word, why)
        with self.changed:
            self.gone.add(helper)
            if self.busy[helper] is not None:
                self._ended(helper, self.busy[helper], "failed", "the helper exited")

    def _ended(self, helper: int, key: str, word: str, why: str) -> None:
        if why:
            self.failures[key] = why
        self.state[key] = word
        self._event(f"{word} {key}")
        self.busy[helper] = None
        self._hand_out()
        self.changed.notify_all()


def weights_bytes(model) -> int:
    """The bytes of a model's weights and buffers."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def weights_to_load(request) -> int | None:
    """weights_bytes of the model verify's request loads, counted on a copy built on the meta device (no memory, no
    initialization), or None where it cannot be built so (a pretrained model: its weights are read, and its config
    only from the local cache; it is counted once loaded)."""
    from autokernel.models import load_model
    from autokernel.registry import parse_dtype

    if request.pretrained:
        return None
    try:
        model = load_model(request.class_name, model_file=request.model, module=request.module,
                           config=request.config, device="meta", dtype=parse_dtype(request.dtype))
    except Exception:  # a model that computes something while it is built
        return None
    return weights_bytes(model)


def wanted(request, device: str, mode: str) -> bool:
    """Whether verify's request gets helpers at all: on a GPU, a prune with a compiled side (mode: its deploy
    modes), --compile-ahead on."""
    return (device == "cuda" and request.compile_ahead and not request.keep_all and not request.no_timing
            and any(m.startswith("compile") for m in mode.split(",")))


@contextlib.contextmanager
def started(request, device: str, mode: str, say, weights: int, loaded: bool = False):
    """Helpers compiling the compiled prune's next models (Ahead) for verify's request, or None: on a GPU, where the
    prune runs on the compiled side (mode: verify's deploy modes), as many as HELPERS whose copies of the weights
    (weights bytes: weights_bytes or weights_to_load) take at most MEMORY_SHARE of the memory the model's own copy
    leaves (loaded: that copy is in memory already; else verify loads it beside the helpers' own), one per 4 CPUs;
    say(line) tells how many, or why none."""
    import torch

    from autokernel.verify import endtoend

    if not wanted(request, device, mode):
        yield None
        return
    free = torch.cuda.mem_get_info()[0] - (0 if loaded else weights)  # what the model's own copy leaves
    count = min(HELPERS, (os.cpu_count() or 1) // 4, int(MEMORY_SHARE * free // max(weights, 1)))
    if count < 1:
        why = f"a copy of the weights ({weights / 2**30:.1f} GiB) would take more than {MEMORY_SHARE:.0%} of the " \
              f"free GPU memory ({free / 2**30:.1f} GiB)" if weights > MEMORY_SHARE * free else f"{os.cpu_count()} CPUs"
        say(f"compiling ahead: off, {why}")
        yield None
        return
    helpers = Ahead(request, endtoend.backend_for(device), count)
    say(f"compiling ahead: {count} more process{'es' * (count > 1)} compile the compiled prune's next models into "
        "Inductor's cache")
    try:
        yield helpers
    finally:
        helpers.close()
        done = sum(how == "done" for how in helpers.state.values())
        say(f"compiling ahead: {done} models compiled for the prune, {len(helpers.failures)} failed, "
            f"{helpers.waited:.0f} s waited for them")


def jobs(keep: list[str], upcoming: list[list[str]], depths, deeper: int | None = None) -> list[tuple]:
    """The models a compiled prune compiles from here, as (kernel types, depth or None: whole), those it surely
    compiles first: the kept set cut to each of depths (None: whole); the first upcoming trial's set (keep without
    the types it leaves out) at each of depths; where the trials may still be cut deeper, the kept set cut to
    `deeper` blocks (the first trial's next compile if the copies read too wide, as Gemma-2 2B's at 1x8192 do and
    TinyLlama's do not); the original whole (the last check's, the same whatever leaves, after the copies: the first
    cut copy a process compiles pays for what every later one reads from Inductor's cache, Gemma-2 2B's at 1x8192
    71 s against 7, and the prune needs the copies first); the other trials' sets at each of depths; the kept set
    whole (the last check's where the last trial keeps its type, as most do) and, in the last trial, the kept set
    without its type, whole; the trials' deeper copies."""
    trial_sets = [[t for t in keep if t not in out] for out in upcoming]
    tried = [(s, d) for s in trial_sets for d in depths]
    found: dict[str, tuple] = {}
    for job in ([(keep, d) for d in depths] + tried[:len(depths)] + [(keep, deeper)] * bool(deeper) + [([], None)]
                + tried[len(depths):] + [(keep, None)] + [(s, None) for s in trial_sets if len(upcoming) == 1]
                + [(s, deeper) for s in trial_sets if deeper]):
        found.setdefault(job_key(*job), (list(job[0]), job[1]))
    return list(found.values())


def job_key(types: Iterable[str], depth: int | None) -> str:
    return f"{','.join(sorted(types))}@{depth if depth else 'whole'}"


def kernel_set(fn) -> list[str]:
    """The kernel types of a model as swap.build made it (its `autokernel`); none for the original."""
    optimized = getattr(fn, "autokernel", None)
    return list(optimized.types) if optimized is not None else []


def quiet(backend, ahead: Ahead | None):
    """The dynamo backend the prune compiles with where a helper compiles ahead: `backend` (a name or a backend),
    each graph it compiles first run with the helper stopped (Ahead.held), where Inductor autotunes its kernels by
    timing launches; the compile itself runs beside the helper. (Holding the whole first call, compile included,
    stopped the helper for every model the prune compiled itself: TinyLlama's cold run got 4 models from it, not 14.)"""
    if ahead is None:
        return backend
    from torch._dynamo.backends.registry import lookup_backend

    compile_graph = lookup_backend(backend)

    def compiler(gm, example_inputs):
        compiled, first = compile_graph(gm, example_inputs), [True]

        def run(*args):
            if not first:
                return compiled(*args)
            first.clear()
            with ahead.held():
                return compiled(*args)
        return run
    return compiler


def wait(ahead: Ahead | None, fn, depth: int | None = None) -> None:
    """ahead.wait() for fn's kernel set cut to depth blocks (None: whole), where there is a helper."""
    if ahead is not None:
        ahead.wait(kernel_set(fn), depth)


class _Warmed(Exception):
    """Raised by a graph the helper compiled: it is never run."""


def _warming(backend: str):
    """A dynamo backend that compiles each graph with `backend` (Inductor stores it in its cache) and returns one
    that raises _Warmed instead of running."""
    from torch._dynamo.backends.registry import lookup_backend

    compile_graph = lookup_backend(backend)

    def warm(gm, example_inputs):
        compile_graph(gm, example_inputs)

        def never_run(*args):
            raise _Warmed()
        return never_run
    return warm


def main(argv: list[str]) -> int:
    """A helper: its first line on stdin a verify Request (as JSON), then one job per line, each compiled in turn; on
    stdout 'done KEY' or 'failed KEY WHY' per job."""
    from autokernel.verify import verification

    request = verification.Request(**json.loads(sys.stdin.readline()))
    request.kernels, request.export = Path(request.kernels), None
    import torch

    from autokernel.ops import swap
    from autokernel.verify import regional
    from autokernel.verify.endtoend import TIMING_SEED

    say = _answers()
    compat.check_cpu_isas()  # while the model loads and compiles
    model, _, inputs = verification.loaded(request, verification._pick_device(request.device))
    example, backend = inputs(TIMING_SEED), _warming(argv[0])
    for line in sys.stdin:
        job = json.loads(line)
        types, depth = job["types"], job["depth"]
        key = job_key(types, depth)
        try:
            torch._dynamo.reset()  # one model at a time: no recompile limit to reach
            fn = swap.build(model, types).module() if types else model
            cut = regional.truncated(fn, depth) if depth else fn
            with torch.no_grad():
                torch.compile(cut, backend=backend)(*example)
            say(f"failed {key} it ran uncompiled")  # dynamo made no graph of it: nothing to store
        except _Warmed:
            say(f"done {key}")
        except Exception as e:
            say(f"failed {key} {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
    return 0


def _answers():
    """say(line) to the prune on the helper's stdout; whatever else prints (the model, the kernels) goes to stderr."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def say(line: str) -> None:
        answers.write(line + "\n")
        answers.flush()
    return say


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
