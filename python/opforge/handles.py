"""Runner handles: stateful objects through the dispatcher as ints.

    @opforge.op("mylib::gemm")
    def gemm(x: Tensor, runner: opforge.Handle[Runner]) -> Tensor:
        return runner.run(x)          # the body gets the object

    gemm(x, my_runner)                 # the caller passes the object
    gemm.schema                        # 'mylib::gemm(Tensor x, SymInt runner) -> Tensor'

The table is the core's, shared with C++. It holds objects weakly: a handle
goes stale when its object is gone (or is released), and a stale handle is an
error, never another object. `pin` keeps an object alive until `unpin`.

Under torch.compile the handle is a graph input, not a constant: N runners
through one compiled region compile one graph, and a released runner passed
again works as in eager (docs/handles.md). The objects of a class that a
Handle[...] parameter names register themselves when made or copied, so a
model's first call may be a compiled one.
"""

from __future__ import annotations

import functools
import gc
import itertools
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from . import _C
from ._types import registered_name


@dataclass(frozen=True)
class _Entry:
    """A registered object as the table holds it: `held` is a weakref to it,
    or the object itself when it cannot be held weakly and was pinned."""

    held: Any
    handle: int

    @property
    def ref(self) -> weakref.ref | None:
        return self.held if isinstance(self.held, weakref.ref) else None

    def target(self) -> Any:
        return self.held() if isinstance(self.held, weakref.ref) else self.held


_lock = threading.RLock()
_by_id: dict[int, _Entry] = {}  # id(obj) -> its entry
_pinned: dict[int, Any] = {}  # handle -> obj

# A registered object carries `(handle, weakref to itself)` in this attribute:
# compiled code reads the handle from it (a graph input), and the weakref lets
# Dynamo tell the object from a copy by an aliasing guard instead of an
# identity guard (which would compile one graph per object).
ATTRIBUTE = "__opforge_handle__"

# ---------------------------------------------------------------------------
# How compiled code gets the handle, by what the installed torch offers:
#   "dynamic_int":     the handle is a torch DynamicInt (an int that Dynamo
#                      lifts as a SymInt graph input). Python objects, C++
#                      handles (`dynamic`) and integer IDs all compile once.
#   "dynamic_sources": no DynamicInt: the attribute's int is named dynamic in
#                      torch.compiler.config.dynamic_sources. Python objects
#                      compile once; bare ints are constants.
#   "constant":        neither: one graph per runner (Dynamo's recompile limit
#                      applies).
# ---------------------------------------------------------------------------

_DYNAMIC_SOURCE_PATTERN = r".*\." + ATTRIBUTE + r"\[0\]"


def _dynamic_int_class() -> type | None:
    try:
        from torch.fx.experimental.sym_node import DynamicInt
    except ImportError:
        return None
    return DynamicInt


def _dynamo_source(module: str) -> str:
    """A Dynamo source file's text, read instead of importing Dynamo (which
    takes a second)."""
    import torch

    path = os.path.join(os.path.dirname(torch.__file__), "_dynamo", *module.split(".")) + ".py"
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def _detect_mode() -> str:
    if _dynamic_int_class() is not None and "_DynamicScalar" in _dynamo_source("variables.builder"):
        return "dynamic_int"
    import torch

    config = getattr(getattr(torch, "compiler", None), "config", None)
    if config is not None and hasattr(config, "dynamic_sources") and "re.match" in _dynamo_source("variables.builder"):
        return "dynamic_sources"
    return "constant"


_MODE: str | None = None  # decided on first use; tests set it to exercise the fallbacks


def compile_mode() -> str:
    """How torch.compile receives handles with the installed torch:
    'dynamic_int', 'dynamic_sources' or 'constant' (see docs/handles.md)."""
    global _MODE
    if _MODE is None:
        mode = _detect_mode()
        if mode == "dynamic_sources":
            _install_dynamic_source_pattern()
        _MODE = mode
    return _MODE


def _install_dynamic_source_pattern() -> None:
    import torch

    config = torch.compiler.config
    current = config.dynamic_sources
    if _DYNAMIC_SOURCE_PATTERN not in current.split(","):
        config.dynamic_sources = f"{current},{_DYNAMIC_SOURCE_PATTERN}" if current else _DYNAMIC_SOURCE_PATTERN


