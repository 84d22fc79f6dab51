"""KernelBench as a second mode of AutoKernel's harness, loop and scorer.

A KernelBench problem is a file with `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`;
a solution defines `class ModelNew` with the same constructor and forward. Here a problem becomes a
kernel type named "kb/<level>/<name>" (e.g. "kb/level1/19_ReLU"): the registry resolves such names
on demand (kernelbench.spec), so bench.py, the loop of orchestrate.py and every agent treat a
ModelNew file like any other kernel file.

    python -m kernelbench list --root ~/KernelBench
    python -m kernelbench setup level1/19_ReLU          # kernel.py becomes a ModelNew skeleton
    python -m kernelbench eval kernel.py                # the five stages and timing, fp32
    python -m kernelbench score --problems level1 --json out.json

Modules: problems (find, list and load problems), spec (the kernel type of a problem), skeleton
(the ModelNew starters), workspace (setting a problem up, finding its solutions), score (fast_p).
"""
