"""verify.py: plug the optimized kernels into a model, prove it is still correct, measure the end-to-end speedup.

    python verify.py --model models/llama.py --class-name LlamaModel --config tinyllama --input-shape 1,2048
    python verify.py --model models/llama.py --class-name LlamaModel --input-shape 1,2048 --compile --json v.json
    python verify.py --module transformers --class-name AutoModelForCausalLM --config gpt2 --input-shape 1,1024
    python verify.py --model models/gpt2.py --class-name GPT2Model --config tiny --input-shape 2,32 --device cpu

Kernels: for each type the loop's winner workspace/kernels/*<type>*_optimized.py, else the extracted
workspace/kernels/NN_<type>.py, else the starter kernels/<type>.py (--kernels DIR searches DIR instead
of workspace/kernels; --types limits the types). Each is registered as a torch.library custom op
(autokernel::<type>) and swapped into the model site by site (autokernel/swap.py); the report lists
every site, replaced or left alone, and why.

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
--compile the optimized model under torch.compile, all in this process through autokernel.timing
(median of many runs, L2 flushed between runs). With --cuda-graph every row is timed again replayed
from a CUDA graph (the GPU time alone, no Python or launch overhead, as a fixed-shape server runs)
and compared with the original's graphed rows. Before timing, on a GPU, each kernel type is left out
in turn and stays out if the model is more than 1% faster without it (a kernel can win at the
harness's shape and lose at the model's); --keep-all times them all. Without a GPU the kernels run
through Triton's CPU interpreter and the compiler backend is aot_eager (inductor's C++ build would
dominate a test run): those timings only show that the pipeline runs and are labelled so.

Exit status: 0 when the optimized model matches, 1 when it does not, 2 when it could not be run.
"""

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from autokernel.cli import add_model_arguments

