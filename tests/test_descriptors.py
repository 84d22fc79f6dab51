"""The TMA kernels of the starters (fused_mlp, matmul, linear_cross_entropy, flash_attention) with their descriptors
made on the host and on the device (DESCRIPTORS). On the CPU through Triton's interpreter, which runs both kinds,
with the TMA path forced (it is taken on Hopper GPUs only), and compiled for sm_90; with the `gpu` marker, at model
shapes, replayed, and under torch.compile."""

import helpers
import pytest
import torch

from autokernel.kernelfile import import_kernel
from autokernel.ops import swap
from autokernel.registry import get_spec

TMA_TYPES = ("fused_mlp", "matmul", "linear_cross_entropy", "flash_attention")
# Ragged against every tile: rows past M or N and depth past K must read as zeros, and stores stop at the edge
# (attention's TMA path takes whole BLOCK_M query blocks only: 2 of them per head)
CPU_SHAPES = {"fused_mlp": {"T": 40, "H": 96, "I": 136}, "matmul": {"M": 72, "K": 96, "N": 136},
              "linear_cross_entropy": {"N": 37, "H": 80, "V": 300},
              "flash_attention": {"B": 1, "H": 2, "S": 128, "D": 64, "causal": True}}
TMA_GATES = {"flash_attention": "_tma_applies"}  # where a file's TMA path is decided; "_tma_ok" elsewhere


def _tma_kernel(repo_root, kernel_type: str, descriptors: str):
    """The starter's module with its TMA variant taken wherever it applies, its descriptors made as asked."""
    module = import_kernel(repo_root / "kernels" / f"{kernel_type}.py")
    module.VARIANT = "tma"
    module.DESCRIPTORS = descriptors
    return module


def _inputs(kernel_type: str, shape: dict, device: str):
    return get_spec(kernel_type).make_inputs(shape, torch.float16, device, torch.Generator(device).manual_seed(0))


@pytest.mark.parametrize("kernel_type", TMA_TYPES)
@pytest.mark.parametrize("descriptors", ["host", "device"])
def test_the_tma_kernels_compute_the_reference_with_either_descriptors(repo_root, interpreter, monkeypatch,
                                                                       kernel_type, descriptors):
    _tma_path_computes_the_reference(_tma_kernel(repo_root, kernel_type, descriptors), CPU_SHAPES[kernel_type],
                                     monkeypatch)


def _tma_path_computes_the_reference(module, shape: dict, monkeypatch) -> None:
    """The module's TMA kernel, forced (the interpreter runs it on the CPU), runs and computes the reference."""
    kernel_type = module.KERNEL_TYPE
    monkeypatch.setattr(module, TMA_GATES.get(kernel_type, "_tma_ok"), lambda *arguments: True)
    if hasattr(module, "_sm_count"):
        monkeypatch.setattr(module, "_sm_count", lambda device_index: 3)  # persistent programs over several tiles
    launched = []
    kernel = next(v for k, v in vars(module).items() if k.endswith("_tma_kernel"))
    monkeypatch.setattr(kernel, "run", _counting(kernel.run, launched))
    args = _inputs(kernel_type, shape, "cpu")
    spec = get_spec(kernel_type)
    got, want = module.kernel_fn(*args), spec.reference(*args)
    assert launched, "the TMA kernel did not run"
    atol, rtol = spec.tolerance(torch.float16)
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)


def _counting(run, launched: list):
    def counted(*args, **kwargs):
        launched.append(1)
        return run(*args, **kwargs)
    return counted


