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
                f"opforge.handles: objects of type {type(obj).__qualname__} cannot be held weakly. "
                f"Pin them with opforge.handles.pin(obj) (and unpin when done)."
            ) from None
        handle = _C.handle_register(ref, _type_key(type(obj)))
        box.append(handle)
        _by_id[id(obj)] = (ref, handle)
        _remember(obj, handle)
        return handle


def _remember(obj: Any, handle: int) -> None:
    # torch.compile reads the handle from this attribute: Dynamo can trace an
    # attribute read (and guards on it), not a lookup in this table.
    try:
        object.__setattr__(obj, ATTRIBUTE, handle)
    except (AttributeError, TypeError):
        pass


def _gone(key: int, box: list[int]) -> None:
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


def resolve(handle: int, cls: type | None = None) -> Any:
    """The object behind `handle`; LookupError when stale, TypeError when not a `cls`."""
    payload = _C.handle_payload(handle, "")
    obj = payload() if isinstance(payload, weakref.ref) else payload
    if obj is None:
        raise LookupError(f"handle {handle}: is stale: its object is gone. Keep the object alive "
                          f"(or opforge.handles.pin it) while ops use it.")
    if cls is not None and not isinstance(obj, cls):
        raise TypeError(f"handle {handle}: refers to a {type(obj).__qualname__}, not a {cls.__qualname__}. "
                        f"Pass an object of the type the op expects.")
    return obj


def handle_for(obj: Any, cls: type | None = None) -> int:
    if cls is not None and not isinstance(obj, cls):
        raise TypeError(f"expected a {cls.__qualname__} for a Handle[{cls.__qualname__}] parameter, "
                        f"got {type(obj).__qualname__}.")
    return register(obj)


def traced_handle(obj: Any) -> int:
    """The handle under torch.compile: an attribute read Dynamo can trace."""
    handle = getattr(obj, ATTRIBUTE, None)
    if handle is None:
        raise RuntimeError(
            f"a {type(obj).__qualname__} passed as a handle inside torch.compile was never "
            f"registered. Call opforge.handles.register(obj) (or the op once eagerly) first."
        )
    return handle


def count() -> int:
    """Live handles in the table (Python and C++)."""
    return _C.handle_count()
