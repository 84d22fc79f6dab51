"""The kernel type of a KernelBench problem: a KernelSpec the unchanged harness runs a ModelNew file with.

Type names are "kb/<level>/<name>", e.g. "kb/level1/19_ReLU", optionally with "@fp16" or "@bf16" for a
problem run in another dtype (KernelBench is fp32: so are the checks and the timing by default). The
registry resolves such names on demand through `resolve` (autokernel/registry.py, RESOLVERS); this
module stands below the registry (it imports autokernel.kerneltype and checking, never the registry).

The problem is the reference, read from its read-only copy workspace/kernelbench/<level>/<name>.py
(written by `python -m kernelbench setup`), looked for beside this project and in the folders above it
(so a --gpus worktree under workspace/worktrees/ finds its main checkout's copy), then in $KERNELBENCH_ROOT.

- Weights: Model and ModelNew are built with get_init_inputs() under one seed (INIT_SEED) and Model's
  state_dict is loaded into ModelNew: identical weights, and a ModelNew whose parameters differ from
  Model's by name or shape is a FAIL that names them.
- Inputs: the problem's own get_inputs(), called under a fresh seed for every check (a seed drawn from
  the harness's generator), made on the device under test; floating-point inputs are cast to the dtype
  under test. A candidate's own get_inputs, if any, is never called.
- Oracle: Model run on float64 copies of model and inputs; in fp32 where float64 fails or the inputs
  exceed ORACLE_F64_MAX_BYTES. Tolerances: KernelBench's atol = rtol = 1e-2.
- Anti-cheat: the harness's guards watch ModelNew.forward as they watch kernel_fn: PyTorch may allocate,
  view and copy tensors there (parameters may be read), any compute op is a FAIL naming it.
- CPU mode: problems keep their own sizes; one whose inputs exceed CPU_MAX_INPUT_BYTES is refused with
  a message (KernelBench's sizes are GPU sizes; the interpreter would take hours).
- Outputs: one tensor. An integer output (argmax) is compared exactly, as a float of the dtype under test.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import torch

from autokernel.harness.checking import CheckFailed
from autokernel.kerneltype import TOLERANCES, KernelSpec, dtype_name, parse_dtype
from kernelbench import problems

PREFIX = "kb/"
WORKSPACE_DIR = Path("workspace") / "kernelbench"  # the read-only problem copies, under a project root
PROJECT_ROOT = Path(__file__).resolve().parent.parent
ENV_WORKSPACE = "KERNELBENCH_WORKSPACE"  # the problem copies of a project other than this one (set by the scorer)
INIT_SEED = 0  # Model and ModelNew are both built under this seed
TRIALS = 5  # correctness trials at the problem's own size, each with fresh inputs (KernelBench's count)
KB_TOLERANCE = (1e-2, 1e-2)  # (atol, rtol): KernelBench's own, for every dtype
INT_TOLERANCE = (0.5, 0.0)  # integer outputs (indices) must match exactly
CPU_MAX_INPUT_BYTES = 64 * 2**20  # bytes; larger problems are refused in CPU mode
ORACLE_F64_MAX_BYTES = 4 * 2**30  # bytes of float64 inputs; above this the oracle runs the fp32 Model
TYPE_RE = re.compile(r"^kb/(level\d+)/(\d+_\w+?)(?:@(\w+))?$")


def parse_type(name: str) -> tuple[str, str, torch.dtype]:
    """(level, problem name, dtype) of a type name such as "kb/level1/19_ReLU@fp16"."""
    match = TYPE_RE.match(name)
    if not match:
        raise KeyError(f"{name!r} is not a KernelBench type: kb/<level>/<name>[@fp16|@bf16], e.g. kb/level1/19_ReLU")
    level, pname, dtype = match.groups()
    try:
        return level, pname, parse_dtype(dtype or "fp32")
    except ValueError as e:
        raise KeyError(f"{name}: {e}") from None


def type_name(problem: problems.Problem, dtype: torch.dtype = torch.float32) -> str:
    return problem.type_name + ("" if dtype == torch.float32 else f"@{dtype_name(dtype)}")


def find_problem_file(level: str, name: str) -> Path:
    """The problem's read-only copy (in $KERNELBENCH_WORKSPACE, else beside this project or above it),
    else its file in $KERNELBENCH_ROOT."""
    relative = WORKSPACE_DIR / level / f"{name}.py"
    chosen = os.environ.get(ENV_WORKSPACE)
    if chosen and (Path(chosen) / level / f"{name}.py").is_file():
        return Path(chosen) / level / f"{name}.py"
    for base in (PROJECT_ROOT, *PROJECT_ROOT.parents):
        if (base / relative).is_file():
            return base / relative
    root = os.environ.get(problems.ENV_ROOT)
    if root:
        try:
            path = problems.checkout_dir(root) / level / f"{name}.py"
        except problems.ProblemError:
            path = None
        if path and path.is_file():
            return path
    raise KeyError(f"KernelBench problem {level}/{name} is not set up: no {relative} "
                   f"(run `python -m kernelbench setup {level}/{name}`)")


def resolve(name: str) -> KernelSpec:
    """The KernelSpec of "kb/<level>/<name>[@dtype]" (the registry's resolver for the "kb/" prefix)."""
    level, pname, dtype = parse_type(name)
    path = find_problem_file(level, pname)
    try:
        runtime = ProblemRuntime(problems.load_module(path), dtype)
    except problems.ProblemError as e:
        raise KeyError(str(e)) from None
    trials = [{**runtime.shape, "trial": k} for k in range(1, TRIALS + 1)]
    tolerance = INT_TOLERANCE if runtime.integer_output else KB_TOLERANCE
    return KernelSpec(
        name=name, reference=runtime.reference, make_inputs=runtime.make_inputs,
        shapes=trials, small_shapes=trials, edge_shapes=[], small_edge_shapes=[],
        bench_shape=runtime.shape, small_bench_shape=runtime.shape,
        bytes_moved=runtime.bytes_moved, flops=runtime.flops,
        tolerances={d: tolerance for d in TOLERANCES}, dtypes=(dtype,), bind=runtime.bind,
        description=f"KernelBench {level}/{pname} ({path})",
    )


def _rng_devices(device: str) -> list:
    return [torch.device(device).index or 0] if device.startswith("cuda") else []


class ProblemRuntime:
    """One problem's models (per device), inputs, oracle and the binding of a ModelNew to them."""

    def __init__(self, module, dtype: torch.dtype):
        self.module = module
        self.dtype = dtype
        self.models: dict[str, torch.nn.Module] = {}
        self.oracles: dict[str, tuple] = {}  # device -> (model, dtype its inputs are cast to)
        self.meta = _meta_run(module)  # shapes, output and FLOPs from a run on the meta device (or None)
        self.integer_output = bool(self.meta) and not self.meta["out_dtype"].is_floating_point
        self.shape = {"inputs": self.meta["label"] if self.meta else "default"}

    # -- inputs ----------------------------------------------------------------------------------
    def make_inputs(self, shape, dtype, device, generator) -> tuple:
        """The problem's get_inputs() under a fresh seed drawn from the harness's generator."""
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
        with torch.random.fork_rng(devices=_rng_devices(device)):
            torch.manual_seed(seed)
            with torch.device(device):
                inputs = self.module.get_inputs()
        return tuple(_prepare(x, dtype, device) for x in inputs)

    # -- the reference ---------------------------------------------------------------------------
    def model(self, device: str) -> torch.nn.Module:
        if device not in self.models:
            self.models[device] = self._build(self.module.Model, device)
        return self.models[device]

    def _build(self, cls, device: str) -> torch.nn.Module:
        with torch.random.fork_rng(devices=_rng_devices(device)):
            torch.manual_seed(INIT_SEED)
            with torch.device(device):
                init = [x.to(device) if isinstance(x, torch.Tensor) else x for x in self.module.get_init_inputs()]
                model = cls(*init)
        model = model.to(device)  # a module that made its tensors on the CPU explicitly
        return model if self.dtype == torch.float32 else model.to(self.dtype)

    def reference(self, *inputs):
        """Model's output: eager on the inputs under test, the oracle on float64 copies (see the docstring)."""
        device = str(next(x.device for x in inputs if isinstance(x, torch.Tensor)))
        with torch.no_grad():
            if any(isinstance(x, torch.Tensor) and x.dtype == torch.float64 for x in inputs):
                return self._oracle(device, inputs)
            return self.model(device)(*inputs)

    def _oracle(self, device: str, inputs) -> torch.Tensor:
        if device not in self.oracles:
            self.oracles[device] = self._oracle_model(device, inputs)
        model, dtype = self.oracles[device]
        if dtype != torch.float64:
            inputs = [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        return model(*inputs)  # fp32 when inputs are huge: compare upcasts it, one float64 copy fewer

    def _oracle_model(self, device: str, inputs) -> tuple[torch.nn.Module, torch.dtype]:
        """A float64 copy of Model where it runs and the inputs are not huge, else an fp32 copy."""
        nbytes = sum(x.numel() * 8 for x in inputs if isinstance(x, torch.Tensor))
        if nbytes <= ORACLE_F64_MAX_BYTES:
            model = copy.deepcopy(self.model(device)).double()
            try:
                model(*inputs)
                return model, torch.float64
            except (RuntimeError, NotImplementedError, TypeError) as e:
                print(f"  note: Model does not run in float64 ({type(e).__name__}: {str(e)[:120]}); "
                      "the oracle is the fp32 Model")
        else:
            print(f"  note: inputs of {nbytes / 2**30:.1f} GiB in float64; the oracle is the fp32 Model")
        return copy.deepcopy(self.model(device)).float(), torch.float32

    # -- the candidate ---------------------------------------------------------------------------
    def bind(self, module, device: str):
        """The callable the harness checks and times: ModelNew built like Model, with Model's weights."""
        cls = getattr(module, "ModelNew", None)
        if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
            raise CheckFailed("the kernel file defines no `class ModelNew(nn.Module)` (KernelBench's solution form)")
        if device == "cpu" and self.meta and self.meta["input_bytes"] > CPU_MAX_INPUT_BYTES:
            raise CheckFailed(f"the problem's inputs are {self.meta['input_bytes'] / 2**20:.0f} MB "
                              f"({self.shape['inputs']}): too large for CPU mode (limit "
                              f"{CPU_MAX_INPUT_BYTES / 2**20:.0f} MB); run it on a GPU")
        reference = self.model(device)
        candidate = self._build(cls, device)
        load_weights(candidate, reference)
        return BoundModel(candidate, self.dtype)

    # -- the roofline ----------------------------------------------------------------------------
    def bytes_moved(self, shape, dtype) -> int:
        """Inputs and weights read once, the output written once: the least any implementation moves."""
        if not self.meta:
            return 0
        size = torch.tensor([], dtype=dtype).element_size()
        ins = sum(n * (size if floating else item) for n, floating, item in self.meta["inputs"])
        out_size = size if self.meta["out_dtype"].is_floating_point else self.meta["out_dtype"].itemsize
        return ins + self.meta["param_numel"] * size + self.meta["out_numel"] * out_size

    def flops(self, shape) -> int:
        return self.meta["flops"] if self.meta else 0


class BoundModel:
    """ModelNew called as the harness calls kernel_fn: no autograd, integer outputs as the dtype under test."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        self.model, self.dtype = model, dtype

    def __call__(self, *inputs):
        with torch.no_grad():
            out = self.model(*inputs)
        if isinstance(out, torch.Tensor) and not out.is_floating_point() and not out.is_complex():
            out = out.to(self.dtype)  # compared exactly (INT_TOLERANCE); a copy, not compute
        return out


def load_weights(candidate: torch.nn.Module, reference: torch.nn.Module) -> None:
    """Model's state_dict into ModelNew; a mismatch by name or shape is a FAIL that names it."""
    want, got = reference.state_dict(), candidate.state_dict()
    problems_found = []
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    shapes = [f"{k} {tuple(got[k].shape)} (Model: {tuple(want[k].shape)})"
              for k in want if k in got and got[k].shape != want[k].shape]
    if missing:
        problems_found.append("missing " + ", ".join(missing[:6]))
    if extra:
        problems_found.append("not in Model " + ", ".join(extra[:6]))
    if shapes:
        problems_found.append("other shape " + ", ".join(shapes[:6]))
    if problems_found:
        raise CheckFailed("ModelNew's parameters and buffers must match Model's by name and shape (the harness "
                          "loads Model's weights into ModelNew): " + "; ".join(problems_found))
    candidate.load_state_dict(want)


def _prepare(x, dtype, device):
    if not isinstance(x, torch.Tensor):
        return x
    x = x.to(device)
    return x.to(dtype) if x.is_floating_point() else x


def _meta_run(module) -> dict | None:
    """Input shapes, output shape and dtype, and FLOPs, from Model run on the meta device (no memory)."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.device("meta"):
            inputs = module.get_inputs()
            model = module.Model(*module.get_init_inputs())
            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad():
                out = model(*inputs)
    except Exception:  # noqa: BLE001  (a problem the meta device cannot run: sizes are learned at run time)
        return None
    if not isinstance(out, torch.Tensor):
        return None
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    label = ",".join("x".join(str(d) for d in x.shape) or "scalar" for x in tensors)
    return {"label": label or "none", "out_numel": out.numel(), "out_dtype": out.dtype,
            "inputs": [(x.numel(), x.is_floating_point(), x.element_size()) for x in tensors],
            "input_bytes": sum(x.numel() * x.element_size() for x in tensors),
            "param_numel": sum(t.numel() for t in model.state_dict().values() if t.is_floating_point()),
            "flops": int(counter.get_total_flops())}