def _layouts(batch=2, heads=4, kv_heads=2, seq=128, dim=64, device="cpu"):
    """q, k, v as models hand them to attention, [B, H, S, D] each: (name, q, k, v, whether TMA can walk them)."""
    gen = torch.Generator(device).manual_seed(5)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=device).half()

    def seq_major(h):  # a projection viewed [B, S, H, D] and transposed, as HF attention modules do
        return rand(batch, seq, h, dim).transpose(1, 2)

    packed = rand(batch, seq, heads, 3 * dim)  # GPT-NeoX's fused qkv, viewed [B, S, H, 3D] and cut in three
    q3, k3, v3 = (t.transpose(1, 2) for t in packed.split(dim, dim=-1))
    padded = rand(batch, heads, seq, 2 * dim)[..., :dim]  # rows 2D apart: a layout no row matrix of D holds cleanly
    cols = rand(batch, heads, dim, seq).transpose(2, 3)  # D not unit-stride: no descriptor
    return [("dense", rand(batch, heads, seq, dim), rand(batch, kv_heads, seq, dim), rand(batch, kv_heads, seq, dim),
             True),
            ("sequence-major", seq_major(heads), seq_major(kv_heads), seq_major(kv_heads), True),
            ("packed qkv", q3, k3, v3, True),
            ("a K/V head expanded over the group", seq_major(heads), *(seq_major(1).expand(-1, heads, -1, -1)
                                                                      for _ in range(2)), True),
            ("rows wider than a head", padded, padded, padded, True),
            ("a transposed head dim", cols, cols, cols, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("overlap", [False, True])
def test_attention_tma_takes_the_models_layouts_on_the_gpu(repo_root, monkeypatch, overlap):
    """On Hopper, at a model's shape, the TMA kernel runs on every layout a descriptor can walk and gives SDPA's
    answer, OVERLAP or not."""
    module = _tma_kernel(repo_root, "flash_attention", "host")
    module.OVERLAP = overlap
    launched = []
    monkeypatch.setattr(module._flash_attention_tma_kernel, "run",
                        _counting(module._flash_attention_tma_kernel.run, launched))
    for name, q, k, v, walks in _layouts(1, 32, 8, 2048, 128, "cuda"):
        launched.clear()
        got = module.kernel_fn(q, k, v, True)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        assert bool(launched) == walks and swap.rel_l2(got, want) < 1e-2, name


@pytest.mark.parametrize("descriptors", ["host", "device"])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_tma_overlapped_computes_the_reference(repo_root, interpreter, monkeypatch, descriptors, causal):
    """OVERLAP (each block's scores issued before the previous block's softmax) gives the reference, causal (the
    first query block has no unmasked keys before its diagonal) and not, with one and several key blocks a program."""
    module = _tma_kernel(repo_root, "flash_attention", descriptors)
    module.OVERLAP = True
    for seq in (64, 192):  # one query block of 64, three
        _tma_path_computes_the_reference(module, {"B": 1, "H": 2, "Hkv": 1, "S": seq, "D": 64, "causal": causal},
                                         monkeypatch)


@pytest.mark.parametrize("descriptors", ["host", "device"])
def test_attention_tma_walks_the_layouts_models_pass_without_copies(repo_root, interpreter, monkeypatch,
                                                                    descriptors):
    """The TMA path reads q, k and v where they lie (heads as rows or as columns of one matrix, a packed qkv's
    slices, a K/V head expanded over its group) and writes the sequence-major output the pointer path writes; a
    layout no descriptor can walk runs the pointer path and still gives the reference."""
    module = _tma_kernel(repo_root, "flash_attention", descriptors)
    monkeypatch.setattr(module, "_tma_applies", lambda *arguments: True)
    launched = []
    monkeypatch.setattr(module._flash_attention_tma_kernel, "run",
                        _counting(module._flash_attention_tma_kernel.run, launched))
    spec = get_spec("flash_attention")
    for name, q, k, v, walks in _layouts():
        launched.clear()
        got = module.kernel_fn(q, k, v, True)
        torch.testing.assert_close(got.float(), spec.reference(q, k, v, True).float(), atol=2e-2, rtol=2e-2,
                                   msg=name)
        assert bool(launched) == walks, name
        assert got.transpose(1, 2).is_contiguous(), name  # [B, S, H, D] in memory, whichever path ran


def test_the_matmul_tma_kernel_reads_a_transposed_weight_on_device_descriptors(repo_root, interpreter, monkeypatch):
    """B as nn.Linear gives it (a W.t() view): the kernel describes W [N, K] as it lies and transposes tiles."""
    module = _tma_kernel(repo_root, "matmul", "device")
    monkeypatch.setattr(module, "_tma_ok", lambda *tensors: True)
    a, w = torch.randn(72, 96).half(), (torch.randn(136, 96) / 10).half()
    got = module.kernel_fn(a, w.t())
    assert swap.rel_l2(got, a.float() @ w.float().t()) < 1e-3


@pytest.mark.parametrize("kernel_type", [*TMA_TYPES, "rmsnorm"])
def test_the_copy_torch_compile_traces_makes_its_descriptors_on_the_device(repo_root, monkeypatch, kernel_type):
    """Host descriptors cannot be traced (launchers._traced): the copy of kernel_fn that torch.compile traces takes
    DESCRIPTORS = "device" where the file has the tunable, while the file itself, which eager calls and the
    harness run, keeps its own value; a file without it is left without it."""
    from autokernel import compat
    from autokernel.ops import launchers

    # what traceable() refuses under the interpreter, whose kernels wrap_triton cannot take
    monkeypatch.setattr(compat, "interpreting", lambda: False)
    monkeypatch.setattr(compat, "is_triton_kernel", compat.is_jit_or_interpreted)
    monkeypatch.setattr(launchers, "_traced", lambda kernel: kernel)
    module = import_kernel(repo_root / "kernels" / f"{kernel_type}.py")
    traced = launchers.traceable(module.kernel_fn)
    assert traced.__globals__.get("DESCRIPTORS") == ("device" if kernel_type in TMA_TYPES else None)
    assert getattr(module, "DESCRIPTORS", None) == ("host" if kernel_type in TMA_TYPES else None)


# Model-like shapes for the compile below (the launches are recorded, not run: the tensors only give types)
HOPPER_SHAPES = {"fused_mlp": {"T": 256, "H": 512, "I": 1024}, "matmul": {"M": 256, "K": 512, "N": 384},
                 "linear_cross_entropy": {"N": 256, "H": 512, "V": 4096},
                 "flash_attention": {"B": 1, "H": 4, "S": 256, "D": 128, "causal": True}}


def hopper_inputs(module):
    """kernel_fn's arguments for the compile below, with the TMA path taken and the GPU's tiles and SM count;
    matmul's B as nn.Linear gives it (W.t()) where the module says LINEAR_WEIGHT."""
    setattr(module, TMA_GATES.get(module.KERNEL_TYPE, "_tma_ok"), lambda *arguments: True)
    if hasattr(module, "_blocks"):  # linear_cross_entropy picks smaller tiles for the interpreter
        module._blocks = lambda hidden: (module.BLOCK_M, module.BLOCK_N, module.BLOCK_K)
    module._sm_count = lambda device_index: 132
    args = _inputs(module.KERNEL_TYPE, HOPPER_SHAPES[module.KERNEL_TYPE], "cpu")
    if getattr(module, "LINEAR_WEIGHT", False):
        args = (args[0], args[1].t().contiguous().t())
    return args


@pytest.mark.slow(15)
def test_the_tma_kernels_compile_for_hopper_with_either_descriptors(repo_root):
    """The TMA path runs only on Hopper GPUs, where CI has none: the TMA kernels kernel_fn launches there are
    compiled here for sm_90, as launched at a model-like shape. Device descriptors take global scratch (a 128-byte
    map per descriptor and program), host ones none."""
    jobs = [(repo_root / "kernels" / f"{t}.py", {"VARIANT": "tma", "DESCRIPTORS": d, "LINEAR_WEIGHT": linear})
            for t in TMA_TYPES for d in ("host", "device") for linear in ((False, True) if t == "matmul" else (False,))]
    jobs.append((repo_root / "kernels" / "flash_attention.py", {"VARIANT": "tma", "DESCRIPTORS": "host",
                                                                 "OVERLAP": True}))
    jobs.append((repo_root / "kernels" / "flash_attention.py", {"VARIANT": "tma", "DESCRIPTORS": "device",
                                                                 "CAUSAL_ORDER": "fold"}))
    compiled = helpers.compiled_for(helpers.HOPPER, jobs, "test_descriptors:hopper_inputs", "_tma_kernel")
    assert compiled[-1][0]["grid"][0] == 2  # 256 positions: 4 query blocks of 64, folded in pairs
    for (path, setup), launches in zip(jobs, compiled):
        assert len(launches) == (2 if path.stem == "fused_mlp" else 1), launches  # the MLP's two GEMM phases
        scratch = [k["global_scratch_size"] for k in launches]
        on_device = setup["DESCRIPTORS"] == "device"
        assert all(size >= 256 if on_device else size == 0 for size in scratch), (path.stem, setup, scratch)


GPU_SHAPES = {"fused_mlp": {"T": 2048, "H": 2048, "I": 5632}, "matmul": {"M": 2048, "N": 2048, "K": 2048},
              "linear_cross_entropy": {"N": 2048, "H": 2048, "V": 32000},
              "flash_attention": {"B": 2, "H": 32, "S": 2048, "D": 128, "causal": True}}


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_type", TMA_TYPES)
def test_device_descriptors_give_the_host_descriptors_answer_on_the_gpu(repo_root, kernel_type):
    args = _inputs(kernel_type, GPU_SHAPES[kernel_type], "cuda")
    host = _tma_kernel(repo_root, kernel_type, "host").kernel_fn(*args)
    device = _tma_kernel(repo_root, kernel_type, "device").kernel_fn(*args)
    assert torch.equal(host, device)  # the same tiles in the same order: bitwise
    want = get_spec(kernel_type).reference(*args)
    assert swap.rel_l2(device, want) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_type", TMA_TYPES)
def test_device_descriptor_kernels_replay_in_a_thread_that_never_set_the_allocator(repo_root, kernel_type):
    """optimize()'s eager path replays the launches (autokernel/ops/replay.py): the kernels that take global scratch
    get it in a thread where kernel_fn never ran, and every call computes on its own inputs."""
    import threading

    from autokernel.ops import launchers, replay

    module = _tma_kernel(repo_root, kernel_type, "device")
    fast = launchers.fast(module.kernel_fn)
    gen = torch.Generator("cuda").manual_seed(1)
    sets = [get_spec(kernel_type).make_inputs(GPU_SHAPES[kernel_type], torch.float16, "cuda", gen) for _ in range(3)]
    got = [fast(*sets[0])]
    thread = threading.Thread(target=lambda: got.extend(fast(*args) for args in sets[1:]))
    thread.start()
    thread.join()
    assert len(got) == 3
    assert all(torch.equal(g, module.kernel_fn(*args)) for g, args in zip(got, sets))
    assert isinstance(fast, replay.Replayed) and fast.reasons() == {}  # replayed, not run through kernel_fn


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_type", TMA_TYPES)
def test_inductor_launches_a_kernel_on_device_descriptors_from_its_own_code(repo_root, kernel_type):
    """Host descriptors leave the op opaque under torch.compile (test_optimize); device ones are traced: the
    compiled code launches the Triton kernel itself and calls no opaque op, and gives the kernel's answer."""
    from torch._inductor.utils import run_and_get_code

    from autokernel.ops import customops

    module = _tma_kernel(repo_root, kernel_type, "device")
    customops.install(kernel_type, module.kernel_fn, f"kernels/{kernel_type}.py", get_spec(kernel_type).deployment)
    op = customops.op(kernel_type)
    # every argument, as a site passes them: the op's schema has no defaults (flash_attention's inputs stop at five)
    args = helpers.every_argument(module.kernel_fn, _inputs(kernel_type, GPU_SHAPES[kernel_type], "cuda"))
    with torch.no_grad():
        want = module.kernel_fn(*args)
        torch._dynamo.reset()
        got, codes = run_and_get_code(torch.compile(lambda *a: op(*a) + 0), *args)
    code = "\n".join(codes)
    assert "_tma_kernel" in code and "_opaque" not in code
    assert swap.rel_l2(got, want) < 1e-3


WS_TYPES = ("fused_mlp", "matmul", "linear_gelu")  # the TMA GEMMs whose K loop WARP_SPECIALIZE turns over
WS_CPU_SHAPES = {**CPU_SHAPES, "linear_gelu": {"T": 40, "H": 96, "I": 136, "approximate": "none"}}


@pytest.mark.parametrize("kernel_type", WS_TYPES)
def test_a_warp_specialized_tma_gemm_computes_the_reference(repo_root, interpreter, monkeypatch, kernel_type):
    """WARP_SPECIALIZE (a tunable the screen tries): the TMA kernel's K loop as tl.range(warp_specialize=True)."""
    module = _tma_kernel(repo_root, kernel_type, "host")
    module.WARP_SPECIALIZE = True
    _tma_path_computes_the_reference(module, WS_CPU_SHAPES[kernel_type], monkeypatch)


@pytest.mark.slow(15)
def test_the_warp_specialized_tma_gemms_compile_for_hopper(repo_root):
    """On an H100 the screen may pick WARP_SPECIALIZE: each TMA GEMM compiles so for sm_90 at a model-like shape."""
    jobs = [(repo_root / "kernels" / f"{t}.py", {"VARIANT": "tma", "WARP_SPECIALIZE": True}) for t in ("fused_mlp",
                                                                                                        "matmul")]
    compiled = helpers.compiled_for(helpers.HOPPER, jobs, "test_descriptors:hopper_inputs", "_tma_kernel")
    assert [len(launches) for launches in compiled] == [2, 1]
