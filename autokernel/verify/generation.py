"""verify.py --generate N: what generation gets from the kernels. Tokens per second of the model's generate() with a
static cache, greedy, N new tokens after the checked input's first sequence (the prompt's prefill included in the
time), the original and the optimized model
timed in turns (as the forward's rows are); eagerly (transformers' own compile of a static cache's decoding turned
off), and with --compile as transformers runs a static cache by default: the prefill eager, each decode step through
its compiled __call__, on a GPU in torch.compile's reduce-overhead mode, CUDA graphs (the row "compile_graph";
"compile" on the CPU, where transformers compiles only when told to). The user's model is given back as it was.

The prune chose the kernels on the forward. Decoding runs other shapes, one token against the cache: the model
timed here is what optimize() deploys, the kept types and those no forward runs (decode_attention takes each decode
step's attention; decide() leaves them out where generation runs faster without them, on a GPU where verify.py
prunes), and a call no kernel covers runs the original code. The row says whether generation gains or
loses, with the same interval as every other row, which kernels ran, and how many of the N tokens the optimized model
chose as the original did (random weights make near ties: a few differing tokens are rounding, not a wrong kernel;
the check proves the forward).
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

from autokernel.harness import timing
from autokernel.ops import swap
from autokernel.verify import endtoend, noise

TURNS = 5  # generate() calls of each model in turns per round, on a GPU (each is N forwards)
CPU_TURNS = 2
ROUNDS = 4  # rounds of TURNS at most: a close call (noise.close_call) gets another that ends within ROUND_BUDGET_S
ROUND_BUDGET_S = 20.0  # of timing per mode: TinyLlama's compiled generate of 64 tokens takes 0.2 s, its eager one 1.4


def measure(model, optimized: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, device: str,
            with_compile: bool) -> dict:
    """{mode: {original_tokens_per_s, optimized_tokens_per_s, speedup, speedup_interval, same_tokens, new_tokens}}
    for eager (and compile or compile_graph), a mode that fails as {"error": ...}; {"error": ...} for a model
    without generate()."""
    if not callable(getattr(model, "generate", None)):
        return {"error": "the model has no generate() (a transformers model has)"}
    modes = {"eager": lambda m: contextlib.nullcontext()}  # no CompileConfig: nothing compiled
    graphs = device == "cuda"
    if with_compile:
        backend = endtoend.backend_for(device)
        modes["compile_graph" if graphs else "compile"] = lambda m: compiled_by_transformers(m, backend, graphs)
    rows = {}
    for mode, wrapped in modes.items():
        try:
            with wrapped(model) as config, wrapped(optimized):
                rows[mode] = _row(model, optimized, prompt, new_tokens, device, config)
                if mode == "eager" and hasattr(optimized, "autokernel"):  # which kernels generation ran
                    rows[mode]["kernel_types"] = optimized.autokernel.swapped_types()
        except Exception as e:  # a mode that cannot generate is reported; the other is still timed
            rows[mode] = {"error": endtoend._error_line(e)}
        if mode != "eager":
            torch._dynamo.reset()
    return rows


def _row(model, optimized, prompt, new_tokens: int, device: str, compile_config) -> dict:
    fns = {"original": generating(model, new_tokens, compile_config),
           "optimized": generating(optimized, new_tokens, compile_config)}
    tokens = {name: fn(prompt) for name, fn in fns.items()}  # also the warm-up: a compile happens here
    samples, v = _timed_in_rounds(fns, prompt, device)
    per_s = {name: new_tokens / (statistics.median(us) / 1e6) for name, us in samples.items()}
    same = int((tokens["original"] == tokens["optimized"]).sum()) if tokens["original"].shape == \
        tokens["optimized"].shape else 0
    return {"original_tokens_per_s": per_s["original"], "optimized_tokens_per_s": per_s["optimized"],
            "speedup": v.ratio, "speedup_interval": [v.low, v.high], "outcome": v.outcome, "same_tokens": same,
            "new_tokens": new_tokens}


def _timed_in_rounds(fns: dict, prompt: torch.Tensor, device: str) -> tuple[dict, noise.Verdict]:
    """Both generate()s timed in turns, a round at a time: five compiled generate()s of TinyLlama read 0.945x with an
    interval of 0.730-1.009 (an H100), too wide to say anything. Another round while the verdict is a close call
    (as a prune trial's, noise.close_call) and one more would end within ROUND_BUDGET_S of the first. ({name: samples},
    the verdict)."""
    turns, rounds = (TURNS, ROUNDS) if device == "cuda" else (CPU_TURNS, 1)
    samples, started = {name: [] for name in fns}, time.monotonic()
    for done in range(1, rounds + 1):
        for name, us in timing.time_turns(fns, [(prompt,)], device, turns, latency=True).items():
            samples[name] += us
        v = noise.compare(samples["original"], samples["optimized"], endtoend.PRUNE_MARGIN)  # as every row's
        spent = time.monotonic() - started
        if not noise.close_call(v, endtoend.PRUNE_MARGIN) or spent / done * (done + 1) > ROUND_BUDGET_S:
            break
    return samples, v


def decide(model, kept, candidates: list[str], prompt: torch.Tensor, new_tokens: int, device: str,
           with_compile: bool) -> tuple[dict, dict]:
    """The types no forward runs (decode_attention's decode steps), decided on generation as the prune decides the
    others on the forward: generate() with the kept types alone against generate() with those types too, in turns,
    eagerly and (with_compile) compiled. Returns ({type: why} left out eagerly, {type: why} left out where
    torch.compile traces the model): those that ran, in a mode where generation runs faster without them outside
    the noise (a type with no site in the model runs nowhere and stays). kept: the prune's swap.Optimized."""
    eager, traced = list(kept.types), list(kept.traced_types())
    trial = swap.build(model, eager + candidates, traced=traced + candidates)
    rows = measure(kept.module(), trial.module(), prompt, new_tokens, device, with_compile)
    ran = [t for t in candidates if t in rows.get("eager", {}).get("kernel_types", ())]  # a site took its calls
    dropped = {}
    for mode, r in rows.items():
        if r.get("outcome") == noise.FASTER:  # without them (the "original" side here) is faster
            low, high = r["speedup_interval"]
            dropped[mode] = {t: f"generate() runs faster without it in {mode} mode ({r['speedup']:.3f}x, "
                                f"{noise.CONFIDENCE:.0%} interval {low:.3f}-{high:.3f})" for t in ran}
    compiled = next((d for m, d in dropped.items() if m != "eager"), {})
    return dropped.get("eager", {}), compiled


def generating(model, new_tokens: int, compile_config=None):
    """prompt -> the new tokens of a greedy generate() with a static cache, exactly new_tokens of them; its decode
    steps compiled by transformers with compile_config, or not compiled at all (None)."""
    options = {"disable_compile": True} if compile_config is None else {"compile_config": compile_config}

    def generate(prompt):
        out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             cache_implementation="static", pad_token_id=0, **options)
        return out[:, prompt.shape[1]:]
    return generate


@contextlib.contextmanager
def compiled_by_transformers(model, backend, graphs: bool):
    """The CompileConfig under which generate() compiles the model's __call__ for its decode steps (in CUDA graphs:
    transformers' default for a static cache; the prefill stays eager, as transformers runs it); the compiled call
    transformers keeps on the model is taken off after. Our forward (the optimized model's patches) is what the
    compiled __call__ runs."""
    from transformers import CompileConfig

    config = CompileConfig(backend=backend, mode="reduce-overhead" if graphs else None)
    config._compile_all_devices = True  # transformers' switch for compiling off a GPU (its own tests use it)
    try:
        yield config
    finally:
        for name in ("_compiled_call", "_last_compile_config"):
            vars(model).pop(name, None)
