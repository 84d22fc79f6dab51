"""Developer tool (GPU): time a starter's declared tunables around its defaults, in one process.

    python scripts/sweep_tunables.py kernels/rmsnorm.py kernels/softmax.py [--rounds 2]
    python scripts/sweep_tunables.py kernels/add_rmsnorm.py --shape M=2048,N=4096   # not the bench shape
    python scripts/sweep_tunables.py kernels/rmsnorm.py --compare MAX_SINGLE_PASS=4096 \
        --compare MAX_SINGLE_PASS=4096,LOOP_ELEMENTS_PER_WARP=128 [--rounds 3]

Coordinate search: from the defaults, each tunable is moved to each of its values one at a time; the
best configuration becomes the start of the next round. Every configuration's output on the bench
shape is checked against the float64 oracle before it is timed. This picks good starter defaults; the
product's own search is the loop's builtin agent, which goes through the full harness.

--compare times just the defaults, the given configurations and torch.compile of the reference, in
--rounds interleaved rounds, so that a difference of 1-3% can be told from the drift between rounds.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autokernel.cli import settings  # noqa: E402
from autokernel.harness import checking, timing  # noqa: E402
from autokernel.harness.perf import compiled_reference, gpu_input_sets  # noqa: E402
from autokernel.kernelfile import declarations, import_kernel  # noqa: E402
from autokernel.registry import get_spec  # noqa: E402

REPS = 60  # timed runs per configuration: enough to rank, few enough to try many


def time_config(module, spec, config, sets):
    for name, value in config.items():
        setattr(module, name, value)
    try:  # the harness's own check: the oracle, the spec's output dtype and tolerance, the guards
        checking.checked_call(module.kernel_fn, spec, sets[0], str(config))
        torch.cuda.synchronize()
    except checking.CheckFailed as e:
        return None, f"WRONG: {str(e)[:120]}"
    except Exception as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    return timing.time_gpu(module.kernel_fn, sets, reps=REPS).median_us, ""


def _inputs(spec, shape):
    return gpu_input_sets(spec, shape or spec.bench_shape, torch.float16)


def sweep(path: Path, rounds: int, start: dict, shape: dict | None):
    decl = {**declarations(path.read_text()), **start}
    module = import_kernel(path)
    spec = get_spec(decl["KERNEL_TYPE"])
    tunables = decl.get("TUNABLES", {})
    sets = _inputs(spec, shape)
    best = {name: decl[name] for name in tunables}
    seen = {}
    for _ in range(rounds):
        configs = [dict(best)] + [{**best, name: v} for name, values in tunables.items() for v in values]
        for config in configs:
            key = tuple(sorted(config.items()))
            if key not in seen:
                seen[key] = time_config(module, spec, config, sets)
        timed = [(us, dict(k)) for k, (us, _) in seen.items() if us is not None]
        best = min(timed, key=lambda t: t[0])[1] if timed else best
    default_us = seen[tuple(sorted({n: decl[n] for n in tunables}.items()))][0]
    print(f"\n== {path} ({spec.name}, {shape or spec.bench_shape}, fp16): default {default_us} us")
    for key, (us, note) in sorted(seen.items(), key=lambda kv: kv[1][0] or 1e12)[:12]:
        print(f"  {us if us is None else round(us, 1):>8}  {dict(key)} {note}")
    failures = [(dict(k), note) for k, (us, note) in seen.items() if us is None]
    for config, note in failures[:5]:
        print(f"  failed: {config} {note}")


def compare(path: Path, rounds: int, configs: list[dict], shape: dict | None):
    decl = declarations(path.read_text())
    module = import_kernel(path)
    spec = get_spec(decl["KERNEL_TYPE"])
    defaults = {name: decl[name] for name in decl.get("TUNABLES", {})}
    sets = _inputs(spec, shape)
    compiled = compiled_reference(spec)
    times = {"torch.compile": [], "defaults": []} | {str(c): [] for c in configs}
    for _ in range(rounds):
        times["torch.compile"].append(timing.time_gpu(compiled, sets, reps=REPS).median_us)
        for label, config in [("defaults", {})] + [(str(c), c) for c in configs]:
            us, note = time_config(module, spec, {**defaults, **config}, sets)
            times[label].append(us if us is not None else note)
    print(f"\n== {path} ({spec.name}, {shape or spec.bench_shape}, fp16), {rounds} interleaved rounds, us")
    for label, row in times.items():
        print(f"  {label:60} " + "  ".join(f"{t:7.1f}" if isinstance(t, float) else t for t in row))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kernels", nargs="+", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--start", action="append", default=[], metavar="NAME=VALUE",
                   help="start the search from this value instead of the file's (a Python literal)")
    p.add_argument("--compare", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE]",
                   help="time only the defaults, these configurations and torch.compile, interleaved")
    p.add_argument("--shape", type=settings, metavar="NAME=VALUE[,NAME=VALUE]",
                   help="time at this shape of the kernel type instead of its bench shape")
    args = p.parse_args()
    start = {name: value for item in args.start for name, value in settings(item).items()}
    for path in args.kernels:
        try:
            if args.compare:
                compare(path, args.rounds, [settings(c) for c in args.compare], args.shape)
            else:
                sweep(path, args.rounds, start, args.shape)
        except Exception as e:
            print(f"\n== {path}: sweep failed: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
