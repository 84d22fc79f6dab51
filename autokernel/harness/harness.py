"""The five correctness stages and the timing of one kernel file, run inside the child process.

Never imported by the parent: `autokernel.harness.runner` starts `python -m autokernel.harness.harness ...` with a time
limit, so a kernel that hangs, segfaults or corrupts the CUDA context takes only this process down.
The result goes to a JSON file; the readable report goes to stdout as it happens.

Stages (DESIGN.md): 1 smoke (+ the caching guard), 2 shape sweep x fp16/bf16/fp32 (+ the model's own
shapes), 3 numerical stability on adversarial inputs, 4 determinism (three runs, bitwise equal),
5 edge cases (non-power-of-two sizes, non-contiguous inputs). The first failing stage ends the run.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
from dataclasses import asdict, dataclass

import torch

from autokernel import compat, kernelfile
from autokernel.harness import channel, checking, crash, gpu, guards, integrity, perf, sourcecheck
from autokernel.registry import KernelSpec, dtype_name, get_spec, parse_dtype, shape_label

STAGES = ("smoke", "shape_sweep", "stability", "determinism", "edge_cases")
QUICK_LIMIT = 3  # shapes per stage under --quick
CPU_MODEL_SHAPE_MAX_BYTES = 32 * 1024 * 1024  # larger model shapes are left to the GPU in CPU mode


class NeedsGPU(Exception):
    """The kernel file cannot run on this device at all (a CUDA C++ kernel asked to run on the CPU)."""


class KernelCrashed(Exception):
    """kernel_fn raised: a compile error, an illegal address, a Python error in the launcher."""


class UnknownKernelType(Exception):
    """The file's KERNEL_TYPE is no registered type, even after its import: nothing to bench it against."""


@dataclass
class StageResult:
    name: str
    passed: bool
    checks: int = 0
    reason: str = ""
    seconds: float = 0.0


