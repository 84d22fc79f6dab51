"""FastLaunch: a @triton.jit kernel's known call patterns launched straight through the cached CompiledKernel.

Built on the launch protocol of each release (launch.py); FastLaunch's class docstring tells what a hit skips and
when a launch takes Triton's own path.
"""

from __future__ import annotations

from autokernel.compat.launch import is_host_descriptor, launch_hooks_probe, raw_launcher, raw_stream

MAX_PATTERNS = 256  # call patterns cached per kernel; past that the cache restarts (a model has a few shapes)


class _Uncacheable(Exception):
    """An argument whose specialization this cache does not model (an unknown type): launch the slow way."""


class FastLaunch:
    """A @triton.jit kernel whose launches skip JITFunction.run's per-call work once a call pattern is known.

    JITFunction.run binds the arguments, computes their specialization (dtypes, 16-byte alignment, integer
    values of 1 or multiples of 16), hashes it into a cache key, evaluates the grid, builds launch metadata
    for the profiler hooks and only then launches: many times more host time per call than the few microseconds
    of GPU work for a norm at a model's shapes. Here the first call of a pattern goes through
    JITFunction.run, which compiles (or finds) and launches the CompiledKernel; its launcher, function handle,
    packed metadata and grid are kept under a key at least as fine as Triton's own (the current device; the
    grid; tensor dtypes and 16-byte alignment; exact integer, bool and string values; float types; TMA
    descriptors by base, shape, strides and block; constexpr and option values), so a hit never launches a
    kernel compiled for other arguments. A hit calls the launcher straight on the current raw stream (see the
    version notes in launch.py). Launches take Triton's own path when a launch hook is set (profilers keep working),
    for a grid function, for a non-constexpr argument passed by keyword, for an argument type not modelled, and
    once a global the kernel read at compile time has changed (Triton then raises, as it would). Not noticed on
    a hit: Triton knobs changed at run time (debug, instrumentation mode).
    """

    def __init__(self, kernel):
        import inspect

        self.kernel = kernel
        params = list(inspect.signature(kernel.fn).parameters.values())
        self.names = [p.name for p in params]
        self.defaults = [p.default for p in params]
        self.constexprs = tuple(sorted(kernel.constexprs))
        self.first_constexpr = self.constexprs[0] if self.constexprs else len(params)
        self.dynamic_names = frozenset(n for i, n in enumerate(self.names) if i not in self.constexprs)
        self.pre_run_hooks = getattr(kernel, "pre_run_hooks", ())  # 3.9: hooks JITFunction.run calls first
        self.device, self.stream, self.hooked, self.arg_key = _launch_context()
        self.cache: dict = {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args, kwargs):
        if (type(grid) is not tuple or self.hooked() or self.pre_run_hooks
                or not self.dynamic_names.isdisjoint(kwargs)):
            return self.kernel[grid](*args, **kwargs)
        device = self.device()
        try:
            key = (device, grid, tuple(map(self.arg_key, args)), tuple(kwargs.items()))
            if len(args) > self.first_constexpr:  # constexprs given by position: keyed by exact value and type
                key += tuple((type(args[i]), args[i]) for i in self.constexprs if i < len(args))
            entry = self.cache.get(key)
        except (_Uncacheable, TypeError):  # TypeError: an unhashable argument
            return self.kernel[grid](*args, **kwargs)
        if entry is None:
            return self._miss(key, grid, args, kwargs)
        run, grid3, head, tail, compiled, used_globals = entry
        if used_globals and any(scope.get(name, _MISSING) != value for name, value, scope in used_globals):
            return self.kernel[grid](*args, **kwargs)  # Triton raises: a global changed since the compile
        run(*grid3, self.stream(device), *head, *args, *tail)
        return compiled

    def _miss(self, key, grid, args, kwargs):
        compiled = self.kernel[grid](*args, **kwargs)  # compiles or finds the kernel, and launches it
        entry = _entry(self.kernel, compiled, grid, self.names[len(args):], self.defaults[len(args):], kwargs)
        if entry is not None:
            if len(self.cache) >= MAX_PATTERNS:
                self.cache.clear()
            self.cache[key] = entry
        return compiled


_MISSING = object()


def _entry(kernel, compiled, grid, rest_names, rest_defaults, kwargs):
    """What a hit launches with: (launcher, grid as 3 ints, arguments between the stream and the kernel's,
    the parameters after the positional ones (constexprs and defaults, fixed by the key), the CompiledKernel,
    the globals the kernel read at compile time); None when compiled is not a CompiledKernel."""
    raw = raw_launcher(compiled)
    if raw is None or not 1 <= len(grid) <= 3:
        return None
    run, head = raw
    tail = tuple(kwargs[n] if n in kwargs else d for n, d in zip(rest_names, rest_defaults))
    used = tuple((name, value, scope) for (name, _), (value, scope) in getattr(kernel, "used_global_vals", {}).items())
    return run, (*grid, 1, 1)[:3], head, tail, compiled, used


def _launch_context():
    """(current device, raw stream of a device, whether a launch hook is set, key of an argument): the
    cheapest calls that say what Triton's own launch path would ask."""
    import torch

    device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
    return device, raw_stream(), launch_hooks_probe(), _arg_key_function(torch.Tensor)


def _arg_key_function(tensor_type):
    import torch

    parameter = torch.nn.Parameter  # types compared first: cheaper than isinstance(a, torch.Tensor)

    def arg_key(a):
        """What Triton specializes a non-constexpr argument on, or finer."""
        kind = type(a)
        if kind is int or kind is str or a is None:
            return a  # exact: Triton specializes ints on ==1, %16 and their width
        if kind is float:
            return float  # not specialized on its value: eps and scales change without a recompile
        if kind is tensor_type or kind is parameter or isinstance(a, tensor_type):
            return a.dtype, a.data_ptr() % 16 == 0
        if kind is bool:
            return bool, a  # True == 1, but Triton compiles an i1
        if is_host_descriptor(a):
            return (kind, arg_key(a.base), tuple(a.shape), tuple(a.strides), tuple(a.block_shape),
                    getattr(a, "padding", None))
        raise _Uncacheable(kind.__name__)

    return arg_key