ROOT = Path(__file__).resolve().parent
CHECK_INPUTS = 3  # fresh inputs the optimized model must match the original on
TIMING_INPUTS = 2  # input sets the timed runs rotate through
CHECK_SEED, TIMING_SEED = 1, 1000  # seeds of the checked and of the timed inputs (distinct sets)
GPU_BACKEND, CPU_BACKEND = "inductor", "aot_eager"  # torch.compile backends (see the docstring)
DEFAULT_KERNELS = ROOT / "workspace" / "kernels"
PRUNE_MARGIN = 0.01  # a kernel type is left out when the model runs this much faster without it


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    p = argparse.ArgumentParser(prog="verify.py", description=doc[0].split(": ", 1)[1].capitalize(),
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Examples:\n" + doc[1] + "\n\n" + "\n\n".join(doc[2:]))
    how = add_model_arguments(p, presets="tiny, compact, tinyllama, ...",
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
    how.add_argument("--keep-all", action="store_true",
                     help="GPU: time every correct kernel plugged in, even those the model is faster without "
                          "(by default each is left out in turn and kept only if it helps)")
    how.add_argument("--checks", type=int, default=CHECK_INPUTS,
                     help=f"fresh inputs to compare outputs on (default {CHECK_INPUTS})")
    how.add_argument("--no-timing", action="store_true", help="check correctness only")
    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    out.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.model is None) == (args.module is None):
        parser.error("give either --model FILE or --module PACKAGE")
    try:
        report = run(args)
    except Exception as e:  # every failure a user can cause becomes one line naming it
        if args.debug:
            raise
        print(f"verify.py: error: {_explain(e)}", file=sys.stderr)
        return 2
    show(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0 if report["correctness"]["status"] == "PASS" else 1


def _pick_device(requested) -> str:
    """cuda or cpu; on the CPU, Triton's interpreter is switched on before any kernel file is imported."""
    from autokernel import gpu

    device = gpu.pick_device(requested)
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # read when a kernel file's @triton.jit runs: set it first
        from autokernel.compat import prepare_interpreter

        prepare_interpreter()
    return device


def run(args) -> dict:
    device = _pick_device(args.device)
    import torch

    from autokernel import gpu, swap
    from autokernel.models import describe_model, load_model, parse_shape
    from autokernel.registry import dtype_name, parse_dtype

    dtype, shape = parse_dtype(args.dtype), parse_shape(args.input_shape)
    if args.checks < 1:
        raise ValueError("--checks must be at least 1")
    if not args.kernels.is_dir() and args.kernels != DEFAULT_KERNELS:
        raise ValueError(f"--kernels {args.kernels}: no such directory")
    choices = load_kernels(args.kernels, [t.strip() for t in args.types.split(",") if t.strip()] or None)
    model = load_model(args.class_name, model_file=args.model, module=args.module, config=args.config,
                       pretrained=args.pretrained, device=device, dtype=dtype)
    inputs = lambda seed: _inputs(model, shape, device, dtype, seed)
    with torch.no_grad():
        optimized = swap.build(model, list(choices))
        correctness = check(model, optimized, inputs, dtype, args.checks)
        sites = [s.to_dict() for s in optimized.sites()]  # calls counted over the checked forwards only
        checked_types = optimized.swapped_types()
        timed = not args.no_timing and correctness["status"] == "PASS"
        graphs = args.cuda_graph and device == "cuda"
        pruned = {}
        if timed and device == "cuda" and not args.keep_all:
            optimized, pruned = prune(model, optimized, inputs, device, graphs)
            _mark_pruned(sites, pruned)
        timings = time_models(model, optimized, inputs, device, args.compile, graphs) if timed else {}
        graph = graph_breaks(optimized, inputs(CHECK_SEED)) if args.compile and correctness["status"] == "PASS" \
            else None
    return {
        "model": describe_model(model), "class_name": args.class_name, "source": args.model or args.module,
        "config": args.config, "input_shape": list(shape), "dtype": dtype_name(dtype), "device": device,
        "gpu": gpu.device_name(device) if device == "cuda" else None, "cpu_mode": device == "cpu",
        "kernels": {t: {"path": _rel(c.path), "source": c.source, "passed_over": [_rel(p) for p in c.passed_over]}
                    for t, c in choices.items()},
        "sites": sites, "swapped_types": [t for t in checked_types if t not in pruned], "pruned": pruned,
        "unused_types": sorted(set(choices) - set(checked_types)),
        "correctness": correctness, "timing": timings, "graph": graph,
        "compile_backend": GPU_BACKEND if device == "cuda" else CPU_BACKEND,
        "torch": torch.__version__, "triton": _triton_version(), "command": "python " + shlex.join(sys.argv),
    }


def load_kernels(kernels_dir: Path, types: list[str] | None) -> dict:
    """The best file of every type (see autokernel/customops.py), each plugged into its custom op."""
    from autokernel import customops

    choices = customops.find_kernels(kernels_dir, ROOT / "kernels", types)
    for choice in choices.values():
        customops.load(choice)
    return choices


def _inputs(model, shape, device, dtype, seed: int) -> tuple:
    import torch

    from autokernel.models import example_inputs

    torch.manual_seed(seed)  # models with their own example_inputs draw from the global generator
    return example_inputs(model, shape, device, dtype, seed=seed)


# ------------------------------------------------------------------------------ correctness
def check(model, optimized, inputs, dtype, n_inputs: int = CHECK_INPUTS) -> dict:
    """Compare the optimized model with the original on n_inputs fresh inputs; blame on a mismatch."""
    from autokernel import customops, swap

    tol = swap.REL_L2_TOLERANCE[dtype]
    runs, cases = [], []
    for i in range(n_inputs):
        args = inputs(CHECK_SEED + i)
        want = forward(model, args)
        try:
            got = forward(optimized.model, args, optimized.patched)
        except customops.KernelCallError as e:
            return {"status": "FAIL", "tolerance_rel_l2": tol, "inputs": runs, "blamed": [e.kernel_type],
                    "reason": str(e).splitlines()[0], "forwards": i}
        runs.append(compare(got, want, tol))
        cases.append((args, want))
    failed = [c for c, r in zip(cases, runs) if not r["ok"]]
    result = {"status": "FAIL" if failed else "PASS", "tolerance_rel_l2": tol, "inputs": runs,
              "worst_rel_l2": max(r["rel_l2"] for r in runs), "forwards": n_inputs}
    if failed:
        result["blame"] = blame(model, optimized.swapped_types(), failed[:1], tol)
        result["blamed"] = [t for t, r in result["blame"].items() if not r["ok"]]
        result["reason"] = _mismatch_reason(result)
    return result


def forward(model, args, scope=None):
    """(main output, next-token loss or None) of one forward, inside `scope` (the patches) if given."""
    import contextlib

    with (scope or contextlib.nullcontext)():
        out = _main_output(model(*args))
        return out, _lm_loss(model, args, out)


def _main_output(out):
    """The tensor to compare: the output itself, or the logits / last hidden state / first tensor."""
    import torch

    for name in ("logits", "last_hidden_state"):
        if getattr(out, name, None) is not None:
            return getattr(out, name)
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        out = next((o for o in out if isinstance(o, torch.Tensor)), None)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"the model returned {type(out).__name__}: verify.py compares tensors or logits")
    return out


def _lm_loss(model, args, logits):
    """The loss a training step computes on a language model's logits: next-token cross-entropy.

    Computed through F.cross_entropy, so that in the optimized model it runs the cross_entropy kernel."""
    import torch.nn.functional as F

    from autokernel.models import config_value

    vocab, ids = config_value(model, "vocab_size"), args[0] if args else None
    if (vocab is None or ids is None or ids.is_floating_point() or ids.dim() != 2 or ids.shape[1] < 2
            or logits.dim() != 3 or tuple(logits.shape) != (*ids.shape, vocab)):
        return None
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))