class Harness:
    def __init__(self, module, spec: KernelSpec, device: str, quick: bool, seed: int,
                 watch: integrity.Watch | None = None):
        # a spec with bind (a KernelBench problem) makes the callable from the module: ModelNew with weights
        self.fn = spec.bind(module, device) if spec.bind else module.kernel_fn
        self.spec = spec
        self.device = device
        self.small = device == "cpu"
        self.quick = quick
        self.seed = seed
        self.calls = 0
        self.watch = watch
        self.stage = STAGES[0]  # where the run is: a stage, then "timing"
        self.model_shapes = self._model_shapes(getattr(module, "MODEL_SHAPES", None) or [])

    def _model_shapes(self, shapes):
        if not self.small:
            return list(shapes)
        keep = [s for s in shapes if self.spec.bytes_moved(s, torch.float32) <= CPU_MODEL_SHAPE_MAX_BYTES]
        if len(keep) < len(shapes):
            print(f"  note: {len(shapes) - len(keep)} model shape(s) too large for the interpreter; "
                  "they are checked on a GPU")
        return keep

    # -- inputs and calls ------------------------------------------------------------------------
    def generator(self) -> torch.Generator:
        self.calls += 1  # a fresh stream for every check: no two checks see the same values
        return torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + self.calls)

    def inputs(self, shape, dtype, maker=None):
        return (maker or self.spec.make_inputs)(shape, dtype, self.device, self.generator())

    def model_inputs(self, shape, dtype):
        """Inputs of a model shape, laid out as the type's model sites pass them (KernelSpec.model_layout)."""
        inputs = self.inputs(shape, dtype)
        return self.spec.model_layout(inputs) if self.spec.model_layout is not None else inputs

    def call(self, inputs, what: str, tol_scale: float = 1.0):
        try:
            out = checking.checked_call(self.fn, self.spec, inputs, what, tol_scale)
        except (checking.CheckFailed, guards.GuardFailed):
            raise
        except Exception as e:
            raise KernelCrashed(f"{what}: kernel_fn {crash.kernel_raised(e)}") from e
        self.sync()
        return out

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()

    def limit(self, items):
        return items[:QUICK_LIMIT] if self.quick else items

    # -- the five stages -------------------------------------------------------------------------
    def smoke(self) -> int:
        shape = self.spec.smoke_shape()
        inputs = self.inputs(shape, torch.float32)
        self.call(inputs, f"smoke {checking.describe(shape, torch.float32)}")
        # Caching guard: the same buffers refilled with new values must give the new answer.
        for old, new in zip(inputs, self.inputs(shape, torch.float32)):
            if isinstance(old, torch.Tensor):
                old.copy_(new)
        self.call(inputs, "same input buffers refilled with new values (is the output cached?)")
        return 2

    def shape_sweep(self) -> int:
        shapes = self.limit(self.spec.sweep(self.small)) + self.model_shapes
        for shape in shapes:
            for dtype in self.spec.dtypes:
                self.call(self.inputs(shape, dtype), checking.describe(shape, dtype))
        return len(shapes) * len(self.spec.dtypes)

    def stability(self) -> int:
        sweep = self.spec.sweep(self.small)
        shape = sweep[min(2, len(sweep) - 1)]
        for name, maker in self.spec.adversarial.items():
            scale = self.spec.adversarial_tolerance.get(name, 1.0)
            for dtype in self.spec.dtypes:
                self.call(self.inputs(shape, dtype, maker), f"{name} {checking.describe(shape, dtype)}", scale)
        return len(self.spec.adversarial) * len(self.spec.dtypes)

    def determinism(self) -> int:
        shape = self.model_shapes[0] if self.model_shapes else self.spec.timing_shape(self.small)
        dtypes = [d for d in (torch.float16, torch.float32) if d in self.spec.dtypes] or self.spec.dtypes[:1]
        for dtype in dtypes:
            inputs = self.inputs(shape, dtype)
            first = self.call(inputs, f"determinism {checking.describe(shape, dtype)}")
            for run in (2, 3):
                again = self.call(inputs, f"determinism run {run}")
                if not checking.bitwise_equal(first, again):
                    raise checking.CheckFailed(
                        f"{checking.describe(shape, dtype)}: run {run} differs bitwise from run 1 on the same "
                        "input (a race or an order-dependent reduction such as float atomics)")
        return 3 * len(dtypes)

    def edge_cases(self) -> int:
        edges = self.limit(self.spec.edges(self.small))
        for shape in edges:
            for dtype in self.spec.dtypes:
                self.call(self.inputs(shape, dtype), f"edge {checking.describe(shape, dtype)}")
        checks = len(edges) * len(self.spec.dtypes)
        if self.spec.noncontiguous is not None:
            shapes = [self.spec.sweep(self.small)[0], edges[0]]
            for shape in shapes:
                for dtype in self.spec.dtypes:
                    inputs = self.spec.noncontiguous(self.inputs(shape, dtype))
                    self.call(inputs, f"non-contiguous {checking.describe(shape, dtype)}")
            checks += len(shapes) * len(self.spec.dtypes)
        return checks

    def run_stages(self) -> list[StageResult]:
        results = []
        for i, name in enumerate(STAGES, 1):
            self.stage = name
            start = time.perf_counter()
            try:
                checks = getattr(self, name)()
                self.check_integrity(f"after stage {name}")
                results.append(StageResult(name, True, checks, seconds=time.perf_counter() - start))
                print(f"stage {i}/5 {name:<12} PASS  {checks} checks, {time.perf_counter() - start:.1f} s")
            except checking.CheckFailed as e:
                results.append(StageResult(name, False, reason=str(e), seconds=time.perf_counter() - start))
                print(f"stage {i}/5 {name:<12} FAIL  {e}")
                break
            sys.stdout.flush()
        self.stage = "timing"  # what runs after the stages
        return results

    def check_integrity(self, when: str, ignore_threads: bool = False) -> None:
        if self.watch is not None:
            self.watch.check(when, ignore_threads)


def _timed_dtype(spec, dtype):
    """The dtype the timing runs in: the one asked for, or the type's own where it is checked in others only."""
    if dtype not in spec.dtypes:  # e.g. the fp16 default on a KernelBench problem, which is fp32
        print(f"  note: {spec.name} is checked in {', '.join(map(dtype_name, spec.dtypes))} only; timed in "
              f"{dtype_name(spec.dtypes[0])}, not {dtype_name(dtype)}")
        return spec.dtypes[0]
    return dtype


def _timing_shape(harness: Harness) -> dict:
    """The shape the kernel is timed at alone: the model's first, else the type's timing shape."""
    return harness.model_shapes[0] if harness.model_shapes else harness.spec.timing_shape(harness.small)


