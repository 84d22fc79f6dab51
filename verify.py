"""verify.py: plug the optimized kernels into a model, prove it is still correct, measure the end-to-end speedup.

    python verify.py --model models/llama.py --class-name LlamaModel --config tinyllama --input-shape 1,2048
    python verify.py --model models/llama.py --class-name LlamaModel --input-shape 1,2048 --compile --json v.json
    python verify.py --module transformers --class-name AutoModelForCausalLM --config gpt2 --input-shape 1,1024
    python verify.py --model models/gpt2.py --class-name GPT2Model --config tiny --input-shape 2,32 --device cpu

Kernels: for each type the loop's winner workspace/kernels/*<type>*_optimized.py, else the extracted
workspace/kernels/NN_<type>.py, else the starter kernels/<type>.py (--kernels DIR searches DIR instead
of workspace/kernels; --types limits the types). Each is registered as a torch.library custom op
(autokernel::<type>) and swapped into the model site by site (autokernel/ops/swap.py); the report lists
every site, swapped, left out (its type pruned: the model is faster without it) or kept as the model has it,
and why.

Correctness: the optimized model's output (and, for a language model, the next-token loss, which
runs the cross_entropy kernel) is compared with the original model's on CHECK_INPUTS fresh inputs.
It passes when the relative L2 error ||opt - orig|| / ||orig|| stays under 1e-2 for fp16, 2e-2 for
bf16 and 1e-4 for fp32, with no NaN or Inf the original does not have. Why these numbers: each
kernel may round differently from PyTorch by about one unit in the last place of its output
(2^-11 = 4.9e-4 in fp16, 2^-8 = 3.9e-3 in bf16, 6e-8 in fp32); such independent roundings add up
like a random walk, so a few hundred kernel calls in a deep model leave ~sqrt(300) ulp ~ 1e-2 (fp16)
relative error on the logits, and one kernel that is wrong anywhere moves the output by O(1). The
per-kernel harness (bench.py) checks each kernel elementwise at atol = rtol = 1e-2 (fp16); end to
end a norm-wise bound is the meaningful one. On a mismatch the kernels are swapped in one type at a
time, and the types that alone exceed the tolerance are named.

Timing: the original model eager, torch.compile of the original, the optimized model, and with
--compile the optimized model under torch.compile, all in this process through autokernel.harness.timing
(median of many runs, L2 flushed between runs). With --cuda-graph every row is timed again replayed
from a CUDA graph (the GPU time alone, no Python or launch overhead, as a fixed-shape server runs)
and compared with the original's graphed rows. Before timing, on a GPU, each kernel type is left out
in turn and stays out if the model is more than 1% faster without it in a mode it will be deployed
in (--deploy, any of eager, graph, compile, compile_graph; by default every mode the flags time): a
kernel can win at the harness's shape and lose at the model's, or win eager and lose under
torch.compile. The eager modes (eager, graph) and the compiled ones (compile, compile_graph) decide
apart: the model runs the kernels kept eagerly in eager calls (and CUDA graphs captured from them),
those kept compiled where torch.compile traces it. --keep-all times them all. --against extracted (the
files the loop began from), starters or DIR times the kept types with those files in turns with this
run's (paired.paired: each side replayed from its own CUDA graph, PAIRED_ROUNDS turns of one run
each, a sign test over them), for differences smaller than two runs' drift.
Without a GPU the kernels run through Triton's CPU interpreter and the compiler
backend is aot_eager (inductor's C++ build would dominate a test run): those timings only show that
the pipeline runs and are labelled so.

The model verify.py checks and times is `autokernel.optimize(model)`, what user code calls. Every run
writes its full report to workspace/verify.json (--report FILE elsewhere); --export DIR writes the
kept kernels as a package that `pip install DIR` installs and that runs without this repository.

Exit status: 0 when the optimized model matches, 1 when it does not, 2 when it could not be run.
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

from autokernel import cli
from autokernel.verify.noise import CONFIDENCE  # torch-free
from autokernel.verify.verification import (  # torch-free
    CHECK_INPUTS,
    DEFAULT_KERNELS,
    ROOT,
    decision_lines,
    deploy_modes,
    site_state,
)

DEFAULT_REPORT = ROOT / "workspace" / "verify.json"  # read by the morning report (orchestrate.py report)


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = cli.Parser(prog="verify.py", description=doc[0].split(": ", 1)[1].capitalize(),
                   epilog="Examples:\n" + doc[1] + "\n\n" + "\n\n".join(doc[2:]))
    how = cli.add_model_arguments(p, presets="tiny, compact, tinyllama, ...",
                                  source_title="the model (a file and class, or a package), as for profile.py")
    how.add_argument("--kernels", metavar="DIR", type=Path, default=DEFAULT_KERNELS,
                     help="where optimized and extracted kernels are looked for (default workspace/kernels); "
                          "types without one there use the starter in kernels/")
    how.add_argument("--types", default="", help="comma-separated kernel types to swap in (default: all)")
    how.add_argument("--compile", action="store_true", help="also time the optimized model under torch.compile "
                                                             "and count its graph breaks")
    how.add_argument("--cuda-graph", action="store_true",
                     help="GPU: also time the original and the optimized model replayed from a CUDA graph "
                          "(no Python or launch overhead: the GPU time alone)")
    how.add_argument("--deploy", metavar="MODE[,MODE...]", type=_deploy,
                     help="GPU: the modes the model will run in, which the prune times: eager, graph, compile, "
                          "compile_graph, joined by commas; the eager ones and the compiled ones each keep their "
                          "own kernels (default: every mode the flags time: eager, with --cuda-graph graph, with "
                          "--compile compile, with both compile_graph)")
    how.add_argument("--keep-all", action="store_true",
                     help="GPU: time every correct kernel plugged in, even those the model is faster without "
                          "(by default each is left out in turn and kept only if it helps)")
    how.add_argument("--fresh", action="store_true",
                     help="GPU: decide the prune afresh (by default a trial that reads as an earlier run on this "
                          "model, GPU and kernel files read it keeps that verdict, so a type on the margin does not "
                          "flip from one morning to the next; ~/.cache/autokernel/verdicts, or $AUTOKERNEL_CACHE)")
    how.add_argument("--whole-trials", dest="shallow_trials", action="store_false",
                     help="GPU, with --compile: each trial of the compiled prune compiles the whole model (by default "
                          "it compiles copies of the model cut to one and two of its repeated blocks, a decoder's "
                          "layers, and takes the whole model's time from theirs: minutes faster on a deep model; the "
                          "last check and the rows compile it whole either way)")
    how.add_argument("--no-compile-ahead", dest="compile_ahead", action="store_false",
                     help="GPU, with --compile: no second process compiling the compiled prune's next models into "
                          "Inductor's cache while this one times them (by default one does, with a second copy of the "
                          "weights where they take at most a quarter of the free GPU memory: Gemma-2 2B at 1x8192 in "
                          "309 s instead of 373 s on H100s)")
    how.add_argument("--against", metavar="KERNELS",
                     help="GPU: time the kept types with other files too, in turns with this run's, each side a "
                          "CUDA graph (deployed compiled, also compiled with its kernels): 'extracted' (the loop's "
                          "first files: --kernels less its *_optimized), 'starters' (kernels/) or a directory")
    how.add_argument("--generate", metavar="N", type=int, default=0,
                     help="also time model.generate() of N new tokens with a static cache (greedy, a transformers "
                          "model), the original against the optimized model in turns: tokens per second eagerly and, "
                          "with --compile, its decode steps compiled as transformers compiles them (on a GPU in CUDA "
                          "graphs; default 0: not timed)")
    how.add_argument("--checks", type=int, default=CHECK_INPUTS,
                     help=f"fresh inputs to compare outputs on (default {CHECK_INPUTS})")
    how.add_argument("--no-timing", action="store_true", help="check correctness only")
    out = p.add_argument_group("output")
    out.add_argument("--report", metavar="FILE", type=Path, default=DEFAULT_REPORT,
                     help="where the full report is written as JSON on every run (default workspace/verify.json)")
    out.add_argument("--json", metavar="FILE", help="also write the full report as JSON here")
    out.add_argument("--export", metavar="DIR", type=Path,
                     help="when the model passes: write the kept kernels as a Python package that installs with "
                          "`pip install DIR` and runs without this repository (see autokernel/verify/export.py)")
    out.add_argument("--package-name", default="autokernel_kernels",
                     help="the exported package's import name (default autokernel_kernels)")
    cli.add_debug_argument(out)
    return p


def _deploy(value: str) -> str:
    try:
        return ",".join(deploy_modes(value))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.model is None) == (args.module is None):
        parser.error("give either --model FILE or --module PACKAGE")
    return cli.run_main("verify.py", lambda: run_and_show(args), args.debug, explain=_explain)


def run_and_show(args) -> int:
    from autokernel.verify.verification import Request, verify  # torch: after the parser's checks

    fields = {name: getattr(args, name) for name in Request.__dataclass_fields__ if hasattr(args, name)}
    report = verify(Request(**fields, command="python " + shlex.join(sys.argv)))
    show(report)
    for path in filter(None, (args.report, args.json)):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {path}")
    if report["export"]:
        print(f"exported {', '.join(report['export']['types']) or 'no kernel'} to {report['export']['path']}: "
              f"pip install {report['export']['path']}")
    return 0 if report["correctness"]["status"] == "PASS" else cli.EXIT_FAILURE


# ------------------------------------------------------------------------------ report
def prune_lines(report: dict) -> list[str]:
    """What the prune left out, in which modes, and what decided each type."""
    prune, lines = report["prune"], []
    if prune["decided"]:
        lines.append(f"prune: timed in {prune['mode'].replace(',', ', ')} (--deploy), {len(report['pruned'])} "
                     "type(s) left out"
                     + (f" eagerly, {len(prune['left_out_compiled'])} under torch.compile" if prune["split"] else ""))
    lines += [f"left out after timing: {t}: {why}" for t, why in report["pruned"].items()]
    if prune["split"]:
        lines += [f"left out under torch.compile: {t}: {why}" for t, why in prune["left_out_compiled"].items()]
    lines += [f"left out of eager calls (CUDA graphs run it): {t}: {why}"
              for t, why in prune.get("left_out_eagerly", {}).items()]
    return lines + decision_lines(prune.get("decisions", {}))


def show(report: dict) -> None:
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)
    where = "CPU, Triton interpreter" if report["cpu_mode"] else report["gpu"]
    console.print(f"[bold]{report['model']}[/bold], input {'x'.join(map(str, report['input_shape']))} "
                  f"{report['dtype']} on {where}")
    console.print(_kernel_table(report))
    console.print(_site_table(report))
    c = report["correctness"]
    colour = "green" if c["status"] == "PASS" else "red"
    why = f": {c['reason']}" if "reason" in c else ""
    console.print(f"correctness: [{colour}]{c['status']}[/{colour}] (relative L2 tolerance "
                  f"{c['tolerance_rel_l2']:g}, {len(c['inputs'])} inputs){why}")
    for i, r in enumerate(c["inputs"]):
        loss = f", loss {r['loss']:.5g} vs {r['ref_loss']:.5g}" if "loss" in r else ""
        console.print(f"  input {i}: rel L2 {r['rel_l2']:.3g}, max abs {r.get('max_abs', float('nan')):.3g}, "
                      f"max rel {r.get('max_rel', float('nan')):.3g}{loss}")
    for t, r in c.get("blame", {}).items():
        console.print(f"  {t} alone: rel L2 {r['rel_l2']:.3g} {'ok' if r['ok'] else 'OVER'}")
    for line in prune_lines(report):
        console.print(line)
    if report["timing"]:
        console.print(_timing_table(report))
    for line in report.get("disagreements") or ():
        console.print(f"[yellow]warning[/yellow]: {line}")
    for row, error in report["timing_errors"].items():
        console.print(f"[red]not timed[/red]: {row}: {error}")
    for line in comparison_lines(report):
        console.print(line)
    if report["graph"]:
        g = report["graph"]
        console.print(f"torch.compile of the optimized model: {g['graphs']} graph(s), {g['graph_breaks']} break(s)"
                      + "".join(f"\n  break: {r}" for r in g["break_reasons"]))
    if report.get("regions"):
        r = report["regions"]
        console.print(f"region kernels under torch.compile ({', '.join(r['types'])}): {r['matches']} place(s), "
                      f"{'kept' if r['kept'] else 'left out'}: {r['why']}"
                      + "".join(f"\n  {t} left out under torch.compile: {why}" for t, why in r["displaced"].items())
                      + "".join(f"\n  {t} left out: {why}" for t, why in (r.get("left_out") or {}).items()))
    print("---")
    for key, value in summary(report).items():
        print(f"{key}: {'' if value is None else (f'{value:.4g}' if isinstance(value, float) else value)}")


AGAINST_MODES = {"graph": "CUDA graph", "compile_graph": "torch.compile in a CUDA graph"}


def against_line(a: dict, cpu_mode: bool = False) -> str:
    """One line for --against: the two medians, their ratio, the rounds won and the sign test's verdict."""
    head = f"against the {a['against']} kernels ({', '.join(a['differs']) or 'none'} differ)"
    if "note" in a or "error" in a:
        return f"{head}: {a.get('note') or 'not timed: ' + a['error']}"
    how = "CPU, Triton interpreter: NOT a performance figure" if cpu_mode else AGAINST_MODES.get(a["mode"], a["mode"])
    return (f"{head}, {a['rounds']} turns of one run each ({how}): {a['ms']:.3f} ms vs {a['against_ms']:.3f} ms, "
            f"{a['speedup']:.4f}x, this run's kernels faster in {a['won_rounds']} of {a['rounds']} turns "
            f"(sign test p={a['p_value']:.2g}): {a['verdict']}")


