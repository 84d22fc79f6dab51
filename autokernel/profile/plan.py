"""The optimization plan: which kernel types are worth optimizing, by Amdahl's law.

A type that takes a share f of the model's time and is made s times faster speeds the whole model
up by gain = 1 / ((1 - f) + f / s). s comes from a measured benchmark of the starter kernel against
PyTorch on that op (benchmarks/starters.json: {type: {"speedup_vs_pytorch": x}}) where one exists,
else from the type's registry entry (default_speedup), and the plan says which. Types are ranked by
gain. Two numbers sum the plan up: the combined gain if every planned type reaches its s, and the
Amdahl ceiling, the gain if every planned type took no time at all (1 / (1 - sum f)); what no type
covers ("other") bounds both.

The time a type takes is the model's as the user deploys it (profile.py --deploy): eagerly (eager, graph: a CUDA
graph replays the same kernels) the eager profile's; under torch.compile (compile, compile_graph) the compiled
forward's, each type's time the Inductor kernels and extern calls its rules cover (profile.py's regions), and s its
starter's measured speedup over the reference compiled (speedup_vs_compile): TinyLlama's rmsnorm takes 9.7% of its
eager forward and 2.3% of its compiled one on an H100, where Inductor's kernel is as fast as the starter (0.996x).
A type torch.compile's kernels beat (s < 1: the prune leaves it out in that mode) ranks after every type that
gains, by its time there: what it would save once the night makes it win. On a GPU each entry also holds floor_us, the
roofline's time for its calls (add_floors), and the plan is ranked again by room (rank_by_room): the share of the
model's time between what the type will take (its profiled time over s, never above it) and that floor, the part a
night could still save (the budget, loop/budget.py, spends the night by the same room). Ranked by gain, Qwen3-0.6B's
plan on an H200 put add_rmsnorm (1.9% of the compiled forward, 1.6x from its roofline) in extract.py's top 4 and left
out the matmul type (14.1%, s 0.96 against cuBLAS): room 0.7% against 4.2% of the model.

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
MAX_PCT_PEAK = 95.0  # % of the roofline; beyond this the room left is noise, not potential
COMPILED = ("compile", "compile_graph")  # the modes whose plan scores the compiled forward
MAX_OTHER = 12  # regions listed under a compiled plan's "other"


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


def room(f: float, left: float, floor: float) -> float:
    """The share of the model's time a type of share f may still save: what is left of its time (left, a fraction of
    its profiled time) down to the roofline's (floor, the same fraction), at least the noise a kernel at MAX_PCT_PEAK
    of its roofline leaves."""
    return f * max(left - floor, left * (1 - MAX_PCT_PEAK / 100))


def rank_by_room(the_plan: dict) -> None:
    """Rank the entries by room (what a night could save of the model's time), the largest first, and record each
    one's: entries with a floor_us (add_floors) and time in the model; after them, in their order, those without (a
    plan profiled on the CPU has no floors: its ranking by gain stands)."""
    entries = the_plan["entries"]
    for e in entries:
        if e.get("floor_us") and e.get("time_us"):
            e["room"] = room(e["f"], fraction_left(e["time_us"], None, False, e["s"]), e["floor_us"] / e["time_us"])
    if not any("room" in e for e in entries):
        return
    entries.sort(key=lambda e: (e.get("room") is None, -(e.get("room") or 0.0), e.get("rank", 0)))
    for rank, entry in enumerate(entries, start=1):
        entry["rank"] = rank


def load_speedups(path: str | Path = STARTERS_JSON, deploy: str = "eager") -> dict[str, float]:
    """Measured speedups of the starters over PyTorch (under torch.compile where `deploy` compiles: over the
    reference compiled), {} when none were measured."""
    path, key = Path(path), "speedup_vs_compile" if deploy in COMPILED else "speedup_vs_pytorch"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        return {t: float(v[key]) for t, v in data.items() if isinstance(v, dict) and v.get(key) and float(v[key]) > 0}
    except (ValueError, TypeError, KeyError) as e:
        raise PlanError(f"cannot read measured speedups from {path}: {e}") from None


def build_plan(profile: dict, measured: dict[str, float] | None = None, source: str = str(STARTERS_JSON),
               deploy: str = "eager") -> dict:
    """Rank the profile's types by gain in the `deploy` mode (the module docstring). `measured` maps a type to its
    starter's measured speedup in that mode (load_speedups)."""
    measured = measured or {}
    types, other, total = _compiled(profile) if deploy in COMPILED else (
        profile["types"], profile["other"], profile["total_us"])
    entries = [_entry(type_, info, measured, source) for type_, info in types.items()]
    entries.sort(key=_rank_key)
    for rank, entry in enumerate(entries, start=1):
        entry["rank"] = rank
    covered = sum(e["f"] for e in entries)
    return {
        "version": PLAN_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "time_kind": profile.get("time_kind", "device"),
        "deploy": deploy,
        "total_us": total,
        "entries": entries,
        "other": {"f": other["share"], "time_us": other["time_us"], "ops": other["ops"]},
        "rivals": _rivals(profile, deploy, total, measured, source),
        "covered_f": covered,
        "combined_gain": 1.0 / ((1.0 - covered) + sum(e["f"] / e["s"] for e in entries)),
        # None: the planned types are all the time there is, so no ceiling short of infinity
        "amdahl_ceiling": 1.0 / (1.0 - covered) if covered < 1.0 - 1e-9 else None,
    }


