"""Developer tool (GPU): what torch.compile does with a reference, to learn from it.

    python scripts/inductor_code.py rmsnorm reduce [--out inductor.txt]

For each kernel type, compiles reference.py's function with mode max-autotune-no-cudagraphs at the
spec's bench shape (fp16), times it with autokernel.harness.timing, and writes the Triton kernels Inductor
generated together with the configurations its autotuner chose (.best_config: XBLOCK, R0_BLOCK,
num_warps, num_stages) to one text file. The reduce starter's defaults came from here.
"""

import argparse
import glob
import os
import sys
import tempfile
from pathlib import Path


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("types", nargs="+", help="kernel types, e.g. rmsnorm layernorm reduce")
    p.add_argument("--out", default="inductor.txt", help="where the generated code goes")
    args = p.parse_args()
    cache = tempfile.mkdtemp(prefix="inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # read when torch._inductor is first imported
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import torch

    from autokernel.harness import timing
    from autokernel.harness.perf import gpu_input_sets
    from autokernel.registry import get_spec

    report = []
    for name in args.types:
        spec = get_spec(name)
        sets = gpu_input_sets(spec, spec.bench_shape, torch.float16)
        before = set(glob.glob(f"{cache}/**/*", recursive=True))
        fn = torch.compile(spec.reference, mode="max-autotune-no-cudagraphs")
        us = timing.time_gpu(fn, sets).median_us
        report.append(f"######## {name} {spec.bench_shape} fp16: torch.compile {us:.1f} us")
        print(report[-1])
        for path in sorted(set(glob.glob(f"{cache}/**/*", recursive=True)) - before):
            if not path.endswith((".best_config", ".py")):
                continue  # compiled binaries and cubins sit beside the sources
            text = Path(path).read_text()
            if path.endswith(".best_config") or "@triton.jit" in text:
                report.append(f"==== {path}\n{text}")
        torch._dynamo.reset()
    Path(args.out).write_text("\n".join(report))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