def _launch_digest(harness: Harness, module, dtype) -> str | None:
    """The launch record's digest at every timed shape (None where it cannot be made: the timing then runs)."""
    from autokernel.harness import launch_record, modeltime

    shapes = [s for s, _ in modeltime.weighted_shapes(module, harness.model_shapes)]
    try:  # each laid out as it is timed: the model's shapes as its sites pass them
        inputs = [harness.model_inputs(s, dtype) for s in shapes] or [harness.inputs(_timing_shape(harness), dtype)]
        launched = launch_record.digest(module.kernel_fn, inputs)
    except Exception:  # noqa: BLE001  (no digest: the timing runs the kernel and reports what fails)
        launched = None
    harness.check_integrity("after recording the launches")
    return launched


def _unchanged(same_as: str) -> dict:
    """The verdict on a candidate that launches exactly what the best launches at every timed shape, found before
    any stage: it cannot be faster there, so it is reverted whatever its stages would say (they would cost the loop
    tens of seconds of compiles at shapes nothing is timed at). "unchanged", never a pass: nothing was checked."""
    reason = (f"the same launches and torch ops as {same_as} at every timed shape (its launch record): it cannot be "
              "faster; not checked, not timed")
    print(f"unchanged: {reason}")
    return {"status": "unchanged", "correctness": "-", "unchanged": True, "launch_digest": same_as, "reason": reason}


def _timing(harness: Harness, module, dtype, reuse_baselines: bool, launched: str | None = None) -> dict:
    """The kernel timed in `dtype` and its time in the model; launched: its launch record's digest where the run took
    it before the stages (else taken here)."""
    spec, device = harness.spec, harness.device
    shape = _timing_shape(harness)
    dtype = _timed_dtype(spec, dtype)
    launched = launched or _launch_digest(harness, module, dtype)
    start = time.perf_counter()
    result = perf.measure(harness.fn, spec, lambda: harness.inputs(shape, dtype), shape, dtype, device,
                          reuse_baselines, after_kernel=lambda: harness.check_integrity("after timing"))
    label = "" if device == "cuda" else "  [CPU interpreter: not a performance figure]"
    print(f"timing {shape_label(shape)} {dtype_name(dtype)}{label}")
    print(f"  kernel         {result.latency_us:12.1f} us  (noise +-{result.noise_pct:.1f}%)")
    print(f"  pytorch eager  {result.eager_us:12.1f} us  speedup {result.speedup_vs_pytorch:.2f}x")
    if result.compile_us:
        print(f"  torch.compile  {result.compile_us:12.1f} us  speedup {result.speedup_vs_compile:.2f}x"
              f"  ({result.compile_note})")
    else:
        print(f"  torch.compile  {'-':>12}     ({result.compile_note})")
    if result.pct_peak is not None:
        c = result.ceilings
        print(f"  roofline       {result.bandwidth_gb_s:.0f} GB/s, {result.throughput_tflops:.1f} TFLOP/s, "
              f"{result.pct_peak:.1f}% of peak ({c['bandwidth_gb_s']} GB/s, {c['fp16_tflops']} TFLOP/s, "
              f"{c['source']})")
    if result.peak_vram_mb is not None:
        print(f"  peak memory    {result.peak_vram_mb:12.1f} MiB  (eager {result.eager_peak_vram_mb:.1f} MiB; one call "
              "beyond its inputs)")
    print(f"  timing took {time.perf_counter() - start:.1f} s")
    out = {k: v for k, v in result.__dict__.items() if k != "ceilings"}
    out.update(speedup_vs_pytorch=result.speedup_vs_pytorch, speedup_vs_compile=result.speedup_vs_compile,
               shape=shape_label(shape), dtype=dtype_name(dtype))
    from autokernel.harness import modeltime

    out.update(modeltime.measure_model(harness, module, dtype, reuse_baselines))  # the loop's objective
    out["launch_digest"] = launched
    return out


