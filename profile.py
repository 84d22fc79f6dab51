"""profile.py: profile a PyTorch model and rank its kernel types by Amdahl's law.

    python profile.py --model models/llama.py --class-name LlamaModel --input-shape 1,512 --dtype fp16
    python profile.py --module transformers --class-name AutoModelForCausalLM --config gpt2 --input-shape 1,256
    python profile.py --model models/llama.py --class-name LlamaModel --input-shape 1,512 --regions  # + compiled
    python profile.py --model models/llama.py --class-name LlamaModel --input-shape 1,512 --deploy compile_graph

Writes workspace/profile.json (time by kernel type, shape, module and op) and workspace/plan.json
(each type's share f, expected speedup s and end-to-end gain, ranked), and prints the plan. On a
machine without a GPU it profiles CPU time, and says so. extract.py turns the plan into kernels.

Exit status: 0 when the plan was written, 2 when it could not be (bad arguments, a missing model file,
an unknown dtype or kernel type, --device cuda without a GPU, a forward that fails or runs out of memory);
then profile.json and plan.json are left as they were.

About the name: this file shadows the standard library's `profile` module for any Python started in
the repository root (the script's directory, or the current directory with -c, -m and pytest, comes
first on sys.path), and cProfile does `import profile`; torch.compile imports cProfile. So when this
file is imported under the name `profile` it does nothing of its own: it loads the standard library's
profile.py in its place and replaces itself in sys.modules, and cProfile, torch.compile and everything
else get exactly the module they expect. Only `python profile.py` (or loading this file under another
name) runs the tool. (`python -m profile` from the repository root runs this tool, not the stdlib one.)
"""

import argparse
import shlex
import sys
from pathlib import Path


def _stdlib_profile():
    """The standard library's profile module, loaded from the stdlib directory by path."""
    import importlib.util
    import os
    import sysconfig

    path = os.path.join(sysconfig.get_paths()["stdlib"], "profile.py")
    spec = importlib.util.spec_from_file_location("profile", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["profile"] = module  # the import machinery returns this entry, not us
    spec.loader.exec_module(module)
    return module


if __name__ == "profile":  # imported by cProfile & co. from the repository root: see the docstring
    _stdlib_profile()


from autokernel import cli  # noqa: E402  (after the stdlib hand-over above)
from autokernel.profile.plan import COMPILED  # noqa: E402

ROOT = Path(__file__).resolve().parent
DEFAULT_OUTPUT = ROOT / "workspace"


def build_parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="profile.py", description="Profile a PyTorch model and rank its kernel types by Amdahl's law.",
        epilog="Examples:\n" + "\n".join(__doc__.split("\n\n")[1].splitlines()))
    how = cli.add_model_arguments(p)
    how.add_argument("--steps", type=int, default=3, help="profiled forward passes (default 3)")
    how.add_argument("--with-loss", action="store_true",
                     help="each forward pass also computes the next-token loss (a loss evaluation): the LM head's "
                          "GEMM and the loss count as linear_cross_entropy")
    how.add_argument("--types", default="", help="comma-separated kernel types whose profiler rules are opt-in "
                     "(rope_attention: RoPE + SDPA of an attention module as one type); default: those whose "
                     "model sites optimize() would place in this model")
    how.add_argument("--regions", action="store_true",
                     help="also profile the model as torch.compile runs it: every kernel Inductor makes and every "
                          "extern call (GEMM, attention), with its share of the compiled forward and the built-in "
                          "type whose rules cover it; those no type covers are listed in the plan as regions")
    how.add_argument("--deploy", choices=cli.DEPLOY_MODES, default="eager",
                     help="the mode the model will run in (verify.py's --deploy): each type is ranked by its time "
                          "in that mode and its starter's measured speedup there; compile and compile_graph "
                          "profile the model under torch.compile (as --regions does) and take the starters' "
                          "speedups over the reference compiled (default eager; graph ranks as eager)")
    out = p.add_argument_group("output")
    out.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT,
                     help="where profile.json and plan.json go (default workspace/)")
    out.add_argument("--starters", type=Path, default=ROOT / "benchmarks" / "starters.json",
                     help="measured starter speedups (default benchmarks/starters.json)")
    out.add_argument("--export-trace", metavar="FILE", help="also write a Chrome trace (chrome://tracing)")
    cli.add_debug_argument(out)
    return p


