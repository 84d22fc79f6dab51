"""The library's rooms import one way: a room (or top-level module) imports only what stands below it.

Read from the source (ast), so an import inside a function counts as much as one at the top of a file.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "autokernel"
# Lowest first. The ops room stands below the types because the type modules build their sites on it; the harness
# stands above the registry because it benches a type by its entry.
LAYERS = ("compat", "kerneltype", "kernelfile", "results", "cli", "models", "ops", "types", "registry", "harness",
          "cuda", "suite", "profile", "verify", "loop")


def unit(module: str) -> str:
    """The room or top-level module that autokernel.<module> belongs to."""
    return module.split(".")[0]


def imports(path: Path) -> set[str]:
    """The autokernel modules a file imports, as dotted names below autokernel (module or package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("autokernel.")}
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("autokernel"):
            if node.module == "autokernel":
                found |= {f"autokernel.{a.name}" for a in node.names}
            else:
                found.add(node.module)
    return {name.removeprefix("autokernel.") for name in found}


def library() -> dict[str, Path]:
    """Every module of the library but the package's own __init__ (its lazy `optimize` reaches verify/)."""
    files = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts != ("__init__",):
            files[".".join(p for p in parts if p != "__init__")] = path
    return files


def test_every_room_and_top_level_module_has_a_layer():
    assert {unit(m) for m in library()} == set(LAYERS)


def test_imports_go_down_the_layers_only():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = [f"{module} imports autokernel.{target}"
              for module, path in sorted(library().items()) for target in sorted(imports(path))
              if rank[unit(target)] > rank[unit(module)]]
    assert upward == []


def test_the_readme_lists_the_rooms_in_their_layers():
    readme = (ROOT.parent / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    block = layout[layout.index("\nautokernel/ "):].split("\n")[2:]
    entries = [line.split()[0] for line in block[:next(i for i, line in enumerate(block) if not line.startswith(" "))]
               if line.startswith("  ") and not line.startswith("   ")]
    assert [e.removesuffix(".py").removesuffix("/") for e in entries if e != "__init__.py"] == list(LAYERS)


def test_the_check_sees_an_upward_import(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("def f():\n    from autokernel.loop import report\n    import autokernel.harness.timing\n")
    assert imports(path) == {"loop", "harness.timing"}