def add_floors(the_plan: dict, dtype) -> None:
    """Give each entry and rival its floor_us: the roofline's time on this GPU (perf.roofline_s) for the calls its
    shapes make in one forward, the least time the night could bring the type's share down to; the budget
    (loop/budget.py) spends the night by what lies between it and the time the model takes. The ceilings are the
    GPU's measured ones (gpu.measure_ceilings: a large copy and a large matmul, cached for the harness's children,
    whose fractions of peak then hold the same ceilings), not the datasheet's: an H100's datasheet 989 TFLOP/s put
    fused_mlp at 66% of its roofline and gave a 19-minute night's search five minutes there. The plan records them
    ("ceilings"). A type without a registered spec here (a region, whose kernel file extract.py writes later) gets
    none."""
    import torch  # here: torch and a GPU only where profile.py has both

    from autokernel import registry
    from autokernel.harness import gpu, perf

    try:
        ceil = gpu.ceilings(measure=True)
    except torch.OutOfMemoryError:  # the model leaves no room for the copy and the matmul: the datasheet's
        ceil = gpu.ceilings()
    the_plan["ceilings"] = {"source": ceil.source, "bandwidth_gb_s": ceil.bandwidth_gb_s,
                            "fp16_tflops": ceil.fp16_tflops}
    for entry in the_plan["entries"] + the_plan.get("rivals", []):
        try:
            spec = registry.get_spec(entry["type"])
            floor = sum(int(s.get("calls") or 1) * perf.roofline_s(spec.bytes_moved(s["shape"], dtype),
                                                                   spec.flops(s["shape"]), dtype, ceil)
                        for s in entry.get("shapes", []))
        except (KeyError, TypeError, ValueError):  # no spec, or a shape its formulas cannot read
            continue
        if floor > 0:
            entry["floor_us"] = floor * 1e6


def _entry(type_: str, info: dict, measured: dict[str, float], source: str) -> dict:
    """A plan entry of the type whose profile entry is `info`, scored (unranked)."""
    f = info["share"]
    if type_ in measured:
        s, s_source = measured[type_], f"measured ({source})"
    else:
        s, s_source = default_speedup(type_), "default"
    return {"type": type_, "f": f, "s": s, "s_source": s_source, "gain": amdahl_gain(f, s),
            "time_us": info["time_us"], "calls": info["calls"], "shapes": info["shapes"],
            **({"f_eager": info["f_eager"]} if "f_eager" in info else {})}


def _rivals(profile: dict, deploy: str, total: float, measured: dict[str, float], source: str) -> list[dict]:
    """The plan's "rivals": the types the opt-in ones take time from (profiling.rivals; under torch.compile the
    regions they would claim, regions.Region.rival), each scored as an entry would be by its time in the model
    without the opt-in types, and not ranked: extract.py writes them beside the opt-in type they rival, whichever
    verify's prune then deploys (a type the plan ranks already, with the time it has beside the opt-in type too, is
    written as its entry is)."""
    found = profile.get("rivals") or {}
    if deploy in COMPILED:
        times: dict[str, list[float]] = {}
        for r in (profile.get("regions") or {}).get("regions", []):
            if r.get("rival") in found:
                us_calls = times.setdefault(r["rival"], [0.0, 0.0])
                us_calls[0] += r["time_us"]
                us_calls[1] += r["calls"]
        found = {t: {**found[t], "time_us": us, "calls": round(calls), "share": us / total,
                     "f_eager": found[t]["share"]} for t, (us, calls) in times.items()}
    return [{**_entry(t, info, measured, source), "rival_of": profile.get("opt_in", [])} for t, info in found.items()]


def _rank_key(entry: dict) -> tuple:
    """The types that gain first, by gain; then those that do not (s <= 1 in the deploy mode), by their time."""
    gains = entry["gain"] > 1.0
    return not gains, -entry["gain"] if gains else -entry["f"], -entry["f"]


def _compiled(profile: dict) -> tuple[dict, dict, float]:
    """(types, other, total_us) of the compiled forward, in the eager profile's form: each type's time the regions
    its rules cover (profile["regions"], regions.capture's), its shapes the eager profile's (extract makes its inputs
    from them), its share of the eager forward beside (f_eager); "other" the rest of the time, its ops the regions no
    type covers, by name."""
    found = profile.get("regions")
    if not found or not found.get("total_us"):
        raise PlanError("a plan for a compiled deploy mode needs the model profiled under torch.compile "
                        "(profile.py --deploy compile_graph captures it; here it was not captured)")
    total, types, other = found["total_us"], {}, {}
    for r in found["regions"]:
        if r["type"] is None:
            other[r["name"]] = other.get(r["name"], 0.0) + r["time_us"]
            continue
        eager = profile["types"].get(r["type"], {})
        entry = types.setdefault(r["type"], {"time_us": 0.0, "calls": 0.0, "shapes": eager.get("shapes", []),
                                             "f_eager": eager.get("share", 0.0)})
        entry["time_us"] += r["time_us"]
        entry["calls"] += r["calls"]
    for type_, eager in profile["types"].items():  # a type no region is still deployed: nothing left to save there
        types.setdefault(type_, {"time_us": 0.0, "calls": 0.0, "shapes": eager["shapes"], "f_eager": eager["share"]})
    for entry in types.values():
        entry.update(share=entry["time_us"] / total, calls=round(entry["calls"]))
    other_us = max(0.0, total - sum(entry["time_us"] for entry in types.values()))  # copies and the host's own too
    top = dict(sorted(other.items(), key=lambda kv: -kv[1])[:MAX_OTHER])
    return types, {"share": other_us / total, "time_us": other_us, "ops": top}, total


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
