"""Loading a model to profile: from a Python file and class, or from an installed package.

From a file: `load_model(model_file="models/llama.py", class_name="LlamaModel", config="tiny")`
imports the file by path (it need not be on sys.path) and builds the class, passing `config` when
given. From a package: `module="transformers", class_name="AutoModelForCausalLM", config=<name or
local path>` builds the model from its configuration with random weights (AutoConfig +
from_config), or loads the weights from the local cache with `pretrained=True`.

The model is built directly on its device in its dtype (a 7B model built in fp32 on the CPU first
would need 28 GB of host memory). Every failure a user can cause is a ModelError whose message
names the problem; scripts print it without a stack dump.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from pathlib import Path

import torch

# attributes of a model's config that bound the sequence length, in the order they are tried
MAX_LENGTH_FIELDS = ("max_seq_len", "n_positions", "max_position_embeddings")


class ModelError(Exception):
    """The model cannot be loaded or fed as asked; the message says why."""


def load_model(class_name: str, model_file: str | None = None, module: str | None = None,
               config: str | None = None, pretrained: bool = False,
               device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Build the model in eval mode on `device` in `dtype`."""
    if (model_file is None) == (module is None):
        raise ModelError("give either a model file (--model) or a package (--module), not both or neither")
    if model_file is not None:
        cls = _class_from_file(model_file, class_name)
        build = (lambda: cls(config)) if config is not None else cls
    else:
        build = _package_builder(module, class_name, config, pretrained)
    with torch.device(device), _default_dtype(dtype):
        try:
            model = build()
        except (TypeError, ValueError, KeyError) as e:
            raise ModelError(f"could not build {class_name}: {e}") from None
    return model.to(device=device, dtype=dtype).eval()


def _class_from_file(path: str, class_name: str):
    file = Path(path)
    if not file.is_file():
        raise ModelError(f"model file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"_autokernel_model_{file.stem}", file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        raise ModelError(f"could not import {path}: {type(e).__name__}: {e}") from None
    cls = getattr(mod, class_name, None)
    if cls is None or not isinstance(cls, type):
        classes = [n for n, v in vars(mod).items()
                   if isinstance(v, type) and issubclass(v, torch.nn.Module) and v.__module__ == spec.name]
        raise ModelError(f"{path} defines no class {class_name!r}; its model classes: "
                         f"{', '.join(classes) or 'none'}")
    return cls


def _package_builder(module: str, class_name: str, config: str | None, pretrained: bool):
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        hint = " (pip install transformers)" if module.split(".")[0] == "transformers" else ""
        raise ModelError(f"cannot import {module}: {e}{hint}") from None
    cls = getattr(mod, class_name, None)
    if cls is None:
        raise ModelError(f"{module} has no attribute {class_name!r}")
    if module.split(".")[0] != "transformers":
        return (lambda: cls(config)) if config is not None else cls
    if config is None:
        raise ModelError("a transformers model needs --config: a model name or a local directory")
    return lambda: _build_transformers(mod, cls, config, pretrained)


def _build_transformers(transformers, cls, config: str, pretrained: bool):
    try:
        if pretrained:
            # weights from the local cache only: profiling never downloads gigabytes behind a user's back
            return cls.from_pretrained(config, local_files_only=True, torch_dtype=torch.get_default_dtype())
        return cls.from_config(transformers.AutoConfig.from_pretrained(config))
    except OSError as e:
        raise ModelError(f"cannot load {config!r}: {e}") from None


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def parse_shape(text: str) -> tuple[int, ...]:
    """'1,512' -> (1, 512); every dimension a positive integer."""
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(","))
    except ValueError:
        raise ModelError(f"bad input shape {text!r}: expected positive integers such as 1,512") from None
    if not shape or any(d <= 0 for d in shape):
        raise ModelError(f"bad input shape {text!r}: every dimension must be a positive integer")
    return shape


def config_value(model: torch.nn.Module, *names: str):
    """The first of `names` set on model.config (a dataclass or a transformers config), else None."""
    cfg = getattr(model, "config", None)
    for name in names:
        value = getattr(cfg, name, None)
        if value is not None:
            return value
    return None


def output_embedding(model: torch.nn.Module) -> tuple[str, torch.nn.Module] | None:
    """(module path, module) of a language model's output embedding, model.get_output_embeddings() (the LM head
    of a transformers model, or any model that names its own), or None where it has none inside the model."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if not isinstance(head, torch.nn.Module):
        return None
    return next(((name, m) for name, m in model.named_modules() if m is head and name), None)


def set_submodule(model: torch.nn.Module, path: str, new: torch.nn.Module) -> None:
    """Put `new` at `path` (dotted, as named_modules() names it) in model."""
    parent, _, child = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def example_inputs(model: torch.nn.Module, shape: tuple[int, ...], device: str, dtype: torch.dtype,
                   seed: int = 0) -> tuple:
    """Positional inputs for the model's forward for an --input-shape (see models/custom.py)."""
    if hasattr(model, "example_inputs"):
        try:
            return tuple(model.example_inputs(shape, device=device, dtype=dtype))
        except ValueError as e:
            raise ModelError(f"input shape {shape} does not fit {type(model).__name__}: {e}") from None
    gen = torch.Generator(device=device).manual_seed(seed)
    vocab = config_value(model, "vocab_size")
    if vocab is None:
        return (torch.randn(shape, device=device, dtype=dtype, generator=gen),)
    if len(shape) != 2:
        raise ModelError(f"{type(model).__name__} takes token ids: the input shape must be batch,seq, "
                         f"got {','.join(map(str, shape))}")
    limit = config_value(model, *MAX_LENGTH_FIELDS)
    if limit is not None and shape[1] > limit:
        raise ModelError(f"input shape {shape[0]},{shape[1]} does not fit {type(model).__name__}: "
                         f"its sequence length is at most {limit}")
    return (torch.randint(0, vocab, shape, device=device, generator=gen),)


def describe_model(model: torch.nn.Module) -> str:
    params = sum(p.numel() for p in model.parameters())
    return f"{type(model).__name__} ({params / 1e6:.1f}M parameters)"

