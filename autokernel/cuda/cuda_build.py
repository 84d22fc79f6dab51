"""The one place that compiles CUDA C++: kernels/cuda/<type>.py hand their source here.

A CUDA kernel file holds its device code as a string: templated `__global__` kernels over float, half and
__nv_bfloat16, and plain C++ launchers that take raw pointers (as int64), sizes and the CUDA stream. That
string includes no torch header, so it compiles on its own (`nvcc -c`, see `compile_only`: the tests
check every starter that way on a machine with nvcc but no GPU) and quickly. The Python binding is
generated here from the launchers' prototypes (pybind11 only, again no torch header), and the pair is
built by torch.utils.cpp_extension.load_inline (ninja), which knows where torch's pybind11 and libraries
live. A cold build so skips most of the compile time that `#include <torch/extension.h>` costs.

Cache: one directory per source hash under $AUTOKERNEL_CUDA_CACHE (default ~/.cache/autokernel/cuda).
The hash covers the CUDA source (compile-time tunables are `#define`s in it), the binding, the
architecture, the flags and the torch/CUDA/Python versions, so a changed tunable is a new build and an
unchanged one is a plain import of the cached library. A build runs under an fcntl lock on
`<dir>.lock`: concurrent processes building the same source wait for the first, then import its result.
A directory counts as built only once its `built.json` marker is written (last, atomically), so a build
killed halfway is redone, never imported. Without a marker the directory is wiped before building (which
also clears a stale lock file left by torch's own FileBaton, a known cause of hangs).

Architecture: the GPU's compute capability, with sm_90a on Hopper (9.0) so that WGMMA and TMA can be
used; AUTOKERNEL_CUDA_ARCH=sm_90a (for example) overrides it, for compile-only checks without a GPU.
A failed compile raises CudaBuildError carrying the compiler's error lines; the full log stays in the
cache directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from autokernel.cuda.cuda_prelude import PRELUDE  # noqa: F401  (kernel files read cuda_build.PRELUDE)

CACHE_ENV = "AUTOKERNEL_CUDA_CACHE"
ARCH_ENV = "AUTOKERNEL_CUDA_ARCH"
CACHE_FORMAT = 1  # bump when the layout of a cache directory changes
LOCK_TIMEOUT_S = 900  # s; longer than any real build: past it another process is stuck, not building
LOCK_POLL_S = 0.2  # s between tries of a busy lock
ERROR_LINES = 30  # compiler lines kept in the error message (the whole log is on disk)
NVCC_FLAGS = ["-O3", "-std=c++17", "-lineinfo"]  # no --use_fast_math: fp32 must meet a 1e-4 tolerance
HOST_FLAGS = ["-O3", "-std=c++17"]
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}  # the `dtype` argument of every launcher

_loaded: dict[str, object] = {}  # hash -> module: one import per process


class CudaBuildError(RuntimeError):
    """A CUDA source did not compile (or could not be compiled here); str() carries the compiler's message."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "autokernel" / "cuda")


def detect_arch() -> str:
    """sm_XY of the current GPU (sm_90a on Hopper), or $AUTOKERNEL_CUDA_ARCH."""
    forced = os.environ.get(ARCH_ENV, "").strip()
    if forced:
        if not re.fullmatch(r"sm_\d{2,3}[af]?", forced):
            raise CudaBuildError(f"{ARCH_ENV}={forced!r} is not an architecture such as sm_90a or sm_80")
        return forced
    import torch

    if not torch.cuda.is_available():
        raise CudaBuildError(f"no CUDA GPU to compile for (set {ARCH_ENV}=sm_90a to compile without one)")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def gencode(arch: str) -> str:
    return f"-gencode=arch=compute_{arch[3:]},code={arch}"


def binding_source(prototypes: list[str]) -> str:
    """pybind11 bindings for the launchers: `m.def("name", &name)` for each C++ prototype."""
    names = [_function_name(p) for p in prototypes]
    lines = ["#include <pybind11/pybind11.h>", "#include <cstdint>", ""]
    lines += [p.strip().rstrip(";") + ";" for p in prototypes]
    lines += ["", "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    lines += [f'  m.def("{n}", &{n});' for n in names] + ["}", ""]
    return "\n".join(lines)


def _function_name(prototype: str) -> str:
    match = re.search(r"(\w+)\s*\(", prototype)
    if not match:
        raise ValueError(f"not a C++ function prototype: {prototype!r}")
    return match.group(1)


def source_hash(cuda_source: str, cpp_source: str, arch: str) -> str:
    import torch

    parts = [str(CACHE_FORMAT), cuda_source, cpp_source, arch, " ".join(NVCC_FLAGS + HOST_FLAGS),
             torch.__version__, str(torch.version.cuda), sys.version.split()[0]]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