def summary(report: dict) -> dict:
    """The greppable key: value lines."""
    t, c, g = report["timing"], report["correctness"], report["graph"] or {}
    ms = lambda k: t[k]["ms"] if k in t else None
    speedup = lambda row, base: t.get(row, {}).get(f"speedup_vs_{base}")
    return {"correctness": c["status"], "blamed": ",".join(c.get("blamed", [])) or None,
            "worst_rel_l2": c.get("worst_rel_l2"), "swapped_types": ",".join(report["swapped_types"]),
            "eager_ms": ms("eager"), "compile_ms": ms("compile"), "optimized_ms": ms("optimized"),
            "optimized_compile_ms": ms("optimized_compile"), "eager_graph_ms": ms("eager_graph"),
            "compile_graph_ms": ms("compile_graph"), "optimized_graph_ms": ms("optimized_graph"),
            "optimized_compile_graph_ms": ms("optimized_compile_graph"), "pruned": ",".join(report["pruned"]) or None,
            "compiled_types": ",".join(report["compiled_types"]),
            "pruned_compiled": ",".join(report["prune"]["left_out_compiled"]) or None,
            "pruned_eagerly": ",".join(report["prune"].get("left_out_eagerly", {})) or None,
            "deploy_mode": report["prune"]["mode"],
            "speedup_vs_eager": speedup("optimized", "eager"), "speedup_vs_compile": speedup("optimized", "compile"),
            "compiled_speedup_vs_compile": speedup("optimized_compile", "compile"),
            "compiled_graph_speedup_vs_compile_graph": speedup("optimized_compile_graph", "compile"),
            "graph_speedup_vs_eager": speedup("optimized_graph", "eager"),
            "graph_speedup_vs_compile": speedup("optimized_graph", "compile"),
            "generate_speedup": (report.get("generation") or {}).get("eager", {}).get("speedup"),
            "generate_compiled_speedup": next((r.get("speedup") for m, r in (report.get("generation") or {}).items()
                                               if m.startswith("compile") and isinstance(r, dict)), None),
            "timing_errors": ",".join(report.get("timing_errors") or {}) or None,
            "against_speedup": (report.get("against") or {}).get("speedup"),
            "against_verdict": (report.get("against") or {}).get("verdict"),
            "against_compiled_speedup": ((report.get("against") or {}).get("compiled") or {}).get("speedup"),
            "graph_breaks": g.get("graph_breaks"),
            "region_kernels": ",".join(t for t in report["regions"]["types"] if t not in
                                       (report["regions"].get("left_out") or {}))
            if (report.get("regions") or {}).get("kept") else None,
            "device": report["gpu"] or "cpu", "cpu_mode": report["cpu_mode"]}


