"""The static check of a kernel file, run on its source before it is imported.

A kernel file is written by an agent that wants the verdict, and once imported its code runs with the
harness's own powers. So before import the source must stay inside what a kernel needs, an allow-list:

  - imports: torch, triton (and their submodules, less the ones that reach the process, the dispatcher
    or the compiler: torch.library, torch.utils, torch._C, triton.runtime, ...), math, functools, typing,
    dataclasses, and the project's CUDA build helper;
  - every dotted name rooted at an import is resolved against the real modules: it may not reach a module
    off the list (`torch.os`, `cuda_build.subprocess`), a private name (`torch._C`), a stream, an event,
    a CUDA graph or a global switch (`torch.set_*`, `torch.use_*`), and a module is never a value
    (`c = torch.cuda` would hide the next attribute from this check);
  - no assignment or deletion through an object the file did not create (patching torch, triton, the
    harness, builtins, or the caller's tensors), no dunder names or attributes, no frame or code
    attributes, no exec/eval/compile/open/__import__/globals/getattr/setattr-style indirection;
  - classes derive only from nn.Module, autograd.Function, NamedTuple or the file's own classes (a Tensor
    subclass could answer the checker's own calls), and define no dunder methods beyond construction;
  - CUDA C++ sources (string literals here, and every source handed to the build helper at run time):
    includes from a list, no host-side escapes (system, popen, fork/exec, dlopen, file I/O, threads,
    environment), no stream, event, graph or host-callback creation, no driver API.

Each violation names its rule and the line. Nothing here imports the candidate.
"""

from __future__ import annotations

import ast
import re
import types
from dataclasses import dataclass

ALLOWED_IMPORTS = ("torch", "triton", "math", "functools", "typing", "dataclasses", "__future__",
                   "autokernel.cuda.cuda_build")
# Submodules of the allowed packages that reach the process, the dispatcher, the compiler or the timers.
DENIED_MODULES = ("torch.library", "torch.utils", "torch.ops", "torch.backends", "torch.overrides", "torch.hub",
                  "torch.multiprocessing", "torch.distributed", "torch.profiler", "torch.testing", "torch.fx",
                  "torch.jit", "torch.compiler", "torch.export", "torch.package", "torch.serialization",
                  "torch.cuda.graphs", "torch.cuda.streams", "torch.cuda.memory", "torch.autograd.profiler",
                  "triton.runtime", "triton.compiler", "triton.backends", "triton.knobs", "triton.testing",
                  "triton.tools", "triton.profiler")
# The project's helpers a kernel file may take, by name: the CUDA build helper, and what a user's own
# kernel type needs to register its spec beside its kernel.
PROJECT_IMPORTS = {"autokernel.cuda": frozenset({"cuda_build"}),
                   "autokernel.registry": frozenset({"KernelSpec", "register"})}
ALLOWED_SUBMODULES = ("triton.tools.tensor_descriptor",)  # exceptions inside a denied package
# Names under torch (and typing) that create streams, events or graphs, compile, touch files or evaluate strings.
DENIED_NAMES = frozenset({"Stream", "Event", "ExternalStream", "StreamContext", "stream", "graph", "CUDAGraph",
                          "make_graphed_callables", "graph_pool_handle", "compile", "load", "save", "from_file",
                          "get_type_hints"})
DENIED_NAME_PREFIXES = ("set_", "use_", "register_")  # global switches: torch.set_default_dtype, use_deterministic_..
DENIED_PATHS = ("triton.compile",)
DENIED_BUILTINS = frozenset({"exec", "eval", "compile", "open", "__import__", "globals", "locals", "vars", "dir",
                             "getattr", "setattr", "delattr", "breakpoint", "input", "exit", "quit", "help"})
# Attributes that walk from an object to frames, code or globals without a dunder.
FRAME_ATTRIBUTES = frozenset({"gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code", "f_back",
                              "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "tb_next", "co_code",
                              "co_consts", "func_globals", "mro"})
ALLOWED_DUNDER_NAMES = frozenset({"__name__"})  # `if __name__ == "__main__":`
ALLOWED_DUNDER_METHODS = frozenset({"__init__", "__post_init__", "__call__", "__repr__"})
SELF_NAMES = frozenset({"self", "cls"})


