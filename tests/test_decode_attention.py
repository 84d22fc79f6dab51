"""decode_attention's mask: a model's boolean mask (left padding, a static cache's empty tail; HF's decode step folds
a group's query heads into the tokens of one mask row) decides which keys each token sees, in the kernel and the
harness's shapes."""

import pytest
import torch
from helpers import starter_source

from autokernel.harness.runner import run_bench
from autokernel.kernelfile import import_kernel
from autokernel.registry import get_spec

TYPE = "decode_attention"

# planted bugs, each a one-line edit of the starter: (what is replaced, what replaces it)
BUGS = {
    "the mask ignored": ("MASKED=mask is not None", "MASKED=False"),  # positions only: padded keys seen
    "every token reads the first mask row": ("mask.stride(1) if mask.shape[1] > 1 else 0", "0"),
}


def test_the_small_shapes_cover_a_mask_per_token_and_a_folded_one():
    shapes = get_spec(TYPE).small_shapes
    assert {s.get("masked") for s in shapes} >= {"causal", "folded"}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_kernel_that_misreads_the_mask_fails_the_harness(tmp_path, bug):
    path = tmp_path / f"{TYPE}.py"
    path.write_text(starter_source(TYPE, *BUGS[bug]))
    result = run_bench(path, device="cpu", timed=False)
    assert result["status"] == "fail" and result["failed_stage"] in ("smoke", "shape_sweep")


def test_the_mask_s_padding_is_not_seen(interpreter, repo_root):
    """A left-padded sequence: the padded keys hold huge values that would swamp the output if they were read."""
    kernel = import_kernel(repo_root / "kernels" / f"{TYPE}.py")
    spec = get_spec(TYPE)
    q, k, v = (torch.randn(1, 2, 1, 16) for _ in range(3))
    k = k.repeat(1, 1, 40, 1)
    v = torch.randn(1, 2, 40, 16)
    v[:, :, :8] = 1e4  # the padding
    mask = torch.zeros(1, 1, 40, dtype=torch.bool)
    mask[:, :, 8:30] = True  # padding, then the prompt and the tokens so far; the cache's tail empty
    seqlens = torch.tensor([30], dtype=torch.int32)
    got = kernel.kernel_fn(q, k, v, seqlens, None, mask)
    torch.testing.assert_close(got, spec.reference(q, k, v, seqlens, None, mask))
    assert got.abs().max() < 10
    with pytest.raises(ValueError, match="bool"):
        kernel.kernel_fn(q, k, v, seqlens, None, mask.float())
