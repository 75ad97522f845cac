"""The one table of opforge's ops and the process hooks the package shares
(docs/architecture.md#the-registry). Ground floor: of opforge it imports
only `_after_import`, which imports nothing of it.

Front ends write it, each once an op's every registration has succeeded:
`_op.define` (an @opforge.op, and through it the compat front ends) and
`_cpp_ops` (a C++ op seen from Python). Consumers read it: `_inductor` (the
lowerings), `_in_graph` (the one-node route), `deploy`, `_inspect`,
`symm_mem`, `_cache_key`.

    _registry.add(opdef)              # every listener sees it, or it is not added
    _registry.get("mylib::f")         # the OpDef, or None
    _registry.ops()                   # every op, in the order added
    _registry.on_add(fn)              # fn(op) for each op added, those already there first
    _registry.on_refresh(fn)          # fn() makes ops found lazily (a loaded C++ library's)
    _registry.on_compile_start(fn)    # fn() at each torch.compile start, after the refreshers

Process state, and what guards it:
- `_ops`, `_listeners`, `_refreshers`, `_starters`: `_lock`. Callbacks run
  outside it (a listener takes its own module's lock, and may read the table).
- The Dynamo start callback is installed once, when Dynamo is imported
  (`import opforge` does not import it: seconds in a program that never
  compiles), and survives `torch._dynamo.reset()` (which clears every start
  callback), see `_install_compile_hook`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from ._after_import import after_import

_lock = threading.RLock()
_ops: dict[str, object] = {}  # "ns::op" -> OpDef
_listeners: list[Callable[[object], None]] = []
_refreshers: list[Callable[[], None]] = []
_starters: list[Callable[[], None]] = []


def add(op) -> None:
    """Adds `op` (an OpDef; `op.name` is "ns::op") and tells every listener.
    A listener that raises leaves the op out of the table, and the error
    goes to the caller, whose definition then undoes its registrations."""
    with _lock:
        if op.name in _ops:
            raise ValueError(f"{op.name}: an opforge op with this name is already registered.")
        _ops[op.name] = op
        listeners = list(_listeners)
    try:
        for listener in listeners:
            listener(op)
    except BaseException:
        remove(op.name, op)
        raise


def remove(name: str, op=None) -> object | None:
    """Takes `name` out of the table (only if it holds `op`, when given) and
    returns what it held."""
    with _lock:
        held = _ops.get(name)
        if held is None or (op is not None and held is not op):
            return None
        return _ops.pop(name)


def get(name: str):
    return _ops.get(name)


def ops() -> list:
    """Every op, in the order added: @opforge.op ops and C++ ops alike."""
    with _lock:
        return list(_ops.values())


def names() -> list[str]:
    with _lock:
        return list(_ops)


def on_add(listener: Callable[[object], None]) -> None:
    """`listener(op)` for every op in the table now, then for each op added."""
    with _lock:
        _listeners.append(listener)
        present = list(_ops.values())
    for op in present:
        listener(op)


def on_refresh(refresher: Callable[[], None]) -> None:
    with _lock:
        _refreshers.append(refresher)


def on_compile_start(starter: Callable[[], None]) -> None:
    with _lock:
        _starters.append(starter)


def refresh() -> None:
    """Has every front end that finds ops lazily make them now (after a
    library loads, before a compile starts)."""
    for refresher in list(_refreshers):
        refresher()


def compile_start(*_args) -> None:
    """Dynamo's compile-start callback: the ops refreshed, then each
    consumer's start step, in the order they were registered."""
    refresh()
    for starter in list(_starters):
        starter()


def _install_compile_hook(module=None) -> None:
    """`compile_start` as a Dynamo compile-start callback, kept through
    `torch._dynamo.reset()`: reset clears every start callback, and a C++
    op loaded after it with a plain `torch.ops.load_library` would then meet
    its first compiled call with no OpDef (the miss path, which Dynamo cannot
    trace) and no symm_mem lowering. `module` is torch._dynamo.callback (by
    default the one imported)."""
    if module is None:
        module = sys.modules.get(_CALLBACK_MODULE)
    callback_handler = getattr(module, "callback_handler", None)
    if callback_handler is None:  # pragma: no cover - every supported torch has it
        return
    if compile_start not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(compile_start)
    clear = getattr(callback_handler, "clear", None)
    if clear is None or getattr(clear, "_opforge_keeps", False):
        return

    def clear_keeping_opforge() -> None:
        try:
            clear()
        finally:  # torch clears the lists before it checks for pending callbacks
            if compile_start not in callback_handler.start_callbacks:
                callback_handler.register_start_callback(compile_start)

    clear_keeping_opforge._opforge_keeps = True
    try:
        callback_handler.clear = clear_keeping_opforge
    except AttributeError:  # pragma: no cover - a handler without instance attributes: opforge.ops' miss path only
        pass


_CALLBACK_MODULE = "torch._dynamo.callback"  # imported by torch._dynamo's own __init__


def _watch_dynamo() -> None:
    """The compile hook now where Dynamo is imported, else right after its
    import (every trace imports it first)."""
    if _CALLBACK_MODULE in sys.modules:
        _install_compile_hook()
    else:
        after_import(_CALLBACK_MODULE, _install_compile_hook)


_watch_dynamo()