@dataclass(frozen=True)
class Violation:
    rule: str
    line: int
    detail: str

    def __str__(self) -> str:
        return f"{self.rule} (line {self.line}: {self.detail})"


class _Checker(ast.NodeVisitor):
    def __init__(self, resolve_objects: bool):
        self.found: list[Violation] = []
        self.aliases: dict[str, str] = {}  # local name -> dotted path of what it was imported as
        self.own: set[str] = set()  # names of classes and functions the file defines
        self.resolve_objects = resolve_objects

    def flag(self, rule: str, node, detail: str):
        self.found.append(Violation(rule, getattr(node, "lineno", 0), detail))

    # -- imports ----------------------------------------------------------------------------------
    def visit_Import(self, node):
        for a in node.names:
            if self._import_allowed(a.name, node):
                self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]

    def visit_ImportFrom(self, node):
        if node.level:
            return self.flag("import", node, "relative imports are not allowed")
        allowed_names = PROJECT_IMPORTS.get(node.module)
        if allowed_names is not None:
            for a in node.names:
                if a.name not in allowed_names:
                    self.flag("import", node, f"imports {a.name} from {node.module} (allowed: "
                              f"{', '.join(sorted(allowed_names))})")
                elif a.name == "cuda_build":
                    self.aliases[a.asname or a.name] = "autokernel.cuda.cuda_build"
            return
        if not self._import_allowed(node.module, node):
            return
        for a in node.names:
            if a.name == "*":
                self.flag("import", node, f"`from {node.module} import *` hides what it binds")
                continue
            path = f"{node.module}.{a.name}"
            self.aliases[a.asname or a.name] = path
            self._check_path(path, node, as_value=False)

    def _import_allowed(self, module: str, node) -> bool:
        allowed = any(module == m or module.startswith(m + ".") for m in ALLOWED_IMPORTS if m != "__future__") \
            or module == "__future__"
        if allowed and module.startswith("autokernel") and module != "autokernel.cuda.cuda_build":
            allowed = False
        if not allowed:
            self.flag("import", node, f"imports {module} (allowed: {', '.join(ALLOWED_IMPORTS[:-1])}, and "
                      "autokernel.cuda.cuda_build)")
            return False
        if _denied_module(module):
            self.flag("import", node, f"imports {module}, which reaches beyond what a kernel needs")
            return False
        return True

    # -- names and attributes ---------------------------------------------------------------------
    def visit_Name(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)) and node.id in self.aliases:
            if not _bound_to_none(node):
                self.flag("alias", node, f"rebinds {node.id}, an imported name")
        elif _is_dunder(node.id) and node.id not in ALLOWED_DUNDER_NAMES:
            self.flag("dunder", node, f"uses {node.id}")
        elif node.id in DENIED_BUILTINS and node.id not in self.own and node.id not in self.aliases:
            self.flag("indirection", node, f"uses {node.id}()")
        elif node.id in self.aliases and not isinstance(getattr(node, "_ak_parent", None), ast.Attribute):
            self._check_path(self.aliases[node.id], node, as_value=True)

    def visit_Attribute(self, node):
        if node.attr == "__init__" and _is_super_call(node.value):
            pass  # super().__init__(): nn.Module's construction
        elif _is_dunder(node.attr):
            self.flag("dunder", node, f"accesses .{node.attr}")
        elif node.attr in FRAME_ATTRIBUTES:
            self.flag("introspection", node, f"accesses .{node.attr}")
        path = self._dotted(node)
        if path is not None:
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                self.flag("patch", node, f"assigns to {path}, which the file did not create")
            elif not isinstance(getattr(node, "_ak_parent", None), ast.Attribute):
                self._check_path(path, node, as_value=True)
        elif isinstance(node.ctx, (ast.Store, ast.Del)) and not self._own_base(node.value):
            self.flag("patch", node, f"assigns to .{node.attr} of an object the file did not create")
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            path = self._dotted(node.value)
            if path is not None:
                self.flag("patch", node, f"assigns into {path}, which the file did not create")
        self.generic_visit(node)

    def _dotted(self, node) -> str | None:
        """The import-rooted dotted path of a Name/Attribute chain (`tl.load` -> triton.language.load)."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return ".".join([self.aliases[node.id], *reversed(parts)])
        return None

    def _own_base(self, node) -> bool:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return isinstance(node, ast.Name) and (node.id in SELF_NAMES or node.id in self.own)

    def _check_path(self, path: str, node, as_value: bool):
        parts = path.split(".")
        for i, name in enumerate(parts[1:], 1):
            prefix = ".".join(parts[:i + 1])
            if name.startswith("_") and not _is_dunder(name):
                return self.flag("private", node, f"uses {prefix}")
            if prefix in DENIED_PATHS or parts[0] in ("torch", "typing") and (
                    name in DENIED_NAMES or name.startswith(DENIED_NAME_PREFIXES)):
                return self.flag("denied", node, f"uses {prefix} (streams, events, graphs, files and global "
                                 "switches are the harness's)")
            if _denied_module(prefix) and not _inside_allowed_submodule(path):
                return self.flag("denied", node, f"uses {prefix}, which reaches beyond what a kernel needs")
        if not self.resolve_objects:
            return
        obj, reached = _resolve(parts)
        for mod_path, mod in reached:
            on_the_way = _inside_allowed_submodule(path) and any(m.startswith(mod_path + ".")
                                                                 for m in ALLOWED_SUBMODULES)
            if not _module_allowed(mod) and not on_the_way:
                return self.flag("denied", node, f"{mod_path} is the module {mod.__name__}, not allowed in a kernel")
        if as_value and isinstance(obj, types.ModuleType):
            self.flag("alias", node, f"uses the module {path} as a value (only its attributes may be used)")

    # -- definitions ------------------------------------------------------------------------------
    def visit_FunctionDef(self, node):
        if _is_dunder(node.name) and node.name not in ALLOWED_DUNDER_METHODS:
            self.flag("dunder", node, f"defines {node.name}")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        for base in node.bases:
            path = self._dotted(base)
            if isinstance(base, ast.Name) and base.id in self.own:
                continue
            if path not in ("torch.nn.Module", "torch.nn.modules.module.Module", "torch.autograd.Function",
                            "typing.NamedTuple"):
                self.flag("class", node, f"class {node.name} derives from {ast.unparse(base)} (allowed: nn.Module, "
                          "torch.autograd.Function, NamedTuple, the file's own classes)")
        self.generic_visit(node)


def check_python(source: str, filename: str = "kernel.py", resolve_objects: bool = True) -> list[Violation]:
    """Every rule the source breaks, in line order. resolve_objects walks dotted names through the real
    modules (imports torch and triton in this process); without it only the names are checked."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        return [Violation("syntax", e.lineno or 0, e.msg)]
    checker = _Checker(resolve_objects)
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child._ak_parent = node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            checker.own.add(node.name)
    for node in tree.body:  # imports first, wherever they stand, so that every use resolves
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            checker.visit(node)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node not in tree.body:
            checker.visit(node)  # an import inside a function
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            checker.visit(node)
    found = checker.found + _check_strings(tree)
    return sorted(set(found), key=lambda v: v.line)


