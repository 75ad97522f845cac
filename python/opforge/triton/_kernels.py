"""What counts as a Triton kernel, and what torch.library.wrap_triton traces of it.

    classify(add_kernel)            # 'jit'
    classify(autotuned_kernel)      # 'autotune'
    classify(LibEntry(add_kernel))  # 'launcher': a library's triton.KernelInterface holding the kernel at .fn
    classify(torch.add)             # None
    split(LibEntry(heuristics_k))   # Split(target=<JITFunction>, heuristics=(<Heuristics>,))
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any

_TYPES: tuple | None = None


def _types() -> tuple:
    """(JITFunction, Autotuner, Heuristics, InterpretedFunction or None,
    KernelInterface), or () while triton is not imported: then no kernel can exist."""
    global _TYPES
    if _TYPES is None:
        if sys.modules.get("triton") is None:
            return ()
        try:
            from triton.runtime.autotuner import Autotuner, Heuristics
            from triton.runtime.jit import JITFunction, KernelInterface
        except ImportError:
            return ()

        try:
            from triton.runtime.interpreter import InterpretedFunction
        except ImportError:  # pragma: no cover - every supported triton has it
            InterpretedFunction = None
        _TYPES = (JITFunction, Autotuner, Heuristics, InterpretedFunction, KernelInterface)
    return _TYPES


def classify(obj: Any) -> str | None:
    """'jit', 'interpreted', 'autotune', 'heuristics', 'launcher', or None for
    anything else. A launcher is a library's own `triton.KernelInterface`
    (FlagGems' `@libentry()`): launched like a kernel, holding one at `.fn`."""
    types = _types()
    if not types:
        return None
    jit, autotuner, heuristics, interpreted, interface = types
    if isinstance(obj, jit):
        return "jit"
    if isinstance(obj, autotuner):
        return "autotune"
    if isinstance(obj, heuristics):
        return "heuristics"
    if interpreted is not None and isinstance(obj, interpreted):
        return "interpreted"
    if isinstance(obj, interface) and not isinstance(obj, type):
        return "launcher"
    return None


def is_kernel(obj: Any) -> bool:
    return classify(obj) is not None


def _chain(kernel: Any) -> list:
    """The layers of a kernel, outermost first, ending at the @triton.jit
    function (or at what a layer's `.fn` holds instead)."""
    layers = [kernel]
    while classify(layers[-1]) in ("autotune", "heuristics", "launcher") and len(layers) < 32:
        inner = getattr(layers[-1], "fn", None)
        if inner is None:
            break
        layers.append(inner)
    return layers


def jit_of(kernel: Any) -> Any:
    """The @triton.jit function under a kernel's layers (itself for a jit function)."""
    return _chain(kernel)[-1]


def kernel_name(kernel: Any) -> str:
    base = jit_of(kernel)
    fn = getattr(base, "fn", None)
    name = getattr(fn, "__name__", None) or getattr(base, "__name__", None)
    return name or repr(kernel)


def is_interpreted(kernel: Any) -> bool:
    """Built under TRITON_INTERPRET=1: launchable eagerly, not traceable."""
    return classify(jit_of(kernel)) == "interpreted"


def _launchers(layers: list) -> int:
    """How many launcher layers wrap the kernel."""
    count = 0
    while count < len(layers) and classify(layers[count]) == "launcher":
        count += 1
    return count


def problem(kernel: Any) -> str | None:
    """Why wrap_triton cannot trace this kernel, with the fix; None if it can."""
    layers = _chain(kernel)
    kinds = [classify(k) for k in layers]
    name = kernel_name(kernel)
    outer = _launchers(layers)
    if outer:
        launcher = type(kernel).__name__
        if outer == len(layers) or kinds[-1] not in ("jit", "interpreted"):
            held = type(layers[-1]).__name__ if outer < len(layers) else "nothing"
            return (f"launcher {launcher} (a triton.KernelInterface) holds {held} at .fn, not a @triton.jit "
                    f"function, so opforge cannot find the kernel it launches. Launch the @triton.jit kernel it "
                    f"wraps directly, or keep the op opaque with triton='off' and a shape function fake=.")
        if "launcher" in kinds[outer:]:
            return (f"Triton kernel '{name}' has a {type(layers[kinds.index('launcher', outer)]).__name__} launcher "
                    f"inside @triton.autotune or @triton.heuristics, which torch.library.wrap_triton cannot trace. "
                    f"Put the launcher outermost, or keep the op opaque with triton='off' and a shape function fake=.")
    elif kinds[0] == "heuristics":
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


@dataclass(frozen=True)
class Split:
    """What a traced launch of a kernel hands to wrap_triton (`target`), and
    the @triton.heuristics layers opforge applies first, as a launcher would
    eagerly (wrap_triton traces heuristics only under @triton.autotune)."""

    target: Any
    heuristics: tuple


def split(kernel: Any) -> Split:
    """The launch of a traceable kernel (problem(kernel) is None): launcher
    layers removed, and the heuristics right under them applied at launch.

        split(LibEntry(heuristics(jit)))   # Split(target=jit, heuristics=(heuristics,))
        split(autotuned)                   # Split(target=autotuned, heuristics=())
    """
    layers = _chain(kernel)
    i = _launchers(layers)
    heuristics = []
    if i:
        while classify(layers[i]) == "heuristics":
            heuristics.append(layers[i])
            i += 1
    return Split(layers[i], tuple(heuristics))


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
    jit = jit_of(kernel)
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
