"""A kernel_fn as a PyTorch op inside a model: how it launches (launchers.py, replay.py), the custom op that wraps
it (customops.py) and the model sites it is swapped into (swap.py).

The lowest room: the type modules (autokernel/types/) build their sites on it, so nothing here imports the registry.
"""