def comparison_lines(report: dict) -> list[str]:
    """--against's line and --generate's lines, where they ran."""
    a = report.get("against")
    against = [against_line(a, report["cpu_mode"])] if a else []
    if a and a.get("compiled"):  # the model deployed under torch.compile: each side compiled with its kernels
        against.append(against_line({"against": a["against"], "differs": a["differs"], **a["compiled"]},
                                    report["cpu_mode"]))
    return against + generation_lines(report.get("generation"))


def generation_lines(generation: dict | None) -> list[str]:
    """One line per mode of --generate: tokens per second of each model, the speedup with its interval."""
    if not generation:
        return []
    if "error" in generation:
        return [f"generate: not timed: {generation['error']}"]
    lines = []
    for mode, r in generation.items():
        if "error" in r:
            lines.append(f"generate ({mode}): not timed: {r['error']}")
            continue
        low, high = r["speedup_interval"]
        lines.append(f"generate ({mode}, {r['new_tokens']} new tokens, static cache): original "
                     f"{r['original_tokens_per_s']:.1f} tokens/s, optimized {r['optimized_tokens_per_s']:.1f} "
                     f"({r['speedup']:.3f}x, {CONFIDENCE:.0%} interval {low:.3f}-{high:.3f}); "
                     f"{r['same_tokens']} of {r['new_tokens']} tokens as the original's"
                     + (f"; its kernels: {', '.join(r['kernel_types'])}" if r.get("kernel_types") else ""))
    return lines


