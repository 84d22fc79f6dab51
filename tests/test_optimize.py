"""autokernel.optimize(model) in user code, and verify.py --export's package installed and run without
this repository. CPU: the kernels run through Triton's interpreter on the shipped tiny models.
"""

import ast
import importlib.util
import json
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import autokernel
import verify
from autokernel.ops import customops, swap
from autokernel.types import rotary_embedding

PLANTED = "rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)"  # the rmsnorm starter's normalization line


@pytest.fixture
def llama(repo_root):
    spec = importlib.util.spec_from_file_location("llama_for_optimize", repo_root / "models" / "llama.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as a user's import would: its rotary helper is found through it
    spec.loader.exec_module(module)
    yield module.LlamaModel("tiny").eval()
    del sys.modules[spec.name]


def test_optimize_matches_the_original_and_leaves_it_alone(llama, tmp_path, capsys):
    ids = torch.randint(0, llama.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = llama(ids)
        optimized = autokernel.optimize(llama, tmp_path / "none", ["rmsnorm", "matmul", "rotary_embedding"])
        got = optimized(ids)
        again = llama(ids)
    line = capsys.readouterr().out.strip()
    assert line.startswith("autokernel: LlamaModel with") and "rmsnorm (starter): RMSNorm x5" in line
    assert swap.rel_l2(got, want) < swap.REL_L2_TOLERANCE[torch.float32]
    assert torch.equal(again, want) and type(llama.norm).__name__ == "RMSNorm"  # the original is untouched
    assert optimized.norm.weight is llama.norm.weight  # a copy of the module tree over the same weights
    ran = {s.kernel_type for s in optimized.autokernel.sites() if s.calls}
    assert ran == {"rmsnorm", "matmul", "rotary_embedding"}
    assert F.linear is customops.original(F, "linear")  # patches live only during the optimized model's call
    again = autokernel.optimize(optimized, tmp_path / "none", ["rmsnorm"], quiet=True)  # from the original
    assert type(again.norm).__name__ == "KernelRMSNorm" and type(again.layers[0].attn.wq).__name__ == "Linear"


def test_a_wrong_kernel_in_the_kernels_directory_changes_the_output(llama, repo_root, tmp_path):
    source = (repo_root / "kernels" / "rmsnorm.py").read_text()
    assert PLANTED in source, "the planted bug no longer fits the starter"
    (tmp_path / "01_rmsnorm_optimized.py").write_text(source.replace(PLANTED, PLANTED + " * 1.05"))
    ids = torch.randint(0, llama.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        optimized = autokernel.optimize(llama, tmp_path, ["rmsnorm"], quiet=True)
        err = swap.rel_l2(optimized(ids), llama(ids))
    assert optimized.autokernel.choices["rmsnorm"].source == "optimized"
    assert err > 100 * swap.REL_L2_TOLERANCE[torch.float32]  # ~5%: the file's kernel is what runs


@pytest.mark.slow(6)
def test_torch_compile_traces_the_types_kept_for_it_and_eager_calls_run_theirs(llama, repo_root, tmp_path, capsys):
    """A wrong rmsnorm kernel kept eagerly and left out under torch.compile: the eager output is off, the compiled
    one the original's (no graph break); kept only under compile, the other way round. The kernel really runs
    in the mode it is kept for."""
    source = (repo_root / "kernels" / "rmsnorm.py").read_text()
    (tmp_path / "01_rmsnorm_optimized.py").write_text(source.replace(PLANTED, PLANTED + " * 1.05"))
    ids = torch.randint(0, llama.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    tol = swap.REL_L2_TOLERANCE[torch.float32]
    with torch.no_grad():
        want = llama(ids)
        for eager, compiled in ((["rmsnorm"], []), ([], ["rmsnorm"])):
            optimized = autokernel.optimize(llama, tmp_path, eager, compiled_types=compiled)
            assert optimized.autokernel.traced_types() == compiled
            explained = torch._dynamo.explain(optimized)(ids)
            torch._dynamo.reset()
            errors = [swap.rel_l2(optimized(ids), want), swap.rel_l2(torch.compile(optimized, backend="aot_eager")(ids),
                                                                    want)]
            torch._dynamo.reset()
            assert [e > 100 * tol for e in errors] == [bool(eager), bool(compiled)], errors
            assert explained.graph_break_count == 0
    assert "; under torch.compile: rmsnorm" in capsys.readouterr().out.splitlines()[-1]


@pytest.mark.gpu
def test_inductor_and_its_cuda_graphs_run_the_types_kept_for_compile(llama, repo_root, tmp_path):
    """On the GPU, with Inductor and mode="reduce-overhead": a wrong rmsnorm kernel kept only eagerly leaves the
    compiled output right and its generated code free of the kernel; kept only under compile, the compiled output
    is off and Inductor's code launches it."""
    from torch._inductor.utils import run_and_get_code

    source = (repo_root / "kernels" / "rmsnorm.py").read_text()
    (tmp_path / "01_rmsnorm_optimized.py").write_text(source.replace(PLANTED, PLANTED + " * 1.05"))
    model = llama.to("cuda", torch.float16)
    ids = torch.randint(0, model.config.vocab_size, (1, 64), device="cuda")
    tol = swap.REL_L2_TOLERANCE[torch.float16]
    with torch.no_grad():
        want = model(ids)
        for eager, compiled in ((["rmsnorm", "matmul"], ["matmul"]), (["matmul"], ["rmsnorm", "matmul"])):
            optimized = autokernel.optimize(model, tmp_path, eager, compiled_types=compiled, quiet=True)
            got, code = run_and_get_code(torch.compile(optimized), ids)
            torch._dynamo.reset()
            graphed = torch.compile(optimized, mode="reduce-overhead")
            for _ in range(3):  # warm-up, record, replay
                replayed = graphed(ids)
            torch._dynamo.reset()
            wrong = "rmsnorm" in compiled
            assert [swap.rel_l2(t, want) > tol for t in (optimized(ids), got, replayed)] == [not wrong, wrong,
                                                                                                   wrong]
            assert ("_rmsnorm_kernel" in "\n".join(code)) == wrong


def test_optimize_follows_the_prune_of_verify_report_for_this_model(llama, tmp_path, capsys):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    report = {"model": "LlamaModel (0.1M parameters)", "correctness": {"status": "PASS"},
              "prune": {"mode": "compile"}, "pruned": {"matmul": "the model is faster without it"}}
    (tmp_path / "verify.json").write_text(json.dumps(report))
    optimized = autokernel.optimize(llama, kernels, ["rmsnorm", "matmul"])
    assert set(optimized.autokernel.choices) == {"rmsnorm"}
    assert "compile mode" in optimized.autokernel.left_out["matmul"]
    assert "left out as verify.py decided: matmul" in capsys.readouterr().out
    report["model"] = "GPT2Model (0.1M parameters)"  # about another model: not followed
    (tmp_path / "verify.json").write_text(json.dumps(report))
    assert set(autokernel.optimize(llama, kernels, ["rmsnorm", "matmul"], quiet=True).autokernel.choices) == {
        "rmsnorm", "matmul"}
    with pytest.raises(FileNotFoundError):
        autokernel.optimize(llama, kernels, ["rmsnorm"], verified=tmp_path / "missing.json")
    # an eager and a compiled mode: each left out its own types
    report.update(model="LlamaModel (0.1M parameters)", pruned={"matmul": "slower"},
                  prune={"mode": "eager,compile_graph", "left_out_compiled": {"rmsnorm": "slower"}})
    (tmp_path / "verify.json").write_text(json.dumps(report))
    optimized = autokernel.optimize(llama, kernels, ["rmsnorm", "matmul"], quiet=True).autokernel
    assert optimized.types == ["rmsnorm"] and optimized.traced_types() == ["matmul"]
    assert "(compile_graph mode)" in optimized.left_out_compiled["rmsnorm"]
    # a type no site ran when verify checked the model: verify timed the model without it, so it runs without it
    report.update(pruned={}, prune={"mode": "eager,compile_graph"}, unused_types=["matmul"])
    (tmp_path / "verify.json").write_text(json.dumps(report))
    optimized = autokernel.optimize(llama, kernels, ["rmsnorm", "matmul"], quiet=True).autokernel
    assert optimized.types == ["rmsnorm"] == optimized.traced_types()
    assert "no site" in optimized.left_out["matmul"] and "no site" in optimized.left_out_compiled["matmul"]


def wrong_rmsnorm_for_graphs_alone(repo_root, tmp_path):
    """A kernels directory holding a wrong rmsnorm file, beside a verify.py report on LlamaModel that left rmsnorm out
    of eager calls alone (kept in CUDA graphs)."""
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    source = (repo_root / "kernels" / "rmsnorm.py").read_text()
    (kernels / "01_rmsnorm_optimized.py").write_text(source.replace(PLANTED, PLANTED + " * 1.05"))
    report = {"model": "LlamaModel (0.1M parameters)", "correctness": {"status": "PASS"}, "pruned": {},
              "prune": {"mode": "eager,graph", "left_out_eagerly": {"rmsnorm": "faster without it in eager mode"}}}
    (tmp_path / "verify.json").write_text(json.dumps(report))
    return kernels


def test_a_type_verify_left_out_of_eager_calls_runs_where_a_cuda_graph_captures(llama, repo_root, tmp_path,
                                                                                 monkeypatch, capsys):
    """verify.py left rmsnorm out of eager calls (slower eagerly, faster graphed): the optimized model's eager calls
    run without it, a forward under CUDA graph capture runs it (a wrong file shows which ran), and so does the first
    eager call with given input shapes, the warm-up before their capture, which loads its kernels for them (Triton
    cannot load one while a stream captures)."""
    kernels = wrong_rmsnorm_for_graphs_alone(repo_root, tmp_path)
    ids = torch.randint(0, llama.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    capturing = [False]
    assert swap._capturing() is False  # asked of a torch without CUDA too (where torch.cuda's own query raises)
    monkeypatch.setattr(swap, "_capturing", lambda: capturing[0])
    with torch.no_grad():
        optimized = autokernel.optimize(llama, kernels, ["rmsnorm", "matmul"])
        errors = []
        for capture, length in ((False, 8), (False, 8), (True, 8), (False, 8), (False, 12), (False, 12)):
            capturing[0] = capture
            got, want = optimized(ids[:, :length]), llama(ids[:, :length])
            errors.append(swap.rel_l2(got, want) > swap.REL_L2_TOLERANCE[torch.float32])
    # a warm-up, an eager call, a capture, an eager call; at another length a warm-up again, then an eager call
    assert errors == [True, False, True, False, True, False]
    assert optimized.autokernel.types == ["matmul"] and optimized.autokernel.graphed_types() == ["rmsnorm", "matmul"]
    assert "eager mode" in optimized.autokernel.left_out_eagerly["rmsnorm"]
    assert "in CUDA graphs: rmsnorm, matmul" in capsys.readouterr().out


@pytest.mark.gpu
def test_a_cuda_graph_captured_after_a_plain_warm_up_runs_the_types_kept_for_graphs(llama, repo_root, tmp_path):
    """On the GPU, captured as a user captures (warm-up calls on a side stream, then the capture): rmsnorm, kept for
    CUDA graphs alone, from a file never launched in this process before (a wrong one, so that the replay shows it
    ran). Its first launch inside the capture would fail (Triton loads a kernel with cuModuleLoadData, which a
    capturing stream forbids): the first warm-up call ran it."""
    from autokernel.harness import timing

    kernels = wrong_rmsnorm_for_graphs_alone(repo_root, tmp_path)
    model = llama.to("cuda", torch.float16)
    ids = torch.randint(0, model.config.vocab_size, (1, 64), device="cuda")
    tol = swap.REL_L2_TOLERANCE[torch.float16]
    with torch.no_grad():
        want = model(ids)
        optimized = autokernel.optimize(model, kernels, ["rmsnorm", "matmul"], quiet=True)
        replayed = timing.cuda_graphed(optimized, (ids,))(ids).clone()
        eager = optimized(ids)
    assert swap.rel_l2(eager, want) < tol and swap.rel_l2(replayed, want) > tol


def test_where_a_gradient_is_wanted_the_original_ops_run_and_train(llama, tmp_path):
    ids = torch.randint(0, llama.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    optimized = autokernel.optimize(llama, tmp_path, ["rmsnorm", "matmul", "rotary_embedding"], quiet=True)
    optimized(ids).sum().backward()  # the weights require grad: every site runs the original op
    grads = {n: p.grad.clone() for n, p in llama.named_parameters()}  # shared weights: the same .grad
    llama.zero_grad()
    llama(ids).sum().backward()
    assert all(torch.equal(grads[n], p.grad) for n, p in llama.named_parameters())
    sites = [s for s in optimized.autokernel.sites() if s.kernel_type in ("rmsnorm", "matmul")]
    assert sites and all(s.calls == 0 and s.fallbacks > 0 for s in sites if s.swapped or s.fallbacks)
    assert any(s.reason == customops.GRAD_REASON for s in sites)


@pytest.mark.slow
def test_optimize_compiles_without_graph_breaks(llama, tmp_path):
    ids = torch.randint(0, llama.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        optimized = autokernel.optimize(llama, tmp_path, ["rmsnorm", "rotary_embedding"], quiet=True)
        explained = torch._dynamo.explain(optimized)(ids)
        torch._dynamo.reset()
        got = torch.compile(optimized, backend="aot_eager")(ids)
        torch._dynamo.reset()
        assert swap.rel_l2(got, llama(ids)) < swap.REL_L2_TOLERANCE[torch.float32]
    assert explained.graph_break_count == 0 and explained.graph_count == 1


USER_SCRIPT = """
import importlib.abc, json, os, sys

class NoAutokernel(importlib.abc.MetaPathFinder):  # this repository, even pip-installed, is not importable
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("autokernel", "reference", "verify"):
            raise ImportError(f"{name} must not be needed")

sys.meta_path.insert(0, NoAutokernel())
os.environ["TRITON_INTERPRET"] = "1"
import torch
import torch.nn as nn
import torch.nn.functional as F
import exported_kernels

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(64), nn.Linear(64, 10)

    def forward(self, x):
        return F.softmax(self.proj(self.norm(x)), dim=-1)

torch.manual_seed(0)
model, x = Net().eval(), torch.randn(4, 64)
with torch.no_grad():
    optimized = exported_kernels.optimize(model, quiet=True)
    err = float((optimized(x) - model(x)).norm() / model(x).norm())
ran = sorted({s.kernel_type for s in optimized.autokernel.sites() if s.calls})
print(json.dumps({"rel_l2": err, "ran": ran, "file": exported_kernels.__file__}))
"""


@pytest.mark.slow
def test_the_export_installs_and_runs_without_this_repository(repo_root, tmp_path, capsys):
    out, report = tmp_path / "export", tmp_path / "verify.json"
    code = verify.main(["--model", str(repo_root / "models" / "custom.py"), "--class-name", "CustomModel",
                        "--config", "tiny", "--input-shape", "2,64", "--device", "cpu", "--checks", "1",
                        "--no-timing", "--types", "layernorm,softmax", "--kernels", str(tmp_path),
                        "--report", str(report), "--export", str(out), "--package-name", "exported_kernels"])
    assert code == 0, capsys.readouterr()
    assert json.loads(report.read_text())["export"]["types"] == ["layernorm", "softmax"]
    target, user = tmp_path / "site", tmp_path / "user"
    user.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(out)], check=True, cwd=user)
    shutil.rmtree(out)  # what runs is the installed copy, not the export directory
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target), "HOME": str(user)}
    done = subprocess.run([sys.executable, "-c", USER_SCRIPT], cwd=user, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["file"].startswith(str(target))
    assert result["ran"] == ["layernorm", "softmax"]
    assert result["rel_l2"] < swap.REL_L2_TOLERANCE[torch.float32]


@pytest.mark.gpu
def test_inductor_launches_the_kernels_from_its_own_code(llama, tmp_path):
    """Under torch.compile the kernels are triton_ops: Inductor's generated code launches them (no call back
    into Python's op dispatch), and mode="reduce-overhead" (CUDA graphs) runs them too."""
    from torch._inductor.utils import run_and_get_code

    model = llama.to("cuda", torch.float16)
    ids = torch.randint(0, model.config.vocab_size, (1, 64), device="cuda")
    types = ["rmsnorm", "rotary_embedding", "fused_mlp", "matmul"]
    with torch.no_grad():
        want = model(ids)
        optimized = autokernel.optimize(model, tmp_path, types, quiet=True)
        got, code = run_and_get_code(torch.compile(optimized), ids)
        code = "\n".join(code)
        assert swap.rel_l2(got, want) < swap.REL_L2_TOLERANCE[torch.float16]
        assert "_rmsnorm_kernel" in code and "_opaque" not in code and "torch.ops.autokernel" not in code
        torch._dynamo.reset()
        graphed = torch.compile(optimized, mode="reduce-overhead")
        for _ in range(3):  # warm-up, record, replay
            got = graphed(ids)
        assert swap.rel_l2(got, want) < swap.REL_L2_TOLERANCE[torch.float16]


def test_an_exported_cuda_kernel_brings_its_build_helper(repo_root, tmp_path):
    from autokernel.verify import export

    package = export.write_package(tmp_path, {"rmsnorm": repo_root / "kernels" / "cuda" / "rmsnorm.py",
                                              "softmax": repo_root / "kernels" / "softmax.py"}, name="mixed")
    kernel = (package / "kernels" / "rmsnorm.py").read_text()
    assert "from mixed._runtime import cuda_build" in kernel and "from autokernel" not in kernel
    assert (package / "kernels" / "softmax.py").read_text() == (repo_root / "kernels" / "softmax.py").read_text()
    runtime = {p.name for p in (package / "_runtime").glob("*.py")}
    assert {"cuda_build.py", "cuda_prelude.py", "customops.py", "swap.py"} <= runtime
    for path in package.rglob("*.py"):  # every file parses, and none imports this repository's modules
        imported = [(n.module or "", n.level) if isinstance(n, ast.ImportFrom) else (a.name, 0)
                    for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in (n.names if isinstance(n, ast.Import) else [None])]
        assert not [m for m, level in imported if level == 0 and m.split(".")[0] in ("autokernel", "reference")], path
    build = package / "_runtime" / "cuda_build.py"  # and what it imports (its static check of CUDA C++) too
    for node in ast.walk(ast.parse(build.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            wanted = [node.module] if node.module else [a.name for a in node.names]
            assert all((package / "_runtime" / f"{m}.py").is_file() for m in wanted), wanted


def test_the_export_runs_the_types_kept_under_torch_compile_and_in_cuda_graphs_there(repo_root, tmp_path):
    """verify.py's prune kept other types eagerly, in CUDA graphs and under torch.compile: the package's optimize()
    passes each set on (autokernel.optimize's compiled_types, graphed_types), with the files of any."""
    from autokernel.verify import export

    kernels = {t: repo_root / "kernels" / f"{t}.py" for t in ("layernorm", "softmax")}
    package = export.write_package(tmp_path, kernels, name="three_sets", eager=["softmax"], compiled=["softmax"],
                                   graphed=["softmax", "layernorm"])
    source = (package / "__init__.py").read_text()
    assignments = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(source).body
                   if isinstance(n, ast.Assign) and isinstance(n.value, ast.List)}
    assert assignments == {"TYPES": ["softmax"], "COMPILED_TYPES": ["softmax"],
                           "GRAPHED_TYPES": ["layernorm", "softmax"]}
    assert "compiled_types=COMPILED_TYPES" in source and "graphed_types=GRAPHED_TYPES" in source
    assert "in CUDA graphs: layernorm, softmax" in source
    assert sorted(p.stem for p in (package / "kernels").glob("[!_]*.py")) == ["layernorm", "softmax"]
    package = export.write_package(tmp_path, kernels, name="two_sets", eager=["softmax", "layernorm"],
                                   compiled=["softmax"])  # no graphed set: CUDA graphs run the eager one
    assert "GRAPHED_TYPES = ['layernorm', 'softmax']" in (package / "__init__.py").read_text()


def test_exported_triton_kernels_pass_the_static_check(repo_root, tmp_path):
    from autokernel.harness import sourcecheck
    from autokernel.verify import export

    kernels = {p.stem: p for p in (repo_root / "kernels").glob("*.py") if p.stem != "__init__"}
    package = export.write_package(tmp_path, kernels, name="checked")
    for path in (package / "kernels").glob("*.py"):
        assert sourcecheck.violations(path.read_text(), path.name) == [], path


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_type, shape", [("fused_mlp", {"T": 2048, "H": 2048, "I": 5632}),
                                                ("matmul", {"M": 2048, "N": 2048, "K": 2048})])
def test_a_kernel_on_host_tma_descriptors_is_traced_on_device_ones(repo_root, kernel_type, shape):
    """At these sizes the starters launch on host TMA descriptors (DESCRIPTORS = "host"), which Inductor cannot
    trace (it loses what the kernel writes); traced, the file makes them on the device (launchers.TRACED_SETTINGS):
    the compiled code launches the TMA kernel itself, calls no opaque op, and gives the kernel's answer."""
    from torch._inductor.utils import run_and_get_code

    from autokernel import kernelfile
    from autokernel.ops import customops
    from autokernel.registry import get_spec

    spec = get_spec(kernel_type)
    args = spec.make_inputs(shape, torch.float16, "cuda", torch.Generator(device="cuda").manual_seed(0))
    module = kernelfile.import_kernel(repo_root / "kernels" / f"{kernel_type}.py")
    assert module.DESCRIPTORS == "host"
    customops.install(kernel_type, module.kernel_fn, f"kernels/{kernel_type}.py", spec.deployment)
    op = customops.op(kernel_type)
    with torch.no_grad():
        want = module.kernel_fn(*args)
        torch._dynamo.reset()
        got, codes = run_and_get_code(torch.compile(lambda *a: op(*a) + 0), *args)
    code = "\n".join(codes)
    assert "_tma_kernel" in code and "_opaque" not in code
    assert swap.rel_l2(got, want) < 1e-3


def test_a_mode_that_computes_something_else_is_not_timed(llama):
    """endtoend.wrong_output stands between every optimized row (compiled, graphed) and its timing."""
    from autokernel.verify import endtoend

    ids = torch.randint(0, llama.config.vocab_size, (1, 16))
    with torch.no_grad():
        assert endtoend.wrong_output(llama, llama, (ids,)) is None
        wrong = endtoend.wrong_output(lambda i: endtoend.main_output(llama(i)) * 0, llama, (ids,))
    assert wrong.startswith("wrong output in this mode (relative L2 error 1")


def test_call_sites_are_counted_by_the_line_that_calls():
    """A patched function's calls count into one site per calling line, its fallbacks with the reason."""
    sites = customops.CallSites()

    def model_code(n):
        for _ in range(n):
            sites.hit("F.softmax", "softmax", depth=1)
        sites.hit("F.softmax", "softmax", "a mask is given", depth=1)

    model_code(3)
    model_code(2)
    found = sorted(sites.sites.values(), key=lambda s: s.where)
    assert [(s.calls, s.fallbacks, s.swapped) for s in found] == [(5, 0, True), (0, 2, False)]
    assert found[1].reason == "a mask is given"
    assert all(s.where.startswith("test_optimize.py:") and s.where.endswith("model_code") for s in found)


def test_the_hf_rotary_wrapper_slices_each_pair_of_tables_once_and_never_reuses_another_pairs(interpreter,
                                                                                             install_starter):
    """Every layer gets the same cos and sin: their halves are sliced once; new tables (the next forward, another
    length) are sliced anew."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    install_starter("rotary_embedding")
    rotary = rotary_embedding.rotary_q_k_cos_sin(apply_rotary_pos_emb, customops.CallSites(), "apply_rotary_pos_emb")
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 6, 8, generator=gen), torch.randn(1, 2, 6, 8, generator=gen)
    with torch.no_grad():
        for _ in range(2):  # fresh tables per forward, each used by two layers
            half = torch.randn(1, 6, 4, generator=gen)
            cos, sin = torch.cat([half.cos()] * 2, -1), torch.cat([half.sin()] * 2, -1)
            for _ in range(2):
                got, want = rotary(q, k, cos, sin), apply_rotary_pos_emb(q, k, cos, sin)
                assert all(swap.rel_l2(g, w) < 1e-5 for g, w in zip(got, want))


def test_a_rotary_call_the_kernel_cannot_run_goes_to_the_models_function_as_called(interpreter, install_starter):
    """Newer transformers' apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) has no position_ids, and GPT-NeoX
    rotates only part of each head (narrower tables): such a call goes back to the model's own function with the
    arguments it came with (it was handed a position_ids it has no place for), and the whole model runs
    optimized with the original's output."""
    import transformers
    from transformers.models.gpt_neox import modeling_gpt_neox

    install_starter("rotary_embedding")
    fn = modeling_gpt_neox.apply_rotary_pos_emb
    rotary = rotary_embedding.rotary_q_k_cos_sin(fn, customops.CallSites(), "apply_rotary_pos_emb")
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 6, 8, generator=gen), torch.randn(1, 2, 6, 8, generator=gen)
    half = torch.randn(1, 6, 2, generator=gen)  # a rotary dimension of 4 in heads of 8
    cos, sin = torch.cat([half.cos()] * 2, -1), torch.cat([half.sin()] * 2, -1)
    with torch.no_grad():
        for args, kwargs in (((), {}), ((1,), {}), ((), {"unsqueeze_dim": 1})):
            got, want = rotary(q, k, cos, sin, *args, **kwargs), fn(q, k, cos, sin, *args, **kwargs)
            assert all(torch.equal(g, w) for g, w in zip(got, want))

    config = transformers.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, vocab_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 16), generator=gen)
    with torch.no_grad():
        want = model(ids).logits
        got = autokernel.optimize(model, verified=None, quiet=True)(ids).logits
    assert swap.rel_l2(got, want) < 1e-4


