"""The code keeps a readable shape: no module over MAX_MODULE_LINES lines, no function over MAX_FUNCTION_LINES.

STYLE.md's typical file is under ~400 lines and its typical function under ~40; these are the ceilings, checked
on every module of the library (autokernel/), of KernelBench mode (kernelbench/) and on the scripts at the root.
Read from the source (ast), so a nested function counts inside the one that holds it as well as on its own.
ruff's PLR0915 and C901 (pyproject.toml) bound a function's statements and branches beside this.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60  # from the `def` line to the last line of the body (decorators not counted)
PACKAGES = ("autokernel", "kernelbench")
SCRIPTS = ("bench.py", "profile.py", "extract.py", "verify.py", "orchestrate.py", "reference.py")


def checked_files() -> list[Path]:
    """Every .py file of the packages, and the scripts: nothing in them is left out."""
    return [REPO / name for name in SCRIPTS] + sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def long_modules(paths: list[Path]) -> list[str]:
    """'path:1: N lines (over MAX_MODULE_LINES)' for each file over the limit."""
    found = []
    for path in paths:
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{_name(path)}:1: {lines} lines (over {MAX_MODULE_LINES})")
    return found


def long_functions(paths: list[Path]) -> list[str]:
    """'path:line name: N lines (over MAX_FUNCTION_LINES)' for each function or method over the limit."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{_name(path)}:{node.lineno} {node.name}: {lines} lines (over {MAX_FUNCTION_LINES})")
    return sorted(found)


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def test_every_checked_file_is_there():
    missing = [name for name in SCRIPTS if not (REPO / name).is_file()]
    assert missing == [], f"scripts named in SCRIPTS but gone: {missing}"
    for package in PACKAGES:
        assert any((REPO / package).rglob("*.py")), f"no module found under {package}/"


def test_no_module_is_over_the_line_limit():
    found = long_modules(checked_files())
    assert found == [], "modules to split:\n" + "\n".join(found)


def test_no_function_is_over_the_line_limit():
    found = long_functions(checked_files())
    assert found == [], "functions to break up:\n" + "\n".join(found)


def test_the_checks_see_a_long_module_and_a_long_nested_function(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "probe.py"
    path.write_text(f"def outer():\n    def inner():\n{body}    return inner\n")
    assert long_functions([path]) == [f"{path}:1 outer: {MAX_FUNCTION_LINES + 3} lines (over {MAX_FUNCTION_LINES})",
                                      f"{path}:2 inner: {MAX_FUNCTION_LINES + 1} lines (over {MAX_FUNCTION_LINES})"]
    path.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_modules([path]) == [f"{path}:1: {MAX_MODULE_LINES + 1} lines (over {MAX_MODULE_LINES})"]
    path.write_text("x = 1\n" * MAX_MODULE_LINES)
    assert long_modules([path]) == []
