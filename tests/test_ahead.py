"""The helper that compiles a compiled prune's next models ahead (autokernel/verify/ahead.py): it compiles what it is
told, in order, into Inductor's cache, which the prune's own compile then reads; the prune tells it every model
before it compiles it."""

import contextlib
import os
import random
import signal
import subprocess
import time

import pytest
import torch
from helpers import SharedForward

from autokernel.harness import timing
from autokernel.ops import swap
from autokernel.verify import ahead, endtoend, pruning, verification


def tiny_llama(tmp_path, **kw) -> verification.Request:
    """verify's request for an HF Llama of four layers, random weights, on the CPU."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=256)
    config.save_pretrained(tmp_path / "config")
    return verification.Request(class_name="AutoModelForCausalLM", module="transformers",
                                config=str(tmp_path / "config"), input_shape="1,16", device="cpu", **kw)


def settled(helper: ahead.Ahead, keys: list[str], timeout: float = 240) -> dict:
    with helper.changed:
        helper.changed.wait_for(lambda: all(helper.state.get(k) in ("done", "failed") for k in keys), timeout)
    return {k: helper.state.get(k) for k in keys}


@pytest.mark.slow(25)
def test_the_helper_compiles_what_it_is_told_and_says_what_it_could_not(tmp_path):
    helper = ahead.Ahead(tiny_llama(tmp_path, types="rmsnorm"), "aot_eager")
    try:
        helper.plan([(["rmsnorm"], 1), ([], None), (["no_such_type"], None)])
        keys = ["rmsnorm@1", "@whole", "no_such_type@whole"]
        assert settled(helper, keys) == {"rmsnorm@1": "done", "@whole": "done", "no_such_type@whole": "failed"}
        assert "no_such_type" in helper.failures["no_such_type@whole"]
        helper.plan([(["rmsnorm"], 1), (["rmsnorm"], 2)])  # what is compiled stays compiled: only the new one
        assert settled(helper, ["rmsnorm@2"]) == {"rmsnorm@2": "done"}
        helper.wait(["rmsnorm"], 1)
        helper.wait(["rmsnorm"], 3)
    finally:
        helper.close()
    assert helper.procs[0].returncode == 0 and list(helper.state) == [*keys, "rmsnorm@2"]
    # the report's compiling_ahead: each job's start and end, and what the prune found when it compiled
    events = [line.split(" s ", 1)[1] for line in helper.timeline]
    assert events[:2] == ["start rmsnorm@1", "done rmsnorm@1"] and "failed no_such_type@whole" in events
    assert events[-2:] == ["prune-compiles rmsnorm@1 (done)", "prune-compiles rmsnorm@3 (not begun by the helper)"]
    seconds = [float(line.split(" s ", 1)[0]) for line in helper.timeline]
    assert seconds == sorted(seconds)


@pytest.mark.slow(25)
def test_a_held_helper_starts_nothing_until_it_is_let_go(tmp_path):
    """While the prune runs a model's first calls (Inductor's kernels autotune by timing them) the helper and its
    compile workers are stopped: a job planned then starts only once they are let go."""
    helper = ahead.Ahead(tiny_llama(tmp_path), "aot_eager")
    try:
        with helper.held(), helper.held():  # nested: the inner release leaves it stopped
            helper.plan([([], None)])
            with helper.changed:
                assert not helper.changed.wait_for(lambda: helper.state["@whole"] != "start", timeout=20)
        assert settled(helper, ["@whole"]) == {"@whole": "done"}
        assert os.getpriority(os.PRIO_PROCESS, helper.procs[0].pid) == ahead.NICE  # below the prune, who times
        # a compile worker of the helper's (in its process group) that would outlive it
        worker = subprocess.Popen(["sleep", "60"], process_group=helper.procs[0].pid)
    finally:
        helper.close()
    assert helper.procs[0].returncode == 0
    assert worker.wait(timeout=5) == -signal.SIGKILL  # close() stopped it with its helper


@pytest.mark.slow(30)
def test_two_helpers_compile_side_by_side_and_one_that_dies_fails_its_model_at_once(tmp_path):
    """Each helper is handed the plan's first model none has begun; one that exits mid-compile leaves its model
    failed, so that the prune waiting for it compiles it itself at once, and the other helper goes on with the
    rest. Once the prune is done, a helper still compiling is stopped at once, not waited for."""
    helper = ahead.Ahead(tiny_llama(tmp_path, types="rmsnorm"), "aot_eager", helpers=2)
    try:
        helper.plan([([], None), (["rmsnorm"], 1), (["rmsnorm"], 2)])
        helper.procs[0].kill()  # mid-way through loading the model for "@whole"
        began = time.monotonic()
        helper.wait([], None)
        assert time.monotonic() - began < 30 and helper.state["@whole"] == "failed"
        assert helper.failures["@whole"] == "the helper exited"
        assert settled(helper, ["rmsnorm@1", "rmsnorm@2"]) == {"rmsnorm@1": "done", "rmsnorm@2": "done"}
        helper.plan([(["rmsnorm"], 3)])  # handed to the helper left, which is compiling it when the prune is done
        began = time.monotonic()
    finally:
        helper.close()
    assert time.monotonic() - began < 3 and helper.procs[1].returncode == -signal.SIGKILL  # not waited for
    assert helper.state["rmsnorm@3"] == "stopped" and "rmsnorm@3" not in helper.failures
    events = [line.split(" s ", 1)[1] for line in helper.timeline]
    assert events[:2] == ["start @whole", "start rmsnorm@1"]  # both at work before either finished


@pytest.mark.slow(60)
def test_a_model_the_helper_compiled_compiles_here_from_inductor_s_cache(tmp_path, monkeypatch):
    """The helper loads the model as verify() does: the graph it stores is the one this process traces."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    request = tiny_llama(tmp_path, types="rmsnorm")
    helper = ahead.Ahead(request, "inductor")
    try:
        helper.plan([([], None)])
        assert settled(helper, ["@whole"]) == {"@whole": "done"}, helper.failures
    finally:
        helper.close()
    model, _, inputs = verification.loaded(request, "cpu")
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_remote_cache=False):
        torch.compile(model, backend="inductor")(*inputs(endtoend.TIMING_SEED))
    assert counters["inductor"]["fxgraph_cache_hit"] == 1 and not counters["inductor"]["fxgraph_cache_miss"]
    torch._dynamo.reset()