# ------------------------------------------------------------------------------------ module resolution
def _is_dunder(name: str) -> bool:
    return name.startswith("__")  # dunders, and name-mangled privates of other classes


def _inside_allowed_submodule(path: str) -> bool:
    return any(path == m or path.startswith(m + ".") for m in ALLOWED_SUBMODULES)


def _bound_to_none(name_node) -> bool:
    """`X = None`: the fallback of an optional import (`except ImportError: TensorDescriptor = None`)."""
    parent = getattr(name_node, "_ak_parent", None)
    return isinstance(parent, ast.Assign) and isinstance(parent.value, ast.Constant) and parent.value.value is None


def _is_super_call(node) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _denied_module(path: str) -> bool:
    if _inside_allowed_submodule(path):
        return False
    return any(path == m or path.startswith(m + ".") for m in DENIED_MODULES)


def _module_allowed(module: types.ModuleType) -> bool:
    name = module.__name__
    if _inside_allowed_submodule(name) or name in ("autokernel", "autokernel.cuda", "autokernel.cuda.cuda_build"):
        return True
    roots = [m for m in ALLOWED_IMPORTS if not m.startswith(("autokernel", "__"))]
    return any(name == m or name.startswith(m + ".") for m in roots) and not _denied_module(name) \
        and not any(part.startswith("_") for part in name.split("."))


