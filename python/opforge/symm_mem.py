"""Symmetric-memory arguments (docs/symm_mem.md).

    @opforge.op("mylib::all_reduce", symm_mem_args=("x",))
    def all_reduce(x: Tensor, reduce_op: str, group_name: str) -> Tensor: ...

    opforge.symm_mem_args("mylib::all_reduce")   # ['x']
    opforge.arg_tags("mylib::all_reduce")        # {'x': ['symm_mem']}

Under torch.compile, Inductor computes `x` straight into a buffer allocated
with `empty_strided_p2p(..., group_name=...)`, so the kernel gets a symmetric
tensor without a copy. torch 2.13+ does that itself once it knows the
arguments (`Library.register_symm_mem_args`), and opforge forwards to it.
Older torch has no such registry: there opforge gives each tagged op an
Inductor lowering that realizes those arguments as symmetric comm buffers,
then falls back to the op.

The tags themselves live in the core (`opforge._C`), next to the op specs, so
ops defined in C++ with `.symm_mem_args({...})` are covered too: `sync()`
picks them up, and runs by itself when Inductor is first imported.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
import random
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _C, _inductor

__all__ = ["TAG", "arg_tags", "declare", "forget", "handled_by", "has_native_registry", "mode", "set_mode",
           "symm_mem_args", "sync", "uninstall"]

TAG = "symm_mem"
_OPTION = "symm_mem_args"
_MODES = ("auto", "native", "lowering")

log = logging.getLogger(__name__)

# Inductor allocates comm buffers (empty_strided_p2p) on CUDA devices only.
_COMM_DEVICE_TYPES = frozenset({"cuda"})


@dataclasses.dataclass
class _Handling:
    how: str  # "native" or "lowering"
    args: tuple[str, ...]
    undo: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    installed: bool = False


_lock = threading.RLock()
_mode = "auto"
_handled: dict[str, _Handling] = {}
_libs: dict[str, weakref.ref] = {}  # op -> the Library given to declare()
_own_libs: dict[str, torch.library.Library] = {}  # namespace -> FRAGMENT library for forwarding
_synced_version: int | None = None


# Queries

def symm_mem_args(name: str) -> list[str]:
    """The flat names of the arguments of `name` that must be symmetric.

        opforge.symm_mem_args("mylib::attn")   # ['k', 'cfg__buf']  (attn(q, k, cfg: Cfg) with Cfg.buf a Tensor)
        opforge.symm_mem_args("mylib::other")  # []

    Ops registered with torch's own registry (torch 2.13+) report what torch holds.
    """
    _C.check_op_name(name)
    args = _C.args_with_tag(name, TAG)
    return list(args) if args else _native_args(name)


def arg_tags(name: str) -> dict[str, list[str]]:
    """Every tagged argument of `name` and its tags, in schema order.

        opforge.arg_tags("mylib::attn")   # {'k': ['symm_mem'], 'cfg__buf': ['symm_mem']}
    """
    _C.check_op_name(name)
    tags = {arg: list(names) for arg, names in _C.arg_tags(name).items()}
    if not _C.args_with_tag(name, TAG):
        for arg in _native_args(name):
            tags.setdefault(arg, []).append(TAG)
    return _in_schema_order(name, tags)


def handled_by(name: str) -> str | None:
    """How the symm_mem tags of `name` reach Inductor: 'native' (torch's
    registry), 'lowering' (opforge's Inductor lowering), or None."""
    with _lock:
        handling = _handled.get(name)
        return handling.how if handling is not None else None


def has_native_registry() -> bool:
    """Whether the installed torch has `Library.register_symm_mem_args` (2.13+)."""
    return hasattr(torch.library.Library, "register_symm_mem_args")


def mode() -> str:
    return _mode


@functools.cache
def lowering_realizes_fixed_buffers() -> bool:
    """Whether this torch's Inductor makes a buffer whose layout is already
    fixed a comm buffer (torch 2.11+). opforge's lowering needs it: an op's
    layout constraint fixes its inputs before the lowering runs. Read from
    Inductor's source, which declaring an op does not import."""
    path = os.path.join(os.path.dirname(torch.__file__), "_inductor", "comm_lowering.py")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return False
    start = text.find("def can_realize_as_comm_buffer(")
    end = text.find("\ndef ", start + 1)
    return start >= 0 and "FixedLayout" in text[start:end if end > 0 else None]


# Declaring

def declare(name: str, lowered: Any, names: Sequence[str], *, lib: torch.library.Library | None = None,
            stacklevel: int = 3) -> list[str]:
    """Tags `names` of the op `name` as symmetric-memory arguments and makes
    Inductor honour them. Returns the flat argument names.

        declare("mylib::attn", lowered, ["cfg", "k"])   # ['k', 'cfg__buf']  (a struct -> its Tensor leaves)
        declare("mylib::attn", lowered, ["scale"])      # ValueError: ... only Tensor arguments can be symm_mem_args ...

    `lowered` is the op's `_C.Lowered`. With `lib` (the op's own library),
    torch's native registration lives and dies with that library.
    """
    if isinstance(names, str):
        raise TypeError(f"{name}: symm_mem_args must be a sequence of argument names, not a string. "
                        f"Write symm_mem_args=({names!r},).")
    names = list(names)
    if not names:
        return []
    resolved = list(_C.resolve_tensor_args(lowered, names, _OPTION))
    problem = _group_name_problem(lowered.flat.arguments)
    if problem is not None:
        warnings.warn(f"{name}: {problem}", UserWarning, stacklevel=stacklevel)
    if _effective_mode() == "lowering" and not lowering_realizes_fixed_buffers():
        warnings.warn(f"{name}: symm_mem_args {', '.join(map(repr, resolved))}: torch {torch.__version__}'s "
                      f"Inductor cannot allocate an argument in symmetric memory once the op's layout constraint "
                      f"has fixed it (torch 2.11 can), so under torch.compile they get ordinary buffers. Pass "
                      f"tensors from torch.distributed._symmetric_memory.empty(), or use torch 2.11 or later.",
                      UserWarning, stacklevel=stacklevel)
    with _lock:
        previous = _C.args_with_tag(name, TAG)
        if lib is not None:
            _libs[name] = weakref.ref(lib)
        _C.set_arg_tag(name, TAG, resolved)
        try:
            _apply(name, resolved)
            _arm()
        except BaseException:
            _C.set_arg_tag(name, TAG, list(previous))
            raise
    return resolved


def forget(name: str) -> None:
    """Drops the symm_mem tags of `name` and undoes what they installed
    (for an op that is being removed)."""
    with _lock:
        _C.set_arg_tag(name, TAG, [])
        _undo(name)
        _libs.pop(name, None)
        _inductor.added_again(name)  # a defined op gets the flat-call lowering back (opforge._inductor)


def sync() -> list[str]:
    """Forwards or installs every op the core tags `symm_mem` that is not
    handled yet (ops defined in C++ get their tags at library load), and
    undoes it for ops whose tags are gone. Returns the ops newly handled.

        torch.ops.load_library("libmyops.so")   # defines mylib::attn with .symm_mem_args({"k"})
        opforge.symm_mem.sync()                  # ['mylib::attn']
    """
    with _lock:
        return _sync_locked(force=False)


def set_mode(new_mode: str) -> str:
    """Chooses how tags reach Inductor; returns the previous mode.

    'auto' (default): torch's native registry where it exists (torch 2.13+),
    else opforge's lowering. 'native' or 'lowering' force one of them; every
    tagged op is moved over at once.
    """
    global _mode
    if new_mode not in _MODES:
        raise ValueError(f"opforge.symm_mem.set_mode: unknown mode {new_mode!r}. Use one of {', '.join(_MODES)}.")
    if new_mode == "native" and not has_native_registry():
        raise RuntimeError(f"opforge.symm_mem.set_mode: torch {torch.__version__} has no native symm-mem registry "
                           f"(Library.register_symm_mem_args, torch 2.13+). Use 'auto' or 'lowering'.")
    with _lock:
        previous = _mode
        if new_mode != previous:
            for name in list(_handled):
                _undo(name)
            _mode = new_mode
            _sync_locked(force=True)
        return previous


def uninstall() -> list[str]:
    """Removes every Inductor lowering opforge installed and undoes its
    native registrations; the tags stay in the core, and a later `declare` or
    `sync()` installs again. Returns the ops that were handled."""
    global _synced_version
    with _lock:
        names = sorted(_handled)
        for name in names:
            _undo(name)
        _synced_version = None
        _disarm()
        _inductor.sync()
        return names


# Internals

def _effective_mode() -> str:
    if _mode == "auto":
        return "native" if has_native_registry() else "lowering"
    return _mode


def _native_args(name: str) -> list[str]:
    if not has_native_registry():
        return []
    from torch._library.simple_registry import singleton

    entry = singleton.get(name)
    args = entry.symm_mem_args.get() if entry is not None else None
    return list(args) if args else []


def _in_schema_order(name: str, tags: dict[str, list[str]]) -> dict[str, list[str]]:
    schemas = torch._C._jit_get_schemas_for_operator(name)
    position = {a.name: i for i, a in enumerate(schemas[0].arguments)} if schemas else {}
    return {arg: tags[arg] for arg in sorted(tags, key=lambda a: (position.get(a, len(position)), a))}


def _group_name_problem(arguments) -> str | None:
    for argument in arguments:
        if argument.name == "group_name":
            type_text = str(argument.type)
            if type_text in ("str", "str?"):
                return None
            return (f"symm_mem_args are declared but argument 'group_name' has type {type_text}; automatic "
                    f"realization under torch.compile needs a str group_name. Declare it as 'group_name: str'.")
    return ("symm_mem_args are declared but the op has no 'group_name' argument; automatic realization under "
            "torch.compile needs one (Inductor allocates the symmetric buffers for that process group). "
            "Add a 'group_name: str' parameter, or pass tensors from torch.distributed._symmetric_memory.empty().")


def _sync_locked(force: bool) -> list[str]:
    global _synced_version
    version = _C.tags_version()
    waiting = [h for h in _handled.values() if not h.installed]
    if not force and version == _synced_version and not (waiting and _inductor.loaded()):
        return []
    tagged = {name: list(_C.args_with_tag(name, TAG)) for name in _C.ops_with_tag(TAG)}
    for name in [n for n in _handled if n not in tagged]:
        _undo(name)
    newly = []
    for name, args in tagged.items():
        current = _handled.get(name)
        if current is not None and current.how == _effective_mode() and current.args == tuple(args):
            continue
        if _apply(name, args):
            newly.append(name)
    for name, handling in _handled.items():
        if handling.how == "lowering" and not handling.installed and _inductor.loaded():
            _install_lowerings(name, handling)
    if tagged:
        _arm()
    _synced_version = version
    return newly


def _apply(name: str, args: Sequence[str]) -> bool:
    """Makes Inductor honour `args` of `name`; False if it already did."""
    how = _effective_mode()
    current = _handled.get(name)
    if current is not None:
        if current.how == how and current.args == tuple(args):
            return False
        _undo(name)
    handling = _Handling(how, tuple(args))
    if how == "native":
        _forward_native(name, handling)
    elif _inductor.loaded():
        _install_lowerings(name, handling)
    # else: installed by _on_inductor_loaded, when Inductor is imported.
    _handled[name] = handling
    return True


def _undo(name: str) -> None:
    handling = _handled.pop(name, None)
    if handling is not None:
        for step in reversed(handling.undo):
            step()


def _forward_native(name: str, handling: _Handling) -> None:
    ref = _libs.get(name)
    lib = ref() if ref is not None else None
    if lib is None or getattr(lib, "m", None) is None:
        ns = name.split("::")[0]
        lib = _own_libs.get(ns)
        if lib is None:
            lib = _own_libs[ns] = torch.library.Library(ns, "FRAGMENT")
    lib.register_symm_mem_args(name, list(handling.args))
    handle = lib._registration_handles[-1]
    lib_ref = weakref.ref(lib)

    def undo() -> None:
        # A destroyed library has already run its handles.
        owner = lib_ref()
        if owner is not None and handle in owner._registration_handles:
            owner._registration_handles.remove(handle)
            handle.destroy()

    handling.undo.append(undo)
    handling.installed = True


def _install_lowerings(name: str, handling: _Handling) -> None:
    from torch._inductor import lowering as L

    ns, opname = name.split("::")
    try:
        packet = getattr(getattr(torch.ops, ns), opname)
    except (AttributeError, RuntimeError):
        log.debug("%s: not in torch.ops yet; its symm_mem lowering waits for the next sync()", name)
        return
    for overload in (getattr(packet, o) for o in packet.overloads()):
        previous = L.lowerings.get(overload)
        inner = previous
        before = None
        if inner is None:
            inner, before = _inductor.make_fallback(overload)
        ours = _make_lowering(overload, inner)
        L.lowerings[overload] = ours
        # Also for code loaded from Inductor's cache, which skips the lowering.
        _inductor.register_flat_call(overload)

        def undo(overload=overload, ours=ours, previous=previous, before=before):
            if L.lowerings.get(overload) is ours:
                if previous is None:
                    del L.lowerings[overload]
                else:
                    L.lowerings[overload] = previous
            if before is not None:
                _inductor.restore_tables(overload, before)

        handling.undo.append(undo)
    handling.installed = True


def _make_lowering(overload: torch._ops.OpOverload, inner: Callable) -> Callable:
    op = overload._schema.name
    names = [a.name for a in overload._schema.arguments]

    def lowering(*args, **kwargs):
        from torch._inductor.virtualized import V

        _realize_tagged(op, names, args, kwargs)
        operations = V.graph.operations
        before = len(operations)
        result = inner(*args, **kwargs)
        _inductor.call_from_c(overload, operations[before:])
        return result

    lowering._opforge_symm_mem = op  # marks opforge's lowering; tests and uninstall() look for it
    lowering.__name__ = f"symm_mem_lowering[{op}]"
    return lowering


flat_call_name = _inductor.flat_call_name


def _realize_tagged(op: str, names: list[str], args: tuple, kwargs: dict) -> None:
    """As torch 2.13's FallbackKernel does for registered ops: each TensorBox of
    a tagged argument becomes a SYMM_MEM comm buffer of the op's group."""
    tagged = _C.args_with_tag(op, TAG)
    if not tagged:
        return
    bound = dict(zip(names, args))
    bound.update(kwargs)
    group_name = bound.get("group_name")
    if not isinstance(group_name, str):
        return
    from torch._inductor import ir
    from torch._inductor.comm_lowering import can_realize_as_comm_buffer, realize_as_comm_buffer
    from torch.utils._pytree import tree_leaves

    for arg in tagged:
        for box in tree_leaves(bound.get(arg)):
            if not isinstance(box, ir.TensorBox):
                continue
            device = box.get_device()
            if device is None or device.type not in _COMM_DEVICE_TYPES:
                log.debug("%s: argument '%s' is on %s, where Inductor has no symmetric memory; passed as is",
                          op, arg, device)
                continue
            if can_realize_as_comm_buffer(box, ir.CommBufferType.SYMM_MEM):
                _fresh_alloc_ids()
                realize_as_comm_buffer(box, ir.CommBufferType.SYMM_MEM, group_name)
                log.debug("%s: argument '%s' is allocated as a symmetric buffer of group %s", op, arg, group_name)
            else:
                log.warning("%s: argument '%s' cannot be allocated in symmetric memory by Inductor (a graph "
                            "input, or a buffer Inductor does not allocate); pass a tensor from "
                            "torch.distributed._symmetric_memory.empty() instead.", op, arg)


_compiles = itertools.count(1)


def _fresh_alloc_ids() -> None:
    """Inductor names each symmetric buffer with `alloc_id=random.randint(...)`
    while torch.compile keeps Python's random state as it was before the
    compile, so two compiles in a row draw the same ids, and the second
    graph's buffer (another size) fails: 'requested allocation size ... is
    different from the size of a previous allocation with the same alloc_id'.
    Reseeding while compiling gives each compile its own ids; the caller's
    random state is restored after the compile all the same."""
    random.seed((os.getpid() << 32) ^ next(_compiles) ^ time.monotonic_ns())


_armed = True  # whether Inductor's import syncs; uninstall() turns it off until the next declare or sync


def _arm() -> None:
    global _armed
    _armed = True
    _inductor.arm()


def _disarm() -> None:
    global _armed
    _armed = False


def _on_inductor_loaded() -> None:
    if not _armed:
        return
    with _lock:
        _sync_locked(force=False)


# Ops tagged in C++ before Inductor is imported are synced when it is.
_inductor.on_load(_on_inductor_loaded)
