"""Developer tool (GPU): where the host time of one kernel call goes, layer by layer.

    python scripts/launch_breakdown.py [--json FILE]

For each starter at a model shape, host microseconds per call (timing.host_cost_us: calls enqueued without a
sync) of: the whole op call, kernel_fn as optimize() plugs it in (replayed, autokernel/ops/replay.py), kernel_fn
with FastLaunch alone, kernel_fn as the harness calls it (JITFunction.run), kernel_fn with its launches
replaced by a no-op (the wrapper's own torch calls), and each recorded launch alone through JITFunction.run,
FastLaunch, CompiledKernel[grid], the compiled launcher called straight (compiled.run with the stream and
metadata fetched once), what a FastLaunch hit calls (`hit_launcher`: CudaLauncher's C entry on triton 3.5-3.6)
and its key alone (`hit_key`). Beside them, the floor of this host: a Python call, torch.empty_like,
torch.add. Issue 17's target is 10 us for the whole op call.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch_overhead import CASES as OVERHEAD_CASES  # noqa: E402  (this script's own folder)

from autokernel import compat  # noqa: E402
from autokernel.harness import timing  # noqa: E402
from autokernel.kernelfile import import_kernel  # noqa: E402
from autokernel.ops import customops, launchers  # noqa: E402
from autokernel.registry import get_spec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CASES = OVERHEAD_CASES[:5]  # one per type, at TinyLlama's shapes


def host(fn, args) -> float:
    return timing.host_cost_us(fn, args, "cuda")


class Recorder:
    """A kernel that records its launches (grid, args, kwargs) and launches them."""

    launches: list = []

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            Recorder.launches.append((self.kernel, grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)
        return launch


class NoLaunch:
    def __init__(self, kernel):
        pass

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def launch_rows(kernel, grid, args, kwargs) -> dict:
    rows = {"jit_run": host(lambda: kernel[grid](*args, **kwargs), ())}
    fast = compat.FastLaunch(kernel)
    compiled = fast[grid](*args, **kwargs)
    rows["fastlaunch"] = host(lambda: fast[grid](*args, **kwargs), ())
    rows["fastlaunch_cached"] = len(fast.cache)
    if not callable(getattr(compiled, "__getitem__", None)) or not isinstance(grid, tuple):
        return rows
    rest = zip(fast.names[len(args):], fast.defaults[len(args):])
    full = (*args, *(kwargs.get(n, d) for n, d in rest))
    g = (*grid, 1, 1)[:3]
    rows["compiled_getitem"] = host(lambda: compiled[g](*full), ())
    run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    stream = torch.cuda.current_stream().cuda_stream
    rows["compiled_run_raw"] = host(lambda: run(g[0], g[1], g[2], stream, function, meta, None, None, None,
                                                *full), ())
    raw_stream = torch._C._cuda_getCurrentRawStream
    rows["compiled_run_stream_lookup"] = host(
        lambda: run(g[0], g[1], g[2], raw_stream(0), function, meta, None, None, None, *full), ())
    # what a FastLaunch hit calls: CudaLauncher.launch itself where compat models it (triton 3.5-3.6), else .run
    launch, head = compat.launcher(compiled, compat.triton_version())
    rows["hit_launcher"] = host(lambda: launch(*g, raw_stream(0), *head, *full), ())
    rows["hit_launcher_is_c_entry"] = launch is not run
    key = fast.arg_key
    rows["hit_key"] = host(lambda: (0, grid, tuple(map(key, args)), tuple(kwargs.items())), ())
    return rows


def main():
    import argparse
    import json

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="also write the rows as JSON")
    opts = p.parse_args()
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    rows = {"python_call": host(lambda: None, ()), "torch.empty_like": host(torch.empty_like, (x,)),
            "torch.add": host(torch.add, (x, x)), "x.reshape+view": host(lambda: x.reshape(-1, 2048).view(x.shape), ())}
    for name, us in rows.items():
        print(f"{name:<40} {us:8.2f} us")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for ktype, shape in CASES:
        spec = get_spec(ktype)
        args = spec.make_inputs(shape, torch.float16, "cuda", gen)
        fn = import_kernel(ROOT / "kernels" / f"{ktype}.py").kernel_fn
        customops.install(ktype, fn, f"kernels/{ktype}.py", spec.deployment)
        case = {}
        with torch.no_grad():
            case["op"] = host(customops.op(ktype), args)
        installed = customops._IMPLS[ktype]
        case["replayed_kernel_fn"] = host(installed, args)
        if hasattr(installed, "reasons"):
            case["not_replayed"] = {str(k): v for k, v in installed.reasons().items()}
        fastlaunch = launchers.rebound(fn, compat.is_jit_kernel, compat.FastLaunch)
        if fastlaunch is not None:
            case["fastlaunch_kernel_fn"] = host(fastlaunch, args)
        case["kernel_fn"] = host(fn, args)
        stubbed = launchers.rebound(fn, compat.is_triton_kernel, NoLaunch)
        if stubbed is not None:
            case["kernel_fn_no_launch"] = host(stubbed, args)
        Recorder.launches = []
        recording = launchers.rebound(fn, compat.is_triton_kernel, Recorder)
        if recording is not None:
            recording(*args)
            torch.cuda.synchronize()
        case["launches"] = []
        for kernel, grid, largs, lkwargs in Recorder.launches:
            try:
                row = launch_rows(kernel, grid, largs, lkwargs)
            except Exception as e:  # noqa: BLE001
                row = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            row["kernel"] = getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel))
            row["type"] = type(kernel).__name__
            case["launches"].append(row)
        torch.cuda.synchronize()
        rows[f"{ktype} {shape}"] = case
        print(f"{ktype} {shape}:")
        for k, v in case.items():
            if k == "not_replayed":
                print(f"    not replayed: {v}")
            elif k != "launches":
                print(f"    {k:<36} {v:8.2f} us")
        for row in case["launches"]:
            print("    launch " + "  ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in row.items()))
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