def test_a_partial_rotary_runs_the_kernel_where_the_models_function_applies_one(interpreter, install_starter):
    """GPT-NeoX rotates the first quarter of each head (tables narrower than head_dim) and passes the rest through:
    the probe sees its apply_rotary_pos_emb do so, and the kernel runs on the rotated part. Llama's function takes
    no narrower tables: its probe says so, and such a call still goes to it."""
    import transformers

    install_starter("rotary_embedding")
    config = transformers.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, vocab_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(config).eval()
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        optimized = autokernel.optimize(model, types=["rotary_embedding"], verified=None, quiet=True)
        got = optimized(ids).logits
    assert swap.rel_l2(got, want) < 1e-4
    (site,) = [s for s in optimized.autokernel.sites() if s.kernel_type == "rotary_embedding" and s.calls]
    assert site.calls == config.num_hidden_layers and not site.fallbacks  # every layer's call ran the kernel

    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    sites = customops.CallSites()
    patches, _ = rotary_embedding.rotary_patches(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, vocab_size=128)), sites)
    (wrapper,) = [new for owner, name, new in patches if name == "apply_rotary_pos_emb"]
    gen = torch.Generator().manual_seed(2)
    q, k, half = torch.randn(1, 2, 6, 8, generator=gen), torch.randn(1, 2, 6, 8, generator=gen), torch.randn(1, 6, 2)
    cos, sin = torch.cat([half.cos()] * 2, -1), torch.cat([half.sin()] * 2, -1)
    with torch.no_grad(), pytest.raises(RuntimeError):  # Llama's own function cannot broadcast narrower tables
        apply_rotary_pos_emb(q, k, cos, sin)
    with torch.no_grad(), pytest.raises(RuntimeError):  # and its wrapper hands the call to it, as it came
        wrapper(q, k, cos, sin)
    assert "tables not [1, seq, head_dim]" in next(iter(sites.sites.values())).reason