def compare(got, want, tol: float) -> dict:
    """Norm-wise and elementwise errors of (output, loss) against the original's."""
    import torch

    from autokernel.swap import rel_l2

    (out, loss), (ref, ref_loss) = got, want
    if out.shape != ref.shape:
        return {"ok": False, "rel_l2": float("inf"), "reason": f"output shape {tuple(out.shape)}, "
                                                              f"expected {tuple(ref.shape)}"}
    bad = int((~torch.isfinite(out) & torch.isfinite(ref)).sum())
    diff = (out.double() - ref.double()).abs().nan_to_num(float("inf"))
    scale = float(ref.double().abs().max()) or 1.0
    r = {"rel_l2": float("inf") if bad else rel_l2(out, ref), "max_abs": float(diff.max()),
         "max_rel": float(diff.max()) / scale, "nonfinite": bad}
    if loss is not None and ref_loss is not None:
        r["loss"], r["ref_loss"] = float(loss), float(ref_loss)
        r["loss_rel"] = abs(float(loss) - float(ref_loss)) / max(abs(float(ref_loss)), 1e-12)
    r["ok"] = r["rel_l2"] <= tol and r.get("loss_rel", 0.0) <= tol
    return r


def blame(model, types, cases, tol) -> dict:
    """Each swapped type alone in the model: its error on the failing inputs."""
    from autokernel import customops, swap

    found = {}
    for t in types:
        single = swap.build(model, [t])
        results = []
        for args, want in cases:
            try:
                results.append(compare(forward(single.model, args, single.patched), want, tol))
            except customops.KernelCallError as e:
                results.append({"ok": False, "rel_l2": float("inf"), "reason": str(e).splitlines()[0]})
        found[t] = max(results, key=lambda r: (not r["ok"], r["rel_l2"]))
    return found


def _mismatch_reason(result) -> str:
    worst = max(result["inputs"], key=lambda r: r["rel_l2"])
    what = f"relative L2 error {worst['rel_l2']:.3g} > {result['tolerance_rel_l2']:g}"
    if worst.get("nonfinite"):
        what = f"{worst['nonfinite']} NaN/Inf outputs where the original is finite"
    elif worst.get("loss_rel", 0) > result["tolerance_rel_l2"]:
        what = f"loss off by {worst['loss_rel']:.3g} (relative)"
    if result["blamed"]:
        return f"{what}; alone over the tolerance: {', '.join(result['blamed'])}"
    errors = {t: r["rel_l2"] for t, r in result["blame"].items()}
    top = max(errors, key=errors.get) if errors else "none"
    return f"{what}; no kernel alone exceeds the tolerance, their errors add up (largest alone: {top})"


def _mark_pruned(sites: list[dict], pruned: dict) -> None:
    for site in sites:
        if site["swapped"] and site["kernel_type"] in pruned:
            site["swapped"], site["reason"] = False, pruned[site["kernel_type"]]


