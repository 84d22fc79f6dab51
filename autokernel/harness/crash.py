"""A crash verdict's cause in one line: what stopped the kernel's run, with the figures that say why.

Inside the harness child, exception_cause names what a kernel raised; in the parent, death_cause names why a
child died without a result: the signal that killed it (SIGSEGV: a segfault), or the last exception its
traceback shows. Out of memory says how much was asked for and, on a GPU, how much was free of how much;
anything else is the exception's type and the first line of its message (with the line after it when the
first only introduces it, as "compiling X failed:" does the compiler's error). Standard library only: the parent
never imports torch for this.
"""

from __future__ import annotations

import re
import signal

OUT_OF_MEMORY = "out of memory"
# what a failed allocation says: CUDA's caching allocator (torch.OutOfMemoryError), the CPU allocator, Triton
OOM_MARKS = ("out of memory", "can't allocate memory", "not enough memory", "OutOfMemoryError", "OutOfResources")
SIGNALS = {  # signal -> what it means for a kernel's run
    "SIGSEGV": "a segfault: an invalid memory access",
    "SIGBUS": "a bus error: a misaligned or unmapped memory access",
    "SIGILL": "an illegal instruction",
    "SIGFPE": "an arithmetic fault",
    "SIGABRT": "aborted, e.g. by a failed assertion in native code",
    "SIGKILL": "killed from outside: the system's out-of-memory killer, or by hand",
}
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Resources|Failed)\w*)(?::\s*(.*))?$")


def exception_cause(e: BaseException) -> str:
    """"out of memory on the GPU (torch.OutOfMemoryError): tried to allocate 20.00 GiB, 1.06 GiB free of 79.11 GiB",
    or "ValueError: <the first line of its message>"."""
    kind = type(e).__name__
    module = type(e).__module__
    return cause(kind if module in ("builtins", "__main__") else f"{module.split('.')[0]}.{kind}", str(e))


def kernel_raised(e: BaseException) -> str:
    """What kernel_fn did, for a verdict: "ran out of memory on the host (...): ..." or "raised ValueError: ..."."""
    text = exception_cause(e)
    return f"ran {text}" if text.startswith(OUT_OF_MEMORY) else f"raised {text}"


def cause(kind: str, message: str) -> str:
    """One line for an exception of type `kind` (its name as a traceback prints it) with `message`."""
    oom = out_of_memory(kind, message)
    if oom is not None:
        return oom
    first = first_line(message)
    return f"{kind}: {first}" if first else kind


def first_line(message: str) -> str:
    """The first non-blank line of `message`; when it ends with a colon, the line it introduces joins it."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else ""


def out_of_memory(kind: str, message: str) -> str | None:
    """The sizes of a failed allocation in one line, or None when the exception is not one."""
    if not any(mark.lower() in f"{kind} {message}".lower() for mark in OOM_MARKS):
        return None
    on_gpu = "CUDA" in message or "GPU" in message or "OutOfResources" in kind or "shared memory" in message
    sizes = []
    asked = re.search(r"[Tt]ried to allocate ([\d.]+ ?[KMGTP]?i?B)", message)
    asked_bytes = re.search(r"tried to allocate (\d+) bytes", message)
    if asked:
        sizes.append(f"tried to allocate {asked.group(1)}")
    elif asked_bytes:
        sizes.append(f"tried to allocate {_bytes(int(asked_bytes.group(1)))}")
    free = re.search(r"total capacity of ([\d.]+ ?[KMGTP]?i?B) of which ([\d.]+ ?[KMGTP]?i?B) is free", message)
    if free:
        sizes.append(f"{free.group(2)} free of {free.group(1)}")
    shared = re.search(r"Required: (\d+), Hardware limit: (\d+)", message)  # Triton: shared memory per block
    if shared:
        sizes.append(f"{int(shared.group(1)):,} bytes of shared memory asked, {int(shared.group(2)):,} the limit")
    detail = ", ".join(sizes) or first_line(message)
    return f"{OUT_OF_MEMORY} on the {'GPU' if on_gpu else 'host'} ({kind})" + (f": {detail}" if detail else "")


def death_cause(returncode: int, stderr: str) -> str:
    """Why a harness child ended without a result, in one line: "killed by SIGSEGV (a segfault: ...)", or its exit
    code with the last exception its traceback shows ("exit code 1: out of memory on the GPU (...): ...")."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        meaning = SIGNALS.get(name)
        return f"killed by {name}" + (f" ({meaning})" if meaning else "")
    raised = last_exception(stderr)
    return f"exit code {returncode}: {cause(*raised)}" if raised else f"exit code {returncode}, and no exception " \
        "in its error output"


def last_exception(stderr: str) -> tuple[str, str] | None:
    """(type, message) of the exception the last traceback in `stderr` ends with (the one raised last, after any
    it was raised while handling), else of the last line that reads as one; None when there is none."""
    lines = stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if starts:  # the first line after the indented frames
        line = next((line for line in lines[starts[-1] + 1:] if line.strip() and not line[0].isspace()), None)
        if line is not None:
            kind, _, message = line.partition(": ")
            return kind.strip(), message
    for line in reversed(lines):
        found = _EXCEPTION_LINE.match(line.strip())
        if found:
            return found.group(1), found.group(2) or ""
    return None


def _bytes(n: int) -> str:
    """1073741824 -> "1.0 GiB"."""
    size, unit = float(n), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
