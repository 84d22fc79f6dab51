"""The optimization plan: which kernel types are worth optimizing, by Amdahl's law.

A type that takes a share f of the model's time and is made s times faster speeds the whole model
up by gain = 1 / ((1 - f) + f / s). s comes from a measured benchmark of the starter kernel against
PyTorch on that op (benchmarks/starters.json: {type: {"speedup_vs_pytorch": x}}) where one exists,
else from the type's registry entry (default_speedup), and the plan says which. Types are ranked by
gain. Two numbers sum the plan up: the combined gain if every planned type reaches its s, and the
Amdahl ceiling, the gain if every planned type took no time at all (1 / (1 - sum f)); what no type
covers ("other") bounds both.

The plan also records the model profile.py ran (source, class, config, input shape, dtype), and the kernels
extracted from it carry that record (MODEL_SOURCE): other_model() is the one comparison of two such records.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from autokernel.cli import DTYPE_ALIASES
from autokernel.kernelfile import KernelFileError, declarations

PLAN_VERSION = 1
STARTERS_JSON = Path("benchmarks/starters.json")

FALLBACK_SPEEDUP = 1.0  # for a type whose registry entry has no default speedup


def default_speedup(type_: str) -> float:
    """The conservative speedup over PyTorch eager on a GPU that the type's registry entry assumes until its
    starter has been measured (FALLBACK_SPEEDUP for a type without one, or not registered here)."""
    from autokernel import registry  # here: the loop reads plans without importing torch (the registry's)

    try:
        speedup = registry.get_spec(type_).default_speedup
    except KeyError:
        return FALLBACK_SPEEDUP
    return FALLBACK_SPEEDUP if speedup is None else speedup


class PlanError(Exception):
    """The plan cannot be read or written; the message says why."""


def amdahl_gain(f: float, s: float) -> float:
    """End-to-end speedup when a share f of the time gets s times faster."""
    return 1.0 / ((1.0 - f) + f / s)


def fraction_left(profiled_us, best_us, in_model: bool, speedup) -> float:
    """What is left of a type's profiled time: its best time in the model over the time the profile
    measured for it (the model's own ops, which the registry's reference may not match), else one over
    its speedup against PyTorch; never above 1 (verify.py leaves out a kernel the model is faster without)."""
    if in_model and profiled_us and best_us:
        return min(1.0, best_us / profiled_us)
    return 1.0 / max(1.0, speedup or 1.0)


def load_speedups(path: str | Path = STARTERS_JSON) -> dict[str, float]:
    """Measured speedups of the starters over PyTorch, {} when none were measured."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        return {t: float(v["speedup_vs_pytorch"]) for t, v in data.items()
                if isinstance(v, dict) and v.get("speedup_vs_pytorch") and float(v["speedup_vs_pytorch"]) > 0}
    except (ValueError, TypeError, KeyError) as e:
        raise PlanError(f"cannot read measured speedups from {path}: {e}") from None


def build_plan(profile: dict, measured: dict[str, float] | None = None, source: str = str(STARTERS_JSON)) -> dict:
    """Rank the profile's types by gain. `measured` maps a type to its starter's measured speedup."""
    measured = measured or {}
    entries = []
    for type_, info in profile["types"].items():
        f = info["share"]
        if type_ in measured:
            s, s_source = measured[type_], f"measured ({source})"
        else:
            s, s_source = default_speedup(type_), "default"
        entries.append({"type": type_, "f": f, "s": s, "s_source": s_source, "gain": amdahl_gain(f, s),
                        "time_us": info["time_us"], "calls": info["calls"], "shapes": info["shapes"]})
    entries.sort(key=lambda e: (-e["gain"], -e["f"]))
    for rank, entry in enumerate(entries, start=1):
        entry["rank"] = rank
    covered = sum(e["f"] for e in entries)
    return {
        "version": PLAN_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "time_kind": profile.get("time_kind", "device"),
        "total_us": profile["total_us"],
        "entries": entries,
        "other": {"f": profile["other"]["share"], "time_us": profile["other"]["time_us"],
                  "ops": profile["other"]["ops"]},
        "covered_f": covered,
        "combined_gain": 1.0 / ((1.0 - covered) + sum(e["f"] / e["s"] for e in entries)),
        # None: the planned types are all the time there is, so no ceiling short of infinity
        "amdahl_ceiling": 1.0 / (1.0 - covered) if covered < 1.0 - 1e-9 else None,
    }


def write_json(data: dict, path: str | Path) -> Path:
    """Write whole or not at all: a temporary file renamed over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    tmp.replace(path)
    return path


def read_plan(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"plan not found: {path} (run profile.py first, or pass --plan)")
    try:
        plan = json.loads(path.read_text())
    except ValueError as e:
        raise PlanError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(plan, dict) or not isinstance(plan.get("entries"), list):
        raise PlanError(f"{path} is not a plan: it has no 'entries' list")
    for entry in plan["entries"]:
        if not isinstance(entry, dict) or "type" not in entry or "rank" not in entry:
            raise PlanError(f"{path}: every entry needs a 'type' and a 'rank', got {entry!r}")
    return plan


# ------------------------------------------------------------------------------ which model kernels were made for
# One question, asked by verify.py (of the kernel files it plugs in), autokernel.optimize (of the files it swaps
# into a model object) and the morning report (of verify.json against the tag's kernels). Each side is a record
# in MODEL_SOURCE's form (autokernel.profile.extraction.model_origin: what extract.py writes into a kernel file):
# {"model": "<file or package>:<class>", "config", "input_shape", "dtype"}.
def other_model(origin: dict, this: dict) -> str | None:
    """What tells two records apart: "model" (the model file's name or the package, the class or the config
    differ), "input" (the same model at another input shape or dtype), or None (the same model and input)."""
    if _model_key(origin) != _model_key(this):
        return "model"
    return "input" if _input_key(origin) != _input_key(this) else None


def kernel_origin(path: str | Path) -> dict | None:
    """A kernel file's MODEL_SOURCE (extract.py's record of the model it was extracted for), None without one."""
    try:
        origin = declarations(Path(path).read_text(), Path(path).name).get("MODEL_SOURCE")
    except (OSError, KernelFileError):
        return None
    return origin if isinstance(origin, dict) else None


def describe_origin(origin: dict) -> str:
    """"models/llama.py:LlamaModel (config tiny)"."""
    config = f" (config {origin['config']})" if origin.get("config") else ""
    return f"{origin.get('model')}{config}"


def describe_input(origin: dict) -> str:
    """"1,512 fp16"."""
    shape, dtype = _input_key(origin)
    return f"{','.join(map(str, shape))} {dtype}"


def _model_key(origin: dict) -> tuple:
    source, _, class_name = str(origin.get("model", "")).rpartition(":")
    return Path(source).name, class_name, origin.get("config")  # models/llama.py and /abs/models/llama.py alike


def _input_key(origin: dict) -> tuple:
    dtype = str(origin.get("dtype"))
    return list(origin.get("input_shape") or []), DTYPE_ALIASES.get(dtype.lower(), dtype)