class Told:  # the helper as the prune sees it: the plans it was sent, the models the prune compiled, the holds
    def __init__(self):
        self.plans, self.compiled, self.holds, self.holding, self.graphs, self.compiled_held = [], [], 0, False, 0, 0

    def plan(self, jobs):
        self.plans.append([ahead.job_key(*job) for job in jobs])

    def wait(self, types, depth):
        self.compiled.append((ahead.job_key(types, depth), len(self.plans)))

    @contextlib.contextmanager
    def held(self):
        self.holds, self.holding = self.holds + 1, True
        try:
            yield
        finally:
            self.holding = False

    def backend(self, gm, example_inputs):  # the prune's dynamo backend: counts the graphs compiled while held
        self.graphs, self.compiled_held = self.graphs + 1, self.compiled_held + self.holding
        return gm.forward


class Block(torch.nn.Module):
    def forward(self, x):
        return (x * 3 / 3).abs()


class Layered(SharedForward):
    def __init__(self, types, blocks: int = 6):
        super().__init__(types)
        self.layers = torch.nn.ModuleList(Block() for _ in range(blocks))
        self.autokernel = swap.Optimized(self, [], [], [], None, self.types)  # what ahead.kernel_set reads

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return super().forward(x)


def told_prune(monkeypatch, ms, blocks: int = 6, spread=None) -> tuple:
    """A compiled prune of Layered kernel sets with shallow trials and a Told helper, each model timed ms(its types,
    its blocks) (with a noise of sigma spread(its blocks), if given): (kept, dropped, told)."""
    rng = random.Random(0)
    told = Told()
    monkeypatch.setattr(endtoend, "backend_for", lambda device: told.backend)
    monkeypatch.setattr(swap, "build", lambda model, types, traced=None, graphed=None: Layered(types, blocks))
    monkeypatch.setattr(timing, "time_turns", lambda fns, sets, device, turns, latency=False: {
        name: [ms(fn.types, len(fn.layers)) * 1e3 * (1 + rng.gauss(0, spread(len(fn.layers)) if spread else 0))
               for _ in range(turns)] for name, fn in fns.items()})
    torch._dynamo.reset()
    with torch.no_grad():
        kept, dropped = pruning.prune(Layered([], blocks), Layered(["type0", "type1", "type2"], blocks),
                                      lambda seed: (torch.ones(4),), "cuda", modes="compile", shallow_trials=True,
                                      ahead=told)
    torch._dynamo.reset()
    return kept, dropped, told


def test_the_plan_puts_first_what_the_prune_compiles_first():
    """ahead.jobs: the kept set's copies, the first trial's, the kept set's deeper copy (while the trials may be cut
    deeper), the original whole, the other trials', the kept set whole before the last trial's set whole (most
    trials keep their type), the trials' deeper copies last."""
    ab, a, b = ["a", "b"], ["a"], ["b"]
    assert ahead.jobs(ab, [a, b], (1, 2), 8) == [(ab, 1), (ab, 2), (b, 1), (b, 2), (ab, 8), ([], None), (a, 1),
                                                 (a, 2), (ab, None), (b, 8), (a, 8)]
    assert ahead.jobs(ab, [b], (1, 2)) == [(ab, 1), (ab, 2), (a, 1), (a, 2), ([], None), (ab, None), (a, None)]


