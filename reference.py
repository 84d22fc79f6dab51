"""PyTorch ground truth for every built-in kernel type, as `<type>_ref` functions. Agents never edit this file.

The references live in the library, each in its type's module (autokernel/types/<type>.py); this file gathers them
for agents and older commands (`import reference; reference.rmsnorm_ref(...)`). Each is written the way a user
writes the op in plain PyTorch. bench.py uses it twice: on the kernel's own dtype it is the "PyTorch eager" baseline
that gets timed, and on float64 copies of the inputs it is the correctness oracle. A kernel file's `kernel_fn` has
exactly the signature of its reference.
"""

from autokernel import types as _types

globals().update({f"{_spec.name}_ref": _spec.reference for _spec in _types.builtin()})