def run(args) -> int:
    cli.check_model_arguments(args)  # before torch's import: bad input fails at once
    cli.check_limits(args, positive=("steps",))
    cli.check_output_files(export_trace=args.export_trace)

    from autokernel import registry
    from autokernel.harness import gpu
    from autokernel.models import describe_model, example_inputs, load_model, parse_shape
    from autokernel.profile import deployed, plan, profiling
    from autokernel.registry import parse_dtype

    # every argument checked before the model runs and before profile.json and plan.json are replaced
    types = cli.kernel_types(args.types, registry.kernel_types())
    dtype = parse_dtype(args.dtype)
    shape = parse_shape(args.input_shape)
    measured = plan.load_speedups(args.starters, args.deploy)
    device = gpu.pick_device(args.device)
    model = load_model(args.class_name, model_file=args.model, module=args.module, config=args.config,
                       pretrained=args.pretrained, device=device, dtype=dtype)
    inputs = example_inputs(model, shape, device, dtype)
    if not types:  # the opt-in types where optimize() would place them: the plan holds what deploy swaps
        types = deployed.opt_in_types(model)
        if types:
            print(f"profile: {', '.join(types)} as optimize() places it in this model (its sites' probes passed); "
                  "--types chooses the opt-in types instead")
    if device == "cpu":
        print("CPU mode: no GPU here, so this profiles CPU time. The shares show where a CPU spends "
              "its time, not where a GPU would; use --device cuda on a GPU for a real plan.")
    try:
        prof = profiling.profile_model(model, inputs, device, steps=args.steps, trace_path=args.export_trace,
                                       with_loss=args.with_loss, types=types)
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        if _is_oom(e):
            raise
        raise ForwardError(f"{type(model).__name__}'s forward failed on an input of shape "
                           f"{','.join(map(str, shape))}: {str(e).splitlines()[0]}") from e
    if args.regions or args.deploy in COMPILED:
        prof["regions"] = compiled_regions(model, inputs, device, args.steps, types, args.with_loss)
    meta = _meta(args, describe_model(model), shape, dtype, device)
    the_plan = {**meta, **plan.build_plan(prof, measured, source=str(args.starters), deploy=args.deploy)}
    if device == "cuda":
        plan.add_floors(the_plan, dtype)
        plan.rank_by_room(the_plan)
    if prof.get("regions"):
        from autokernel.profile.regions import uncovered

        the_plan["regions"] = uncovered(prof["regions"])
    profile_path = plan.write_json({**meta, **prof}, args.output_dir / "profile.json")
    plan_path = plan.write_json(the_plan, args.output_dir / "plan.json")
    show(the_plan)
    if prof.get("regions"):
        show_regions(prof["regions"], the_plan["cpu_mode"])
    if the_plan["cpu_mode"]:
        print(CPU_CAVEAT)
    print(f"wrote {profile_path} and {plan_path}" + (f" and {args.export_trace}" if args.export_trace else ""))
    print(f"next: python extract.py --plan {plan_path} --top 3")
    return 0


