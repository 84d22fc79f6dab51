"""One analysis per kernel and arguments when torch.compile traces a Triton launch, not one per launch; and the
compile caches keyed on the kernel files installed (tag_compile_caches).

Each Triton launch inside a triton_op becomes a graph node, and torch finds the tensors it writes by compiling the
kernel to Triton's IR and walking its stores: twice per launch (functionalization, then Inductor's IR), each a
Triton front-end compile. A decoder calls the same few kernels with the same arguments in every layer, so a
22-layer model with our kernels paid that a few hundred times, most of a minute-long compile. The answer depends
on the kernel and on what its arguments are (which are tensors, of which dtype; the scalars and compile-time
constants that steer its code), not on the call site: one analysis per such key serves every layer. The kernel
is keyed by what it compiles (Triton's own cache key: its source and its helpers'; an autotuner's configs), not by
the object: torch wraps each launch that passes num_warps in an autotuner of its own (on torch 2.11 a memo keyed
by identity missed 68 of the 128 analyses of a 3-layer TinyLlama's compile).

The function has moved between torch releases (identify_mutated_tensors, then identify_accessed_tensors); each one
found in torch._higher_order_ops.triton_kernel_wrap is memoized there and in every torch module that imported it by
name (a module imported later takes the memoized one).
"""

from __future__ import annotations

import copy
import functools
import sys

ANALYSES = ("identify_mutated_tensors", "identify_accessed_tensors")  # torch's name for it, by release
MAX_ENTRIES = 4096  # per analysis; past that the memo restarts (a model has a few kernels and shapes)


def memoize_kernel_analysis() -> None:
    """Memoize torch's write analysis of traced Triton launches (idempotent; a torch without it is left alone)."""
    try:
        import torch._higher_order_ops.triton_kernel_wrap as wrap
    except ImportError:
        return
    for name in ANALYSES:
        analysis = getattr(wrap, name, None)
        if analysis is not None and not getattr(analysis, "memoized", False):
            memoized = _memoized(analysis)
            for module in _holders(analysis):  # Inductor's IR may have imported it by name already
                setattr(module, name, memoized)
            setattr(wrap, name, memoized)


def _holders(function) -> list:
    """torch's modules that hold `function` under its name (imported with `from ... import`): a patch of its own
    module alone would miss the calls they make."""
    return [module for key, module in list(sys.modules.items()) if key.startswith("torch")
            and getattr(module, function.__name__, None) is function]


def _memoized(analysis):
    memo = {}

    @functools.wraps(analysis)
    def memoized(kernel, kwargs, *rest, **options):
        try:
            key = (_kernel_key(kernel), tuple(sorted((k, _arg_key(v)) for k, v in kwargs.items())), repr(rest),
                   repr(sorted(options.items())))
            known = key in memo
        except Exception:  # an argument we cannot key: analysed afresh
            return analysis(kernel, kwargs, *rest, **options)
        if not known:
            if len(memo) >= MAX_ENTRIES:
                memo.clear()
            # the kernel kept alive with its answer: an id in a key stays its own
            memo[key] = (kernel, analysis(kernel, kwargs, *rest, **options))
        return copy.deepcopy(memo[key][1])  # callers own what they get, as from the analysis itself

    memoized.memoized = True
    return memoized


def _kernel_key(kernel):
    """A @triton.jit kernel by Triton's cache key (the hash of its source, its helpers' and the globals it reads:
    what Triton itself compiles by); an autotuned one by that and its configs (torch wraps a launch that passes
    num_warps or num_stages in an autotuner of one config of its own, a new one per launch); so two objects for one
    kernel share an analysis. Any other kernel (heuristics: functions steer its code) by identity."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, JITFunction):
        return ("jit", kernel.cache_key)
    if isinstance(kernel, Autotuner):
        return ("autotuned", _kernel_key(kernel.fn), tuple(str(config) for config in kernel.configs))
    return ("object", id(kernel))


def _arg_key(value):
    """What of an argument the analysis can depend on: a tensor's kind, dtype and rank (Inductor's TensorBox and
    fake tensors alike); any other value itself, by repr where it does not hash (sympy and symbolic sizes)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None and hasattr(value, "get_dtype"):
        dtype = value.get_dtype()
    if dtype is not None:
        size = value.get_size() if hasattr(value, "get_size") else getattr(value, "shape", ())
        return ("tensor", type(value).__name__, str(dtype), len(size))
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


OUR_TAG = "autokernel:"  # what precedes the digest in torch.compile's cache key tag (after the user's own and a "|")


def tag_compile_caches(kernels: str) -> None:
    """Make torch.compile's caches key on the kernels installed now (a digest of their files), beside the user's own
    tag. Dynamo's graph holds each kernel as one op call, `autokernel::<type>(...)`, the same whichever file runs
    behind it, and AOTAutograd's cache keys on that graph: without the tag a compile after another kernel file was
    installed (verify --against's second side, a night's winner deployed after the starter was compiled, in this
    process or any other sharing the cache directory) loads the code compiled for the first file, and launches its
    kernel. torch.compiler.config.cache_key_tag (torch >= 2.6) is part of both the AOTAutograd and the Inductor key;
    a torch without it has AOTAutograd's cache turned off instead, so that Inductor's key (which holds each traced
    kernel's source) decides."""
    import torch

    try:
        from torch.compiler import config
    except ImportError:
        config = None
    if config is not None and hasattr(config, "cache_key_tag"):
        users = config.cache_key_tag.split(OUR_TAG)[0].removesuffix("|")  # the user's tag, ours (if any) cut off
        config.cache_key_tag = f"{users}|{OUR_TAG}{kernels}" if users else f"{OUR_TAG}{kernels}"
        return
    functorch_config = getattr(getattr(torch, "_functorch", None), "config", None)
    if functorch_config is not None and hasattr(functorch_config, "enable_autograd_cache"):
        functorch_config.enable_autograd_cache = False
