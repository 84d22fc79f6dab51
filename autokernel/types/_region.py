"""A region as a kernel type: the module extract.py writes for it, and the registry's resolver for "region/<name>".

extract.py turns a hot region no built-in type covers (autokernel/profile/regions.py) into a type of its own, in
the shape of a built-in one: workspace/regions/<name>.py holds its reference (the captured subgraph,
regionkernel.reference_source), the shapes and dtypes of the tensors it reads, and a SPEC built by region_spec.
The harness finds it by the kernel file's KERNEL_TYPE, "region/<name>", through the registry's resolver (resolve),
and checks and times a region kernel as any other. The module is read-only, outside kernel.py (an agent edits
the kernel, never its oracle), the loop stops when it changes (experiment.HARNESS_FILES), and the harness
fingerprints the spec as it does every type's.

Shapes: a region was captured at one shape. Its inputs whose leading dimension is the output's rows (the tokens,
in a transformer) scale with the shape's "M"; the others (a weight, a bias) keep their size. The model's shape is
the captured one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import textwrap
from pathlib import Path

import torch

from autokernel.kerneltype import TOLERANCES, KernelSpec

PREFIX = "region/"
SWEEP_ELEMENTS = 2**28  # the most elements an input of a region's sweep has, the model's own shape aside
DIR = Path("workspace") / "regions"  # under the project root
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
ENV_DIR = "AUTOKERNEL_REGIONS"  # a folder of region modules other than the project's workspace/regions
_NAME = re.compile(r"^region/([A-Za-z_][A-Za-z0-9_]*)$")

MODULE = '''"""Region {name} of {model}: {share:.1%} of its compiled forward, {calls:g} calls per forward.

It computes {ops}.

Written by extract.py from profile.json. The reference is the region's subgraph as torch.compile captured it (casts
left out): the oracle of the kernel files of type "{type_name}". Read-only; the loop stops if it changes.
"""

import torch
from torch import device, inf, nan  # noqa: F401  (names the captured code prints)

from autokernel.types._region import region_spec

{code}

{pattern}
reference.pattern = {pattern_name}  # what deploy looks for in a compiled graph: the region as the model computes it
INPUTS = {inputs!r}  # the captured (shape, dtype) of each tensor the region reads
SPEC = region_spec("{type_name}", reference, INPUTS, rows={rows}, ops={n_ops})
'''


def type_name(region: dict) -> str:
    """"region/fused_div_mul_sigmoid_tanh_1_3f2a9c" for Inductor's "cpp_fused_div_mul_sigmoid_tanh_1" (or
    triton_poi_...): the kernel's name, which two models can share for different math, and a digest of the math."""
    stem = re.sub(r"^.*?(?=fused_)", "", region["name"]) or region["name"]
    digest = hashlib.sha256(region.get("code", "").encode()).hexdigest()[:6]
    return PREFIX + re.sub(r"\W", "_", stem)[:72] + "_" + digest


def rows_of(region: dict) -> int:
    """The output's rows: the leading dimension of the widest input."""
    widest = max(region["inputs"], key=lambda i: len(i["shape"]))
    return widest["shape"][0] if widest["shape"] else 1


def module_source(region: dict, model: str) -> str:
    inputs = tuple((tuple(i["shape"]), i["dtype"].replace("torch.", "")) for i in region["inputs"])
    if any(not getattr(torch, dtype).is_floating_point for _, dtype in inputs):
        raise ValueError("the region reads integer tensors; a region type takes floating-point inputs so far")
    ops = textwrap.fill(" ".join(o.replace("aten::", "") for o in region["ops"]), 100, subsequent_indent="    ")
    return MODULE.format(name=region["name"], model=model, ops=ops,
                         share=region["share"], calls=region["calls"], type_name=type_name(region),
                         code=region["code"].strip(), inputs=inputs, rows=rows_of(region), n_ops=len(region["ops"]),
                         pattern=(region.get("pattern") or "").strip(),
                         pattern_name="pattern" if region.get("pattern") else "reference")


def module_path(name: str, root: Path) -> Path:
    match = _NAME.match(name)
    if not match:
        raise KeyError(f"{name!r} is not a region type: region/<name>, e.g. region/fused_mul_sigmoid_0")
    return root / DIR / f"{match.group(1)}.py"


ROUNDING_ALLOWANCE = 8.0  # a region kernel may be off by this many times the error of its math run in float32
RTOL32 = TOLERANCES[torch.float32][1]


