"""AutoKernel: profile a model, optimize its bottleneck kernels overnight, plug them back in.

`autokernel.optimize(model)` is the one call user code needs (autokernel/verify/deploy.py). It is imported on
first use, so that `import autokernel.cli` (argparse only) stays free of torch.
"""


def __getattr__(name: str):
    if name == "optimize":
        from autokernel.verify.deploy import optimize

        return optimize
    raise AttributeError(f"module 'autokernel' has no attribute {name!r}")