def _kernel_table(report):
    from rich.table import Table

    table = Table(title="kernels plugged in")
    for col in ("type", "file", "from", "sites swapped"):
        table.add_column(col)
    for t, k in report["kernels"].items():
        n = sum(1 for s in report["sites"] if s["kernel_type"] == t and s["swapped"])
        table.add_row(t, k["path"], k["source"], str(n) if n else "[dim]none in this model[/dim]")
    return table


STATE_STYLE = {"swapped": "green", "unused": "yellow", "left out": "magenta", "kept": "yellow"}


def site_rows(report: dict) -> list[dict]:
    """The site table's rows: sites grouped over repeated layers (layers.0.attn.wq ... layers.21.attn.wq is one
    row), each with its state (verification.site_state: swapped, unused, left out or kept), how many sites, their
    calls per forward and why the model's own code runs there."""
    import re

    groups = {}
    forwards = max(report["correctness"].get("forwards", 1), 1)
    for s in report["sites"]:
        key = (re.sub(r"\.\d+(?=\.|$)", ".*", s["where"]), s["what"], s["kernel_type"] or "", site_state(s),
               s["reason"])
        g = groups.setdefault(key, [0, 0, 0])
        g[0], g[1], g[2] = g[0] + 1, g[1] + s["calls"], g[2] + s["fallbacks"]
    rows = []
    for (where, what, kind, state, reason), (n, calls, fallbacks) in groups.items():
        if state == "unused":
            reason = reason or "never called (computed inline?)"
        elif fallbacks:
            reason = f"{fallbacks / forwards:g} calls/forward: {reason}"
        rows.append({"site": where, "what": what, "kernel": kind, "state": state, "count": n,
                     "calls": calls / forwards, "why": reason})
    return rows


