"""AutoKernel: profile a model, optimize its bottleneck kernels overnight, plug them back in.

`autokernel.optimize(model)` is the one call user code needs (autokernel/verify/deploy.py);
`autokernel.install_regions()` puts region kernels into what torch.compile compiles (autokernel/verify/regiondeploy.py).
Both are imported on first use, so that `import autokernel.cli` (argparse only) stays free of torch.
"""


def __getattr__(name: str):
    if name == "optimize":
        from autokernel.verify.deploy import optimize

        return optimize
    if name in ("install_regions", "uninstall_regions"):
        from autokernel.verify import regiondeploy

        return getattr(regiondeploy, name)
    raise AttributeError(f"module 'autokernel' has no attribute {name!r}")