@contextmanager
def file_lock(path: Path, timeout_s: float = LOCK_TIMEOUT_S):
    """An exclusive fcntl lock on `path`, released when the block ends or the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CudaBuildError(f"the build lock {path} has been held for over {timeout_s:.0f} s "
                                         "by another process (a stuck build?)") from None
                time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def cached_build(build_dir: Path, builder: Callable[[Path], Path]) -> Path:
    """The library built in build_dir, building it with builder(build_dir) under the lock if needed.

    builder compiles into the (empty) directory and returns the library's path. The marker is written
    only after it returns, so a reader either sees a whole build or builds again.
    """
    with file_lock(build_dir.parent / f"{build_dir.name}.lock"):
        built = _built_library(build_dir)
        if built is not None:
            return built
        shutil.rmtree(build_dir, ignore_errors=True)  # a half-finished build of a killed process
        build_dir.mkdir(parents=True)
        library = builder(build_dir)
        marker = {"library": os.path.relpath(library, build_dir), "built_at": time.time()}
        tmp = build_dir / "built.json.tmp"
        tmp.write_text(json.dumps(marker))
        os.replace(tmp, build_dir / "built.json")
        return library


def _built_library(build_dir: Path) -> Path | None:
    try:
        marker = json.loads((build_dir / "built.json").read_text())
    except (OSError, ValueError):
        return None
    library = build_dir / marker.get("library", "")
    return library if library.is_file() else None


def load(name: str, cuda_source: str, prototypes: list[str], arch: str | None = None):
    """The compiled module exposing the launchers (built once per source, then imported from the cache)."""
    arch = arch or detect_arch()
    cpp_source = binding_source(prototypes)
    _check_sources(name, cuda_source, cpp_source)
    key = source_hash(cuda_source, cpp_source, arch)
    if key in _loaded:
        return _loaded[key]
    module_name = f"ak_{re.sub(r'[^0-9A-Za-z_]', '_', name)}_{key[:16]}"
    build_dir = cache_root() / module_name

    def builder(directory: Path) -> Path:
        return _compile(module_name, cuda_source, cpp_source, arch, directory)

    library = cached_build(build_dir, builder)
    module = _import(module_name, library)
    _loaded[key] = module
    return module


def _compile(module_name: str, cuda_source: str, cpp_source: str, arch: str, directory: Path) -> Path:
    """load_inline into `directory`; the compiler's message becomes a CudaBuildError."""
    import torch
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        raise CudaBuildError(f"torch {torch.__version__} is a CPU build: building {module_name} needs a CUDA build "
                             "of torch (and nvcc); compile_only() checks the device code without one")
    extra = {}
    if "no_implicit_headers" in inspect.signature(cpp_extension.load_inline).parameters:
        extra["no_implicit_headers"] = True  # our sources include what they need: faster builds
    try:
        path = cpp_extension.load_inline(
            name=module_name, cpp_sources=[cpp_source], cuda_sources=[cuda_source], functions=None,
            extra_cflags=HOST_FLAGS, extra_cuda_cflags=NVCC_FLAGS + [gencode(arch)], build_directory=str(directory),
            with_cuda=True, is_python_module=False, verbose=False, **extra)
    except Exception as e:  # RuntimeError from ninja, OSError without CUDA_HOME, ...
        log = str(e)
        (directory / "build.log").write_text(log)
        raise CudaBuildError(f"compiling {module_name} for {arch} failed:\n{compiler_errors(log)}\n"
                             f"(full log: {directory / 'build.log'})", log) from None
    return Path(path)


def compiler_errors(log: str) -> str:
    """The lines of a compiler log that say what is wrong (errors first), at most ERROR_LINES of them."""
    lines = [line for line in log.splitlines() if line.strip()]
    diagnostics = [line for line in lines if re.search(r"\berror\b\s*:|\): error", line)]  # "x.cu(12): error: ..."
    others = [line for line in lines if re.search(r"\berror\b|Error", line) and line not in diagnostics]
    return "\n".join((diagnostics + others or lines)[:ERROR_LINES]) or "(no compiler output)"