# ------------------------------------------------------------------------------ timing
def time_models(model, optimized, inputs, device: str, with_compile: bool, with_graphs: bool = False) -> dict:
    """Median latency of the original (eager, compiled) and the optimized model, one process, one protocol."""
    import torch

    from autokernel import timing

    backend = GPU_BACKEND if device == "cuda" else CPU_BACKEND
    sets = [inputs(TIMING_SEED + i) for i in range(TIMING_INPUTS)]
    runs = {"eager": model, "compile": torch.compile(model, backend=backend), "optimized": optimized}
    if with_compile:
        runs["optimized_compile"] = optimized.compiled(backend)
    if with_graphs:  # every row again, replayed from a CUDA graph, and compared with its graphed original
        runs.update({f"{name}_graph": timing.cuda_graphed(fn, sets[0]) for name, fn in list(runs.items())})
    result = {}
    for name, fn in runs.items():
        t = timing.time_fn(fn, sets, device)
        result[name] = {"ms": t.median_us / 1e3, "noise_pct": t.spread_pct, "runs": len(t.samples_us)}
    for name, r in result.items():
        mode = "_graph" if name.endswith("_graph") else ""
        r["speedup_vs_eager"] = result["eager" + mode]["ms"] / r["ms"]
        r["speedup_vs_compile"] = result["compile" + mode]["ms"] / r["ms"]
    return result


def prune(model, optimized, inputs, device: str, graphs: bool):
    """Leave out, one type at a time, each kernel whose removal makes the whole model faster.

    A kernel that beats PyTorch at the harness's shape can still lose at this model's shapes (a
    Triton matmul against cuBLAS at N=256), and the end-to-end time is what counts. Greedy, in the
    order of the types; timed like time_models (from a CUDA graph with --cuda-graph).
    """
    from autokernel import swap, timing

    sets = [inputs(TIMING_SEED + i) for i in range(TIMING_INPUTS)]

    def ms(candidate) -> float:
        fn = timing.cuda_graphed(candidate, sets[0]) if graphs else candidate
        return timing.time_fn(fn, sets, device).median_us / 1e3

    keep, best, dropped = optimized.swapped_types(), ms(optimized), {}
    for kernel_type in list(keep):
        trial = swap.build(model, [t for t in keep if t != kernel_type])
        trial_ms = ms(trial)
        if trial_ms < best * (1 - PRUNE_MARGIN):
            dropped[kernel_type] = f"the model is faster without it ({trial_ms:.3f} ms vs {best:.3f} ms)"
            keep.remove(kernel_type)
            optimized, best = trial, trial_ms
    return optimized, dropped


def graph_breaks(optimized, args) -> dict:
    """Graphs and graph breaks dynamo makes of the optimized model (0 breaks: the kernels are graph nodes)."""
    import torch._dynamo

    with optimized.patched():
        explained = torch._dynamo.explain(optimized.model)(*args)
    torch._dynamo.reset()  # explain's traces are not the ones to time
    return {"graphs": explained.graph_count, "graph_breaks": explained.graph_break_count,
            "break_reasons": [str(b.reason) for b in explained.break_reasons][:10]}


# ------------------------------------------------------------------------------ report
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
    for t, why in report["pruned"].items():
        console.print(f"left out after timing: {t}: {why}")
    if report["timing"]:
        console.print(_timing_table(report))
    if report["graph"]:
        g = report["graph"]
        console.print(f"torch.compile of the optimized model: {g['graphs']} graph(s), {g['graph_breaks']} break(s)"
                      + "".join(f"\n  break: {r}" for r in g["break_reasons"]))
    print("---")
    for key, value in summary(report).items():
        print(f"{key}: {'' if value is None else (f'{value:.4g}' if isinstance(value, float) else value)}")