def _row_worst(error: torch.Tensor) -> torch.Tensor:
    return error.amax(dim=-1, keepdim=True).expand_as(error) if error.dim() and error.numel() else error


def region_spec(name: str, reference, inputs: tuple, rows: int, ops: int = 1) -> KernelSpec:
    """The KernelSpec of a region that reads `inputs` ((shape, dtype) each, captured with `rows` rows) and computes
    `ops` elementwise ops per output element (its FLOP count for the roofline)."""
    inputs = tuple((tuple(shape), dtype) for shape, dtype in inputs)

    def shapes_at(m: int) -> list[tuple]:
        return [(m, *shape[1:]) if len(shape) > 1 and shape[0] == rows else shape for shape, _ in inputs]

    def make_inputs(shape, dtype, device, gen):
        return tuple(torch.randn(s, dtype=dtype, device=device, generator=gen) for s in shapes_at(shape["M"]))
    make_inputs.captured = inputs  # region deploy traces its pattern in the captured dtype

    def bytes_moved(shape, dtype) -> int:
        size = torch.finfo(dtype).bits // 8
        read = [torch.Size(s).numel() for s in shapes_at(shape["M"])]
        return size * (sum(read) + max(read))

    def flops(shape) -> int:
        return max(torch.Size(s).numel() for s in shapes_at(shape["M"])) * max(1, ops)

    def error_scale(inputs):
        """Where the region's math is ill-conditioned (the norm of nearly equal values: their mean subtracted, then
        divided by a tiny deviation) the error the math itself makes in float32, which the model's own kernel makes
        too: each output may be off by ROUNDING_ALLOWANCE times the worst of it in its row (in float32's rtol units,
        compare's scale). A row, not an element: a mean rounded one step the other way moves the whole row, and the
        reference's own rounding cancels at some elements by chance."""
        exact, single = reference(*inputs), reference(*(x.float() for x in inputs))
        pairs = zip(exact, single) if isinstance(exact, tuple) else [(exact, single)]
        scales = tuple(_row_worst((s.double() - e).abs().nan_to_num(0.0)) * (ROUNDING_ALLOWANCE / RTOL32)
                       for e, s in pairs)
        return scales if isinstance(exact, tuple) else scales[0]

    def scaled(factor: float, offset: float = 0.0):  # inputs that stress the numerics: huge, or nearly equal
        def make(shape, dtype, device, gen):
            return tuple(x * factor + offset for x in make_inputs(shape, torch.float32, device, gen))
        return lambda shape, dtype, device, gen: tuple(x.to(dtype) for x in make(shape, dtype, device, gen))

    # no input of the sweep past SWEEP_ELEMENTS (a leading dimension is often the batch: 128 rows of a
    # [1, 2048, 50304] region are 26 GB a tensor)
    widest_row = max(torch.Size(s).numel() for s in shapes_at(1))

    def fits(m: int) -> bool:
        return m * widest_row <= SWEEP_ELEMENTS

    small = sorted({1, 3, min(rows, 8)})
    return KernelSpec(
        name=name, reference=reference, make_inputs=make_inputs,
        shapes=[{"M": m} for m in sorted({rows, *filter(fits, (1, 16, 128, 2 * rows))})],
        small_shapes=[{"M": m} for m in small],
        edge_shapes=[{"M": m} for m in filter(fits, (7, 33))] or [{"M": 1}], small_edge_shapes=[{"M": 5}],
        bench_shape={"M": rows}, error_scale=error_scale,
        small_bench_shape={"M": min(rows, 16)}, bytes_moved=bytes_moved, flops=flops,
        adversarial={"large values": scaled(100.0), "nearly equal values": scaled(1e-3, 1.0)},
        description=f"a region of a model, captured from torch.compile's graph ({rows} rows)")


def resolve(name: str) -> KernelSpec:
    """The SPEC of "region/<name>" from workspace/regions/<name>.py ($AUTOKERNEL_REGIONS's, else beside the current
    folder or one above it, else this project's: a --gpus worktree finds its main checkout's), imported afresh."""
    relative = module_path(name, Path("."))
    chosen = os.environ.get(ENV_DIR)
    places = ([Path(chosen) / relative.name] if chosen else []) + [
        base / relative for base in (Path.cwd(), *Path.cwd().parents, PROJECT_ROOT)]
    path = next((p for p in places if p.is_file()), None)
    if path is None:
        raise KeyError(f"region type {name!r} has no module {relative} (extract.py --regions writes it)")
    spec = importlib.util.spec_from_file_location(f"_autokernel_region_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SPEC
