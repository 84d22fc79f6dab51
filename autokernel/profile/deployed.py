"""Which opt-in kernel types optimize() would place in a model: the plan holds what deploy swaps.

A type whose profiler rules are opt-in (Profiling.opt_in: rope_attention, a fusion that takes rotary_embedding's and
flash_attention's time inside an attention module) is profiled where its model sites would take the model's
modules: its module sites are probed on a copy of the model (swap.build over the same weights, as optimize() does),
each against the type's reference, with the reference standing in for a kernel that is not installed (the probes
never run a kernel). So an HF Llama's or Qwen3's plan holds rope_attention, and a model whose attention no site
takes (OLMo2's, which normalizes q and k whole; a model of its own) keeps rotary_embedding and flash_attention.
"""

from __future__ import annotations

import contextlib

from autokernel import registry
from autokernel.ops import customops, swap


def opt_in_types(model) -> list[str]:
    """The opt-in types with a module site that optimize() would swap into `model` (the site's probe passed)."""
    wanted = [name for name, spec in registry.specs_where("profiling").items()
              if spec.profiling.opt_in and spec.deployment is not None and spec.deployment.module_site is not None]
    if not wanted:
        return []
    with _references_standing_in(wanted):
        sites = swap.build(model, wanted).module_sites
    return sorted({s.kernel_type for s in sites if s.swapped})


@contextlib.contextmanager
def _references_standing_in(types: list[str]):
    """Each of `types` without a kernel installed gets its reference as the kernel for the duration (a site's
    replacement module takes its op when it is built); what was installed before is put back after."""
    before = {t: customops.installed([t])[t] for t in types if customops.is_installed(t)}
    for t in types:
        if t not in before:
            spec = registry.get_spec(t)
            customops.install(t, spec.reference, f"{t}'s reference (a site probe)", spec.deployment)
    try:
        yield
    finally:
        customops.reinstall(before)
        for t in types:
            if t not in before:
                customops.uninstall(t)


def placed_modules(model) -> dict[str, list[str]]:
    """{type: the module paths its module sites would take in `model`, [] where they take none} for every type that
    deploys by module sites (the probes run against the references, as in opt_in_types): what a region's "covered
    by" must agree with."""
    wanted = [name for name, spec in registry.specs_where("deployment").items()
              if spec.deployment is not None and spec.deployment.module_site is not None]
    with _references_standing_in(wanted):
        sites = swap.build(model, wanted).module_sites
    placed: dict[str, list[str]] = {t: [] for t in wanted}
    for s in sites:
        if s.swapped:
            placed[s.kernel_type].append(s.where)
    return placed
