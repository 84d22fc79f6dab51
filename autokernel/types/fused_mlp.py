"""fused_mlp: a SwiGLU MLP, down(silu(x @ w_gate.T) * (x @ w_up.T)), and where a model runs it (a module of
exactly three bias-free Linears, or of two with the gate and up projections as the halves of one (Phi-3's
gate_up_proj), that passes the probe)."""

import inspect
import math
import re

import torch.nn as nn
import torch.nn.functional as F

from autokernel.kerneltype import Deployment, KernelSpec, Profiling, SuiteTarget
from autokernel.ops.customops import Site, in_eager
from autokernel.ops.swap import KernelModule, f64, probe
from autokernel.types._common import esize, first_padded, numel, randn
from autokernel.types.matmul import MATMUL_OPS, matmul_shape, matmul_taking

NAME = "fused_mlp"


def fused_mlp_ref(x, w_gate, w_up, w_down):
    """SwiGLU MLP: down(silu(x @ w_gate.T) * (x @ w_up.T)); weights are nn.Linear-shaped."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def _inputs(scale: float = 1.0):
    def make(shape, dtype, device, gen):
        t, h, i = shape["T"], shape["H"], shape["I"]
        lead = (shape["B"],) if "B" in shape else ()
        x = randn(lead + (t, h), dtype, device, gen, scale)
        w_gate = randn((i, h), dtype, device, gen, 1 / math.sqrt(h))
        w_up = randn((i, h), dtype, device, gen, 1 / math.sqrt(h))
        w_down = randn((h, i), dtype, device, gen, 1 / math.sqrt(i))
        return x, w_gate, w_up, w_down
    return make


def _large_activations(shape, dtype, device, gen):
    # h = silu(x Wg^T) * (x Wu^T) grows as scale^2 (up to ~10^3, where fp16 accumulation of the GEMMs
    # would fail); w_down / scale^2 keeps the output O(1), so the absolute tolerance still means something
    # and eager's own 16-bit rounding of h stays within it.
    x, w_gate, w_up, w_down = _inputs(scale=8.0)(shape, dtype, device, gen)
    return x, w_gate, w_up, w_down / 64


def _shape(t_h, members) -> dict | None:
    """The MLP's input [..., H] and its first matmul that takes H, [T, H] -> I; I the K of the matmul that gives H back
    (down) where there is one, so that a gate and up made by one matmul of 2I outputs (Phi-3's gate_up_proj) count
    as they run in the kernel, two of I."""
    found = matmul_taking(t_h, members)
    if not found:
        return None
    rows, hidden, outputs = found
    mms = [matmul_shape(op) for op in members if op.name in MATMUL_OPS and op.shapes]
    down = next((mm["K"] for mm in mms if mm["N"] == hidden and mm["K"] != hidden), outputs)
    return {"T": rows, "H": hidden, "I": down}


def _liger(liger) -> dict:
    if not liger:
        return {}
    return {"liger": lambda x, wg, wu, wd: F.linear(liger.liger_swiglu(F.linear(x, wg), F.linear(x, wu)), wd)}


# ------------------------------------------------------------------------------ where a model runs it
# Fewer tokens a call than one row tile of the kernel's (64) go to the original's GEMMs: a decode step's MLP is
# three GEMVs bound by reading the weights, where the kernel's tiles are padding and its grid (I / BLOCK_N programs
# for the gate and up, H / DOWN_BLOCK_N for the down projection: 8-16 at TinyLlama's H) leaves most SMs idle, while
# cuBLAS splits K. TinyLlama's compiled, graphed generate() ran 0.846x of the original's with the kernel taking its
# decode steps on an H200. Under torch.compile the branch is on a static shape: the prefill and the decode steps
# are separate graphs anyway. A GPU's rule: on a CPU the kernel runs interpreted, for tests, at every size.
DECODE_TOKENS = 64
DECODE_DEVICES = ("cuda",)


class _SwiGLU(KernelModule):
    def _takes(self, x, weight) -> bool:
        """Whether the kernel takes this call: _fits, and not a decode-sized one (DECODE_TOKENS)."""
        if x.device.type not in DECODE_DEVICES or x.numel() >= DECODE_TOKENS * x.shape[-1]:
            return self._fits(x, weight)
        if in_eager():
            self.site.fallbacks += 1
            self.site.reason = f"fewer than {DECODE_TOKENS} tokens a call (a decode step: cuBLAS's GEMVs take it)"
        return False


class KernelSwiGLU(_SwiGLU):
    def __init__(self, original, site, gate: nn.Linear, up: nn.Linear, down: nn.Linear):
        super().__init__(original, site, NAME)
        self.gate, self.up, self.down = gate, up, down
        self._direct("gate", "up", "down")

    def forward(self, x):
        w_gate = self._gate.weight
        if not self._takes(x, w_gate):
            return self._original(x)
        return self.op(x, w_gate, self._up.weight, self._down.weight)


class KernelGateUpSwiGLU(_SwiGLU):
    """The MLP with its gate and up projections stacked in one Linear (Phi-3's gate_up_proj): the kernel takes the
    halves of its weight as two views, made again only when the weight is another tensor."""

    def __init__(self, original, site, gate_up: nn.Linear, down: nn.Linear, gate_first: bool):
        super().__init__(original, site, NAME)
        self.gate_up, self.down, self.gate_first = gate_up, down, gate_first
        self._direct("gate_up", "down")
        self._halves = (None, None, None)  # (the weight they are views of, gate's, up's)

    def forward(self, x):
        weight = self._gate_up.weight
        if not self._takes(x, weight):
            return self._original(x)
        gate, up = self._gate_and_up(weight)
        return self.op(x, gate, up, self._down.weight)

    def _gate_and_up(self, weight):
        if not in_eager():  # traced: the views cost nothing, and a trace keeps no tensors
            return self._split(weight)
        if self._halves[0] is not weight:
            self._halves = (weight, *self._split(weight))
        return self._halves[1:]

    def _split(self, weight):
        first, second = weight.chunk(2, dim=0)
        return (first, second) if self.gate_first else (second, first)


def _gate_up_site(name, m, linears: dict):
    """A module with exactly two bias-free Linears, one H->2I and one I->H, computing down(silu(gate) * up) with gate
    and up the halves of the first's output (which half is the gate is settled by the probe). None when the Linears
    are not shaped so; a kept site when the module computes something else."""
    (a, la), (b, lb) = linears.items()
    (gate_up_name, gate_up), (down_name, down) = ((a, la), (b, lb)) if la.out_features == 2 * lb.in_features \
        else ((b, lb), (a, la))
    if gate_up.out_features != 2 * down.in_features or gate_up.in_features != down.out_features \
            or gate_up.bias is not None or down.bias is not None or not _takes_one_input(m):
        return None
    site = Site(name, f"{type(m).__name__}(two Linears)", NAME, False)
    first, second = f64(gate_up.weight).chunk(2, dim=0)
    for gate_first in (True, False):
        w_gate, w_up = (first, second) if gate_first else (second, first)
        expected = lambda x, g=w_gate, u=w_up: fused_mlp_ref(x, g, u, f64(down.weight))
        reason = probe(m, down.out_features, expected)
        if reason is None:
            half = "first" if gate_first else "second"
            site.what, site.swapped = f"{type(m).__name__}(gate={gate_up_name}'s {half} half, down={down_name})", True
            return site, KernelGateUpSwiGLU(m, site, gate_up, down, gate_first)
    site.reason = reason
    return site, None


def _takes_one_input(m) -> bool:
    """Whether m's forward needs one argument, as an MLP's does (an attention module of two Linears shaped alike,
    Phi-3's qkv_proj and o_proj where Hq = 2 Hkv, needs its tables and mask too)."""
    params = inspect.signature(m.forward).parameters.values()
    return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) == 1


def _swiglu_site(name, m, linears: dict):
    """A module with exactly three bias-free Linears, two H->I and one I->H, computing down(silu(gate)*up).

    None when the Linears are not shaped so (not a candidate at all); a kept site when they are but
    the module computes something else (a GELU MLP, say)."""
    down = [n for n, l in linears.items() if l.in_features != l.out_features
            and sum(o.in_features == l.in_features for o in linears.values()) == 1]
    if len(down) != 1 or any(l.bias is not None for l in linears.values()):
        return None
    d = linears[down[0]]
    pair = [n for n in linears if n != down[0]]
    if any((linears[n].in_features, linears[n].out_features) != (d.out_features, d.in_features) for n in pair):
        return None
    site = Site(name, f"{type(m).__name__}(three Linears)", NAME, False)
    for gate, up in (pair, pair[::-1]):  # which of the two is the gate is settled by the probe
        g, u = linears[gate], linears[up]
        expected = lambda x, g=g, u=u: fused_mlp_ref(x, f64(g.weight), f64(u.weight), f64(d.weight))
        reason = probe(m, d.out_features, expected)
        if reason is None:
            site.what, site.swapped = f"{type(m).__name__}(gate={gate}, up={up}, down={down[0]})", True
            return site, KernelSwiGLU(m, site, g, u, d)
    site.reason = reason
    return site, None


def swiglu_module_site(name, m):
    """A module holding exactly three bias-free Linears (or two, the gate's and up's stacked) that computes SwiGLU."""
    if isinstance(m, nn.Linear):
        return None
    linears = {n: c for n, c in m.named_children() if type(c) is nn.Linear}
    if len(linears) == 2:
        return _gate_up_site(name, m, linears)
    return _swiglu_site(name, m, linears) if len(linears) == 3 else None


SPEC = KernelSpec(
    name=NAME,
    reference=fused_mlp_ref,
    make_inputs=_inputs(),
    shapes=[{"T": 4096, "H": 2048, "I": 5632}, {"T": 2048, "H": 4096, "I": 11008},
            {"T": 512, "H": 768, "I": 3072}, {"T": 1024, "H": 1024, "I": 2816},
            {"T": 8192, "H": 2048, "I": 5632}, {"T": 128, "H": 4096, "I": 11008},
            {"T": 2048, "H": 512, "I": 1536}, {"B": 2, "T": 512, "H": 1024, "I": 2816}],
    small_shapes=[{"T": 16, "H": 32, "I": 64}, {"T": 8, "H": 64, "I": 96}, {"T": 32, "H": 48, "I": 80},
                  {"B": 2, "T": 8, "H": 32, "I": 64}],
    edge_shapes=[{"T": 1023, "H": 1024, "I": 2816}, {"T": 1537, "H": 768, "I": 4097},
                 {"T": 4097, "H": 1000, "I": 1537}],
    small_edge_shapes=[{"T": 1023, "H": 16, "I": 32}, {"T": 37, "H": 24, "I": 1537}],
    bench_shape={"T": 4096, "H": 2048, "I": 5632}, small_bench_shape={"T": 64, "H": 64, "I": 128},
    # x read, three weight matrices read, the output written; the [T, I] intermediate never leaves chip
    bytes_moved=lambda s, dt: (2 * numel(s, "B", "T", "H") + 3 * s["H"] * s["I"]) * esize(dt),
    flops=lambda s: 6 * numel(s, "B", "T", "H", "I"),
    adversarial={"large_activations": _large_activations},
    noncontiguous=first_padded,
    description="SwiGLU MLP: down(silu(x @ w_gate.T) * (x @ w_up.T))",
    # an MLP module that runs a silu (SwiGLU), its three matmuls included: the fused kernel replaces the whole
    # MLP and its speedup is measured against the whole MLP (attribution.GATED_MLP_OWNS_MATMULS)
    profiling=Profiling(modules=re.compile(r"mlp|feed_?forward|ffn|swiglu", re.I),
                        module_needs=frozenset({"aten::silu", "aten::silu_"}), module_shape=_shape),
    default_speedup=1.1,  # three cuBLAS matmuls stay; the gain is the silu*up round trip through memory
    suite_target=SuiteTarget("1.0x eager", lambda r, b: r["speedup_vs_pytorch"]),
    extra_baselines=_liger,
    deployment=Deployment("(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down) -> Tensor",
                          lambda x, w_gate, w_up, w_down: (*x.shape[:-1], w_down.shape[0]),
                          module_site=swiglu_module_site),
)
