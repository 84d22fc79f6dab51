"""From a model to kernel files: profile it (profiling.py; the model loaded by autokernel/models.py), attribute
its GPU time to kernel types (attribution.py), plan the night (plan.py) and write the kernel files
(extraction.py)."""
