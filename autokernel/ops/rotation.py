"""HF's apply_rotary_pos_emb on one tensor as one op, `autokernel::rotate_half`: the keys the RoPE-attention site
puts in a KV cache under torch.compile (attention_sites._rotated, traced).

Traced as HF's ops, that rotation is Inductor's to fuse, and it fused it with the model's making of the tables
(position ids times inv_freq, cos, sin) and Qwen3's per-head norm: every element of every layer's keys took its cos
and sin again, and layer 0's kernel ran 721 us a forward on an H200 (Qwen3-0.6B at 1x2048 under torch.compile,
scripts/types_profile.py; the keys of one layer are 4 MB), 994 us in all against 471 us of the same kernels with
flash_attention and rotary_embedding in rope_attention's place. Earlier a roll there made a kernel ptxas compiled
for over six minutes. One op takes the tables as the tensors they are: Inductor makes them once, and the op reads
them.

On a GPU the op is a triton_op (torch >= 2.6): traced, Inductor launches its Triton kernel from its own code. The
kernel computes in fp32 and rounds once, as Inductor computes HF's ops in the compiled original: within a rounding
of eager HF's keys, which round each product and the sum (Triton contracts such a chain into fused multiply-adds
unless told otherwise, which a traced launch cannot be). Elsewhere (a CPU, the interpreter, an older torch) it
computes HF's formula with torch ops, which a trace takes in as they are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autokernel import compat

NAME = "autokernel::rotate_half"
TILE = 4096  # elements a program: positions x the head's (padded) features


@triton.jit
def _rotate_half_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, H, S, D, ROT,
                        stride_xb, stride_xh, stride_xs, stride_xd, stride_cb, stride_cs, stride_sb, stride_ss,
                        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr):
    """BLOCK_S positions of one (batch, head) of x: out = x * cos + rotate_half(x) * sin on the first ROT features
    (rotate_half: the second half of them negated, then the first; INTERLEAVED: each pair (2i, 2i+1) as (-x[2i+1],
    x[2i]), turned by the tables' entry i), the rest as they are; out is contiguous."""
    b = (tl.program_id(1) // H).to(tl.int64)
    h = (tl.program_id(1) % H).to(tl.int64)
    offs_s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    half = ROT // 2
    rotated = (offs_s[:, None] < S) & (offs_d[None, :] < ROT)
    row = x_ptr + b * stride_xb + h * stride_xh + offs_s[:, None].to(tl.int64) * stride_xs
    x = tl.load(row + offs_d[None, :] * stride_xd, mask=(offs_s[:, None] < S) & (offs_d[None, :] < D), other=0.0)
    if INTERLEAVED:
        partner, negated, entry = offs_d ^ 1, offs_d % 2 == 0, offs_d // 2
    else:
        partner, negated, entry = tl.where(offs_d < half, offs_d + half, offs_d - half), offs_d < half, offs_d
    xp = tl.load(row + partner[None, :] * stride_xd, mask=rotated, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + b * stride_cb + offs_s[:, None] * stride_cs + entry[None, :], mask=rotated, other=1.0)
    s = tl.load(sin_ptr + b * stride_sb + offs_s[:, None] * stride_ss + entry[None, :], mask=rotated, other=0.0)
    turned = tl.where(negated[None, :], -xp, xp)
    out = (x.to(tl.float32) * c.to(tl.float32) + turned * s.to(tl.float32)).to(x.dtype)
    out = tl.where(offs_d[None, :] < ROT, out, x)
    o_rows = (tl.program_id(1).to(tl.int64) * S + offs_s[:, None]) * D
    tl.store(out_ptr + o_rows + offs_d[None, :], out, mask=(offs_s[:, None] < S) & (offs_d[None, :] < D))


def formula(x, cos, sin, interleaved=False):
    """HF's apply_rotary_pos_emb on x [B, H, S, D] with cos and sin [S, R] or [1 or B, S, R] (R < D: partial rotary,
    the rest of each head passes), in torch ops; interleaved as GLM's (pairs 2i, 2i+1, the tables' first half). Also
    rope_attention's reference rotation (in its inputs' precision: float64 there)."""
    rot = cos.shape[-1]
    cos, sin = (t[None] if t.dim() == 2 else t for t in (cos, sin))
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    part, rest = x[..., :rot], x[..., rot:]
    if interleaved:
        cos, sin = (t[..., : rot // 2].repeat_interleave(2, dim=-1) for t in (cos, sin))
        turned = torch.stack((-part[..., 1::2], part[..., 0::2]), dim=-1).flatten(-2)
    else:
        turned = torch.cat((-part[..., rot // 2:], part[..., :rot // 2]), dim=-1)
    out = part * cos + turned * sin
    return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


def _tables(t):
    """t as [1 or B, S, R] with unit-stride rows, and its batch stride (0 for one table for the batch)."""
    t3 = t if t.dim() == 3 else t[None]
    t3 = t3 if t3.stride(-1) == 1 else t3.contiguous()
    return t3, (0 if t3.shape[0] == 1 else t3.stride(0)), t3.stride(1)


def _launched(x, cos, sin, interleaved, launch):
    batch, heads, seq, dim = x.shape
    out = torch.empty((batch, heads, seq, dim), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    (cos3, cb, cs), (sin3, sb, ss) = _tables(cos), _tables(sin)
    block_d = triton.next_power_of_2(dim)
    block_s = max(1, min(TILE // block_d, triton.next_power_of_2(seq)))
    grid = (triton.cdiv(seq, block_s), batch * heads)
    launch(_rotate_half_kernel)[grid](x, cos3, sin3, out, heads, seq, dim, cos.shape[-1], *x.stride(), cb, cs, sb, ss,
                                      BLOCK_S=block_s, BLOCK_D=block_d, INTERLEAVED=interleaved, num_warps=4)
    return out


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if not x.is_cuda or compat.interpreting():
        return formula(x, cos, sin, interleaved)
    traced = compat.has_triton_op() and compat.wrap_triton_enabled()
    return _launched(x, cos, sin, interleaved, torch.library.wrap_triton if traced else _direct)


def _direct(kernel):
    return kernel


def _define():
    """The op, defined once (on this module's import: torch.library cannot define a name twice in a process, and a
    trace cannot define one); a triton_op where torch has them, else an opaque op whose fake gives the shape."""
    if compat.has_triton_op():
        return torch.library.triton_op(NAME, _rotate_half, mutates_args=())
    op = torch.library.custom_op(NAME, _rotate_half, mutates_args=())
    op.register_fake(lambda x, cos, sin, interleaved: x.new_empty(x.shape))
    return op


rotate_half = _define()
"""rotate_half(x, cos, sin, interleaved): x * cos + rotate_half(x) * sin as HF computes it, one op a trace keeps whole;
x [B, H, S, D], cos and sin [S, R] or [1 or B, S, R] (cat(freqs, freqs)) with R <= D even; interleaved: GLM's pairs;
contiguous out."""
