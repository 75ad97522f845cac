"""opforge ops in the code Inductor emits (docs/performance.md#start-up-and-compile-time).

Inductor's Python wrapper calls an op it does not lower, an opforge op
included, as `torch.ops.ns.op.overload(...)`: pybind's argument packing and
the OpOverload's Python frame, about 1.2-1.8 µs a call on a 2-core CPU host.
Here every opforge op (Python and C++) gets the lowering Inductor would make
for it (a fallback with the op's layout constraint), whose FallbackKernels
call `_C.FlatCall(overload)` instead, the dispatcher from C:

    buf3 = (getattr(extern_kernels, 'opforge_4_mylib_4_gelu_default', None) or torch.ops.mylib.gelu.default)(buf2, 0.5)

The name falls back to torch's op where the call is not registered (code
loaded from Inductor's cache into a process that has not defined the op
through opforge). Ops Inductor already lowers (a lowering of the user's, the
symmetric-memory lowering, which calls the FlatCall itself) and ops with a
decomposition in Inductor's table are left alone, as are ops that never reach
Inductor as calls (a Triton op's body is traced, a CompositeImplicitAutograd
op decomposes). The C++ and FX wrappers keep torch's call.

None of this imports Inductor: it runs for the ops defined so far when
Inductor's lowering module is first imported (`on_load`), then for each op
as it is defined.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable

import torch

from . import _C, _registry
from ._after_import import after_import

__all__ = ["added", "added_again", "call_from_c", "flat_call_name", "loaded", "on_load", "register_flat_call",
           "remove", "sync"]

LOWERING_MODULE = "torch._inductor.lowering"
_PREFIX = "(getattr(extern_kernels, "

log = logging.getLogger(__name__)

_lock = threading.RLock()
_ready = False  # set by the import hook, while the module still reads as initializing
_callbacks: list[Callable[[], None]] = []
# overload -> the lowering installed for it, checked against Inductor's table at each sync.
_installed: dict[torch._ops.OpOverload, Callable] = {}
_before: dict[torch._ops.OpOverload, tuple] = {}  # what Inductor's tables held for the op before it
_ABSENT = object()


def loaded() -> bool:
    """Whether Inductor's lowering module has been imported (and has run)."""
    if _ready:
        return True
    module = sys.modules.get(LOWERING_MODULE)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


def on_load(callback: Callable[[], None]) -> None:
    """Runs `callback()` once Inductor's lowering module has run (in the order
    registered); an exception in it is logged, never raised into Inductor's
    import."""
    _callbacks.append(callback)


def flat_call_name(overload: torch._ops.OpOverload) -> str:
    """The name under `extern_kernels` of the op's `_C.FlatCall` in the code
    Inductor emits: 'opforge_7_kernels_10_all_reduce_default'. The lengths
    keep two ops apart whose names differ only in where '_' falls
    ('a__b::c' and 'a::b__c')."""
    ns, name = overload._schema.name.split("::")
    return f"opforge_{len(ns)}_{ns}_{len(name)}_{name}_{overload._overloadname}"


def register_flat_call(overload: torch._ops.OpOverload) -> None:
    """Registers the op's `_C.FlatCall` under `extern_kernels` (the namespace
    Inductor's Python wrapper imports for its own external kernels), as
    `flat_call_name(overload)`. It stays registered: code compiled earlier
    keeps it."""
    from torch._inductor.select_algorithm import extern_kernels

    name = flat_call_name(overload)
    current = getattr(extern_kernels, name, None)
    if not isinstance(current, _C.FlatCall) or current.overload is not overload:
        setattr(extern_kernels, name, _C.FlatCall(overload))


def call_from_c(overload: torch._ops.OpOverload, operations) -> None:
    """Has the Python wrapper call the op's FallbackKernels among
    `operations` through `_C.FlatCall` instead of `torch.ops.ns.op.overload`.
    A node already rewritten (a lowering of ours around another) stays as it
    is."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    if V.graph.cpp_wrapper or getattr(V.graph, "fx_wrapper", False):
        return
    name = flat_call_name(overload)
    for node in operations:
        if (isinstance(node, ir.FallbackKernel) and node.op_overload is overload
                and isinstance(node.python_kernel_name, str) and not node.python_kernel_name.startswith(_PREFIX)):
            # Inductor's own name for the call, torch.ops.ns.op.overload, is the fallback.
            node.python_kernel_name = f"{_PREFIX}{name!r}, None) or {node.python_kernel_name})"


def _overload_of(op) -> torch._ops.OpOverload | None:
    overload = getattr(op, "overload", None)
    return overload if isinstance(overload, torch._ops.OpOverload) else None


def _opforge_overloads() -> list[torch._ops.OpOverload]:
    return [overload for overload in map(_overload_of, _registry.ops()) if overload is not None]


def _make_lowering(overload: torch._ops.OpOverload, inner: Callable) -> Callable:
    def lowering(*args, **kwargs):
        from torch._inductor import config
        from torch._inductor.exc import MissingOperatorWithoutDecomp
        from torch._inductor.virtualized import V

        if not config.implicit_fallbacks:
            # What Inductor does for an op it has no lowering for.
            raise MissingOperatorWithoutDecomp(overload, args, kwargs)
        operations = V.graph.operations
        before = len(operations)
        result = inner(*args, **kwargs)
        call_from_c(overload, operations[before:])
        return result

    lowering._opforge_flat_call = overload  # marks opforge's lowering; tests look for it
    lowering.__name__ = f"flat_call_lowering[{overload}]"
    return lowering


def _decomposed(overload: torch._ops.OpOverload) -> bool:
    """Whether Inductor would decompose the op: an entry in its own table or
    in torch's post-autograd table (what `get_decompositions([op])` finds,
    without walking the table)."""
    from torch._decomp import global_decomposition_table
    from torch._inductor import lowering as L

    table = global_decomposition_table["post_autograd"]
    return overload in L.decompositions or overload in table or overload.overloadpacket in table


def make_fallback(overload: torch._ops.OpOverload) -> tuple[Callable, tuple]:
    """What Inductor does when it first meets a custom op: a fallback with
    the op's layout constraint. Returns the fallback's lowering and what
    Inductor's tables held for the op before (for `restore_tables`)."""
    from torch._inductor import lowering as L
    from torch._library.utils import get_layout_constraint_tag

    before = (overload in L.fallbacks, overload in L.needs_realized_inputs,
              L._maybe_layout_constraints.get(overload, _ABSENT))
    constraint = L.tag_to_layout_constraint(get_layout_constraint_tag(overload, with_default=True))
    L.make_fallback(overload, layout_constraint=constraint, warn=False)
    return L.lowerings[overload], before


