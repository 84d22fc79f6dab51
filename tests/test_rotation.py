"""autokernel::rotate_half (autokernel/ops/rotation.py): the keys the RoPE-attention site puts in a KV cache under
torch.compile, one op: HF's apply_rotary_pos_emb within one rounding (the GPU kernel rounds once, as Inductor
computes HF's ops), bit for bit on a CPU."""

import pytest
import torch
from transformers.models.glm.modeling_glm import apply_rotary_pos_emb as glm_rotary
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from autokernel.ops import rotation


def _case(dtype, device, rotary, batched, seq=10, dim=16, gen=None, pairs=False):
    """k [2, 3, seq, dim] as a view of [2, seq, 3, dim] (the model's projections), tables [1 or 2, seq, rotary], and
    what HF's apply_rotary_pos_emb makes of k (partial rotary: the first `rotary` features, the rest as they are;
    pairs: GLM's, which turns features 2i and 2i+1 together)."""
    gen = gen or torch.Generator().manual_seed(0)
    k = torch.randn(2, seq, 3, dim, generator=gen).to(device, dtype).transpose(1, 2)
    angles = torch.rand(2 if batched else 1, seq, rotary // 2, generator=gen) * 6
    cos, sin = (torch.cat([f(angles)] * 2, -1).to(device, dtype) for f in (torch.cos, torch.sin))
    if pairs:
        return k, cos, sin, glm_rotary(k, k, cos, sin)[1]
    part = k[..., :rotary]
    want = torch.cat((apply_rotary_pos_emb(part, part, cos, sin)[1], k[..., rotary:]), -1)
    return k, cos, sin, want


ULP = {torch.float16: 2**-10, torch.bfloat16: 2**-7, torch.float32: 2**-23}  # a rounding, relative


def _within_a_rounding(got, want, keys):
    """Eager HF rounds each product (|x * cos|, |turned * sin| <= max |x|) and the sum, the kernel the sum alone."""
    ulp = ULP[got.dtype]
    torch.testing.assert_close(got, want, rtol=ulp, atol=2 * ulp * keys.abs().max().item())


@pytest.mark.parametrize("pairs", [False, True], ids=["rotate_half", "pairs"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_triton_kernel_rotates_as_hf(interpreter, dtype, pairs):
    """The op's kernel (run by the interpreter): strided keys, 2-D and batched tables, partial rotary, a sequence
    no multiple of the tile, Llama's rotate-half and GLM's pairs; HF's keys within a rounding. bfloat16 only on a
    GPU (the interpreter rounds it otherwise)."""
    for rotary, batched, seq in ((16, True, 10), (16, False, 37), (8, True, 5), (4, False, 1)):
        k, cos, sin, want = _case(dtype, "cpu", rotary, batched, seq, pairs=pairs)
        tables = (cos, sin) if batched else (cos[0], sin[0])
        got = rotation._launched(k, *tables, pairs, rotation._direct)
        assert got.is_contiguous() and got.shape == want.shape, (rotary, batched, seq)
        _within_a_rounding(got, want, k)


def test_a_kernel_that_turns_the_wrong_half_is_not_hfs(interpreter):
    """The comparison above can fail: the same kernel with the minus on the other half differs from HF's keys."""
    k, cos, sin, want = _case(torch.float32, "cpu", 16, True)
    got = rotation._launched(k, cos, -sin, False, rotation._direct)  # the sign flipped: x * cos - turned * sin
    with pytest.raises(AssertionError):
        _within_a_rounding(got, want, k)
    with pytest.raises(AssertionError):  # and GLM's pairs are not Llama's halves
        _within_a_rounding(rotation._launched(k, cos, sin, True, rotation._direct), want, k)


def test_traced_the_op_stays_one_node_and_computes_hfs_keys():
    """Under torch.compile the op is one node of dynamo's graph (Inductor cannot fuse its inside with the tables'
    making), and the compiled result is HF's (a CPU: the op's torch formula)."""
    graphs = []

    def backend(gm, example):
        graphs.append(gm)
        return gm.forward

    k, cos, sin, want = _case(torch.float32, "cpu", 16, True)
    got = torch.compile(rotation.rotate_half, backend=backend, fullgraph=True)(k, cos, sin, False)
    assert torch.equal(got, want)
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert targets == ["autokernel.rotate_half.default"]
    assert torch.equal(torch.compile(rotation.rotate_half)(k, cos, sin, False), want)  # Inductor's own code


@pytest.mark.gpu
@pytest.mark.parametrize("pairs", [False, True], ids=["rotate_half", "pairs"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_on_a_gpu_the_op_rotates_as_hf_eager_and_compiled(dtype, pairs):
    gen = torch.Generator().manual_seed(0)
    for rotary, batched, seq in ((128, False, 2048), (64, True, 300), (32, False, 77)):
        k, cos, sin, want = _case(dtype, "cuda", rotary, batched, seq, dim=128, gen=gen, pairs=pairs)
        _within_a_rounding(rotation.rotate_half(k, cos, sin, pairs), want, k)
        _within_a_rounding(torch.compile(rotation.rotate_half, fullgraph=True)(k, cos, sin, pairs), want, k)
