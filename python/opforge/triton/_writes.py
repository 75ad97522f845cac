"""Which arguments a Triton kernel writes, from torch's own analysis.

torch reads the kernel's Triton IR to find the pointers that reach a store
(`identify_accessed_tensors` since torch 2.12, `identify_mutated_tensors`
before). It needs Triton's active GPU driver to build that IR; without one
it logs a warning and assumes every argument is written, which says nothing,
so this module answers None then.

    written_arguments(add_kernel, {"x_ptr": x, "y_ptr": y, "out_ptr": out, "n": 8, "BLOCK": 32})
    # frozenset({'out_ptr'})
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from . import _kernels

_CACHE: dict[int, tuple[weakref.ref, dict]] = {}
_LOGGER = "torch._higher_order_ops.triton_kernel_wrap"
stats = {"analyses": 0}


class _Failed(logging.Filter):
    """Notes (and drops) torch's 'assuming every input is mutated' warning."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and "Encountered an exception" in str(record.msg):
            self.failed = True
            return False
        return True


def _resolve(kernel: Any, combined: dict) -> tuple[Any, dict] | None:
    """The @triton.jit function and its full arguments: the first autotune
    config's values and the heuristics' values added."""
    args = dict(combined)
    layers = _kernels._chain(kernel)
    for layer in layers[:-1]:
        kind = _kernels.classify(layer)
        if kind == "autotune":
            configs = getattr(layer, "configs", None) or []
            if configs:
                args = {**args, **(configs[0].kwargs or {})}
        elif kind == "heuristics":
            for name, fn in (getattr(layer, "values", {}) or {}).items():
                if name not in args:
                    try:
                        args[name] = fn(dict(args))
                    except Exception:
                        return None
    jit = layers[-1]
    names = list(getattr(jit, "arg_names", ()) or ())
    if not names or any(n not in args for n in names):
        return None
    return jit, {n: args[n] for n in names}


def _sanitized(jit: Any, args: dict) -> tuple[dict, tuple]:
    """Arguments the analysis can compile with (a small real tensor per
    tensor argument, as torch does for fake tensors), and a cache key."""
    import torch

    constexprs = set(getattr(jit, "constexprs", ()) or ())
    out, key = {}, []
    with torch._C._DisableTorchDispatch():
        for i, (name, v) in enumerate(args.items()):
            if isinstance(v, torch.Tensor):
                out[name] = torch.empty(2, dtype=v.dtype)
                key.append(("T", v.dtype))
                continue
            if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                v = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(v)](v) \
                    if i in constexprs else v
            out[name] = v
            if i in constexprs or v is None or isinstance(v, (bool, str)):
                key.append(("C", v if _hashable(v) else repr(v)))
            else:
                key.append(("V", type(v).__name__))
    return out, tuple(key)


def _hashable(v: Any) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False


_NO_DRIVER: list = []


def _driver_ready() -> bool:
    """Whether Triton has an active driver to build the kernel's IR with
    (looked up once: without a GPU the lookup is slow and fails every time)."""
    import triton

    config = triton.runtime.driver
    if getattr(config, "_active", None) is not None:
        return True
    if _NO_DRIVER:
        return False
    try:
        config.active.get_current_target()
        return True
    except Exception:
        _NO_DRIVER.append(True)
        return False


def _analyse(jit: Any, args: dict) -> frozenset | None:
    import torch
    from torch._higher_order_ops import triton_kernel_wrap as tkw

    log = getattr(tkw, "log", None) or logging.getLogger(_LOGGER)
    failed = _Failed()
    log.addFilter(failed)
    stats["analyses"] += 1
    try:
        if hasattr(tkw, "identify_accessed_tensors"):  # torch >= 2.12
            accesses = tkw.identify_accessed_tensors(jit, args, {})
            names = [d.name for d in accesses.read_writes.writes]
        else:
            try:
                names = tkw.identify_mutated_tensors(jit, args, {})
            except TypeError:  # pragma: no cover - torch without TMA metadata
                names = tkw.identify_mutated_tensors(jit, args)
    except Exception:
        return None
    finally:
        log.removeFilter(failed)
    if failed.failed:
        return None
    return frozenset(n for n in names if isinstance(args.get(n), torch.Tensor))


def written_arguments(kernel: Any, combined: dict) -> frozenset | None:
    """Names of the kernel arguments the kernel writes, or None when the
    analysis cannot tell (no GPU driver, a kernel it does not understand)."""
    if not _driver_ready():  # torch's analysis would only guess
        return None
    resolved = _resolve(kernel, combined)
    if resolved is None:
        return None
    jit, args = resolved
    try:
        sanitized, key = _sanitized(jit, args)
    except Exception:
        return None
    entry = _CACHE.get(id(jit))
    if entry is None or entry[0]() is not jit:
        entry = (weakref.ref(jit), {})
        _CACHE[id(jit)] = entry
    if key not in entry[1]:
        entry[1][key] = _analyse(jit, sanitized)
    return entry[1][key]