_DynamicInt = _dynamic_int_class()

if _DynamicInt is not None:

    class HandleId(_DynamicInt):
        """A handle that torch.compile takes as a graph input (a SymInt)
        instead of a constant. Prints and compares as the plain int."""

        __slots__ = ()

        def __repr__(self) -> str:
            return int.__repr__(self)

        __str__ = __repr__

else:  # pragma: no cover - torch without DynamicInt
    HandleId = int  # type: ignore[misc,assignment]


def dynamic(handle: int) -> int:
    """`handle` as an int that torch.compile passes to the graph as an input,
    so that modules holding different handles share one compiled graph:

        self.runner = opforge.handles.dynamic(ext.make_runner(3.0))   # a C++ handle
        int(self.runner) == ...                                       # the same int

    Where the installed torch cannot do that (compile_mode() != 'dynamic_int',
    torch before 2.10) this warns once and returns the plain int, a constant
    under torch.compile."""
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise TypeError(f"opforge.handles.dynamic: expected an int handle, got {type(handle).__name__}. "
                        f"Pass the int that opforge.handles.register (or a C++ RegisterHandle) returned.")
    if compile_mode() == "dynamic_int":
        return handle if type(handle) is HandleId else HandleId(handle)
    _warn_constant_handles()
    return int(handle)


@functools.cache
def _warn_constant_handles() -> None:
    import warnings

    import torch

    warnings.warn(f"opforge.handles.dynamic: torch {torch.__version__} has no DynamicInt (torch 2.10 has), so an int "
                  f"handle is a constant under torch.compile: each handle compiles a graph of its own, up to "
                  f"Dynamo's recompile limit. Runners passed as Handle[...] objects share one graph.", stacklevel=3)


def _type_key(cls: type) -> str:
    return "py:" + registered_name(cls)


def _live(obj: Any) -> int | None:
    entry = _by_id.get(id(obj))
    return entry.handle if entry is not None and entry.target() is obj else None


def register(obj: Any) -> int:
    """The handle of `obj`, registering it (weakly) on first use."""
    return _register(obj, remember=True)


def _register(obj: Any, remember: bool) -> int:
    with _lock:
        handle = _live(obj)
        if handle is not None:
            return handle
        box: list[int] = []
        try:
            # The callback holds _gone itself: at exit this module's globals
            # may be gone before the object is.
            ref = weakref.ref(obj, functools.partial(_gone, id(obj), box))
        except TypeError:
            raise TypeError(
                f"opforge.handles: objects of type {type(obj).__name__} cannot be held weakly. "
                f"Pin them with opforge.handles.pin(obj) (and unpin when done)."
            ) from None
        handle = _C.handle_register(ref, _type_key(type(obj)))
        box.append(handle)
        _by_id[id(obj)] = _Entry(ref, handle)
        if remember:
            _remember(obj, handle, ref)
        return handle


def _remember(obj: Any, handle: int, ref: weakref.ref | None = None) -> None:
    # Compiled code reads the handle from this attribute: Dynamo can trace an
    # attribute read, not a lookup in this table.
    if ref is None:
        entry = _by_id.get(id(obj))
        ref = entry.ref if entry is not None else None
    if ref is None:
        try:
            ref = weakref.ref(obj)
        except TypeError:
            return  # no aliasing guard possible: compiled code registers it while tracing
    old = getattr(obj, ATTRIBUTE, None)
    if type(old) is tuple and len(old) == 2 and old[1]() is obj:
        _reserved.pop(int(old[0]), None)
    value = HandleId(handle) if compile_mode() == "dynamic_int" else handle
    try:
        object.__setattr__(obj, ATTRIBUTE, (value, ref))
    except (AttributeError, TypeError):
        pass


# Attribute writes for objects registered while Dynamo traced a frame that
# reads them: written when the op's kernel first runs, because Dynamo builds
# the frame's guards from the objects after tracing.
_pending: list[tuple[weakref.ref, int]] = []


def _flush_pending() -> None:
    with _lock:
        todo = list(_pending)
        _pending.clear()
        for ref, handle in todo:
            obj = ref()
            if obj is not None and _live(obj) == handle:
                _remember(obj, handle)


