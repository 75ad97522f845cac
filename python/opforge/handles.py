"""Runner handles (SPEC §6): stateful objects through the dispatcher as ints.

    @opforge.op("mylib::gemm")
    def gemm(x: Tensor, runner: opforge.Handle[Runner]) -> Tensor:
        return runner.run(x)          # the body gets the object

    gemm(x, my_runner)                 # the caller passes the object
    gemm.schema                        # 'mylib::gemm(Tensor x, int runner) -> Tensor'

The table is the core's, shared with C++. It holds objects weakly: a handle
goes stale when its object is gone (or is released), and a stale handle is an
error, never another object. `pin` keeps an object alive until `unpin`.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

from . import _C
from ._types import registered_name

_lock = threading.RLock()
_by_id: dict[int, tuple[Any, int]] = {}  # id(obj) -> (weakref or obj, handle)
_pinned: dict[int, Any] = {}  # handle -> obj

ATTRIBUTE = "__opforge_handle__"


def _type_key(cls: type) -> str:
    return "py:" + registered_name(cls)


def _live(obj: Any) -> int | None:
    entry = _by_id.get(id(obj))
    if entry is None:
        return None
    ref, handle = entry
    target = ref() if isinstance(ref, weakref.ref) else ref
    return handle if target is obj else None


def register(obj: Any) -> int:
    """The handle of `obj`, registering it (weakly) on first use."""
    with _lock:
        handle = _live(obj)
        if handle is not None:
            return handle
        box: list[int] = []
        try:
            ref = weakref.ref(obj, lambda _r, box=box, key=id(obj): _gone(key, box))
        except TypeError:
            raise TypeError(
                f"opforge.handles: objects of type {type(obj).__name__} cannot be held weakly. "
                f"Pin them with opforge.handles.pin(obj) (and unpin when done)."
            ) from None
        handle = _C.handle_register(ref, _type_key(type(obj)))
        box.append(handle)
        _by_id[id(obj)] = (ref, handle)
        _remember(obj, handle)
        return handle


def _remember(obj: Any, handle: int) -> None:
    # Without trace-time registration, torch.compile reads the handle from
    # this attribute: Dynamo can trace an attribute read (and guards on it),
    # not a lookup in this table. The id tells a copy from the original.
    try:
        object.__setattr__(obj, ATTRIBUTE, (handle, id(obj)))
    except (AttributeError, TypeError):
        pass


def _gone(key: int, box: list[int], _finalizing=sys.is_finalizing) -> None:
    # At exit the interpreter tears down this module's globals before the
    # last runners die; the table goes with the process, so there is nothing
    # to release (and touching the globals would print "Exception ignored").
    if _finalizing():
        return
    with _lock:
        if box:
            _C.handle_release(box[0])
            entry = _by_id.get(key)
            if entry is not None and entry[1] == box[0]:
                del _by_id[key]


def pin(obj: Any) -> int:
    """Registers `obj` and keeps it alive until `unpin(obj)` or `release`."""
    with _lock:
        handle = _live(obj)
        if handle is None:
            try:
                handle = register(obj)
            except TypeError:
                handle = _C.handle_register(obj, _type_key(type(obj)))
                _by_id[id(obj)] = (obj, handle)
                _remember(obj, handle)
        _pinned[handle] = obj
        return handle


def unpin(obj: Any) -> None:
    with _lock:
        handle = _live(obj)
        if handle is not None:
            _pinned.pop(handle, None)
            entry = _by_id.get(id(obj))
            if entry is not None and not isinstance(entry[0], weakref.ref):
                release(handle)  # held strongly only because pinned


def release(obj_or_handle: Any) -> bool:
    """Drops a handle; later use of it is a clear error."""
    with _lock:
        if isinstance(obj_or_handle, int) and not isinstance(obj_or_handle, bool):
            handle = obj_or_handle
        else:
            handle = _live(obj_or_handle)
            if handle is None:
                return False
        released = _C.handle_release(handle)
        _pinned.pop(handle, None)
        for key, (_ref, h) in list(_by_id.items()):
            if h == handle:
                del _by_id[key]
        return released


def resolve(handle: int, cls: type | None = None, where: str = "") -> Any:
    """The object behind `handle`; LookupError when stale, TypeError when not a `cls`.
    `where` ("mylib::gemm: parameter 'runner'") prefixes the message."""
    prefix = f"{where}: " if where else ""
    try:
        payload = _C.handle_payload(handle, "")
    except (LookupError, TypeError) as e:
        if not prefix:
            raise
        raise type(e)(f"{prefix}{e}") from None
    obj = payload() if isinstance(payload, weakref.ref) else payload
    if obj is None:
        raise LookupError(f"{prefix}handle {handle} is stale: its object is gone. Keep the object alive "
                          f"(or opforge.handles.pin it) while ops use it.")
    if cls is not None and not isinstance(obj, cls):
        raise TypeError(f"{prefix}handle {handle} refers to a {type(obj).__name__}, not a {cls.__name__}. "
                        f"Pass an object of the type the op expects.")
    return obj


def _wrong_type(obj: Any, cls: type, where: str) -> TypeError:
    prefix = f"{where}: " if where else ""
    return TypeError(f"{prefix}expected a {cls.__name__} for a Handle[{cls.__name__}] parameter, "
                     f"got {type(obj).__name__}. Pass the {cls.__name__} object itself.")


def handle_for(obj: Any, cls: type | None = None, where: str = "") -> int:
    """The handle of `obj` (registered on first use), checking its type."""
    if cls is not None and not isinstance(obj, cls):
        raise _wrong_type(obj, cls, where)
    return register(obj)


def checked(obj: Any, cls: type, where: str = "") -> Any:
    """`obj` itself, for the eager fast path: checks the type and registers
    it, so that a later torch.compile trace finds its handle."""
    if not isinstance(obj, cls):
        raise _wrong_type(obj, cls, where)
    if _TRACE_TIME_REGISTRATION is False and _live(obj) is None:
        register(obj)
    return obj


def _dynamo_registers_at_trace_time() -> bool:
    """Whether `torch._dynamo.assume_constant_result` accepts a plain object
    argument (it calls the function at trace time with the real object and
    guards on its identity); torch releases before that lack it. Read from
    Dynamo's source file, because importing Dynamo takes a second."""
    import os

    import torch

    path = os.path.join(os.path.dirname(torch.__file__), "_dynamo", "variables", "functions.py")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return False
    start = text.find("def invoke_and_store_as_constant(")
    if start < 0:
        return False
    end = text.find("\ndef ", start + 1)
    return ("UserDefinedObjectVariable" in text[start:end if end > 0 else None]
            and "_dynamo_marked_constant" in text)


