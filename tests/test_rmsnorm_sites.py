"""rmsnorm's module sites: LLaMA's RMSNorm (x * rsqrt(mean(x^2) + eps) * weight) and Gemma's, which scales by
1 + weight (its weights start at zero): the kernel runs both with the module's output (a norm of neither form is
left alone: test_verify.py)."""

import pytest
import torch
from helpers import tiny_gemma2

import autokernel

transformers = pytest.importorskip("transformers")


def _gemma2():
    model = tiny_gemma2()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # trained norms are not at their zero start
                p.normal_(0, 0.3)
    return model


def _norm_sites(optimized):
    return [s for s in optimized.autokernel.sites() if s.kernel_type == "rmsnorm" and s.where.endswith("norm")]


def test_gemma_s_norms_run_the_kernel_with_one_plus_the_weight(interpreter, tmp_path):
    model = _gemma2()
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        optimized = autokernel.optimize(model, tmp_path / "none", ["rmsnorm"], verified=None, quiet=True)
        torch.testing.assert_close(optimized(ids, use_cache=False).logits, model(ids, use_cache=False).logits,
                                   atol=1e-4, rtol=1e-4)
        sites = _norm_sites(optimized)
        assert len(sites) == 9 and all(s.swapped and s.calls == 1 and "1 + weight" in s.what for s in sites), sites
        model.model.norm.weight.add_(1.0)  # weights loaded after optimize(): the kernel's scale follows
        want = model(ids, use_cache=False).logits
        torch.testing.assert_close(optimized(ids, use_cache=False).logits, want, atol=1e-4, rtol=1e-4)
        torch._dynamo.reset()
        compiled = torch.compile(optimized, backend="aot_eager", fullgraph=True)  # the scale traced, no break
        torch.testing.assert_close(compiled(ids, use_cache=False).logits, want, atol=1e-4, rtol=1e-4)
        torch._dynamo.reset()