def _gone(key: int, box: list[int], _ref: weakref.ref, _finalizing=sys.is_finalizing) -> None:
    # At exit the interpreter tears down this module's globals before the
    # last runners die; the table goes with the process, so there is nothing
    # to release (and touching the globals would print "Exception ignored").
    if _finalizing():
        return
    with _lock:
        if box:
            _C.handle_release(box[0])
            entry = _by_id.get(key)
            if entry is not None and entry.handle == box[0]:
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
                _by_id[id(obj)] = _Entry(obj, handle)
                _remember(obj, handle)
        _pinned[handle] = obj
        return handle


def unpin(obj: Any) -> None:
    with _lock:
        handle = _live(obj)
        if handle is not None:
            _pinned.pop(handle, None)
            entry = _by_id.get(id(obj))
            if entry is not None and entry.ref is None:
                release(handle)  # held strongly only because pinned


# ---------------------------------------------------------------------------
# Released objects. Eager code registers a released object again when it is
# passed again; compiled code reads the handle from the object's attribute
# without running Python, so `release` leaves a reservation there instead: an
# int that is never a live handle (generation 0), which `resolve` turns into a
# new registration while the object lives. The graph's input changes value,
# not kind: no recompilation.
# ---------------------------------------------------------------------------

_reserved: dict[int, weakref.ref] = {}  # reservation -> the released object
_reservation_index = itertools.count(1)
_MARKER = 1 << 62  # what every handle and reservation has set (cpp/src/core/handles.cc)


def _retire(obj: Any) -> None:
    entry = getattr(obj, ATTRIBUTE, None)
    if type(entry) is not tuple or len(entry) != 2 or entry[1]() is not obj:
        return
    reservation = _MARKER | (next(_reservation_index) & 0xFFFFFFFF)
    # Bound now, as in _register: the callback may run after this module's globals are gone.
    ref = weakref.ref(obj, lambda _r, key=reservation, drop=_reserved.pop: drop(key, None))
    _reserved[reservation] = ref
    value = HandleId(reservation) if compile_mode() == "dynamic_int" else reservation
    try:
        object.__setattr__(obj, ATTRIBUTE, (value, ref))
    except (AttributeError, TypeError):
        _reserved.pop(reservation, None)


def _revive(handle: int) -> Any:
    """The released object a reservation stands for, registered again; None
    when `handle` is no reservation or its object is gone."""
    with _lock:
        ref = _reserved.get(handle)
        obj = ref() if ref is not None else None
        if obj is None:
            return None
        register(obj)  # a new handle; its attribute replaces the reservation
        return obj


def release(obj_or_handle: Any) -> bool:
    """Drops a handle; later use of it is a clear error. The object itself, when
    passed again to an op, is registered again (eager and compiled alike)."""
    with _lock:
        if isinstance(obj_or_handle, int) and not isinstance(obj_or_handle, bool):
            handle = int(obj_or_handle)
        else:
            handle = _live(obj_or_handle)
            if handle is None:
                return False
        released = _C.handle_release(handle)
        _pinned.pop(handle, None)
        for key, entry in list(_by_id.items()):
            if entry.handle == handle:
                del _by_id[key]
                obj = entry.target()
                if obj is not None:
                    _retire(obj)
        return released


def resolve(handle: int, cls: type | None = None, where: str = "") -> Any:
    """The object behind `handle`; LookupError when stale, TypeError when not a `cls`.
    `where` ("mylib::gemm: parameter 'runner'") prefixes the message."""
    prefix = f"{where}: " if where else ""
    if _pending:
        _flush_pending()
    try:
        payload = _C.handle_payload(handle, "")
    except (LookupError, TypeError) as e:
        obj = _revive(handle) if isinstance(e, LookupError) else None
        if obj is None:
            if not prefix:
                raise
            raise type(e)(f"{prefix}{e}") from None
        payload = obj
    obj = payload() if isinstance(payload, weakref.ref) else payload
    if obj is None:
        raise LookupError(f"{prefix}handle {int(handle)} is stale: its object is gone. Keep the object alive "
                          f"(or opforge.handles.pin it) while ops use it.")
    if cls is not None and not isinstance(obj, cls):
        raise TypeError(f"{prefix}handle {int(handle)} refers to a {type(obj).__name__}, not a {cls.__name__}. "
                        f"Pass an object of the type the op expects.")
    return obj


