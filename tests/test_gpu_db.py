"""GPU detection picks the right part by its exact name, prefers a measured ceiling, estimates the rest."""

import json
from types import SimpleNamespace

import pytest

from autokernel.harness import gpu


@pytest.mark.parametrize("name, bandwidth", [
    ("NVIDIA H100 80GB HBM3", 3350),  # the SXM part
    ("NVIDIA H100 PCIe", 2000),
    ("NVIDIA H100 NVL", 3900),
    ("NVIDIA H200", 4800),
    ("NVIDIA B200", 8000),
    ("NVIDIA A100-SXM4-80GB", 2039),
    ("NVIDIA A100-PCIE-40GB", 1555),
    ("NVIDIA L40S", 864),
    ("NVIDIA L4", 300),
    ("NVIDIA A10", 600),
    ("NVIDIA GeForce RTX 4090", 1008),
    ("NVIDIA GeForce RTX 3080", 760),
    ("AMD Instinct MI300X", 5300),
    ("AMD Instinct MI355X", 8000),
])
def test_known_gpus_are_matched_by_their_exact_sku(name, bandwidth):
    ceil = gpu.table_ceilings(name)
    assert ceil is not None and ceil.bandwidth_gb_s == bandwidth and ceil.source == "datasheet"


def test_l40s_is_not_an_l4_and_an_a100_is_not_an_a10():
    assert gpu.table_ceilings("NVIDIA L40S").bandwidth_gb_s != gpu.table_ceilings("NVIDIA L4").bandwidth_gb_s
    assert gpu.table_ceilings("NVIDIA A100 80GB PCIe").bandwidth_gb_s == 1935


def test_a_measured_ceiling_cached_on_disk_wins_over_the_table(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(gpu, "device_name", lambda device="cuda": "NVIDIA H100 80GB HBM3")
    assert gpu.ceilings().source == "datasheet"
    measured = gpu.Ceilings("NVIDIA H100 80GB HBM3", 3012, 780, 67, "measured")
    gpu._cache_file(measured.name).write_text(json.dumps(measured.__dict__))
    assert gpu.ceilings() == measured
    # the physical limit used by the roofline guard never comes from a measurement
    assert gpu.physical_limit("NVIDIA H100 80GB HBM3").bandwidth_gb_s == 3350


def test_an_unknown_gpu_is_estimated_from_sms_clocks_and_capability(monkeypatch):
    props = SimpleNamespace(name="NVIDIA Future X1", multi_processor_count=100, clock_rate=2_000_000, major=9,
                            minor=0, memory_clock_rate=2_600_000, memory_bus_width=5120)
    monkeypatch.setattr(gpu.torch.cuda, "get_device_properties", lambda i=0: props)
    ceil = gpu.estimated_ceilings()
    assert ceil.source == "estimated"
    assert ceil.fp16_tflops == round(100 * 2e9 * 4096 / 1e12)  # 819
    assert ceil.bandwidth_gb_s == round(2 * 2.6e9 * 5120 / 8 / 1e9)  # 3328


def test_asking_for_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(gpu, "has_cuda", lambda: False)
    assert gpu.pick_device(None) == "cpu"
    with pytest.raises(RuntimeError, match="no CUDA GPU is visible"):
        gpu.pick_device("cuda")
