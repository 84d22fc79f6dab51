"""Developer tool (GPU): where the GPU time of a model's forward goes, original and with kernels swapped in.

    python scripts/verify_profile.py [TYPES]      # e.g. rmsnorm,rotary_embedding (default: every type)

TinyLlama's shape (models/llama.py --config tinyllama), batch 1, sequence 2048, fp16: one forward of
the original model and one of the model built by autokernel.ops.swap (as verify.py builds it), each under
torch.profiler after three warm-up forwards; prints the top kernels by device time.
"""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autokernel.models import example_inputs, load_model  # noqa: E402
from autokernel.ops import swap  # noqa: E402
from autokernel.verify import deploy  # noqa: E402

ROWS = 18  # kernels shown per table


def profile(name: str, fn, args) -> None:
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    print(f"######## {name}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=ROWS, max_name_column_width=70))


def main() -> None:
    types = sys.argv[1].split(",") if len(sys.argv) > 1 else None
    choices = deploy.load_kernels(ROOT / "workspace" / "kernels", types, ROOT / "kernels")
    model = load_model("LlamaModel", model_file=str(ROOT / "models" / "llama.py"), config="tinyllama",
                       device="cuda", dtype=torch.float16)
    args = example_inputs(model, (1, 2048), "cuda", torch.float16, seed=0)
    with torch.no_grad():
        profile("original", model, args)
        profile("optimized", swap.build(model, list(choices)), args)


if __name__ == "__main__":
    main()