def _resolve(parts: list[str]):
    """The object a dotted path names, and every module met on the way; (None, [...]) where it stops."""
    import importlib

    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return None, []
    reached = [(parts[0], obj)]
    for i, name in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            try:  # a submodule not imported yet by its package
                obj = importlib.import_module(".".join(parts[:i + 1]))
            except ImportError:
                return None, reached
        if isinstance(obj, types.ModuleType):
            reached.append((".".join(parts[:i + 1]), obj))
    return obj, reached


# ------------------------------------------------------------------------------------------ CUDA C++
CUDA_INCLUDES = frozenset({"cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "mma.h", "cstdint",
                           "stdint.h", "cstddef", "cmath", "math.h", "cfloat", "climits", "limits", "mutex",
                           "stdexcept", "string", "type_traits", "unordered_map", "utility", "array", "algorithm",
                           "tuple", "vector", "cooperative_groups.h", "cuda/pipeline", "cuda/barrier",
                           "pybind11/pybind11.h"})
CUDA_INCLUDE_PREFIXES = ("cooperative_groups/", "cuda/std/", "cub/")
CUDA_RULES = [
    ("host escape", re.compile(r"\b(system|popen|fork|vfork|exec[lv]p?e?|posix_spawnp?|dlopen|dlsym|syscall|ptrace|"
                               r"kill|raise|_exit|exit|abort|atexit|at_quick_exit|setenv|putenv|getenv|unsetenv|"
                               r"signal|sigaction|pthread_create|mmap|mprotect)\s*\(")),
    ("file I/O", re.compile(r"\b(fopen|freopen|fdopen|open|openat|creat|unlink|remove|rename|fwrite|fputs|fprintf|"
                            r"write|pwrite|read|fread)\s*\(|\bstd::[io]?fstream\b|\bFILE\s*\*")),
    ("threads", re.compile(r"\bstd::(thread|jthread|async)\b")),
    ("streams and events", re.compile(r"\bcuda(StreamCreate\w*|EventCreate\w*|EventRecord\w*|StreamBeginCapture\w*|"
                                      r"Graph\w*|LaunchHostFunc|StreamAddCallback|StreamWaitEvent|SetDevice|"
                                      r"HostAlloc|MallocHost|HostRegister|DeviceReset|ThreadExchangeStreamCaptureMode)"
                                      r"\b|\b(getStreamFromPool|setCurrentCUDAStream|CUDAStreamGuard|CUDAEvent)\b")),
    ("driver API", re.compile(r"\bcu[A-Z][A-Za-z]+\s*\(")),
]
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.M)
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def check_cuda(source: str, first_line: int = 1) -> list[Violation]:
    """Violations in a CUDA C++ source; line numbers counted from first_line."""
    code = COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), source)  # keep line numbers
    found = []
    for m in INCLUDE.finditer(code):
        header = m.group(1).strip()
        if header not in CUDA_INCLUDES and not header.startswith(CUDA_INCLUDE_PREFIXES):
            found.append(Violation("cuda include", first_line + code.count("\n", 0, m.start()),
                                   f"#include <{header}> is not on the list"))
    for rule, pattern in CUDA_RULES:
        for m in pattern.finditer(code):
            found.append(Violation(f"cuda {rule}", first_line + code.count("\n", 0, m.start()),
                                   f"{m.group().strip().rstrip('(').strip()}"))
    return found


def _check_strings(tree) -> list[Violation]:
    """The CUDA C++ in the file's string literals (docstrings are prose, left alone)."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                and _looks_like_cuda(node.value):
            found += check_cuda(node.value, node.lineno)
    return found


def _looks_like_cuda(text: str) -> bool:
    return "\n" in text and any(k in text for k in ("__global__", "#include", "__device__", "extern", "{"))


def violations(source: str, filename: str = "kernel.py") -> list[str]:
    """The rules a kernel file breaks, one line each (`static check: <rule> (line N: what)`)."""
    return [str(v) for v in check_python(source, filename)]
