"""What a compiled graph of an opforge op depends on, as one digest that
enters the keys of torch.compile's on-disk caches (docs/compile_cache.md).

AOTAutograd's cache and Inductor's FX graph cache key a graph by its code
and Inductor's config, not by what an op called in it means: a process
whose op has another fake, backward, Enum table or default could reuse a
graph compiled for the op as it was. At each compile start every opforge
op's digest goes into Inductor's `unsafe_marked_cacheable_functions`
(config, hashed into both caches' keys) as `"opforge <name>" -> digest`;
one that changed misses, one that did not hits.

    definition(op)   # the parts, readable: schema, signature, enums, structs, fake, ...
    digest(op)       # sha256 of them, memoized per definition
    note_all(ops)    # a compile-start step (opforge._registry): every op's entry in Inductor's config

In the key: the flat schema with defaults and alias marks (so
`mutates_args`), the original signature with its defaults, the `(name,
value)` table of every Enum and the fields (type, default) of every struct
its parameters and returns reach, and the code of the fake, `setup_context`,
backward (and a Triton op's traced body, whose kernels are traced into the
graph): bytecode, constants, names, the code of the functions of the same
module they call, and closure values that are plain data. Not in it: the
op's body or kernels (compiled code calls the op), a C++ op's C++ fake or
backward (compiled code calls the op; its schema and Enums are keyed). A
function whose code cannot be read makes the op's digest unique to the
process: graphs with the op are then compiled anew in every process (said
once per op at DEBUG), never reused on a guess.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import inspect
import logging
import sys
import types
import uuid
import weakref

from . import _registry

log = logging.getLogger("opforge.cache")

# id(op) -> (the parts it was computed from, digest, weakref to the op)
_memo: dict[int, tuple] = {}
_noted: dict[str, str] = {}  # "opforge <name>" -> digest, as last given to Inductor's config
_said_uncacheable: set = set()
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


class _Unreadable(Exception):
    """A function whose code the digest cannot read."""


def _plain(value, depth: int = 0):
    """`value` as stable text where it is plain data, else None."""
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}={value.value!r}"
    if depth < 4 and isinstance(value, (tuple, list, frozenset, set)):
        items = [_plain(v, depth + 1) for v in value]
        if None in items:
            return None
        if isinstance(value, (set, frozenset)):
            items.sort()
        return f"{type(value).__name__}({', '.join(items)})"
    if depth < 4 and isinstance(value, dict):
        items = [(_plain(k, depth + 1), _plain(v, depth + 1)) for k, v in value.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return "dict(" + ", ".join(f"{k}: {v}" for k, v in sorted(items)) + ")"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [(f.name, _plain(getattr(value, f.name), depth + 1)) for f in dataclasses.fields(value)]
        if any(v is None for _, v in fields):
            return None
        return f"{type(value).__qualname__}(" + ", ".join(f"{k}={v}" for k, v in fields) + ")"
    return None


def _code_text(code: types.CodeType, out: list) -> None:
    out.append(code.co_code.hex())
    out.append(repr(code.co_names))
    out.append(repr(code.co_varnames))
    out.append(repr((code.co_argcount, code.co_kwonlyargcount, code.co_flags & 0x0C)))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_text(const, out)
        else:
            out.append(_plain(const) or f"<{type(const).__name__}>")


def code_digest(fn, seen: set | None = None) -> str:
    """The text of what `fn` computes: its code, constants, names, plain
    closure values and defaults, and the code of the same module's functions
    it names. Raises _Unreadable for a callable with no Python code."""
    seen = set() if seen is None else seen
    target = getattr(fn, "__func__", fn)  # a bound method: its function
    target = getattr(target, "__wrapped__", None) if not hasattr(target, "__code__") else target
    code = getattr(target, "__code__", None)
    if not isinstance(code, types.CodeType):
        raise _Unreadable(f"{fn!r} has no Python code")
    if id(target) in seen:
        return f"<recursion {target.__qualname__}>"
    seen.add(id(target))
    out = [getattr(target, "__qualname__", "?")]
    _code_text(code, out)
    for default in (target.__defaults__ or ()) + tuple((target.__kwdefaults__ or {}).values()):
        out.append(_plain(default) or f"<{type(default).__name__}>")
    for name, cell in zip(code.co_freevars, target.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            value = None
        out.append(f"{name}={_plain(value) or _callee(value, target, seen)}")
    module = getattr(target, "__module__", None)
    names = set(code.co_names)
    for const in code.co_consts:  # names of nested functions (lambdas, comprehensions)
        if isinstance(const, types.CodeType):
            names.update(const.co_names)
    for name in sorted(names):
        value = target.__globals__.get(name)
        if isinstance(value, types.FunctionType) and value.__module__ == module:
            out.append(f"{name}: {code_digest(value, seen)}")
        elif isinstance(value, _PLAIN) and not name.startswith("__"):
            out.append(f"{name}={value!r}")
    return hashlib.sha256("\n".join(out).encode()).hexdigest()


def _callee(value, within, seen: set) -> str:
    if isinstance(value, types.FunctionType) and value.__module__ == within.__module__:
        return code_digest(value, seen)
    return f"<{type(value).__qualname__}>"


def _types_reached(t, enums: dict, structs: dict) -> None:
    if t is None:
        return
    if t.kind == "enum" and t.py is not None:
        enums[f"{t.py.__module__}.{t.py.__qualname__}"] = [(m.name, repr(m.value)) for m in t.py]
    elif t.kind == "struct" and t.py is not None:
        key = f"{t.py.__module__}.{t.py.__qualname__}"
        if key in structs:
            return
        fields = []
        for f in dataclasses.fields(t.py):
            if f.default is not dataclasses.MISSING:
                default = _plain(f.default) or f"<{type(f.default).__name__}>"
            elif f.default_factory is not dataclasses.MISSING:
                default = f"factory {_plain(f.default_factory()) or '?'}"
            else:
                default = "required"
            info = t.fields.get(f.name)
            fields.append((f.name, info.text if info is not None else str(f.type), default))
        structs[key] = fields
        for child in t.fields.values():
            _types_reached(child, enums, structs)
    elif t.kind == "list":
        _types_reached(t.element, enums, structs)


def _functions(op) -> dict:
    state = getattr(op, "_state", None)
    if state is None:
        return {}
    found = {"fake": state.fake, "setup_context": state.setup_context, "backward": state.backward}
    if state.traced_body is not None and state.fake is None:
        found["traced_body"] = state.traced_body  # a Triton op's fake, its kernels traced into the graph
    return found


def definition(op) -> dict:
    """The parts of `op`'s digest, readable (`opforge.cache_key(op)`)."""
    enums: dict = {}
    structs: dict = {}
    signature = []
    for p in op._code.params:
        _types_reached(p.type, enums, structs)
        if p.default is inspect.Parameter.empty:
            default = "required"
        else:
            default = _plain(p.default) or f"<{type(p.default).__name__}>"
        signature.append((p.name, p.type.text, "kw" if p.kw_only else "pos", default))
    parts = {
        "name": op.name,
        "kind": "cpp" if getattr(op, "_duck_structs", False) else "python",
        "schema": op.schema,
        "signature": signature,
        "enums": enums,
        "structs": structs,
    }
    functions = {}
    for what, fn in _functions(op).items():
        if fn is None:
            functions[what] = None
            continue
        try:
            functions[what] = code_digest(fn)
        except _Unreadable as e:
            functions[what] = f"unreadable: {e}"
    parts["functions"] = functions
    return parts