def _site_table(report):
    from rich.table import Table

    table = Table(title="sites (calls per forward)")
    for col in ("site", "what", "kernel", "", "count", "calls", "left alone because"):
        table.add_column(col, justify="right" if col in ("count", "calls") else "left")
    for r in site_rows(report):
        style = STATE_STYLE[r["state"]]
        table.add_row(r["site"], r["what"], r["kernel"], f"[{style}]{r['state']}[/{style}]", str(r["count"]),
                      f"{r['calls']:g}", r["why"])
    return table


def _timing_table(report):
    from rich.table import Table

    label = " (CPU, Triton interpreter: NOT performance figures)" if report["cpu_mode"] else ""
    table = Table(title=f"end-to-end latency, median{label}; torch.compile backend {report['compile_backend']}",
                  caption="an optimized row against the original of its mode: the median of their ratios turn by turn "
                          "(its interval last); else the ratio of the medians")
    for col in ("model", "ms", "noise", "host share", "vs eager", "vs torch.compile", "in turns, 99% interval"):
        table.add_column(col, justify="left" if col == "model" else "right")
    names = {"eager": "original, eager", "compile": "original, torch.compile", "optimized": "optimized",
             "optimized_compile": "optimized + torch.compile"}
    for k, r in report["timing"].items():
        name = names[k.removesuffix("_graph")] + (", CUDA graph" if k.endswith("_graph") else "")
        ratios = [f"{r[key]:.2f}x" if key in r else "-" for key in ("speedup_vs_eager", "speedup_vs_compile")]
        host = f"{r['host_share']:.0%}" if "host_share" in r else "-"
        interval = "{:.3f}-{:.3f}x".format(*r["speedup_interval"]) if "speedup_interval" in r else "-"
        table.add_row(name, f"{r['ms']:.3f}", f"{r['noise_pct']:.1f}%", host, *ratios, interval)
    return table


def _explain(e: Exception) -> str:
    known = ("ModelError", "KernelFileError", "ValueError", "KeyError", "RuntimeError", "KernelCallError")
    return cli.error_text(e, known)


if __name__ == "__main__":
    sys.exit(main())