def in_the_order_told(told: Told) -> None:
    """Each model the prune compiled was in the plan last sent before, the first there it had not compiled yet but
    the whole models (the last check's: the original, planned after the first trial's copies as it is the same
    whatever leaves, and the kept set, planned before the last trial's set whole as most trials keep their type)."""
    assert told.compiled and all(n > 0 for _, n in told.compiled)
    done = set()
    for key, sent in told.compiled:
        plan = told.plans[sent - 1]
        assert [k for k in plan if k not in done and (not k.endswith("@whole") or k == key)][0] == key, \
            (key, plan, done)
        done.add(key)


@pytest.mark.parametrize("leaves", [[], ["type1"]])
def test_the_prune_tells_the_helper_each_model_before_it_compiles_it(monkeypatch, leaves):
    """Every model the compiled prune compiles (each trial's cut copies, the last check's whole models) was in the
    plan last sent before it, and the plan's first model the prune had not compiled yet is the one it compiles."""
    def ms(types, blocks):  # each type saves 1 ms but `leaves`, which costs 2
        return 10.0 - len([t for t in types if t not in leaves]) + 2 * len(set(leaves) & set(types))
    kept, dropped, told = told_prune(monkeypatch, ms)
    assert sorted(dropped) == leaves
    in_the_order_told(told)
    assert told.holds == told.graphs > 1 and not told.compiled_held  # each graph's first run held, not its compile
    assert told.compiled[-2:] == [(ahead.job_key(kept.types, None), len(told.plans)),
                                  ("@whole", len(told.plans))]  # the last check: the kept set, then the original


def test_copies_cut_deeper_were_planned_before_the_first_trial_compiles_them(monkeypatch):
    """Gemma-2's case (tests/test_prune_noise.py's fake): the copies read too wide at one and two blocks, and every
    trial is cut to one and eight. The kept set's eight-block copy was planned right after its shallow ones and the
    first trial's, before the prune knew it would cut deeper; once it knows, no plan holds a copy of two blocks of a
    trial's set."""
    def ms(types, blocks):
        return 10.0 + blocks * (1.0 + 0.05 * ("type1" in types))
    kept, dropped, told = told_prune(monkeypatch, ms, blocks=16, spread=lambda blocks: 0.3 / (10 + blocks))
    assert list(dropped) == ["type1"]
    first = told.plans[0]
    assert first[:2] == ["type0,type1,type2@1", "type0,type1,type2@2"]
    assert first[4:6] == ["type0,type1,type2@8", "@whole"]
    in_the_order_told(told)
    deep = [n for key, n in told.compiled if key == "type0,type1,type2@8"][0]
    assert not [k for plan in told.plans[deep - 1:] for k in plan if k.endswith("@2")]


def test_the_first_plan_goes_out_as_the_model_is_loaded(interpreter, tmp_path):
    """verify plans the compiled side's first models as soon as its model is loaded, before the outputs are checked
    (the helpers, started before the load, compile while the check runs): the kept set of every type with a site
    swapped in, cut to one and two blocks, first."""
    model, optimized, _ = verification.loaded(tiny_llama(tmp_path, types="rmsnorm,add_rmsnorm"), "cpu")
    told = Told()
    pruning.plan_ahead(told, model, optimized, shallow_trials=True)
    assert told.plans[0][:2] == ["add_rmsnorm,rmsnorm@1", "add_rmsnorm,rmsnorm@2"]


def test_a_type_the_eager_side_leaves_out_leaves_the_helper_s_plan(monkeypatch):
    """prune_deployed tells the helper the compiled side's trials before the eager side runs, and again after each of
    its trials: the kept set's copies first, without each type the eager side left out (a kernel that loses graphed
    most often leaves the compiled side untried), then the first trial's copies, in the order its verdicts give (the
    likeliest to leave first), and the original whole after them (the last check's)."""
    told = Told()
    calls = []

    def fake_prune(model, optimized, inputs, device, modes, progress=None, decisions=None, *args, after_trial=None,
                   **kw):
        calls.append(modes)
        if modes == ["eager", "graph"]:  # type1 left out eagerly, type2 1% faster without it in graph mode
            after_trial(["type0", "type2"], {"type2": {"graph": {"ratio": 0.99}}})
        return optimized, {}
    monkeypatch.setattr(pruning, "prune", fake_prune)
    monkeypatch.setattr(swap, "build", lambda model, types, traced=None, graphed=None: Layered(types))
    optimized = Layered(["type0", "type1", "type2"])
    pruning.prune_deployed(Layered([]), optimized, lambda seed: (torch.ones(4),), "cuda",
                           ["eager", "graph", "compile", "compile_graph"], shallow_trials=True, ahead=told)
    assert calls == [["eager", "graph"], ["compile_graph"]] and len(told.plans) == 2
    assert told.plans[0][:2] == ["type0,type1,type2@1", "type0,type1,type2@2"]
    assert told.plans[1][:5] == ["type0,type2@1", "type0,type2@2", "type0@1", "type0@2", "@whole"]  # type2's first
    assert not any("type1" in k for k in told.plans[1])


