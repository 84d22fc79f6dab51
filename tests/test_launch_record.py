"""The launch record: a change that does not change what runs on the GPU is known without timing it.

Kernels run through Triton's interpreter; the starters are the files, edited as an agent would edit them.
"""

import pytest
import torch

from autokernel.harness import launch_record
from autokernel.harness.runner import run_bench
from autokernel.kernelfile import import_kernel

RMSNORM_ONE_PASS = "rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)"


def digest(path, *input_sets):
    return launch_record.digest(import_kernel(path).kernel_fn, list(input_sets))


def edited(repo_root, tmp_path, name, *replacements):
    text = (repo_root / "kernels" / "rmsnorm.py").read_text()
    for old, new in replacements:
        assert old in text, f"the edit no longer fits the starter: {old}"
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def test_equal_launches_give_equal_digests_and_any_real_change_another(repo_root, tmp_path, interpreter):
    inputs = (torch.randn(8, 64, dtype=torch.float16), torch.randn(64, dtype=torch.float16))
    starter = digest(repo_root / "kernels" / "rmsnorm.py", inputs)
    assert starter is not None
    # a tunable of the looped variant, which a row of 64 never takes: the same launches
    inert = edited(repo_root, tmp_path, "inert.py", ("LOOP_ELEMENTS_PER_WARP = 256", "LOOP_ELEMENTS_PER_WARP = 512"))
    assert digest(inert, inputs) == starter
    # what does change the GPU's work: another variant, the kernel's code, a torch op on the side, the inputs
    changed = [edited(repo_root, tmp_path, "variant.py", ('VARIANT = "auto"', 'VARIANT = "persistent"')),
               edited(repo_root, tmp_path, "code.py", (RMSNORM_ONE_PASS, RMSNORM_ONE_PASS + " * 1.0")),
               edited(repo_root, tmp_path, "torch_op.py", ("    weight = weight.contiguous()",
                                                           "    weight = weight.contiguous() * 1"))]
    digests = {digest(path, inputs) for path in changed} | {starter}
    assert len(digests) == 4 and None not in digests
    assert digest(repo_root / "kernels" / "rmsnorm.py", (inputs[0][:4], inputs[1])) != starter


def test_what_the_record_cannot_see_has_no_digest(repo_root, tmp_path, interpreter):
    inputs = (torch.randn(8, 64, dtype=torch.float16), torch.randn(64, dtype=torch.float16))
    # an autotuned kernel picks its configuration at run time
    tuned = edited(repo_root, tmp_path, "tuned.py", ("@triton.jit\ndef _rmsnorm_kernel(",
                                                     "@triton.autotune(configs=[triton.Config({}, num_warps=4)], "
                                                     "key=['N'])\n@triton.jit\ndef _rmsnorm_kernel("))
    assert launch_record.digest(import_kernel(tuned).kernel_fn, [inputs]) is None
    # a file that launches nothing through its own @triton.jit names
    plain = tmp_path / "plain.py"
    plain.write_text('KERNEL_TYPE = "rmsnorm"\n\ndef kernel_fn(x, weight, eps=1e-6):\n    return x\n')
    assert launch_record.digest(import_kernel(plain).kernel_fn, [inputs]) is None


@pytest.mark.slow
@pytest.mark.usefixtures("warm_launcher")  # what the harness reports, not how it starts: its benches fork warm
def test_the_harness_reports_the_digest_and_skips_what_launches_the_same(repo_root, tmp_path):
    """A candidate that launches what the best launches at the timed shapes is "unchanged" before any stage: not a
    pass (nothing was checked), reverted by the loop; one that launches anything else runs its stages."""
    starter = repo_root / "kernels" / "rmsnorm.py"
    first = run_bench(starter, device="cpu", quick=True)
    assert first["status"] == "pass" and first["launch_digest"]
    inert = edited(repo_root, tmp_path, "inert.py", ("LOOP_ELEMENTS_PER_WARP = 256", "LOOP_ELEMENTS_PER_WARP = 512"))
    again = run_bench(inert, device="cpu", quick=True, same_as=first["launch_digest"])
    assert again["status"] == "unchanged" and again["correctness"] == "-" and again["unchanged"]
    assert again["stages"] == [] and "latency_us" not in again and "unchanged: the same launches" in again["log"]
    # a wrong kernel launches another compiled kernel: its stages run, and fail it
    wrong = edited(repo_root, tmp_path, "wrong.py", (RMSNORM_ONE_PASS, RMSNORM_ONE_PASS + " * 1.05"))
    failed = run_bench(wrong, device="cpu", quick=True, same_as=first["launch_digest"])
    assert failed["status"] == "fail" and not failed.get("unchanged")


@pytest.mark.gpu
def test_on_the_gpu_every_starter_has_a_digest_and_an_inert_edit_keeps_it(repo_root, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from autokernel.harness.perf import gpu_input_sets
    from autokernel.registry import get_spec, kernel_types

    for kernel_type in kernel_types():
        path = repo_root / "kernels" / f"{kernel_type}.py"
        if not path.is_file():
            continue
        spec = get_spec(kernel_type)
        dtype = torch.float16 if torch.float16 in spec.dtypes else spec.dtypes[0]
        sets = gpu_input_sets(spec, spec.bench_shape, dtype)[:1]
        assert digest(path, *sets) is not None, f"{kernel_type}: a launch escapes the record on the GPU"
    inputs = (torch.randn(2048, 2048, dtype=torch.float16, device="cuda"),
              torch.randn(2048, dtype=torch.float16, device="cuda"))
    starter = digest(repo_root / "kernels" / "rmsnorm.py", inputs)
    inert = edited(repo_root, tmp_path, "inert.py", ("LOOP_ELEMENTS_PER_WARP = 256", "LOOP_ELEMENTS_PER_WARP = 512"))
    variant = edited(repo_root, tmp_path, "variant.py", ('VARIANT = "auto"', 'VARIANT = "persistent"'))
    assert digest(inert, inputs) == starter != digest(variant, inputs)
