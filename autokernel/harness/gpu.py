"""Which device we run on and what it can do at best: memory bandwidth and matrix throughput.

Ceilings come from a table of datasheet figures, matched on the exact device name (the SKU matters:
"NVIDIA H100 80GB HBM3" is the SXM part, "H100 PCIe" is not; "L40S" is not "L4"), and better from a
one-time measurement on the machine (a large device copy, a large matmul) cached on disk. A GPU in
neither is estimated from its SM count, clocks and compute capability.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Ceilings:
    name: str
    bandwidth_gb_s: float  # DRAM, read + write
    fp16_tflops: float  # dense tensor-core fp16/bf16
    fp32_tflops: float  # non-tensor-core fp32 (what an fp32 kernel with ieee dot gets)
    source: str  # "datasheet", "measured" or "estimated"


# (pattern on the device name, bandwidth GB/s, fp16 dense TFLOP/s, fp32 TFLOP/s). First match wins,
# so the more specific names come first.
GPU_TABLE = [
    (r"H100.*(PCIe|PCI-E)", 2000, 756, 51),
    (r"H100.*NVL", 3900, 835, 60),
    (r"H100", 3350, 989, 67),  # "NVIDIA H100 80GB HBM3": the SXM part
    (r"H200", 4800, 989, 67),
    (r"GH200", 4000, 989, 67),
    (r"B200", 8000, 2250, 80),
    (r"A100.*(PCIe|PCI-E).*40GB|A100-PCIE-40GB", 1555, 312, 19.5),
    (r"A100.*80GB.*(PCIe|PCI-E)|A100-PCIE-80GB", 1935, 312, 19.5),
    (r"A100.*40GB", 1555, 312, 19.5),
    (r"A100", 2039, 312, 19.5),
    (r"L40S", 864, 362, 91.6),
    (r"\bL40\b", 864, 181, 90.5),
    (r"\bL4\b", 300, 121, 30.3),
    (r"\bA10G\b", 600, 70, 31.2),
    (r"\bA10\b", 600, 125, 31.2),
    (r"RTX 4090", 1008, 165, 82.6),
    (r"RTX 4080", 717, 97.5, 48.7),
    (r"RTX 3090", 936, 71, 35.6),
    (r"RTX 3080", 760, 59.5, 29.8),
    (r"MI300X", 5300, 1307, 163),
    (r"MI325X", 6000, 1307, 163),
    (r"MI350X", 8000, 2300, 144),
    (r"MI355X", 8000, 2500, 157),
]

# Dense fp16 tensor-core FLOPs per SM per clock by compute capability (major, minor).
_FP16_FLOPS_PER_SM_CLOCK = {(7, 0): 1024, (7, 5): 512, (8, 0): 2048, (8, 6): 1024, (8, 9): 1024,
                            (9, 0): 4096, (10, 0): 8192, (12, 0): 2048}

CACHE_DIR = Path(os.environ.get("AUTOKERNEL_CACHE", Path.home() / ".cache" / "autokernel"))


def has_cuda() -> bool:
    return torch.cuda.is_available()


def pick_device(requested: str | None) -> str:
    """'cuda' or 'cpu'; auto-detects when requested is None or 'auto'."""
    if requested in (None, "auto"):
        return "cuda" if has_cuda() else "cpu"
    if requested == "cuda" and not has_cuda():
        raise RuntimeError("--device cuda was asked for, but no CUDA GPU is visible to PyTorch")
    if requested not in ("cuda", "cpu"):
        raise ValueError(f"unknown device {requested!r}; use cuda or cpu")
    return requested


def device_name(device: str = "cuda") -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"


def table_ceilings(name: str) -> Ceilings | None:
    for pattern, bw, fp16, fp32 in GPU_TABLE:
        if re.search(pattern, name, re.IGNORECASE):
            return Ceilings(name, bw, fp16, fp32, "datasheet")
    return None


def estimated_ceilings() -> Ceilings:
    p = torch.cuda.get_device_properties(0)
    clock_hz = getattr(p, "clock_rate", 1_500_000) * 1e3  # kHz in the properties
    per_clock = _FP16_FLOPS_PER_SM_CLOCK.get((p.major, p.minor), 1024)
    fp16 = p.multi_processor_count * clock_hz * per_clock / 1e12
    fp32 = p.multi_processor_count * clock_hz * 256 / 1e12  # 128 FMA lanes per SM
    mem_clock_khz, bus_bits = getattr(p, "memory_clock_rate", 0), getattr(p, "memory_bus_width", 0)
    bw = 2 * mem_clock_khz * 1e3 * bus_bits / 8 / 1e9 if mem_clock_khz and bus_bits else 1000.0
    return Ceilings(p.name, round(bw), round(fp16), round(fp32, 1), "estimated")


def _cache_file(name: str) -> Path:
    return CACHE_DIR / f"ceilings-{re.sub(r'[^A-Za-z0-9]+', '_', name)}.json"


def measured_ceilings(name: str) -> Ceilings | None:
    path = _cache_file(name)
    if not path.is_file():
        return None
    try:
        return Ceilings(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return None


def measure_ceilings() -> Ceilings:
    """Measure copy bandwidth and matmul throughput once and cache them on disk."""
    from autokernel.harness.timing import time_gpu  # timing imports gpu; keep the cycle lazy

    name = device_name()
    n = 256 * 1024 * 1024  # 512 MiB of fp16 per buffer: far beyond any L2
    src = torch.randn(n, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    copy_us = time_gpu(lambda s: dst.copy_(s), [(src,)], reps=20).median_us
    bandwidth = 2 * n * 2 / (copy_us * 1e-6) / 1e9
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_us = time_gpu(torch.matmul, [(a, b)], reps=20).median_us
    fp16 = 2 * 8192**3 / (mm_us * 1e-6) / 1e12
    fp32 = (table_ceilings(name) or estimated_ceilings()).fp32_tflops
    ceil = Ceilings(name, round(bandwidth), round(fp16), fp32, "measured")
    _cache_file(name).parent.mkdir(parents=True, exist_ok=True)
    _cache_file(name).write_text(json.dumps(asdict(ceil), indent=2))
    return ceil


def ceilings(measure: bool = False) -> Ceilings:
    """The best ceilings known for the current GPU: measured (cached) > datasheet > estimated."""
    name = device_name()
    found = measured_ceilings(name)
    if found is None and measure:
        found = measure_ceilings()
    return found or table_ceilings(name) or estimated_ceilings()


def physical_limit(name: str) -> Ceilings:
    """The fastest a device could possibly be: the datasheet (or estimate), never a measurement.

    A kernel timed above this is not fast, it is not doing the work (or the clock is lying).
    """
    return table_ceilings(name) or estimated_ceilings()
