"""What counts as a Triton kernel, and how a launch is made traceable.

    classify(add_kernel)            # 'jit'
    classify(autotuned_kernel)      # 'autotune'
    classify(torch.add)             # None
    wrap(add_kernel)                # TraceableTritonKernelWrapper (what wrap_triton returns)
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

_TYPES: tuple | None = None


def _types() -> tuple:
    """(JITFunction, Autotuner, Heuristics, InterpretedFunction or None), or
    () while triton is not imported: then no kernel can exist."""
    global _TYPES
    if _TYPES is None:
        if sys.modules.get("triton") is None:
            return ()
        try:
            from triton.runtime.autotuner import Autotuner, Heuristics
            from triton.runtime.jit import JITFunction
        except ImportError:
            return ()

        try:
            from triton.runtime.interpreter import InterpretedFunction
        except ImportError:  # pragma: no cover - every supported triton has it
            InterpretedFunction = None
        _TYPES = (JITFunction, Autotuner, Heuristics, InterpretedFunction)
    return _TYPES


def classify(obj: Any) -> str | None:
    """'jit', 'interpreted', 'autotune', 'heuristics', or None for anything else."""
    types = _types()
    if not types:
        return None
    jit, autotuner, heuristics, interpreted = types
    if isinstance(obj, jit):
        return "jit"
    if isinstance(obj, autotuner):
        return "autotune"
    if isinstance(obj, heuristics):
        return "heuristics"
    if interpreted is not None and isinstance(obj, interpreted):
        return "interpreted"
    return None


def is_kernel(obj: Any) -> bool:
    return classify(obj) is not None


def _chain(kernel: Any) -> list:
    """The decorator layers of a kernel, outermost first, ending at the
    @triton.jit function."""
    layers = [kernel]
    while classify(layers[-1]) in ("autotune", "heuristics") and len(layers) < 32:
        layers.append(layers[-1].fn)
    return layers


def kernel_name(kernel: Any) -> str:
    base = _chain(kernel)[-1]
    fn = getattr(base, "fn", None)
    name = getattr(fn, "__name__", None) or getattr(base, "__name__", None)
    return name or repr(kernel)


def is_interpreted(kernel: Any) -> bool:
    """Built under TRITON_INTERPRET=1: launchable eagerly, not traceable."""
    return classify(_chain(kernel)[-1]) == "interpreted"


def problem(kernel: Any) -> str | None:
    """Why wrap_triton cannot trace this kernel, with the fix; None if it can."""
    layers = _chain(kernel)
    kinds = [classify(k) for k in layers]
    name = kernel_name(kernel)
    if kinds[0] == "heuristics":
        return (f"Triton kernel '{name}' has @triton.heuristics as its outermost decorator, which "
                f"torch.library.wrap_triton cannot trace. Put @triton.autotune outermost: "
                f"autotune → heuristics → jit (for a kernel with no configs, "
                f"@triton.autotune(configs=[triton.Config({{}})], key=[]) above @triton.heuristics).")
    if kinds.count("autotune") > 1:
        return (f"Triton kernel '{name}' has {kinds.count('autotune')} @triton.autotune decorators; "
                f"Inductor traces at most one. Merge their configs into a single @triton.autotune.")
    if kinds[-1] not in ("jit", "interpreted"):
        return (f"Triton kernel '{name}' does not end in a @triton.jit function "
                f"({type(layers[-1]).__name__}). Decorate the innermost function with @triton.jit.")
    return None


class KernelError(ValueError):
    """A kernel that cannot be made traceable; `kernel` is the kernel."""

    def __init__(self, message: str, kernel: Any = None):
        super().__init__(message)
        self.kernel = kernel


def wrap(obj: Any) -> Any:
    """The launch target as traced code sees it: Triton kernels go through
    torch.library.wrap_triton (which returns the kernel itself while wrapping
    is disabled), with the kernel's parameter defaults bound at each launch;
    anything else, and a kernel the user already wrapped, is returned
    unchanged."""
    kind = classify(obj)
    if kind is None:
        return obj
    if kind == "heuristics":
        raise KernelError(problem(obj))
    if is_interpreted(obj):
        # Interpreter kernels run eagerly on CPU; wrap_triton cannot trace them.
        return obj
    from torch.library import wrap_triton

    return Traceable(obj, wrap_triton(obj))


_SPECIAL_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "num_consumer_groups",
                              "num_buffers_warp_spec", "num_cpu_threads", "maxnreg", "grid", "warmup"})


def _provided_by_layers(kernel: Any) -> frozenset:
    """Parameters that an autotune config or a heuristic of the kernel sets."""
    names: set = set()
    for layer in _chain(kernel):
        kind = classify(layer)
        if kind == "autotune":
            for config in getattr(layer, "configs", ()) or ():
                names.update(getattr(config, "kwargs", {}) or {})
        elif kind == "heuristics":
            names.update(getattr(layer, "values", {}) or {})
    return frozenset(names)


_DEFAULTS: dict[int, tuple] = {}  # id(kernel) -> (kernel, ((name, position, default), ...))


def defaults_of(kernel: Any) -> tuple:
    """((name, position, default), ...) for the kernel's parameters that have
    a default and that no autotune config or heuristic sets."""
    entry = _DEFAULTS.get(id(kernel))
    if entry is not None and entry[0] is kernel:
        return entry[1]
    jit = _chain(kernel)[-1]
    provided = _provided_by_layers(kernel)
    empty = inspect.Parameter.empty
    out = []
    for position, param in enumerate(getattr(jit, "params", ()) or ()):
        default = getattr(param, "default", empty)
        if default is not empty and param.name not in provided:
            out.append((param.name, position, default))
    _DEFAULTS[id(kernel)] = (kernel, tuple(out))
    return tuple(out)


def bind_defaults(kernel: Any, args: tuple, kwargs: dict) -> dict:
    """kwargs plus every defaulted parameter the launch leaves out, because
    Inductor launches a traced kernel with exactly the arguments recorded:
    `element_mul_kernel[grid](x, s, g, n, BLOCK_SIZE=b)` also gets `X_col_stride=1`."""
    defaults = defaults_of(kernel)
    if not defaults:
        return kwargs
    missing = [(name, d) for name, position, d in defaults if position >= len(args) and name not in kwargs]
    if not missing:
        return kwargs
    return {**kwargs, **dict(missing)}


class Traceable:
    """`wrap_triton(kernel)`, binding the kernel's parameter defaults at each
    launch and letting opforge check which arguments the kernel writes.

        Traceable(k, wrap_triton(k))[grid](x, out, n)   # wrap_triton(k)[grid](x, out, n, BLOCK=128)
    """

    __slots__ = ("kernel", "wrapped")

    def __init__(self, kernel: Any, wrapped: Any):
        self.kernel = kernel
        self.wrapped = wrapped

    def __getitem__(self, grid: Any) -> "Traceable":
        return Traceable(self.kernel, self.wrapped[grid])

    def __call__(self, *args, **kwargs):
        kwargs = bind_defaults(self.kernel, args, kwargs)
        if _trace.watching():
            _trace.check_launch(self.kernel, args, kwargs, sys._getframe(1))
        return self.wrapped(*args, **kwargs)

    def run(self, *args, **kwargs):
        kwargs = bind_defaults(self.kernel, args, kwargs)
        if _trace.watching():
            _trace.check_launch(self.kernel, args, kwargs, sys._getframe(1))
        return self.wrapped.run(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)

    def __repr__(self) -> str:
        return f"<opforge traceable launch of {kernel_name(self.kernel)}>"


from . import _trace  # noqa: E402  (imports this module back)
