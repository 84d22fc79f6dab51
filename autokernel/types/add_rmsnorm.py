"""add_rmsnorm: a decoder layer's residual add and the RMSNorm after it as one kernel, (sum, normed), and where a
model runs them (a pre-norm decoder layer whose post-attention norm is an RMSNorm site: its forward rewritten,
autokernel/ops/addnorm_sites.py)."""

from autokernel.kerneltype import Deployment, KernelSpec
from autokernel.ops import addnorm_sites
from autokernel.types import _addnorm
from autokernel.types.rmsnorm import rmsnorm_probed, rmsnorm_ref

NAME = "add_rmsnorm"


def add_rmsnorm_ref(x, residual, weight, eps: float = 1e-6):
    """A decoder layer's residual add and the RMSNorm after it: (sum, normed). The sum is rounded to the
    input dtype before it is normalized, as eager computes `residual + x` and then normalizes that tensor."""
    total = x + residual
    return total, rmsnorm_ref(total, weight, eps)


def _baselines(liger) -> dict:
    fused = getattr(liger, "liger_fused_add_rms_norm", None)  # Liger >= 0.6 (returns normed, sum)
    if fused is None:
        return {}
    return {"liger": lambda x, r, w, eps=1e-6: fused(x, r, w, eps, in_place=False)[::-1]}


def add_rmsnorm_layer_site(name, m):
    """A pre-norm decoder layer whose post-attention norm is an RMSNorm site."""
    layout = addnorm_sites.layout_of(m)
    if layout is None or "RMSNorm" not in type(getattr(m, layout[2])).__name__:
        return None
    norm_site, eps = rmsnorm_probed(f"{name}.{layout[2]}", getattr(m, layout[2]))
    reason = None if norm_site.swapped else norm_site.reason
    return addnorm_sites.fuse(name, m, layout[2], NAME, reason, eps, with_bias=False)


SPEC = KernelSpec(
    name=NAME,
    reference=add_rmsnorm_ref,
    **_addnorm.spec_fields(with_bias=False, flops_per_element=5),
    adversarial={
        # residual ~ -x: the sum cancels (exactly, Sterbenz) to ~1e-3, its mean square near eps
        "cancellation": _addnorm.inputs(with_bias=False, scale=1e-3, residual_scale=1.0, cancel=True),
        # the sum's squares overflow fp16 unless accumulated in fp32
        "large_values": _addnorm.inputs(with_bias=False, scale=200.0, residual_scale=200.0),
    },
    description="residual add + RMSNorm: (x + residual, rmsnorm(x + residual)), the sum rounded first",
    default_speedup=1.5,  # eager writes the sum and reads it back before its ~5 norm kernels; compile fuses both
    extra_baselines=_baselines,
    deployment=Deployment("(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
                          _addnorm.output_shapes, module_site=add_rmsnorm_layer_site),
)
