"""Region kernels as the model runs them (GPU): the compiled forward's kernels without and with them.

Each region kernel file alone, then all together, from a profile of the forward, not the harness's timing.

    python scripts/region_profile.py benchmarks/hf/pythia-410m [--kernels workspace/kernels] [--shape 1,2048]
    python scripts/region_profile.py benchmarks/hf/pythia-410m --configs 8 --only R04

For each set it prints the forward's kernel time against the compiled original, the places the region pass
filled, and the kernels that appear or disappear with it (calls a forward, us a call): a region kernel's own
time as the model runs it (its inputs warm in the L2 from the kernel before, where the harness flushes the L2),
and any kernel Inductor adds beside it (a match that leaves part of its region to Inductor shows up here).
With --configs N, each file (those whose name holds --only) alone under N configurations of its TUNABLES, drawn
as scripts/l2_regimes.py draws them (search.drawn_from: the same N, the same configurations in the same order): the
model's ranking of them, to hold against the harness's under each L2 flush.
"""

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import autokernel  # noqa: E402
from autokernel.kernelfile import apply_config  # noqa: E402
from autokernel.loop.agents import search  # noqa: E402
from autokernel.profile.profiling import is_device_work  # noqa: E402
from autokernel.verify import regiondeploy  # noqa: E402

FORWARDS = 5


def kernels(fn, x) -> dict[str, tuple[float, float]]:
    """{kernel name: (calls a forward, us a forward)} from a profile of FORWARDS forwards after a warm-up."""
    with torch.no_grad():
        for _ in range(3):
            fn(x)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(FORWARDS):
                fn(x)
            torch.cuda.synchronize()
    found = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if is_device_work(event):  # not the ranges' device-side shadows: they would count the kernels again
            found[event.name][0] += 1
            found[event.name][1] += event.device_time
    return {name: (n / FORWARDS, us / FORWARDS) for name, (n, us) in found.items()}


def report(label: str, got: dict, base: dict) -> None:
    total, base_total = (sum(us for _, us in k.values()) for k in (got, base))
    print(f"{label}: {total:.1f} us of kernels a forward ({total - base_total:+.1f} us, "
          f"{base_total / total:.3f}x), {regiondeploy.matches()} places")
    changed = [(name, got.get(name, (0, 0.0)), base.get(name, (0, 0.0))) for name in {*got, *base}]
    changed = [c for c in changed if c[1][0] != c[2][0]]
    for name, (n, us), (n0, us0) in sorted(changed, key=lambda c: -abs(c[1][1] - c[2][1])):
        now = f"x{n:g} {us / n:.2f} us a call" if n else "gone"
        print(f"  {us - us0:+8.1f} us  {now:24s} (x{n0:g} before)  {name[:100]}")


def main() -> None:
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="an HF config directory (benchmarks/hf/NAME)")
    ap.add_argument("--kernels", default="workspace/kernels", help="where the region kernel files are")
    ap.add_argument("--shape", default="1,2048", help="the input ids' shape (default 1,2048)")
    ap.add_argument("--configs", type=int, default=0, help="time each file alone under N of its configurations")
    ap.add_argument("--only", default="", help="with --configs: the files whose name holds this")
    args = ap.parse_args()
    files = sorted(regiondeploy.region_files(args.kernels).values())
    if not files or not torch.cuda.is_available():
        sys.exit("region_profile.py: needs a CUDA GPU and region kernel files (extract.py --regions)")
    config = transformers.AutoConfig.from_pretrained(args.config)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to("cuda", torch.float16).eval()
    x = torch.randint(0, config.vocab_size, tuple(int(s) for s in args.shape.split(",")), device="cuda")
    with torch._inductor.config.patch(fx_graph_cache=False):
        base = kernels(torch.compile(model), x)
        print(f"compiled original: {sum(us for _, us in base.values()):.1f} us of kernels a forward")
        if args.configs:
            for f in (f for f in files if args.only in f.name):
                for i, tunables in enumerate(search.drawn_from(f.read_text(), args.configs)):
                    profiled(model, x, base, [(f, apply_config(f.read_text(), tunables))],
                             f"{f.name} config {i} {json.dumps(tunables, sort_keys=True)}")
            return
        for chosen in [[f] for f in files] + ([files] if len(files) > 1 else []):
            profiled(model, x, base, [(f, f.read_text()) for f in chosen], " + ".join(f.name for f in chosen))


def profiled(model, x, base: dict, files: list[tuple[Path, str]], label: str) -> None:
    """The compiled forward's kernels with these region kernel files (name, source) installed, against base."""
    with tempfile.TemporaryDirectory() as tmp:
        for path, source in files:
            (Path(tmp) / path.name).write_text(source)
        torch._dynamo.reset()
        try:
            autokernel.install_regions(tmp, verified=None, quiet=True)
            report(label, kernels(torch.compile(model), x), base)
        except Exception as e:  # noqa: BLE001  (a set that does not compile: said, the next one runs)
            print(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        finally:
            autokernel.uninstall_regions()


if __name__ == "__main__":
    main()