def _identity(op) -> tuple:
    """What a digest was computed from, by identity: a decorator that swaps a
    function, or an op defined again, recomputes it."""
    return (op.schema,) + tuple(id(fn) for fn in _functions(op).values())


def digest(op) -> str:
    """The op's digest (hex); unique to this process where a function's code
    cannot be read."""
    key = _identity(op)
    memo = _memo.get(id(op))
    if memo is not None and memo[0] == key and memo[2]() is op:
        return memo[1]
    parts = definition(op)
    unreadable = [w for w, v in parts["functions"].items() if isinstance(v, str) and v.startswith("unreadable")]
    if unreadable:
        value = f"uncacheable-{uuid.uuid4().hex}"
        if op.name not in _said_uncacheable:
            _said_uncacheable.add(op.name)
            log.debug("%s: its %s has no Python code to key, so graphs calling it are compiled anew in every "
                      "process instead of read from torch.compile's caches (docs/compile_cache.md).",
                      op.name, " and ".join(unreadable))
    else:
        value = hashlib.sha256(repr(sorted(parts.items(), key=lambda kv: kv[0])).encode()).hexdigest()[:32]
    _memo[id(op)] = (key, value, weakref.ref(op, lambda _, i=id(op): _memo.pop(i, None)))
    return value


def note_all(ops) -> None:
    """Every op's `"opforge <name>" -> digest` in Inductor's
    unsafe_marked_cacheable_functions, once Inductor's config is loaded (it is
    by the time a graph is compiled). Cheap when nothing changed: digests are
    memoized per definition, and the config is assigned only on a change."""
    config = sys.modules.get("torch._inductor.config")
    marked = getattr(config, "unsafe_marked_cacheable_functions", None) if config is not None else None
    if not isinstance(marked, dict):
        return
    changed = False
    for op in list(ops):
        entry = f"opforge {op.name}"
        try:
            value = digest(op)
        except Exception as e:  # noqa: BLE001 - a compile start must not fail on one op's digest
            log.debug("%s: no digest (%s: %s); its graphs are compiled anew in every process.", op.name,
                      type(e).__name__, e)
            value = _noted.get(entry) if str(_noted.get(entry, "")).startswith("uncacheable-") else \
                f"uncacheable-{uuid.uuid4().hex}"
        if _noted.get(entry) != value or marked.get(entry) != value:
            _noted[entry] = value
            changed = True
    if changed:
        # A new dict, as torch's config expects an assignment.
        config.unsafe_marked_cacheable_functions = {**config.unsafe_marked_cacheable_functions, **_noted}


def explain(op) -> str:
    """What `op` contributes to the compile caches' keys, as text."""
    parts = definition(op)
    lines = [f"{parts['name']} ({parts['kind']} op): digest {digest(op)}",
             f"  schema: {parts['schema']}"]
    for name, text, kind, default in parts["signature"]:
        lines.append(f"  parameter {name}: {text}" + ("" if default == "required" else f" = {default}"))
    for qual, members in parts["enums"].items():
        lines.append(f"  enum {qual}: " + ", ".join(f"{n}={v}" for n, v in members))
    for qual, fields in parts["structs"].items():
        lines.append(f"  struct {qual}: " + ", ".join(
            f"{n}: {t}" + ("" if d == "required" else f" = {d}") for n, t, d in fields))
    for what, value in parts["functions"].items():
        lines.append(f"  {what}: " + ("none" if value is None else value[:16] if not value.startswith("unreadable")
                                      else value + " (graphs with the op are not reused across processes)"))
    lines.append("  not in the key: the op's body and kernels (compiled code calls the op)" +
                 ("; its C++ fake and backward" if parts["kind"] == "cpp" else ""))
    return "\n".join(lines)


def _note_registered() -> None:
    note_all(_registry.ops())


_registry.on_compile_start(_note_registered)
