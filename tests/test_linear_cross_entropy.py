"""linear_cross_entropy: the LM head and its loss as one kernel call, never holding the [N, V] logits.

A kernel that counts ignored targets fails the harness (the starter passes: tests/test_starters.py); verify.py
on a tiny HF Llama computes its loss through the fused head; the fused loss allocates nothing of N x V; the output
embedding is left alone, with a reason, where it does not fit; profile.py --with-loss attributes the head's GEMM
and the loss to the type (CPU: the starter runs through Triton's interpreter)."""

import json
import re

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

import verify
from autokernel.harness.runner import run_bench
from autokernel.ops import swap
from autokernel.profile.profiling import profile_model
from autokernel.types import linear_cross_entropy
from autokernel.verify import deploy, endtoend

LCE = "linear_cross_entropy"
TINY_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256)


@pytest.mark.slow
def test_a_kernel_that_counts_ignored_targets_fails(repo_root, tmp_path, interpreter):
    source = (repo_root / "kernels" / f"{LCE}.py").read_text()
    counted = "counted = row_mask & (target != ignore_index) & (target >= 0) & (target < V)"
    assert counted in source
    wrong = tmp_path / f"{LCE}.py"
    wrong.write_text(source.replace(counted, "counted = row_mask"))  # every row in the mean, padding too
    result = run_bench(wrong, device="cpu", quick=True, timed=False)
    assert result["status"] == "fail" and result["failed_stage"] == "stability"
    assert "ignored_padding" in result["reason"]


def _tiny_llama(**overrides):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**TINY_LLAMA, **overrides})).eval()


class _Largest(TorchDispatchMode):
    """The largest new tensor (bytes) an aten op returns while active: views, in-place ops and the interpreter's
    copies of its arguments share their inputs' storage and are not new."""

    def __init__(self):
        super().__init__()
        self.nbytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        seen = {a.untyped_storage().data_ptr() for a in inputs}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                self.nbytes = max(self.nbytes, t.untyped_storage().nbytes())
        return out


def test_the_fused_loss_matches_and_never_builds_the_logits(repo_root, interpreter):
    vocab = 1024  # the logits (32 x 1024 fp32, 128 KiB) outweigh the model's largest activation (its MLP's, 16 KiB)
    model = _tiny_llama(tie_word_embeddings=True, vocab_size=vocab)  # tied: the head's weight is the embedding's
    deploy.load_kernels(repo_root / "kernels", [LCE], repo_root / "kernels")
    optimized = swap.build(model, [LCE])
    head = swap.fused_lm_head(optimized.model)
    assert head is not None and head.original.weight is model.model.embed_tokens.weight
    ids = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(1))
    logits_bytes = ids.numel() * vocab * 4
    head_calls = []
    head.original.register_forward_hook(lambda *a: head_calls.append(1))
    with torch.no_grad():
        with _Largest() as unfused:
            want = endtoend.forward(model, (ids,))
        with _Largest() as fused:
            loss = head.next_token_loss(optimized.module(), (ids,), ids)
    assert unfused.nbytes >= logits_bytes  # the measure sees the logits where they are built
    assert fused.nbytes <= logits_bytes / 8 and not head_calls
    assert loss.dtype == torch.float32 and abs(float(loss) - float(want[1])) <= 1e-4 * float(want[1])
    assert [(s.calls, s.swapped) for s in optimized.module_sites if s.kernel_type == LCE] == [(1, True)]


def test_verify_computes_a_llamas_loss_through_the_fused_head(tmp_path, capsys, interpreter):
    transformers = pytest.importorskip("transformers")
    transformers.LlamaConfig(**TINY_LLAMA).save_pretrained(tmp_path / "cfg")
    out = tmp_path / "report.json"
    code = verify.main(["--module", "transformers", "--class-name", "AutoModelForCausalLM", "--config",
                        str(tmp_path / "cfg"), "--input-shape", "2,16", "--dtype", "float32", "--device", "cpu",
                        "--checks", "1", "--types", f"matmul,{LCE}", "--no-timing", "--report", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    report = json.loads(out.read_text())
    assert set(report["swapped_types"]) == {"matmul", LCE}
    (checked,) = report["correctness"]["inputs"]
    assert checked["loss_rel"] <= 1e-4 and checked["ok"]
    (site,) = [s for s in report["sites"] if s["kernel_type"] == LCE]
    assert site["where"] == "lm_head" and site["calls"] == 1


class _TinyLM(nn.Module):
    """A language model in miniature: embedding, one Linear, an output embedding (maybe with a bias)."""

    def __init__(self, bias=False, **config):
        super().__init__()
        self.config = type("Config", (), {"vocab_size": 50, **config})()
        self.embed, self.body = nn.Embedding(50, 16), nn.Linear(16, 16)
        self.head = nn.Linear(16, 50, bias=bias)

    def get_output_embeddings(self):
        return self.head

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)))


@pytest.mark.parametrize("model,reason", [(_TinyLM(bias=True), "bias"),
                                          (_TinyLM(final_logit_softcapping=30.0), "final_logit_softcapping")])
def test_an_output_embedding_that_does_not_fit_is_left_alone_with_the_reason(model, reason):
    path, site, replacement = linear_cross_entropy.lm_head_site(model)
    assert (path, site.swapped, replacement) == ("head", False, None) and reason in site.reason


def test_a_model_without_an_output_embedding_has_no_site(repo_root, interpreter):
    deploy.load_kernels(repo_root / "kernels", [LCE], repo_root / "kernels")  # what the swapped site will run
    assert linear_cross_entropy.lm_head_site(nn.Sequential(nn.Linear(4, 4))) is None
    path, site, replacement = linear_cross_entropy.lm_head_site(_TinyLM())
    assert path == "head" and site.swapped and isinstance(replacement, linear_cross_entropy.KernelLMHead)


@pytest.mark.parametrize("with_loss", [False, True])
def test_profiling_with_a_loss_gives_the_head_and_the_loss_to_the_type(with_loss):
    model = _tiny_llama()
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 16))
    prof = profile_model(model, (ids,), "cpu", with_loss=with_loss)
    if not with_loss:
        assert LCE not in prof["types"] and "cross_entropy" not in prof["types"]
        return
    lce = prof["types"][LCE]
    assert lce["calls"] == 1 and [s["shape"] for s in lce["shapes"]] == [{"N": 32, "H": 64, "V": 256}]
    assert "cross_entropy" not in prof["types"]  # the loss's ops are the type's, not a cross_entropy of their own
    assert type(model.get_output_embeddings()) is nn.Linear  # the head is put back


def test_profiling_with_a_loss_needs_token_ids():
    with pytest.raises(ValueError, match=re.escape("get_output_embeddings()")):
        profile_model(nn.Sequential(nn.Linear(4, 4)), (torch.randn(2, 4),), "cpu", with_loss=True)