def _load(path: str, device: str = "cuda"):
    """The kernel module, its spec and the integrity watch; KernelFileError, KeyError or GuardFailed says
    what is wrong. The source passes the static check before it is imported, and everything the verdict
    depends on is fingerprinted before the import and checked right after it."""
    source = kernelfile.read_source(path)
    name = os.path.basename(path)
    ktype = kernelfile.kernel_type(source, name)
    violations = sourcecheck.violations(source, name)
    if violations:
        more = f" (and {len(violations) - 1} more: {'; '.join(violations[1:4])})" if len(violations) > 1 else ""
        raise guards.GuardFailed(f"static check: {violations[0]}{more}")
    if kernelfile.declarations(source, name).get("BACKEND") == "cuda" and device != "cuda":
        raise NeedsGPU(f"needs a GPU: {name} is a CUDA C++ kernel (BACKEND = \"cuda\"), compiled "
                       "with nvcc and run only on an NVIDIA GPU; bench it on a GPU machine (--device cuda)")
    # Imported before the fingerprint: triton is the kernels' and the timing's; torch._dynamo (which the
    # guards' deterministic mode imports) wraps torch.manual_seed and others when it first loads.
    import torch._inductor.config  # noqa: F401
    import triton.language  # noqa: F401

    if device == "cuda":  # CUDA's lazy initialization replaces torch.cuda.default_generators: do it first
        torch.cuda.init()
    known = _known_spec(ktype)
    watch = integrity.Watch(*([known] if known else []))
    module = kernelfile.import_kernel(path, source)  # a user's own type may register its spec on import
    try:
        spec = get_spec(ktype)
    except KeyError as e:
        raise UnknownKernelType(e.args[0]) from None
    if known is None:
        watch.extend(spec)
    watch.check(f"after importing {name}")
    if spec.bind is None:
        kernelfile.check_signature(module.kernel_fn, spec.reference)
    return module, spec, watch


def _known_spec(ktype: str) -> KernelSpec | None:
    try:
        return get_spec(ktype)
    except KeyError:
        return None  # a user's own type, registered by the kernel file itself


def run(path: str, device: str, quick: bool, seed: int, dtype: str, timed: bool = True,
        reuse_baselines: bool = False, same_as: str | None = None, compile_ahead: bool = False) -> dict:
    result = {"status": "crash", "correctness": "FAIL", "failed_stage": None, "reason": "", "stages": [],
              "seed": seed}
    loaded = _load_or_verdict(path, device, result)
    if loaded is None:
        return result
    module, spec, watch = loaded
    result["kernel_type"] = spec.name
    launched = float(os.environ.get("AUTOKERNEL_LAUNCHED_AT", time.time()))
    print(f"kernel {path}: {spec.name} on {device}{' (quick)' if quick else ''}, seed {seed} "
          f"(started in {time.time() - launched:.1f} s)")
    try:
        harness = Harness(module, spec, device, quick, seed, watch)
    except checking.CheckFailed as e:  # e.g. a ModelNew whose parameters are not Model's
        result.update(status="fail", failed_stage="smoke", reason=str(e))
        print(f"stage 1/5 smoke        FAIL  {e}")
        return result
    except Exception as e:
        result.update(status="crash", failed_stage="smoke", reason=f"building the kernel failed: "
                      f"{crash.exception_cause(e)}")
        print(f"CRASH  {result['reason']}")
        traceback.print_exc(file=sys.stderr)
        return result
    ahead = _started_ahead(path, device, seed, quick) if compile_ahead else None
    return _check_and_time(harness, module, result, parse_dtype(dtype) if timed else None, reuse_baselines, same_as,
                           ahead)


def _started_ahead(path: str, device: str, seed: int, quick: bool):
    """The workers making the stages' calls alongside them (precompile.start: a cold cache's compiles side by side),
    started before anything compiles here; None where there are too few cores."""
    from autokernel.harness import precompile

    ahead = precompile.start(path, device, seed, quick)
    print(f"compiling ahead: {len(ahead.procs)} processes" if ahead else "compiling ahead: off (too few cores)",
          flush=True)
    return ahead


def _load_or_verdict(path: str, device: str, result: dict) -> tuple | None:
    """_load's (module, spec, watch), or None with the verdict in `result`: a file that cannot run here, a guard
    caught at the static check or the import, an unknown type (status "invalid": bad input, no experiment), a
    file that is no kernel file, an import that raised."""
    try:
        return _load(path, device)
    except NeedsGPU as e:
        result.update(status="fail", failed_stage="device", reason=str(e))
        print(f"FAIL  {e}")
    except guards.GuardFailed as e:
        _guard_failed(result, e)
    except UnknownKernelType as e:
        result.update(status="invalid", failed_stage="load", reason=str(e))
    except kernelfile.KernelFileError as e:
        result["reason"] = str(e)
    except Exception as e:
        result["reason"] = f"importing {os.path.basename(path)} failed: {crash.exception_cause(e)}"
    return None


