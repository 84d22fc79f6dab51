"""From a model to kernel files: load the model (models.py), profile it (profiling.py), attribute its GPU time to
kernel types (attribution.py), plan the night (plan.py) and write the kernel files (extraction.py)."""