def restore_tables(overload: torch._ops.OpOverload, before: tuple) -> None:
    """Inductor's fallback tables for the op as `make_fallback` found them."""
    from torch._inductor import lowering as L

    in_fallbacks, in_realized, constraint = before
    if not in_fallbacks:
        L.fallbacks.discard(overload)
    if not in_realized:
        L.needs_realized_inputs.discard(overload)
    if constraint is _ABSENT:
        L._maybe_layout_constraints.pop(overload, None)
    else:
        L._maybe_layout_constraints[overload] = constraint


def _install(overload: torch._ops.OpOverload) -> None:
    from torch._inductor import lowering as L

    if overload in L.lowerings or _decomposed(overload):
        return  # a lowering of someone else's, or Inductor decomposes the op: theirs
    register_flat_call(overload)
    fallback, _before[overload] = make_fallback(overload)
    ours = L.lowerings[overload] = _make_lowering(overload, fallback)
    _installed[overload] = ours


def remove(overload: torch._ops.OpOverload) -> bool:
    """Takes the op's flat-call lowering out of Inductor's tables, as they
    were before it; False where the op's lowering is not that one. (The
    FlatCall stays under extern_kernels for code compiled before.)"""
    from torch._inductor import lowering as L

    with _lock:
        ours = _installed.pop(overload, None)
        before = _before.pop(overload, None)
        if ours is None or L.lowerings.get(overload) is not ours:
            return False
        del L.lowerings[overload]
        restore_tables(overload, before)
        return True


def _try_install(overload: torch._ops.OpOverload) -> bool:
    from torch._inductor import lowering as L

    current = L.lowerings.get(overload)
    if current is not None and current is _installed.get(overload):
        return False
    try:
        _install(overload)
    except Exception:  # noqa: BLE001 - Inductor's own fallback still calls the op
        log.exception("opforge: the flat-call lowering of %s failed to install; Inductor calls torch.ops for it",
                      overload)
        return False
    return L.lowerings.get(overload) is _installed.get(overload)


def added(overload: torch._ops.OpOverload) -> None:
    """Called for each opforge op as it is defined: where Inductor is loaded,
    the op gets its lowering now (otherwise when Inductor is imported). A
    failure is logged, never raised into the op's definition."""
    if loaded():
        with _lock:
            _try_install(overload)


def added_again(name: str) -> None:
    """`added` for the opforge op `name` ('ns::op') where it is defined
    (Python or C++), say once a lowering of its own is gone; nothing for a
    name that is not (an op whose definition failed)."""
    overload = _overload_of(_registry.get(name))
    if overload is not None:
        added(overload)


def sync() -> int:
    """Installs the lowering for every opforge op that has none (again: a
    lowering removed since), when Inductor is loaded; returns how many."""
    if not loaded():
        return 0
    with _lock:
        return sum(_try_install(overload) for overload in _opforge_overloads())


def _run_callbacks() -> None:
    for callback in list(_callbacks):
        try:
            callback()
        except Exception:  # never break Inductor's import
            log.exception("opforge: %s failed after Inductor's import", getattr(callback, "__qualname__", callback))


def _lowering_ran(_module) -> None:
    global _ready
    _ready = True  # the module still reads as initializing while its import returns
    _run_callbacks()


def arm() -> None:
    """Watches (again) for Inductor's import where it is not loaded yet, so
    defining an op does not import Inductor (seconds) in programs that never
    compile, and ops defined before are seen before the first lowering."""
    if not loaded():
        after_import(LOWERING_MODULE, _lowering_ran)


on_load(sync)
arm()


def _on_add(op) -> None:
    overload = _overload_of(op)
    if overload is not None:
        added(overload)


_registry.on_add(_on_add)
