"""Ops that Dynamo writes into its graph as one call, without tracing their
Python `__call__` (docs/performance.md#one-node-in-dynamos-graph).

An op whose arguments Dynamo can hold as they are (Tensors, scalars,
strings, lists of them, frozen-dataclass structs of them, None) and that
Dynamo can name (the op and its struct classes found by module and
qualified name, as a module's top-level definitions are) is given to
`torch.compiler.allow_in_graph` at the next compile start. Dynamo then
records `op(x, w, cfg)` as one node, guards the struct's fields as it guards
any constant it reads, and runs the op on fake tensors to learn its outputs:
that run is the op's eager call, boundary and all. AOTAutograd's trace of
the node records the op's flat OpOverload, which Inductor, `torch.export`
and the flat-call lowering see as before. The op and its struct classes are
marked cacheable for AOTAutograd's cache (Inductor's
`unsafe_marked_cacheable_functions`, keyed by the op's schema and the
structs' fields), which otherwise refuses a graph with a call it does not
know. Every other op keeps its traced `__call__`.

Where the boundary refuses the arguments in that fake run, `refused` turns
its error into Dynamo's graph break carrying the same message: with graph
breaks allowed the call then runs eagerly and raises the boundary's own
error, as an eager call does; with `fullgraph=True` Dynamo reports it.

    offer(opdef)     # each op added to opforge._registry that may be one node: looked at at the next compile start
    admit_pending()  # a compile-start step (opforge._registry)
    admitted(opdef)  # whether Dynamo records it as one node
"""

from __future__ import annotations

import dataclasses
import sys
import weakref

from . import _C, _registry

_pending: list[weakref.ref] = []
_admitted: "weakref.WeakSet" = weakref.WeakSet()
# "module.qualname" -> cache key, for Inductor's unsafe_marked_cacheable_functions once it is loaded.
_cacheable: dict[str, str] = {}
_unmarked = False  # whether _cacheable holds what Inductor's config does not yet


def offer(opdef) -> None:
    """Looks at `opdef` at the next compile start. Cheap at definition: no
    Dynamo import, no allow_in_graph call yet."""
    _pending.append(weakref.ref(opdef))


def admitted(opdef) -> bool:
    return opdef in _admitted


def admit_pending() -> None:
    """Every op offered since the last call that Dynamo can name, given to
    allow_in_graph; the cacheable names given to Inductor's config."""
    if _pending:
        try:
            from torch.compiler import allow_in_graph
        except ImportError:  # pragma: no cover - every supported torch has it
            allow_in_graph = None
        while _pending:
            op = _pending.pop()()
            if op is None or allow_in_graph is None:
                continue
            names = _names(op)
            if names is None:
                continue  # the traced __call__: Dynamo's graph could not be cached
            allow_in_graph(op)
            _admitted.add(op)
            _note_cacheable(names)
    _mark_cacheable()


def _note_cacheable(names: dict[str, str]) -> None:
    """`names` for Inductor's config; a name that now holds another op (a
    module attribute defined again) takes that op's key."""
    global _unmarked
    for name, key in names.items():
        if _cacheable.get(name) != key:
            _cacheable[name] = key
            _unmarked = True


def _mark_cacheable() -> None:
    global _unmarked
    config = sys.modules.get("torch._inductor.config")
    if config is None or not _unmarked:
        return
    marked = getattr(config, "unsafe_marked_cacheable_functions", None)
    if not isinstance(marked, dict):
        return
    # A new dict, as torch's config expects an assignment.
    config.unsafe_marked_cacheable_functions = {**marked, **_cacheable}
    _unmarked = False


def _names(op) -> dict[str, str] | None:
    """"module.qualname" -> cache key of `op` and of every struct class its
    parameters hold, or None where one of them is not found by that name
    (AOTAutograd's cache pickles a graph's callables by reference)."""
    if not _found(op):
        return None
    names = {f"{op.__module__}.{op.__name__}": f"opforge op {op.name} {op.schema}"}
    seen: set = set()
    for p in op._code.params:
        for cls in _struct_classes(p.type, seen):
            if not _found(cls):
                return None
            fields = ", ".join(f"{f.name}: {f.type}" for f in dataclasses.fields(cls))
            names[f"{cls.__module__}.{cls.__name__}"] = f"opforge struct {cls.__qualname__}({fields})"
    return names


def _struct_classes(t, seen: set):
    if t is None:
        return
    if t.kind == "struct" and t.py not in seen:
        seen.add(t.py)
        yield t.py
        for child in t.fields.values():
            yield from _struct_classes(child, seen)
    elif t.kind == "list":
        yield from _struct_classes(t.element, seen)


def _found(obj) -> bool:
    """Whether `obj` is what its module's attribute path `__qualname__` holds
    (and its `__name__` the last part of it, as torch names it)."""
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    qualname = getattr(obj, "__qualname__", None)
    if module is None or not isinstance(qualname, str) or "<" in qualname:
        return False
    if qualname.rsplit(".", 1)[-1] != getattr(obj, "__name__", None):
        return False
    value = module
    for part in qualname.split("."):
        value = getattr(value, part, None)
    return value is obj


def refused(op, error: BaseException) -> None:
    """Called from C where `op`'s boundary refused a call's arguments with
    `error`. In Dynamo's fake-tensor run of `op`'s node it raises Dynamo's
    graph break with the same message; anywhere else it returns, and the
    boundary's error is raised as it is."""
    if op not in _admitted:
        return
    convert = sys.modules.get("torch._dynamo.symbolic_convert")
    if convert is None or getattr(getattr(convert, "tls", None), "current_tx", None) is None:
        return
    current = getattr(sys.modules.get("torch._dynamo.utils"), "get_current_node", None)
    node = current() if current is not None else None
    if current is not None and (node is None or node.target is not op):
        return  # not the fake run of this op's node: the error stays the boundary's
    from torch._dynamo.exc import Unsupported

    # A list argument reaches the fake run as torch.fx's immutable_list: the message names what was passed.
    raise Unsupported(str(error).replace(" got immutable_list ", " got list ")) from error


_C.set_refused_hook(refused)


def _on_add(op) -> None:
    """An op whose kind may be one node (not a Triton op, whose traced body
    is captured through `__call__`; not a C++ op) and whose arguments and
    returns Dynamo can hold as they are: no struct return (rebuilt in
    Python), no handle (resolved in Python), no mutated argument (tracked by
    Dynamo)."""
    kind = getattr(op, "_kind", None)
    if kind is not None and kind.one_node and op._code.one_graph_call:
        offer(op)


_registry.on_add(_on_add)
_registry.on_compile_start(admit_pending)
