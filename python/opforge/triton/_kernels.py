"""What counts as a Triton kernel, and how a launch is made traceable.

    classify(add_kernel)            # 'jit'
    classify(autotuned_kernel)      # 'autotune'
    classify(torch.add)             # None
    wrap(add_kernel)                # TraceableTritonKernelWrapper (what wrap_triton returns)
"""

from __future__ import annotations

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
    is disabled); anything else, and a kernel the user already wrapped, is
    returned unchanged."""
    kind = classify(obj)
    if kind is None:
        return obj
    if kind == "heuristics":
        raise KernelError(problem(obj))
    if is_interpreted(obj):
        # Interpreter kernels run eagerly on CPU; wrap_triton cannot trace them.
        return obj
    from torch.library import wrap_triton

    return wrap_triton(obj)
