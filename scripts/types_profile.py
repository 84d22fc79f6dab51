"""Kernel types as the model runs them (GPU): the forward's kernels with one set of types against another.

verify.py's prune says which set the model runs faster with (Qwen3-0.6B under torch.compile on an H200: 1.108x with
flash_attention and rotary_embedding in rope_attention's place, where the harness timed rope_attention's call 57 us);
this says where the difference is, kernel by kernel, from a profile of the forward rather than one call's timing:

    python scripts/types_profile.py benchmarks/hf/qwen3-0.6b --types rope_attention \
        --against flash_attention,rotary_embedding [--kernels workspace/kernels] [--shape 1,2048] [--eager]
    python scripts/types_profile.py benchmarks/hf/tinyllama --types add_rmsnorm,fused_mlp,rmsnorm,rope_attention \
        --against none --generate 64 --shape 1,128        # generate()'s decode steps against the original's

Each set runs the model as verify.py runs it (model(ids), HF's cache as its config has it) under torch.compile
(--eager: without), with the kernel files of --kernels (the starters for types without one there); "none" is the
original model. With --generate N, a call is generate() of N new tokens with a static cache after the --shape prompt,
its decode steps compiled as transformers compiles them (CUDA graphs; --eager: not compiled), as verify.py --generate
times it. It prints each set's kernel time a call and the kernels whose calls or time a call differ by more than
--min-us (calls a call and us a kernel call on each side); --code DIR writes each set's compiled forward as Inductor
generated it (what a fused kernel of the profile computes: its name lists only the ops it came from).
"""

import argparse
import contextlib
import sys
from pathlib import Path

import torch
from torch._inductor.utils import run_and_get_code

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from region_profile import kernels  # noqa: E402  (scripts/: the profile of FORWARDS forwards, kernel by kernel)

from autokernel.verify import generation  # noqa: E402
from autokernel.verify.deploy import optimize  # noqa: E402


def profiled(model, x, types: list[str], kernels_dir: str, eager: bool, new_tokens: int, code: Path | None) -> dict:
    """{kernel: (calls a call, us a call)} of the model with `types` deployed (none: the original), compiled unless
    eager; a call is a forward, or generate() of new_tokens tokens. code: a file for the compiled forward's code."""
    torch._dynamo.reset()
    optimized = optimize(model, kernels_dir, types=types, verified=None, quiet=True) if types else model
    if not new_tokens:
        fn = optimized if eager else torch.compile(optimized)
        if code is not None and not eager:  # Inductor's code of the forward, what each kernel computes
            with torch.no_grad():
                code.write_text("\n\n".join(run_and_get_code(fn, x)[1]))
        return kernels(fn, x)
    compiled = contextlib.nullcontext() if eager else generation.compiled_by_transformers(optimized, "inductor", True)
    with compiled as config:
        return kernels(generation.generating(optimized, new_tokens, config), x)


def differences(got: dict, against: dict, min_us: float) -> list[str]:
    """One line per kernel whose calls or time a forward differ, the largest difference first."""
    lines = []
    for name in sorted({*got, *against}, key=lambda n: -abs(got.get(n, (0, 0.0))[1] - against.get(n, (0, 0.0))[1])):
        (n, us), (n0, us0) = got.get(name, (0, 0.0)), against.get(name, (0, 0.0))
        if n != n0 or abs(us - us0) > min_us:
            side = lambda calls, t: f"x{calls:g} {t / calls:.2f} us" if calls else "none"  # noqa: E731
            lines.append(f"  {us - us0:+8.1f} us  {side(n, us):20s} against {side(n0, us0):20s} {name[:100]}")
    return lines


def main() -> None:
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="an HF config directory (benchmarks/hf/NAME)")
    for flag, which in (("--types", "first"), ("--against", "second")):
        ap.add_argument(flag, required=True, help=f"the kernel types of the {which} set, comma-separated (none: the "
                                                  "original model)")
    ap.add_argument("--kernels", default="workspace/kernels", help="the kernel files (default workspace/kernels)")
    ap.add_argument("--shape", default="1,2048", help="the input ids' shape (default 1,2048)")
    ap.add_argument("--eager", action="store_true", help="run the model as it is, not under torch.compile")
    ap.add_argument("--generate", type=int, default=0, metavar="N",
                    help="profile generate() of N new tokens (a static cache) instead of a forward")
    ap.add_argument("--min-us", type=float, default=1.0, help="show kernels whose time a forward differs by more")
    ap.add_argument("--code", type=Path, metavar="DIR",
                    help="write each set's compiled forward (Inductor's code) to DIR/<types>.py")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("types_profile.py: needs a CUDA GPU")
    config = transformers.AutoConfig.from_pretrained(args.config)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to("cuda", torch.float16).eval()
    x = torch.randint(0, config.vocab_size, tuple(int(s) for s in args.shape.split(",")), device="cuda")
    sets = [[] if s == "none" else s.split(",") for s in (args.types, args.against)]
    names = ["+".join(types) or "the original" for types in sets]
    if args.code:
        args.code.mkdir(parents=True, exist_ok=True)
    with torch._inductor.config.patch(fx_graph_cache=False):
        got, against = (profiled(model, x, types, args.kernels, args.eager, args.generate,
                                 args.code / f"{name.replace(' ', '_')}.py" if args.code else None)
                        for types, name in zip(sets, names))
    total, total0 = (sum(us for _, us in k.values()) for k in (got, against))
    call = f"generate() of {args.generate} tokens" if args.generate else "forward"
    print(f"{names[0]}: {total:.1f} us of kernels a {call}; {names[1]}: {total0:.1f} us ({total0 / total:.3f}x)")
    print("\n".join(differences(got, against, args.min_us)))


if __name__ == "__main__":
    main()