_TRACE_TIME_REGISTRATION: bool | None = None  # decided when the first op with a handle is defined


def traced_handle(obj: Any, cls: type | None = None, where: str = "") -> int:
    """The handle under torch.compile, as a constant of the graph.

    Where Dynamo can call a function on the real object at trace time, the
    object is registered then (guarded on its identity). Otherwise the handle
    is read from an attribute set at registration, with a check that the
    attribute belongs to this very object (a copy carries its original's)."""
    if _TRACE_TIME_REGISTRATION:
        return _handle_at_trace_time(obj, cls, where)
    entry = getattr(obj, ATTRIBUTE, None)
    if entry is None or entry[1] != id(obj):
        name = type(obj).__name__
        prefix = f"{where}: " if where else ""
        raise RuntimeError(
            f"{prefix}the {name} passed as a handle inside torch.compile was never registered. "
            f"Call opforge.handles.register(obj) (or the op once outside torch.compile) first."
        )
    return entry[0]


def _handle_at_trace_time(obj: Any, cls: type | None = None, where: str = "") -> int:
    return handle_for(obj, cls, where)


def _decide_trace_time_registration() -> None:
    """Called when an op with a handle parameter is defined."""
    global _TRACE_TIME_REGISTRATION
    if _TRACE_TIME_REGISTRATION is None:
        ok = _dynamo_registers_at_trace_time()
        if ok:
            if "torch._dynamo" in sys.modules:
                sys.modules["torch._dynamo"].assume_constant_result(_handle_at_trace_time)
            else:
                # What assume_constant_result sets, without importing Dynamo.
                _handle_at_trace_time._dynamo_marked_constant = True
        _TRACE_TIME_REGISTRATION = ok


def count() -> int:
    """Live handles in the table (Python and C++)."""
    return _C.handle_count()