def _wrong_type(obj: Any, cls: type, where: str) -> TypeError:
    prefix = f"{where}: " if where else ""
    return TypeError(f"{prefix}expected a {cls.__name__} for a Handle[{cls.__name__}] parameter, "
                     f"got {type(obj).__name__}. Pass the {cls.__name__} object itself.")


def _exporting() -> bool:
    """Whether torch.export is tracing. The flag itself, not
    `torch.compiler.is_exporting()`, which the Dynamo of some releases (2.11
    among them) traces as True under torch.compile too, so every compiled
    call of a handle op would be refused as an export."""
    import torch

    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    return flag if isinstance(flag, bool) else torch.compiler.is_exporting()


def _export_error(obj: Any, where: str) -> RuntimeError:
    """torch.export would record a handle as a constant, which names nothing
    in the process that loads the program (docs/handles.md#handles-are-process-state)."""
    prefix = f"{where}: " if where else ""
    name = type(obj).__name__
    return RuntimeError(
        f"{prefix}torch.export would record the handle of this {name} as a constant, a number that names an "
        f"object of this process only (a handle is process state), so the exported program could not run "
        f"anywhere else. Keep the runner out of the exported program: export the part of the model around the "
        f"op, and call the op with the {name} in the process that runs the program (docs/deploy.md#runners)."
    )


def handle_for(obj: Any, cls: type | None = None, where: str = "") -> int:
    """The handle of `obj` (registered on first use), checking its type."""
    if cls is not None and not isinstance(obj, cls):
        raise _wrong_type(obj, cls, where)
    if _exporting():
        raise _export_error(obj, where)
    if _pending:
        _flush_pending()
    return register(obj)


def checked(obj: Any, cls: type, where: str = "") -> Any:
    """`obj` itself, for the eager fast path: checks the type and registers
    it, so that a later torch.compile trace finds its handle."""
    if not isinstance(obj, cls):
        raise _wrong_type(obj, cls, where)
    if _pending:
        _flush_pending()
    if _live(obj) is None:
        register(obj)
    return obj


# ---------------------------------------------------------------------------
# Registered when created. Compiled code reads a handle from the object's
# attribute, so an object must be registered before Dynamo traces a frame that
# passes it; a model whose first call is compiled passes runners no eager call
# has seen. So the objects of a handle class register themselves when they are
# made: by the class's __init__, or as a copy (copy, deepcopy and pickle
# restore an object's state through __setstate__). Every torch can do that;
# registering while tracing needs torch 2.12 (_register_at_trace_time).
# ---------------------------------------------------------------------------

_INSTALLED = "__opforge_registers__"  # marks the methods installed below


def _restore_state(obj: Any, state: Any) -> None:
    """What copy and pickle do with a state for a class without __setstate__."""
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state:
        obj.__dict__.update(state)
    for name, value in (slots or {}).items():
        setattr(obj, name, value)


def _adopt(obj: Any) -> None:
    # A copy carries its original's attribute; registering gives it its own.
    if _live(obj) is None:
        try:
            register(obj)
        except TypeError:
            pass  # cannot be held weakly: its user pins it


def _registering(method: Any) -> Any:
    import torch

    compiling = torch.compiler.is_compiling

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        if not compiling():  # made inside a compiled region: registered while tracing
            _adopt(self)
        return result

    setattr(wrapper, _INSTALLED, True)
    return wrapper


def register_on_creation(cls: type) -> None:
    """Makes every `cls` object register itself when its __init__ returns or
    when it is restored as a copy, and registers those that exist already.
    @opforge.op does this for each Handle[cls] parameter:

        r = Runner()
        getattr(r, ATTRIBUTE)          # (handle, weakref to r): compiled code finds it

    A class whose methods cannot be replaced (a C extension type) is left as
    it is; its objects are registered when an eager call passes them."""
    with _lock:
        if getattr(cls.__init__, _INSTALLED, False):
            return
        try:
            cls.__setstate__ = _registering(getattr(cls, "__setstate__", _restore_state))
            cls.__init__ = _registering(cls.__init__)
        except (AttributeError, TypeError):
            return
        _register_live_instances(cls)


