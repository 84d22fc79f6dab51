"""extract.py: turn the plan's best-ranked kernel types into kernel files with the model's shapes.

    python extract.py                          # workspace/plan.json, top 3, Triton starters
    python extract.py --plan profiles/llama_compact_1x2048_fp16_h200.plan.json --top 5
    python extract.py --backend cuda           # CUDA C++ starters from kernels/cuda/
    python extract.py --regions 2              # also the 2 largest regions no type covers (profile.py --regions)

For each of the top N types of the plan (ranked by Amdahl gain), kernels/<type>.py is copied to
workspace/kernels/NN_<type>.py with `MODEL_SHAPES = [...]` set to the shapes the profile recorded;
and `MODEL_CALLS = [...]` to the calls per forward pass of each. An opt-in type chosen (rope_attention) brings
its rivals, the types it takes the time of (flash_attention, rotary_embedding), ranked after the plan's types:
verify's prune deploys whichever the model runs faster with, and the loop then has optimized both. bench.py adds
the shapes to its sweep, times the first as the primary shape, and scores the kernel by its time in the model:

    python bench.py workspace/kernels/01_rmsnorm.py

The files are recorded in workspace/plan.json (each entry's `kernel_file`; a plan given from elsewhere,
such as profiles/, is copied there with them), which is where `orchestrate.py run` takes them from
(with --output-dir DIR: DIR/plan.json).

Exit status: 0 when every requested kernel was written, 1 when a starter is missing (the others are
still written), 2 when nothing could be extracted (bad arguments, a plan that is missing or unreadable).
"""

import argparse
import sys
from pathlib import Path

from autokernel import cli

ROOT = Path(__file__).resolve().parent
WORKSPACE_PLAN = ROOT / "workspace" / "plan.json"
DEFAULT_OUTPUT_DIR = ROOT / "workspace" / "kernels"


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = cli.Parser(prog="extract.py", description=doc[0].split(": ", 1)[1].capitalize(),
                   epilog="Examples:\n" + doc[1] + "\n\n" + "\n\n".join(doc[2:]))
    p.add_argument("--plan", type=Path, default=WORKSPACE_PLAN,
                   help="plan written by profile.py, or one shipped in profiles/ (default workspace/plan.json)")
    p.add_argument("--top", type=int, default=3, help="how many types to extract, best gain first (default 3)")
    p.add_argument("--regions", type=int, default=0, metavar="N",
                   help="also make kernel types of the plan's N largest regions no built-in type covers (profile.py "
                        "--regions): workspace/regions/<name>.py (the reference, read-only) and a Triton starter "
                        "RNN_<name>.py (elementwise regions, and those that reduce over their rows; a larger region "
                        "without a starter is passed over, with why)")
    p.add_argument("--backend", choices=["triton", "cuda"], default="triton",
                   help="triton: kernels/<type>.py; cuda: kernels/cuda/<type>.py (default triton)")
    p.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR,
                   help="where the kernel files go (default workspace/kernels)")
    cli.add_debug_argument(p)
    return p


def run(args) -> int:
    from autokernel.profile.extraction import (
        extract,
        extract_regions,
        record_kernel_files,
        region_entries,
        with_rivals,
    )
    from autokernel.profile.plan import read_plan, write_json

    if args.top < 1:
        raise cli.UsageError("--top must be at least 1")
    if args.regions < 0:
        raise cli.UsageError("--regions must be 0 or more")
    plan = read_plan(args.plan)
    if args.regions and not plan.get("regions"):
        raise cli.UsageError(f"{args.plan} lists no regions: profile the model with `profile.py --regions` first")
    plan = with_rivals(plan, args.top)
    results = extract(plan, args.top, args.backend, args.output_dir, ROOT)
    regions = extract_regions(plan, args.regions, args.output_dir, ROOT) if args.regions else []
    plan = {**plan, "entries": plan["entries"] + region_entries(plan, regions)}
    results += regions
    where = "CPU time" if plan.get("cpu_mode") else f"device time on {plan.get('device', 'a GPU')}"
    print(f"plan {args.plan}: {plan.get('model', '?')}, {where}")
    for r in results:
        entry = next((e for e in plan["entries"] if e["type"] == r.type), {})
        share = "" if entry.get("f") is None else f"{entry['f']:6.1%}"
        share += f"  (a rival of {', '.join(entry['rival_of'])})" if entry.get("rival_of") else ""
        primary = " ".join(f"{k}={v}" for k, v in r.shapes[0].items()) if r.shapes else "no shapes recorded"
        if r.path is None:
            print(f"  #{r.rank} {r.type:<17} {share}  {'PASSED OVER' if r in regions else 'MISSING'}: {r.problem}")
        else:
            print(f"  #{r.rank} {r.type:<17} {share}  -> {_rel(r.path)}  "
                  f"({len(r.shapes)} model shapes; primary {primary})")
    written = [r for r in results if r.path is not None]
    if written:
        target = plan_out(args.output_dir)
        recorded = write_json(record_kernel_files(plan, results, ROOT), target)
        copied = "" if args.plan.resolve() == target else f" (a copy of {_rel(args.plan)})"
        print(f"kernel files recorded in {_rel(recorded)}{copied}: `python orchestrate.py run` takes them")
        print(f"next: python bench.py {_rel(written[0].path)}")
    passed = [r for r in regions if r.path is None]
    if passed:
        print(f"extract.py: {len(passed)} larger region(s) passed over: no starter for them yet (above)",
              file=sys.stderr)
    missing = [r for r in results[:len(results) - len(regions)] if r.path is None]
    if missing:
        print(f"extract.py: {len(missing)} of {len(results) - len(regions)} starters do not exist yet: "
              f"{', '.join(r.type for r in missing)}", file=sys.stderr)
    made = len(regions) - len(passed)
    if made < args.regions:
        print(f"extract.py: {made} of the {args.regions} region kernels asked for: the plan's other regions have no "
              "starter", file=sys.stderr)
    if missing or made < args.regions:
        return cli.EXIT_FAILURE
    return 0


def plan_out(output_dir: Path) -> Path:
    """Where the plan with its kernel files goes: workspace/plan.json for the workspace's kernels (the
    loop's default plan), else beside the kernel files."""
    output_dir = output_dir.resolve()
    return WORKSPACE_PLAN if output_dir == DEFAULT_OUTPUT_DIR else output_dir / "plan.json"


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run_main("extract.py", lambda: run(args), args.debug, known=("PlanError", "ExtractError", "ValueError"))


if __name__ == "__main__":
    sys.exit(main())