def summary(report: dict) -> dict:
    """The greppable key: value lines."""
    t, c, g = report["timing"], report["correctness"], report["graph"] or {}
    ms = lambda k: t[k]["ms"] if k in t else None
    return {"correctness": c["status"], "blamed": ",".join(c.get("blamed", [])) or None,
            "worst_rel_l2": c.get("worst_rel_l2"), "swapped_types": ",".join(report["swapped_types"]),
            "eager_ms": ms("eager"), "compile_ms": ms("compile"), "optimized_ms": ms("optimized"),
            "optimized_compile_ms": ms("optimized_compile"), "eager_graph_ms": ms("eager_graph"),
            "compile_graph_ms": ms("compile_graph"), "optimized_graph_ms": ms("optimized_graph"),
            "optimized_compile_graph_ms": ms("optimized_compile_graph"), "pruned": ",".join(report["pruned"]) or None,
            "speedup_vs_eager": t["optimized"]["speedup_vs_eager"] if t else None,
            "speedup_vs_compile": t["optimized"]["speedup_vs_compile"] if t else None,
            "compiled_speedup_vs_compile": t["optimized_compile"]["speedup_vs_compile"]
            if "optimized_compile" in t else None,
            "graph_speedup_vs_eager": t["optimized_graph"]["speedup_vs_eager"] if "optimized_graph" in t else None,
            "graph_speedup_vs_compile": t["optimized_graph"]["speedup_vs_compile"] if "optimized_graph" in t else None,
            "graph_breaks": g.get("graph_breaks"), "device": report["gpu"] or "cpu", "cpu_mode": report["cpu_mode"]}


def _kernel_table(report):
    from rich.table import Table

    table = Table(title="kernels plugged in")
    for col in ("type", "file", "from", "sites swapped"):
        table.add_column(col)
    for t, k in report["kernels"].items():
        n = sum(1 for s in report["sites"] if s["kernel_type"] == t and s["swapped"])
        table.add_row(t, k["path"], k["source"], str(n) if n else "[dim]none in this model[/dim]")
    return table


def _site_table(report):
    """Sites grouped over repeated layers: layers.0.attn.wq ... layers.21.attn.wq is one row."""
    import re

    from rich.table import Table

    groups = {}
    forwards = max(report["correctness"].get("forwards", 1), 1)
    for s in report["sites"]:
        key = (re.sub(r"\.\d+(?=\.|$)", ".*", s["where"]), s["what"], s["kernel_type"], s["swapped"], s["reason"])
        g = groups.setdefault(key, [0, 0, 0])
        g[0], g[1], g[2] = g[0] + 1, g[1] + s["calls"], g[2] + s["fallbacks"]
    table = Table(title="sites (calls per forward)")
    for col in ("site", "what", "kernel", "", "count", "calls", "left alone because"):
        table.add_column(col, justify="right" if col in ("count", "calls") else "left")
    for (where, what, kind, swapped, reason), (n, calls, fallbacks) in groups.items():
        status = "[green]swapped[/green]" if swapped else "[yellow]kept[/yellow]"
        if swapped and not calls:
            status, reason = "[yellow]unused[/yellow]", reason or "never called (computed inline?)"
        elif fallbacks:
            reason = f"{fallbacks / forwards:g} calls/forward: {reason}"
        table.add_row(where, what, kind or "", status, str(n), f"{calls / forwards:g}", reason)
    return table


def _timing_table(report):
    from rich.table import Table

    label = " (CPU, Triton interpreter: NOT performance figures)" if report["cpu_mode"] else ""
    table = Table(title=f"end-to-end latency, median{label}; torch.compile backend {report['compile_backend']}")
    for col in ("model", "ms", "noise", "vs eager", "vs torch.compile"):
        table.add_column(col, justify="left" if col == "model" else "right")
    names = {"eager": "original, eager", "compile": "original, torch.compile", "optimized": "optimized",
             "optimized_compile": "optimized + torch.compile"}
    for k, r in report["timing"].items():
        name = names[k.removesuffix("_graph")] + (", CUDA graph" if k.endswith("_graph") else "")
        table.add_row(name, f"{r['ms']:.3f}", f"{r['noise_pct']:.1f}%", f"{r['speedup_vs_eager']:.2f}x",
                      f"{r['speedup_vs_compile']:.2f}x")
    return table


def _rel(path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _triton_version():
    import triton

    return triton.__version__


def _explain(e: Exception) -> str:
    known = ("ModelError", "KernelFileError", "ValueError", "KeyError", "RuntimeError", "KernelCallError")
    text = str(e).splitlines()[0].strip("'\"") if str(e) else type(e).__name__
    return text if type(e).__name__ in known else f"{type(e).__name__}: {text} (--debug shows where)"


if __name__ == "__main__":
    sys.exit(main())
