"""A template for your own model: copy this file, replace the layers, keep the interface.

What profile.py needs from a model file:
  - a class it can build with no arguments, or with one argument when `--config NAME` is given
    (here a preset name);
  - inputs: either `example_inputs(shape, device, dtype)` returning the positional arguments of
    forward for an `--input-shape` (as below), or a `config.vocab_size`, in which case the input is
    token ids of that shape (see llama.py), or neither, in which case it is one float tensor of the shape.

    python profile.py --model models/custom.py --class-name CustomModel --input-shape 64,256 --dtype float16

The layers below (Linear, LayerNorm, GELU, a softmax over classes) are only an example; any
nn.Module works. Name norm, MLP and attention modules after what they are (RMSNorm, MLP,
Attention): profile.py attributes time by module class names as well as by op.
"""

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class CustomConfig:
    in_features: int = 1024
    hidden: int = 4096
    n_layers: int = 4
    n_classes: int = 1000


PRESETS = {
    "tiny": CustomConfig(in_features=64, hidden=128, n_layers=2, n_classes=10),
    "default": CustomConfig(),
}


class CustomBlock(nn.Module):
    def __init__(self, cfg: CustomConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.hidden)
        self.fc_in = nn.Linear(cfg.hidden, 4 * cfg.hidden)
        self.fc_out = nn.Linear(4 * cfg.hidden, cfg.hidden)

    def forward(self, x):
        return x + self.fc_out(F.gelu(self.fc_in(self.norm(x))))


class CustomModel(nn.Module):
    def __init__(self, config: CustomConfig | str = "default", **overrides):
        super().__init__()
        if isinstance(config, str):
            if config not in PRESETS:
                raise ValueError(f"unknown config {config!r}; presets: {', '.join(PRESETS)}")
            config = PRESETS[config]
        self.config = cfg = replace(config, **overrides)
        self.proj = nn.Linear(cfg.in_features, cfg.hidden)
        self.blocks = nn.ModuleList(CustomBlock(cfg) for _ in range(cfg.n_layers))
        self.head = nn.Linear(cfg.hidden, cfg.n_classes)

    def example_inputs(self, shape, device, dtype):
        """Inputs for `--input-shape batch,in_features`: one float tensor of that shape."""
        if len(shape) != 2 or shape[1] != self.config.in_features:
            raise ValueError(f"input shape must be batch,{self.config.in_features}, got {','.join(map(str, shape))}")
        return (torch.randn(*shape, device=device, dtype=dtype),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        for block in self.blocks:
            x = block(x)
        return torch.softmax(self.head(x), dim=-1)  # class probabilities