def _import(module_name: str, library: Path):
    import torch  # noqa: F401  (the library links against libtorch/c10, loaded by importing torch)

    spec = importlib.util.spec_from_file_location(module_name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nvcc_path() -> str | None:
    """nvcc on PATH or under CUDA_HOME / /usr/local/cuda, or None."""
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


def _nvcc(name: str, cuda_source: str, arch: str, flags: list[str], timeout_s: float, output: str = "-c") -> str:
    """`nvcc -c` (or `-cubin`: the device code alone) of a source for arch (no torch, no GPU); its output, or
    CudaBuildError with the errors."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise CudaBuildError("nvcc not found (PATH, CUDA_HOME, /usr/local/cuda)")
    with tempfile.TemporaryDirectory(prefix="autokernel-nvcc-") as tmp:
        src = Path(tmp) / f"{name}.cu"
        src.write_text(cuda_source)
        cmd = [nvcc, *NVCC_FLAGS, gencode(arch), *flags, output, str(src), "-o", str(src) + ".out"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise CudaBuildError(f"nvcc failed on {name} for {arch}:\n{compiler_errors(log)}", log)
    return log


def compile_only(name: str, cuda_source: str, arch: str, timeout_s: float = 600) -> None:
    """`nvcc -c` of a kernel's device code for arch, no torch and no GPU needed; CudaBuildError on failure."""
    _nvcc(name, cuda_source, arch, ["--expt-relaxed-constexpr"], timeout_s)


def resource_usage(name: str, cuda_source: str, arch: str, timeout_s: float = 600) -> dict[str, dict]:
    """Per kernel (demangled name): registers, spill_bytes (stores + loads), smem_bytes, from ptxas -v.

    What a launch configuration must fit: registers x threads <= 65536 per block, no spills in a hot loop.
    Compiles with nvcc only (no GPU); CudaBuildError if it does not compile.
    """
    log = _nvcc(name, cuda_source, arch, ["--resource-usage"], timeout_s, output="-cubin")  # ptxas is what counts
    usage, current = {}, None
    for line in log.splitlines():
        entry = re.search(r"(?:Function properties for|Compiling entry function) '?([\w$]+)'?", line)
        if entry:
            current = entry.group(1)
            usage.setdefault(current, {"registers": 0, "spill_bytes": 0, "smem_bytes": 0})
        elif current and (spill := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            usage[current]["spill_bytes"] = int(spill.group(1)) + int(spill.group(2))
        elif current and (regs := re.search(r"Used (\d+) registers", line)):
            usage[current]["registers"] = int(regs.group(1))
            smem = re.search(r"(\d+) bytes smem", line)
            usage[current]["smem_bytes"] = int(smem.group(1)) if smem else 0
    return {_demangle(k): v for k, v in usage.items() if v["registers"]}


def _demangle(symbol: str) -> str:
    filt = shutil.which("c++filt") or shutil.which("cu++filt")
    if filt is None:
        return symbol
    return subprocess.run([filt, symbol], capture_output=True, text=True).stdout.strip() or symbol


def dtype_code(t) -> int:
    """The launcher's dtype code of a tensor; float64 and integer inputs are refused, not converted."""
    code = DTYPE_CODES.get(str(t.dtype).removeprefix("torch."))
    if code is None:
        raise TypeError(f"CUDA kernels take float16, bfloat16 or float32 tensors, not {t.dtype}")
    return code


def _check_sources(name: str, cuda_source: str, cpp_source: str) -> None:
    """The static check of CUDA C++ (autokernel.harness.sourcecheck) on the sources as built, however they were
    put together: a host-side escape never reaches the compiler."""
    from autokernel.harness import guards, sourcecheck

    for what, source in (("CUDA source", cuda_source), ("binding source", cpp_source)):
        found = sourcecheck.check_cuda(source)
        if found:
            raise guards.GuardFailed(f"static check of {name}'s {what}: {found[0]}")


def stream_of(t) -> int:
    """The raw handle of the current CUDA stream of t's device (kernels launch on it, as PyTorch ops do)."""
    import torch

    return torch.cuda.current_stream(t.device).cuda_stream


def defines(values: dict) -> str:
    """`#define NAME value` lines: compile-time tunables become part of the source (and of its hash)."""
    return "".join(f"#define {k} {int(v)}\n" for k, v in values.items())




def pack_width(vec_bytes: int, t) -> int:
    """Elements per vectorized load of t's dtype (the C++ ak::pack_width)."""
    return max(1, vec_bytes // t.element_size())


def vectorizable(width: int, n: int, *tensors) -> bool:
    """True when rows of n elements of every tensor can be moved `width` elements at a time, aligned:
    n and every row stride a multiple of width, every base pointer aligned to the pack size."""
    if width <= 1 or n % width:
        return width <= 1
    for t in tensors:
        if t.data_ptr() % (width * t.element_size()) or any(s % width for s in t.stride()[:-1]):
            return False
    return True


def block_threads(units: int, per_thread: int, fixed: int = 0) -> int:
    """Threads per block: `fixed` if set, else enough for per_thread units each (a multiple of 32, <= 1024)."""
    if fixed:
        if fixed % 32 or not 32 <= fixed <= 1024:
            raise ValueError(f"threads per block must be a multiple of 32 in 32..1024, not {fixed}")
        return fixed
    want = -(-units // max(1, per_thread))
    return min(1024, max(32, -(-want // 32) * 32))


def check_dtypes(*tensors) -> None:
    """Every tensor of one floating dtype that the launchers take (reading one dtype as another is garbage)."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise TypeError(f"CUDA kernel inputs must share one dtype, got {sorted(map(str, dtypes))}")
    dtype_code(tensors[0])
