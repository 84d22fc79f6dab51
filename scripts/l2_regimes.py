"""How the L2 flush before each timed run ranks a kernel's configurations at its model shapes (GPU).

The harness times a kernel at the model's shapes after flushing the L2 by writing (timing._flush_l2, "dirty"): the
call pays for writing back an L2 of data it never touched. In a compiled model a memory-bound kernel runs nearer
its DRAM roofline (Pythia-410M's residual + two norms region: 7.1 us a call in the forward, 15.3 us in the harness,
H100), and a night ranks its configurations as the flush does. This screens configurations of each kernel file
(its own first, then drawn from its TUNABLES as the builtin agent draws them) under every flush of timing.FLUSHES,
torch.compile's reference beside them, and prints each one's time in the model (calls x us, summed over the
shapes) and its rank under each; hold the ranks against scripts/region_profile.py's in-model figures.

    python scripts/l2_regimes.py workspace/kernels/R04_*.py [--configs 24] [--out l2.json]
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autokernel.harness import modeltime, perf, screen, timing  # noqa: E402
from autokernel.loop.agents import search  # noqa: E402
from autokernel.registry import parse_dtype  # noqa: E402


def regimes(path: str, configs: list[dict], device: str, dtype: str) -> dict:
    """{flush: {"configs": [model us per configuration, None where not timed], "compile": model us}}."""
    found = {}
    box = screen._Screen(path, device, parse_dtype(dtype))  # the spec and the inputs of each model shape
    compiled = perf.compiled_reference(box.spec)
    for flush in timing.FLUSHES:
        modeltime.L2_FLUSH = flush
        got = screen.screen(path, configs, device, dtype, eta=1, compile_ahead=False)  # eta 1: every rung times all
        ref = [modeltime.graph_time(compiled, sets)[0].median_us if device == "cuda" else None for sets in box.inputs]
        found[flush] = {"configs": [r["model_us"] for r in got["results"]],
                        "compile": box.model_us(ref) if None not in ref else None}
    modeltime.L2_FLUSH = "dirty"
    return found


def show(name: str, configs: list[dict], found: dict) -> None:
    ranks = {}
    for flush, got in found.items():
        timed = sorted((us, i) for i, us in enumerate(got["configs"]) if us is not None)
        ranks[flush] = {i: r for r, (_, i) in enumerate(timed, start=1)}
    print(f"{name}: us in the model a forward (rank) under each flush: " + ", ".join(timing.FLUSHES))
    print("  torch.compile  " + "  ".join(f"{got['compile']:9.1f}" if got["compile"] else "        -"
                                            for got in found.values()))
    for i, config in enumerate(configs):
        cells = "  ".join(f"{got['configs'][i] or 0:9.1f} ({ranks[f].get(i, '-'):>2})" for f, got in found.items())
        print(f"  {i:>3} {cells}  {json.dumps(config, sort_keys=True)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kernels", nargs="+", help="kernel files with MODEL_SHAPES (extract.py's)")
    p.add_argument("--configs", type=int, default=24, help="configurations per file, its own first (default 24)")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--out", type=Path, help="also write the figures here as JSON")
    args = p.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    figures = {}
    for path in args.kernels:
        configs = search.drawn_from(Path(path).read_text(), args.configs)
        found = regimes(path, configs, device, args.dtype)
        show(Path(path).name, configs, found)
        figures[path] = {"configs": configs, "regimes": found}
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
