"""Reading a kernel file: its declarations without running it, and the module itself.

A kernel file declares `KERNEL_TYPE`, its tunables as CAPS constants with a `TUNABLES` dict of
the values worth trying, optionally `MODEL_SHAPES` (the shapes of the model it came from, put
there by extract.py), and `kernel_fn` with its reference's signature. The declarations are read
with `ast` so that the loop and extract.py can inspect and edit a kernel without importing it.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import sys
from pathlib import Path


class KernelFileError(Exception):
    """The kernel file cannot be used: missing, unparsable, or lacking its declarations."""


def read_source(path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise KernelFileError(f"kernel file not found: {path}")
    return path.read_text()


def declarations(source: str, filename: str = "kernel.py") -> dict:
    """The module-level `NAME = <literal>` assignments of a kernel file (CAPS names only)."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise KernelFileError(f"syntax error in {filename} line {e.lineno}: {e.msg}") from None
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.isupper():
                try:
                    found[name] = ast.literal_eval(node.value)
                except ValueError:
                    pass  # computed constants are the kernel's business, not ours
    return found


def kernel_type(source: str, filename: str = "kernel.py") -> str:
    decl = declarations(source, filename)
    if "KERNEL_TYPE" not in decl or not isinstance(decl["KERNEL_TYPE"], str):
        raise KernelFileError(f"{filename} does not declare KERNEL_TYPE = \"<type>\"")
    return decl["KERNEL_TYPE"]


def import_kernel(path: str | Path, source: str | None = None):
    """Import a kernel file as a fresh module (never cached under a shared name), compiled from `source`
    (the text the caller checked; the file's text by default).

    Never through the import system's bytecode cache: a .pyc in __pycache__ stamped with the file's mtime
    and size is run in place of the file, so a stale one (an edit of the same size within a second) or one
    an agent planted would run code that nobody read."""
    path = Path(path).resolve()
    if source is None:
        source = read_source(path)
    name = f"_autokernel_candidate_{abs(hash(str(path)))}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path))
    sys.modules[name] = module  # Triton's jit looks functions up through their module
    exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)
    if not callable(getattr(module, "kernel_fn", None)) and not isinstance(getattr(module, "ModelNew", None), type):
        raise KernelFileError(f"{path.name} defines no kernel_fn (nor a KernelBench ModelNew class)")
    return module


def check_signature(kernel_fn, reference) -> None:
    """kernel_fn must take the reference's parameters, by the same names and in the same order."""
    want = [p.name for p in inspect.signature(reference).parameters.values()]
    got = [p.name for p in inspect.signature(kernel_fn).parameters.values()]
    if got != want:
        raise KernelFileError(
            f"kernel_fn({', '.join(got)}) does not match {reference.__name__}({', '.join(want)})"
        )


def lacked_defaults(kernel_fn, reference) -> tuple:
    """The defaults of the reference's last parameters that kernel_fn lacks: () when it takes them all; a file written
    before its type gained trailing parameters with defaults (rope_attention's interleaved) takes the others in
    order. Deployment runs such a file where a call passes those defaults (customops); the harness checks a file
    against the whole signature (check_signature). KernelFileError for any other mismatch."""
    want = list(inspect.signature(reference).parameters.values())
    got = [p.name for p in inspect.signature(kernel_fn).parameters.values()]
    lacked = want[len(got):]
    if got == [p.name for p in want[:len(got)]] and all(p.default is not p.empty for p in lacked):
        return tuple(p.default for p in lacked)
    check_signature(kernel_fn, reference)  # raises, naming both
    return ()


# ------------------------------------------------------------------------------ tunables
def tunable_space(source: str) -> tuple[dict, dict]:
    """({name: values worth trying}, {name: current value}) for the tunables the file declares."""
    decl = declarations(source)
    space = {name: list(values) for name, values in (decl.get("TUNABLES") or {}).items()
             if name in decl and isinstance(values, (list, tuple)) and values}
    return space, {name: decl[name] for name in space}


def _literal(value, old: str) -> str:
    if isinstance(value, str) and old.lstrip()[:1] == '"':
        return json.dumps(value)
    return repr(value)


def apply_config(source: str, config: dict) -> str:
    """The source with each `NAME = literal` line of `config` rewritten to the new value."""
    data = source.encode()
    line_starts = [0]
    for line in data.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    spans = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            v = node.value  # ast offsets are in UTF-8 bytes
            spans[node.targets[0].id] = (line_starts[v.lineno - 1] + v.col_offset,
                                         line_starts[v.end_lineno - 1] + v.end_col_offset)
    for name in sorted(config, key=lambda n: spans[n][0], reverse=True):
        start, end = spans[name]
        new = _literal(config[name], data[start:end].decode()).encode()
        data = data[:start] + new + data[end:]
    return data.decode()