# ---------------------------------------------------------------------------
# Under torch.compile.
# ---------------------------------------------------------------------------


def traced_handle(obj: Any, cls: type | None = None, where: str = "") -> int:
    """The handle under torch.compile: Dynamo traces this function.

    A registered object's handle comes from its attribute, as a graph input
    (compile_mode() says which kind); the guards are on the attribute's type
    and on the attribute's weakref pointing back at the object, so another
    registered object of the same class reuses the graph, and a copy (which
    carries its original's attribute) does not. An object met unregistered, or
    a copy, is registered while tracing, where this torch's Dynamo can do that."""
    if _exporting():
        raise _export_error(obj, where)
    entry = getattr(obj, ATTRIBUTE, None)
    owner = entry[1]() if type(entry) is tuple else None
    if owner is obj and (cls is None or isinstance(obj, cls)):
        return entry[0]
    if _TRACE_TIME_REGISTRATION:
        return _register_at_trace_time(obj, cls, where, owner)
    import torch

    name = type(obj).__name__
    prefix = f"{where}: " if where else ""
    raise RuntimeError(
        f"{prefix}the {name} passed as a handle inside torch.compile was never registered: it was not made by "
        f"{name}.__init__ or copied (those register themselves), and torch {torch.__version__} cannot register "
        f"it while tracing (torch 2.12 can). Call opforge.handles.register(obj) (or the op once outside "
        f"torch.compile) first."
    )


def _register_at_trace_time(obj: Any, cls: type | None = None, where: str = "", owner: Any = None) -> int:
    """Registers `obj` while Dynamo traces, and returns its handle as a
    constant of that graph. The graph is used once: it is guarded on `obj`'s
    identity and on what its attribute held (nothing, or `owner`, the original
    of a copy), and the attribute changes when the kernel runs. Every other
    live object of the handle class is registered too, so that a model whose
    runners exist before its first compiled call compiles one more graph, not
    one per runner."""
    if cls is not None and not isinstance(obj, cls):
        raise _wrong_type(obj, cls, where)
    with _lock:
        handle = _live(obj)
        if handle is None:
            handle = _register(obj, remember=False)
        _pending.append((_by_id[id(obj)].ref or weakref.ref(obj), handle))
    _register_live_instances(cls if cls is not None else type(obj), skip=obj)
    return int(handle)


def _register_live_instances(cls: type, skip: Any = None) -> int:
    """Registers (weakly) every live object of `cls` that is not registered,
    or is a copy of a registered one."""
    found = [o for o in gc.get_objects() if issubclass(type(o), cls) and o is not skip]
    count = 0
    for o in found:
        if _live(o) is None:
            try:
                register(o)
                count += 1
            except TypeError:
                pass  # cannot be held weakly: registered when first passed
    return count


def _dynamo_registers_at_trace_time() -> bool:
    """Whether `torch._dynamo.assume_constant_result` accepts a plain object
    argument (it calls the function at trace time with the real object and
    guards on its identity); torch releases before that lack it."""
    text = _dynamo_source("variables.functions")
    start = text.find("def invoke_and_store_as_constant(")
    if start < 0:
        return False
    end = text.find("\ndef ", start + 1)
    return ("UserDefinedObjectVariable" in text[start:end if end > 0 else None]
            and "_dynamo_marked_constant" in text)


_TRACE_TIME_REGISTRATION: bool | None = None  # decided when the first op with a handle is defined


def prepare(classes) -> None:
    """Called when an op with Handle[cls] parameters of these classes is defined."""
    _decide_trace_time_registration()
    for cls in classes:
        register_on_creation(cls)


def _decide_trace_time_registration() -> None:
    global _TRACE_TIME_REGISTRATION
    compile_mode()
    if _TRACE_TIME_REGISTRATION is None:
        ok = _dynamo_registers_at_trace_time()
        if ok:
            if "torch._dynamo" in sys.modules:
                sys.modules["torch._dynamo"].assume_constant_result(_register_at_trace_time)
            else:
                # What assume_constant_result sets, without importing Dynamo.
                _register_at_trace_time._dynamo_marked_constant = True
        _TRACE_TIME_REGISTRATION = ok


def count() -> int:
    """Live handles in the table (Python and C++)."""
    return _C.handle_count()
