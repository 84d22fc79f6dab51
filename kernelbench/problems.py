"""Finding, listing and loading KernelBench problems, from a local checkout or a cached dataset file.

Nothing is fetched at run time. A checkout is the KernelBench repository (or its KernelBench/ folder):
KernelBench/level1/19_ReLU.py ... level4. A dataset file is a JSON list (or JSON lines, or parquet
when pyarrow is installed) of records {level, problem_id, name, code}, such as a saved copy of the
published dataset. The source comes from --root / --dataset, else $KERNELBENCH_ROOT /
$KERNELBENCH_DATASET.

A problem is named by its level and file stem: "level1/19_ReLU". Selections accept a whole level
("level1"), a name ("level1/19_ReLU"), or a level and an id ("level1/19").
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ENV_ROOT = "KERNELBENCH_ROOT"
ENV_DATASET = "KERNELBENCH_DATASET"
LEVEL_RE = re.compile(r"^level(\d+)$")
NAME_RE = re.compile(r"^(\d+)_(\w+)$")
REQUIRED = ("Model", "get_inputs", "get_init_inputs")


class ProblemError(Exception):
    """A problem or a problem source cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class Problem:
    level: str  # "level1"
    problem_id: int  # 19
    name: str  # "19_ReLU", the file stem
    code: str
    origin: str  # the file or dataset it came from

    @property
    def key(self) -> str:
        return f"{self.level}/{self.name}"

    @property
    def type_name(self) -> str:
        """The kernel type the harness knows this problem by."""
        return f"kb/{self.key}"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()


def _level(value) -> str:
    text = str(value).strip().lower().replace("_", "").replace(" ", "")
    if text.isdigit():
        text = f"level{text}"
    if not LEVEL_RE.match(text):
        raise ProblemError(f"unknown level {value!r}: use level1, level2, ... (or 1, 2, ...)")
    return text


def _name(problem_id, name: str) -> str:
    stem = Path(str(name)).name.removesuffix(".py")
    return stem if NAME_RE.match(stem) else f"{int(problem_id)}_{stem}"


def checkout_dir(root: str | Path) -> Path:
    """The folder holding level1/, level2/ ...: `root` itself or root/KernelBench."""
    root = Path(root).expanduser()
    for candidate in (root / "KernelBench", root):
        if candidate.is_dir() and any(LEVEL_RE.match(p.name) for p in candidate.iterdir() if p.is_dir()):
            return candidate
    raise ProblemError(f"{root} is not a KernelBench checkout: no KernelBench/level1/ (or level1/) in it")


def from_checkout(root: str | Path) -> list[Problem]:
    base = checkout_dir(root)
    found = []
    for level_dir in sorted(p for p in base.iterdir() if p.is_dir() and LEVEL_RE.match(p.name)):
        for path in level_dir.glob("*.py"):
            match = NAME_RE.match(path.stem)
            if match:
                found.append(Problem(level_dir.name, int(match.group(1)), path.stem, path.read_text(), str(path)))
    return sorted(found, key=_order)


def _records(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        try:
            import pandas as pd

            return pd.read_parquet(path).to_dict("records")
        except ImportError as e:
            raise ProblemError(f"reading {path.name} needs a parquet engine: pip install pyarrow ({e})") from None
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    if isinstance(data, dict):  # {"level1": [...], ...} as a split-per-level dump
        return [{"level": level, **r} for level, rows in data.items() for r in rows]
    return data


def from_dataset(path: str | Path) -> list[Problem]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise ProblemError(f"no dataset file at {path}")
    found = []
    for i, rec in enumerate(_records(path)):
        try:
            name = _name(rec["problem_id"], rec["name"])
            found.append(Problem(_level(rec["level"]), int(rec["problem_id"]), name, rec["code"], str(path)))
        except (KeyError, TypeError, ValueError) as e:
            raise ProblemError(f"{path.name} record {i}: needs level, problem_id, name and code ({e})") from None
    return sorted(found, key=_order)


def catalog(root: str | None = None, dataset: str | None = None) -> list[Problem]:
    """Every problem of the source given, else of $KERNELBENCH_ROOT, else of $KERNELBENCH_DATASET."""
    root = root or (None if dataset else os.environ.get(ENV_ROOT))
    dataset = dataset or (None if root else os.environ.get(ENV_DATASET))
    if root:
        return from_checkout(root)
    if dataset:
        return from_dataset(dataset)
    raise ProblemError(f"no KernelBench source: pass --root DIR (a checkout) or --dataset FILE, "
                       f"or set ${ENV_ROOT} / ${ENV_DATASET}")


def _order(p: Problem):
    return (int(LEVEL_RE.match(p.level).group(1)), p.problem_id)


def _matches(p: Problem, pattern: str) -> bool:
    level, _, rest = pattern.strip().strip("/").partition("/")
    if _level(level) != p.level:
        return False
    rest = rest.removesuffix(".py")
    return not rest or rest == p.name or (rest.isdigit() and int(rest) == p.problem_id)


def select(problems: list[Problem], patterns: list[str]) -> list[Problem]:
    """The problems matching any pattern, in catalog order; a pattern matching nothing is an error."""
    chosen = []
    for pattern in patterns:
        hits = [p for p in problems if _matches(p, pattern)]
        if not hits:
            raise ProblemError(f"no problem matches {pattern!r} (try `python -m kernelbench list`)")
        chosen += [p for p in hits if p not in chosen]
    return sorted(chosen, key=_order)


def parse_key(key: str) -> tuple[str, str]:
    """("level1", "19_ReLU") from "level1/19_ReLU"."""
    level, _, name = key.partition("/")
    if not name or not NAME_RE.match(name):
        raise ProblemError(f"{key!r} is not a problem name like level1/19_ReLU")
    return _level(level), name


def load_module(path: str | Path):
    """Import a problem file as a fresh module; it must define Model, get_inputs and get_init_inputs."""
    path = Path(path).resolve()
    name = f"_kernelbench_problem_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # inspect and torch.compile look classes up through their module
    spec.loader.exec_module(module)
    missing = [attr for attr in REQUIRED if not hasattr(module, attr)]
    if missing:
        raise ProblemError(f"{path.name} is not a KernelBench problem: it defines no {', '.join(missing)}")
    return module
