"""The warm launcher (autokernel.harness.zygote) on a real device: correct, and how many seconds it saves a bench.

    python3 scripts/gpu_zygote.py                   # on the GPU machine (auto-detects the device)
    python3 scripts/gpu_zygote.py --device cpu      # the same through Triton's interpreter

Checks: the zygote imports torch, triton and the harness without touching CUDA; kernels/rmsnorm.py
--quick benched through it gives the result a fresh `python -m autokernel.harness.harness` gives (pass, the same
stages and checks); a hanging kernel is a TIMEOUT and the zygote serves the next bench; on a GPU, a CUDA
C++ starter (compiled by torch.utils.cpp_extension in the forked child) gets the status it gets fresh.
Then it times fresh and warm benches in turn, as the loop runs them (torch.compile's time reused), and
prints the medians. Exits non-zero if a check fails.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autokernel.harness import gpu, runner, zygote  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernels" / "rmsnorm.py"
CUDA_KERNEL = ROOT / "kernels" / "cuda" / "softmax.py"
HANG = 'KERNEL_TYPE = "rmsnorm"\nimport time\ntime.sleep(600)\n\ndef kernel_fn(x, weight, eps):\n    return x\n'
HANG_LIMIT_S = 10  # the time limit given to the hanging kernel


def started_in(result: dict) -> float | None:
    log = result.get("log", "")
    return float(log.split("(started in ", 1)[1].split(" s)", 1)[0]) if "(started in " in log else None


def stages(result: dict) -> list:
    return [(s["name"], s["passed"], s["checks"]) for s in result.get("stages", [])]


def bench(device: str, warm: bool, path=KERNEL, **kw) -> dict:
    kw = {"quick": True, "reuse_baselines": True, **kw}
    result = runner.run_bench(path, device=device, warm=warm, **kw)
    print(f"  {'warm ' if warm else 'fresh'} {Path(path).name:<14} {result['status']:<8} wall {result['wall_s']:6.2f} s"
          f"  started in {started_in(result)} s  launcher {result['launcher']}")
    return result


def check(failures: list, ok: bool, what: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def correctness(device: str, failures: list) -> None:
    hello = runner.warm_launcher().hello
    print(f"zygote pid {hello['pid']}: imports took {hello['import_s']} s, {len(hello['files'])} repository "
          "files watched for changes")
    fresh = bench(device, False, reuse_baselines=False)  # also measures torch.compile once for the cache
    warm = bench(device, True)
    check(failures, fresh["status"] == warm["status"] == "pass", "rmsnorm passes fresh and warm")
    check(failures, warm["launcher"] == "warm", "the warm bench was forked from the zygote")
    check(failures, stages(fresh) == stages(warm) and stages(warm), "the same stages and checks")
    with tempfile.TemporaryDirectory() as tmp:
        hang = Path(tmp) / "hang.py"
        hang.write_text(HANG)
        start = time.perf_counter()
        result = bench(device, True, hang, timeout=HANG_LIMIT_S)
        check(failures, result["status"] == "timeout" and time.perf_counter() - start < HANG_LIMIT_S + 15,
              f"a hang is a TIMEOUT at its {HANG_LIMIT_S} s limit")
    check(failures, bench(device, True)["launcher"] == "warm", "the zygote serves the bench after the hang")
    if device == "cuda":
        fresh, warm = bench(device, False, CUDA_KERNEL), bench(device, True, CUDA_KERNEL)
        check(failures, fresh["status"] == warm["status"] and warm["launcher"] == "warm",
              f"a CUDA C++ starter gets the same status warm ({warm['status']}) as fresh ({fresh['status']})")


def rate(device: str, runs: int, failures: list) -> None:
    walls = {False: [], True: []}
    starts = {False: [], True: []}
    for _ in range(runs):
        for warm in (False, True):
            result = bench(device, warm)
            check(failures, result["status"] == "pass", f"{'warm' if warm else 'fresh'} bench passes")
            walls[warm].append(result["wall_s"])
            starts[warm].append(started_in(result) or 0.0)
    fresh_s, warm_s = statistics.median(walls[False]), statistics.median(walls[True])
    print(f"\nrun_bench {KERNEL.name} --quick on {gpu.device_name(device) if device == 'cpu' else device}, "
          f"median of {runs}:")
    print(f"  fresh process  {fresh_s:6.2f} s  (harness started {statistics.median(starts[False]):.2f} s "
          "after the request)")
    print(f"  warm launcher  {warm_s:6.2f} s  (harness started {statistics.median(starts[True]):.2f} s "
          "after the request)")
    print(f"  saved          {fresh_s - warm_s:6.2f} s per bench ({100 * (fresh_s - warm_s) / fresh_s:.0f}%)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if a GPU is visible")
    p.add_argument("--runs", type=int, default=5, help="fresh and warm benches timed, each (default 5)")
    args = p.parse_args()
    if args.runs < 1:
        p.error("--runs must be at least 1")
    device = gpu.pick_device(args.device)
    failures = []
    if not runner.start_warm(device):
        print("FAIL the warm launcher cannot start on this platform")
        return 1
    try:
        runner.warm_launcher().ready()
        correctness(device, failures)
        rate(device, args.runs, failures)
    except zygote.ZygoteError as e:
        failures.append(f"zygote: {e}")
    finally:
        print(f"warm launcher: {runner.stop_warm()}")
    print(f"\n{'FAILED: ' + '; '.join(failures) if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
