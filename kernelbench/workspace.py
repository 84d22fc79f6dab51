"""Setting problems up in a project, and finding the kernel files that solve them.

`setup` writes, per problem:
  workspace/kernelbench/<level>/<name>.py   the problem, read-only: the reference the harness resolves
  workspace/kernels/kb_<level>_<name>.py    the ModelNew starter (a loop can take several: --kernel ...)
and, for a single problem, kernel.py (the one file the loop's agent edits), unless asked not to. It
never overwrites uncommitted work in kernel.py, nor runs while a loop holds the repository.

A problem's solution, for eval and score, is the first of: a file in --solutions DIR named for the
problem (<level>/<name>.py, <name>.py, kb_<level>_<name>.py, or KernelBench's
level_<n>_problem_<id>_*.py), else the loop's best kept version workspace/kernels/kb_<level>_<name>_optimized.py,
else the newest workspace/kernels/*_optimized.py that declares the problem's KERNEL_TYPE (a loop run on
kernel.py). A solution in KernelBench's own form (a ModelNew, no KERNEL_TYPE) is evaluated through a
copy that declares it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from autokernel import kernelfile
from autokernel.loop.state import lock_holder
from kernelbench import skeleton
from kernelbench.problems import Problem, ProblemError
from kernelbench.spec import WORKSPACE_DIR, parse_type

STARTERS_DIR = Path("workspace") / "kernels"
PREPARED_DIR = WORKSPACE_DIR / "prepared"  # solutions given a KERNEL_TYPE line for the harness
KERNEL_PATH = "kernel.py"


def problem_copy(root: Path, problem: Problem) -> Path:
    return root / WORKSPACE_DIR / problem.level / f"{problem.name}.py"


def starter_path(root: Path, problem: Problem) -> Path:
    return root / STARTERS_DIR / f"kb_{problem.level}_{problem.name}.py"


def is_installed(root: Path, problem: Problem) -> bool:
    path = problem_copy(root, problem)
    return path.is_file() and path.read_text() == problem.code


def install_problem(root: Path, problem: Problem) -> Path:
    """The read-only copy the harness takes the reference from (rewritten only if the problem changed)."""
    path = problem_copy(root, problem)
    if is_installed(root, problem):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    path.write_text(problem.code)
    path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)  # agents edit kernel.py, never the reference
    return path


def _kernel_py_is_committed(root: Path) -> bool:
    """True when kernel.py has no uncommitted edits (or the project is not a git repository)."""
    try:
        import git

        repo = git.Repo(root)
    except Exception:  # noqa: BLE001  (no git, or not a repository: nothing to lose track of)
        return True
    return not repo.git.status("--porcelain", "--", KERNEL_PATH).strip()


def setup(root: Path, chosen: list[Problem], backend: str = "triton", dtype: str = "fp32",
          write_kernel_py: bool = True, force: bool = False) -> list[tuple[Problem, Path]]:
    """Set every chosen problem up; kernel.py gets the starter when exactly one is chosen."""
    from kernelbench.spec import parse_dtype, type_name

    root = Path(root).resolve()
    holder = lock_holder(root)
    if holder:
        raise ProblemError(f"a loop (pid {holder}) is running in {root}: set problems up when it has stopped")
    kernel_py = root / KERNEL_PATH
    if write_kernel_py and len(chosen) == 1 and kernel_py.exists() and not force \
            and not _kernel_py_is_committed(root):
        raise ProblemError("kernel.py has uncommitted changes: commit them first, or pass --force to overwrite")
    done = []
    for problem in chosen:
        copy = install_problem(root, problem)
        text = skeleton.render(problem, backend, type_name(problem, parse_dtype(dtype)),
                               str(copy.relative_to(root)), dtype)
        starter = starter_path(root, problem)
        if starter.exists() and starter.read_text() != text and not force:
            raise ProblemError(f"{starter.relative_to(root)} exists and differs from a fresh starter "
                               "(edited?): pass --force to overwrite it")
        starter.parent.mkdir(parents=True, exist_ok=True)
        starter.write_text(text)
        done.append((problem, starter))
    if write_kernel_py and len(chosen) == 1:
        kernel_py.write_text(done[0][1].read_text())
    return done


# ---------------------------------------------------------------------------------- solutions
def _declared_type(path: Path) -> str | None:
    try:
        return kernelfile.declarations(path.read_text(), path.name).get("KERNEL_TYPE")
    except kernelfile.KernelFileError:
        return None


def _same_problem(declared: str | None, problem: Problem) -> bool:
    if not declared:
        return False
    try:
        level, name, _ = parse_type(declared)
    except KeyError:
        return False
    return (level, name) == (problem.level, problem.name)


def find_solution(root: Path, problem: Problem, solutions: Path | None = None) -> Path | None:
    """The kernel file to evaluate for `problem` (see the module docstring), or None."""
    if solutions is not None:
        level_n = problem.level.removeprefix("level")
        named = [solutions / problem.level / f"{problem.name}.py", solutions / f"{problem.name}.py",
                 solutions / f"kb_{problem.level}_{problem.name}.py",
                 solutions / problem.level / f"kb_{problem.level}_{problem.name}.py"]
        named += sorted(solutions.glob(f"**/level_{level_n}_problem_{problem.problem_id}_*.py"))
        return next((p for p in named if p.is_file()), None)
    kernels = root / STARTERS_DIR
    best = kernels / f"kb_{problem.level}_{problem.name}_optimized.py"
    if best.is_file():
        return best
    others = [p for p in kernels.glob("*_optimized.py") if _same_problem(_declared_type(p), problem)]
    return max(others, key=lambda p: p.stat().st_mtime, default=None)


def prepared(root: Path, problem: Problem, solution: Path, kernel_type: str) -> Path:
    """`solution` itself when it declares the problem's type, else a copy that does."""
    declared = _declared_type(solution)
    if declared == kernel_type:
        return solution
    if declared and not _same_problem(declared, problem):
        raise ProblemError(f"{solution} declares KERNEL_TYPE {declared!r}, not {problem.key}")
    path = root / PREPARED_DIR / problem.level / f"{problem.name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    # at the end, so that line numbers in tracebacks are the solution's own
    text = solution.read_text().rstrip("\n") + f'\n\nKERNEL_TYPE = "{kernel_type}"  # added for the harness\n'
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path