def test_the_cpu_checks_inductor_runs_before_its_first_c_kernel_run_side_by_side(monkeypatch):
    """compat.check_cpu_isas, which the helper runs while it loads the model: each instruction set this CPU has is
    checked once, all at the same time (Inductor checks them one after another, 36 s of Gemma-2's first compile on
    an H100 host), and Inductor's own list is made from those answers; one the CPU lacks is not checked."""
    from torch._inductor import cpu_vec_isa

    from autokernel import compat

    asked, listed = [], []

    class Isa:
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return self.name

        def __bool__(self):
            asked.append(self.name)
            time.sleep(0.5)
            return True
    monkeypatch.setattr(cpu_vec_isa, "supported_vec_isa_list", [Isa("amx_tile"), Isa("avx512"), Isa("avx2"),
                                                                 Isa("avx2 fma"), Isa("neon")])
    monkeypatch.setattr(cpu_vec_isa, "x86_isa_checker", lambda: ["avx2", "avx512", "amx_tile", "fma"])
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", lambda: listed.append(sorted(asked)))
    monkeypatch.setattr(compat.platform, "machine", lambda: "x86_64")
    began = time.monotonic()
    compat.check_cpu_isas().join()
    assert time.monotonic() - began < 1.5  # four checks of 0.5 s each
    assert sorted(asked) == ["amx_tile", "avx2", "avx2 fma", "avx512"]
    assert listed == [sorted(asked)]  # after every check


def test_no_helper_where_a_copy_of_the_weights_would_crowd_the_gpu(monkeypatch):
    """--compile-ahead loads the weights again in each helper, before verify loads its own: where a copy would take
    more than a quarter of the memory the model's own copy leaves, verify says so in one line and prunes without
    helpers; two where two copies fit and the host has 8 CPUs or more, none on a host of fewer than 4."""
    weights = 4 * 2**20  # a Linear(1024, 1024) in fp32
    request = verification.Request(class_name="X", compile=True, compile_ahead=True)
    said, started = [], []

    class Started:
        state, failures, waited = {}, {}, 0.0

        def __init__(self, request, backend, helpers):
            started.append(helpers)

        def close(self):
            pass
    monkeypatch.setattr(ahead, "Ahead", Started)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (12 * 2**20, 80 * 2**30))  # 8 MiB left by the model
    with ahead.started(request, "cuda", "eager,compile_graph", said.append, weights) as helpers:
        assert helpers is None
    assert said[-1] == "compiling ahead: off, a copy of the weights (0.0 GiB) would take more than 25% of the free " \
                       "GPU memory (0.0 GiB)"
    with ahead.started(request, "cuda", "eager,graph", said.append, weights) as helpers:  # no compiled side
        assert helpers is None
    for free_mib, cpus in [(20, 16), (68, 16), (68, 6), (68, 2)]:  # room for one copy, for four; 6 CPUs, 2 CPUs
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda free_mib=free_mib: (free_mib * 2**20, 80 * 2**30))
        monkeypatch.setattr(ahead.os, "cpu_count", lambda cpus=cpus: cpus)
        with ahead.started(request, "cuda", "eager,compile_graph", said.append, weights):
            pass
    assert started == [1, 2, 1] and said[-1] == "compiling ahead: off, 2 CPUs"
    # counted once loaded (a pretrained model): the model's own copy is in memory already, none of it left to take
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (16 * 2**20, 80 * 2**30))
    monkeypatch.setattr(ahead.os, "cpu_count", lambda: 16)
    with ahead.started(request, "cuda", "eager,compile_graph", said.append, weights, loaded=True):
        pass
    assert started == [1, 2, 1, 1]


def test_the_weights_are_counted_without_loading_them(tmp_path):
    """ahead.weights_to_load builds verify's model on the meta device: the bytes of the copy verify then loads."""
    request = tiny_llama(tmp_path, dtype="fp16")
    model, _, _ = verification.loaded(request, "cpu")
    assert ahead.weights_to_load(request) == sum(t.numel() * t.element_size()
                                              for t in [*model.parameters(), *model.buffers()]) > 0
    assert ahead.weights_to_load(verification.Request(class_name="Nothing", module="torch.nn")) is None
    request.pretrained = True  # its weights are read, its config from the local cache only: counted once loaded
    assert ahead.weights_to_load(request) is None and ahead.weights_bytes(model) > 0