def compiled_regions(model, inputs, device: str, steps: int, types, with_loss: bool = False) -> dict | None:
    """The regions of the model compiled (autokernel/profile/regions.py), or None with a line saying why not: a
    model torch.compile cannot compile still gets its eager plan."""
    from autokernel.profile import deployed, regions

    print("profile: compiling the model with torch.compile to see its regions (Inductor's kernels and extern calls)")
    try:
        found = regions.capture(model, inputs, device, steps=steps, types=types, with_loss=with_loss)
    except Exception as e:  # noqa: BLE001  (any compiler failure: the eager profile stands)
        print(f"profile: no regions: torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
        return None
    regions.unplaced(found, deployed.placed_modules(model))  # covered means deploy places it there
    return found


def _meta(args, model: str, shape, dtype, device: str) -> dict:
    """What profile.json and plan.json record of the run: the model, its input, the device, torch, the command."""
    import torch

    from autokernel.harness import gpu

    return {"model": model, "class_name": args.class_name, "source": args.model or args.module,
            "config": args.config, "input_shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
            "device": gpu.device_name(device) if device == "cuda" else "cpu", "cpu_mode": device == "cpu",
            "torch": torch.__version__, "command": "python " + shlex.join(sys.argv)}


def show_regions(found: dict | None, cpu_mode: bool) -> None:
    """The compiled forward's regions, the largest first, each with the type that covers it or none."""
    if not found:
        return
    from rich.console import Console
    from rich.table import Table

    kind = "CPU time" if cpu_mode else "device time"
    table = Table(title=f"compiled with torch.compile: {found['total_us'] / 1e3:.2f} ms per forward ({kind}); "
                        "regions, the largest first")
    for col in ("share", "time ms", "calls", "covered by", "region", "ops", "reads"):
        table.add_column(col, justify="right" if col in ("share", "time ms", "calls") else "left")
    for r in found["regions"][:REGION_ROWS]:
        reads = ", ".join("x".join(map(str, i["shape"])) for i in r["inputs"][:3])
        claimed = f"(none: {r['claimed_by']}'s sites do not take it)" if r.get("claimed_by") else "(none)"
        covered = r["type"] or claimed
        table.add_row(f"{r['share']:.1%}", f"{r['time_us'] / 1e3:.3f}", f"{r['calls']:g}", covered,
                      r["name"][:48], " ".join(op.replace("aten::", "") for op in r["ops"][:6]), reads,
                      style=None if r["type"] else "bold")
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    left = sum(r["share"] for r in found["regions"] if not r["type"])
    print(f"regions no built-in type covers: {left:.1%} of the compiled forward (listed in the plan's \"regions\")")


REGION_ROWS = 12

CPU_CAVEAT = ("CPU mode: each share f above is this CPU's time running the model in PyTorch, not a GPU's (a busy CPU "
              "ranks the types differently from an idle one), and the speedups s measured on a GPU (or defaults) "
              "are applied to these CPU shares: the gains rank the types for a CPU-mode run, they are not a GPU "
              "plan; profile on a GPU (--device cuda) for one, or take a shipped plan from profiles/")


class ForwardError(Exception):
    """The model ran but its forward failed on the inputs made for --input-shape."""


def _is_oom(e: BaseException) -> bool:
    text = str(e).lower()
    return type(e).__name__ == "OutOfMemoryError" or "out of memory" in text or "can't allocate" in text


def show(the_plan: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    kind = "CPU time (not GPU time)" if the_plan["cpu_mode"] else f"device time on {the_plan['device']}"
    deploy = the_plan.get("deploy", "eager")
    how = f" under torch.compile (--deploy {deploy})" if deploy in COMPILED else ""
    title = (f"{the_plan['model']}, input {'x'.join(map(str, the_plan['input_shape']))} "
             f"{the_plan['dtype']}: {kind}, {the_plan['total_us'] / 1e3:.2f} ms per forward{how}")
    table = Table(title=title)
    eager_f = ["eager f"] if deploy in COMPILED else []  # beside the compiled share: what compiling took away
    room = ["room"] if any(e.get("room") is not None for e in the_plan["entries"]) else []  # the ranking (plan.py)
    for col in ("rank", "type", "share f", *eager_f, "time ms", "from roof", *room, "s", "gain", "top shape"):
        table.add_column(col, justify="left" if col in ("type", "top shape") else "right")
    for e in the_plan["entries"]:
        top = e["shapes"][0]["shape"] if e["shapes"] else {}
        s = f"{e['s']:.2f}" + ("" if e["s_source"] == "default" else " (measured)")
        beside = [f"{e.get('f_eager', 0.0):.1%}"] if eager_f else []
        saves = [f"{e['room']:.1%}" if e.get("room") is not None else "-"] if room else []
        table.add_row(str(e["rank"]), e["type"], f"{e['f']:.1%}", *beside, f"{e['time_us'] / 1e3:.3f}",
                      _from_roof(e), *saves, s, f"{e['gain']:.3f}x", " ".join(f"{k}={v}" for k, v in top.items()))
    other = the_plan["other"]
    ops = ", ".join(name.replace("aten::", "") for name in list(other["ops"])[:4])
    table.add_row("", "other", f"{other['f']:.1%}", *[""] * len(eager_f), f"{other['time_us'] / 1e3:.3f}", "",
                  *[""] * len(room), "", "", ops, style="dim")
    Console(width=None if sys.stdout.isatty() else 140).print(table)  # logs: no wrapping at 80 columns
    ceiling = the_plan["amdahl_ceiling"]
    print(f"named types cover {the_plan['covered_f']:.1%} of the time; all at their s: "
                  f"{the_plan['combined_gain']:.3f}x end to end; Amdahl ceiling (named types at zero "
                  f"time): {'unbounded' if ceiling is None else f'{ceiling:.2f}x'}")
    ceil = the_plan.get("ceilings")
    if ceil:
        print(f"the roofline (\"from roof\"): {ceil['fp16_tflops']:.0f} TFLOP/s fp16 and "
              f"{ceil['bandwidth_gb_s']:.0f} GB/s, {ceil['source']}")
    if room:
        print("ranked by room: the share of the model's time between what each type will take (its time over s) and "
              "its roofline's, what a night could save there")
    rivals = the_plan.get("rivals") or []
    if rivals:
        print(f"rivals of {', '.join(rivals[0]['rival_of'])} (the time it takes is theirs without it; extract.py "
              f"writes them beside it, verify's prune deploys the faster): "
              + ", ".join(f"{r['type']} {r['f']:.1%}" + (f" ({_from_roof(r)} from the roof)" if r.get("floor_us")
                                                         else "") for r in rivals))


def _from_roof(entry: dict) -> str:
    """How far the model's time for the type is from the roofline's for its calls ("2.9x"; "-": not known)."""
    floor, time_us = entry.get("floor_us"), entry.get("time_us")
    return f"{time_us / floor:.1f}x" if floor and time_us else "-"


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.model is None) == (args.module is None):
        parser.error("give either --model FILE or --module PACKAGE")
    return cli.run_main("profile.py", lambda: run(args), args.debug, explain=lambda e: _explain(e, args))


def _explain(e: Exception, args) -> str:
    if _is_oom(e):
        where = "the GPU" if "cuda" in str(e).lower() or type(e).__name__ == "OutOfMemoryError" else "the host"
        return (f"out of memory on {where} with input shape {args.input_shape} in {args.dtype}: try a smaller "
                "--input-shape, a smaller --config, or --dtype fp16")
    return cli.error_text(e, known=("ModelError", "PlanError", "ForwardError", "ValueError", "RuntimeError"))


if __name__ == "__main__":
    sys.exit(main())