def _check_and_time(harness: Harness, module, result: dict, dtype, reuse_baselines: bool,
                    same_as: str | None, ahead=None) -> dict:
    """The five stages, then the timing in `dtype` (None: untimed); the verdict in `result`. Whatever the kernel
    raises, in a stage or in the timing, is a crash whose reason names it (crash.exception_cause). same_as: a timed
    candidate's launch record is taken first, and one that launches exactly that is "unchanged" (_unchanged) with
    no stage run. ahead: the workers compiling alongside the stages (precompile.start), stopped when the stages
    end."""
    try:
        launched = (_launch_digest(harness, module, _timed_dtype(harness.spec, dtype))
                    if same_as and dtype is not None else None)
        if same_as and launched == same_as:
            result.update(_unchanged(same_as))
            _stop(ahead, "with no stage to run")
            return result
        try:
            stages = harness.run_stages()
        finally:
            _stop(ahead)
        result["stages"] = [asdict(s) for s in stages]
        failed = next((s for s in stages if not s.passed), None)
        if failed:
            result.update(status="fail", failed_stage=failed.name, reason=failed.reason)
            return result
        if dtype is not None:
            result.update(_timing(harness, module, dtype, reuse_baselines, launched))
        harness.check_integrity("at the end", ignore_threads=True)
        result.update(status="pass", correctness="PASS")
    except guards.GuardFailed as e:
        return _guard_failed(result, e)
    except checking.CheckFailed as e:
        result.update(status="fail", failed_stage="timing", reason=str(e))
        print(f"timing FAIL  {e}")
    except Exception as e:  # KernelCrashed from a checked call, or raised outside one (the timing, model time)
        reason = str(e) if isinstance(e, KernelCrashed) else f"{harness.stage}: {crash.exception_cause(e)}"
        result.update(status="crash", failed_stage=harness.stage, reason=reason)
        print(f"CRASH  {reason}")
        traceback.print_exc(file=sys.stderr)
    finally:
        _stop(ahead)  # a guard caught before the stages: no worker outlives the run
    return result


def _stop(ahead, when: str = "when the stages ended") -> None:
    line = ahead.stop(when) if ahead is not None else ""
    if line:
        print(line, flush=True)


def _guard_failed(result: dict, e: Exception) -> dict:
    """The verdict for a kernel caught reaching for it: one line naming how, counted as a FAIL."""
    result.update(status="fail", correctness="FAIL", failed_stage="guard", reason=str(e))
    print(f"guard: FAIL  {e}")
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Run the five stages and timing on one kernel (child of bench.py)")
    p.add_argument("kernel")
    p.add_argument("--device", required=True, choices=["cpu", "cuda"])
    p.add_argument("--out", required=True, help="where to write the JSON result")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dtype", default="fp16", help="dtype of the timing run")
    p.add_argument("--no-timing", action="store_true")
    p.add_argument("--reuse-baselines", action="store_true")
    p.add_argument("--compile-ahead", action="store_true",
                   help="make the stages' calls in several processes first (autokernel/harness/precompile.py)")
    p.add_argument("--same-as", metavar="DIGEST",
                   help="skip the timing when the kernel launches exactly this (autokernel/harness/launch_record.py)")
    p.add_argument("--key-fd", type=int, default=None,
                   help="a pipe holding the key that signs the result (autokernel.harness.channel); "
                        "the runner passes it")
    args = p.parse_args(argv)
    key = channel.read_key(args.key_fd) if args.key_fd is not None else None  # before any kernel code runs
    if compat.interpreting():
        compat.prepare_interpreter()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    result = run(args.kernel, args.device, args.quick, seed, args.dtype, timed=not args.no_timing,
                 reuse_baselines=args.reuse_baselines, same_as=args.same_as, compile_ahead=args.compile_ahead)
    result["gpu"] = gpu.device_name(args.device)
    channel.write(args.out, result, key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
