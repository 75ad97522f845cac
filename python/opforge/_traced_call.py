"""`_call`: the generated function Dynamo traces for an op (its
`OpDef.__call__`), and the checks it runs on traced values
(docs/architecture.md#the-python-package).

For `attn(q: Tensor, cfg: AttnCfg, mode: Literal["a", "b"] = "a") -> Tensor`
see opforge._codegen's docstring. Eager calls never run it; its source is
made once per signature and shared by ops with the same one.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch

from ._types import TypeInfo
from ._writer import Writer as _Writer

EMPTY = inspect.Parameter.empty

# Signature -> `_call`'s source, counter, shared constants, their ids and the
# templates of its tables (Builder.chunk_call).
_CALL_CACHE: dict[tuple, tuple] = {}
# The constants of `_call` that do not depend on the op: its struct classes,
# helpers, torch.Tensor and plain defaults.
_SHARED_CONSTS = frozenset({"S", "none", "Tensor", "leaves", "D", "ok"})


def _op_table_template(op: str, kind: str, table: tuple) -> tuple | None:
    """A table of `_call` without the op's name, or None where the name is
    not where it is expected."""
    if kind == "leaf":
        return tuple(row[1:] for row in table) if all(row[0] == op for row in table) else None
    prefix = f"{op}: "
    if not all(message.startswith(prefix) for _i, _path, message in table):
        return None
    return tuple((i, path, message[len(prefix):]) for i, path, message in table)


def _op_table(op: str, kind: str, template: tuple) -> tuple:
    if kind == "leaf":
        return tuple((op, *row) for row in template)
    return tuple((i, path, f"{op}: {message}") for i, path, message in template)


class TracedCall:
    """The `_call` chunk of a Builder (opforge._codegen), which supplies
    `const`, `var`, `emit_validation`, `emit_flatten`, the signatures, the
    boundary and the op's leaves and parameters."""

    def chunk_call(self) -> str:
        """`_call`'s source, made once per signature: ops whose parameters
        have the same names, types (the same struct classes) and plain
        defaults share it, and its constants but the two tables that name
        the op (docs/performance.md#start-up-and-compile-time)."""
        key = self._call_key()
        hit = _CALL_CACHE.get(key) if key is not None else None
        if hit is not None:
            source, counter, shared, ids, tables = hit
            self.ns.update(shared)
            self._ids.update(ids)
            for name, (kind, template) in tables.items():
                self.ns[name] = _op_table(self.op_name, kind, template)
            self._counter = counter
            return source
        before = set(self.ns)
        self._op_tables = {}
        source = self._generate_call()
        if key is not None:
            entry = self._call_entry(source, before)
            if entry is not None:
                if len(_CALL_CACHE) >= 4096:
                    _CALL_CACHE.clear()
                _CALL_CACHE[key] = entry
        return source

    def _call_key(self) -> tuple | None:
        """What `_call`'s source and shared constants depend on, or None
        where a constant is the op's own (an enum, a Literal, a handle, a
        default other than a plain value) or another chunk came first."""
        if self._counter or any(leaf.enum is not None or leaf.allowed or leaf.handle for leaf in self.leaves):
            return None
        parts: list = [self.duck_structs, self.leaf_returns,
                       tuple((leaf.name, leaf.type_text, leaf.kw_only, leaf.is_presence, leaf.mutated)
                             for leaf in self.leaves)]
        for p in self.params:
            default = p.default
            if default is EMPTY:
                dkey: tuple = ()
            elif default is None or type(default) in (bool, int, float, str):
                dkey = (type(default), default)
            else:
                return None
            t = p.type
            parts.append((p.name, p.kw_only, dkey, t.kind, t.text, t.optional, t.py))
        return tuple(parts)

    def _call_entry(self, source: str, before: set) -> tuple | None:
        made = {name: self.ns[name] for name in self.ns if name not in before}
        tables = {}
        for name, kind in self._op_tables.items():
            template = _op_table_template(self.op_name, kind, made.pop(name))
            if template is None:
                return None
            tables[name] = (kind, template)
        ids = {key: name for key, name in self._ids.items() if name in made}
        if any(prefix not in _SHARED_CONSTS for prefix, _id in ids):
            return None
        return source, self._counter, made, ids, tables

    def _generate_call(self) -> str:
        """The op as Dynamo traces it (OpDef.__call__, hence `_self`): values
        Dynamo sees as constants are checked here, the rest by torch when the
        flat op runs on fake tensors."""
        w = _Writer()
        w.line(f"def _call(_self, {self.original_signature()}):")
        with w.block():
            self.emit_validation(w)
            checks, missing = [], []
            for p in self.params:
                if p.node.is_leaf:
                    continue
                if not self.duck_structs:
                    cls = self.const("S", p.type.py)
                    check = f"isinstance({self.var(p)}, {cls})"
                    checks.append(f"({self.var(p)} is None or {check})" if p.node.optional else check)
                missing.extend(self._missing_fields(p.node, p.type, self.var(p), False))
            if checks or missing:
                bad = [f"not ({' and '.join(checks)})"] if checks else []
                w.line(f"if {' or '.join(bad + missing)}:")
                with w.block():
                    table = self._none_errors()
                    if table:
                        # Dynamo cannot call into the boundary: the same message, raised in Python.
                        values = "".join(f"{self.var(p)}, " for p in self.params)
                        name = self.const('table', table)
                        self._op_tables[name] = "none"
                        w.line(f"if _compiling(): {self.const('none', _raise_none_error)}(({values}), {name})")
                    w.line(f"_convert({self.original_call_args([self.var(p) for p in self.params])})  # raises")
            exprs = self.emit_flatten(w)
            checks = tuple(self.boundary.leaf_checks())
            if any(c is not None for c in checks):
                # Torch checks these values again when the flat op runs on fake
                # tensors, with its own message: the boundary's comes first.
                # Dynamo evaluates the guards of whatever the test reads on
                # every compiled call, so it reads only builtins, literals and
                # one test function; the helper that raises is traced only
                # when a value is bad. A Tensor leaf is one isinstance; the
                # other leaves go to one call of `_leaf_test`'s function, which
                # Dynamo evaluates at once where the values are constants.
                values = "".join(f"{e}, " for e, c in zip(exprs, checks) if c is not None)
                table = tuple((self.op_name, *c) for c in checks if c is not None)
                tensor = self.const("Tensor", torch.Tensor)
                bad = [_traced_leaf_test(e, tensor, *c) for e, c in zip(exprs, checks)
                       if c is not None and c[0] == "tensor"]
                scalars = [(e, c) for e, c in zip(exprs, checks) if c is not None and c[0] != "tensor"]
                if scalars:
                    ok = self.const("ok", _leaf_test(tuple((c[0], c[3]) for _e, c in scalars)))
                    bad.append(f"not {ok}({', '.join(e for e, _c in scalars)})")
                # `_compiling()` last: traced only where a value may be bad.
                w.line(f"if ({' or '.join(bad)}) and _compiling():")
                with w.block():
                    # The table names the op: a constant, so that ops of one signature share compiled code.
                    name = self.const('table', table)
                    self._op_tables[name] = "leaf"
                    w.line(f"{self.const('leaves', _check_traced_leaves)}(({values}), {name})")
            w.line(f"return {self._wrap_output(f'_op({self.flat_call_args(exprs)})')}")
        return w.text()

    def _none_errors(self) -> tuple:
        """(parameter index, field path, message) for each field of a struct
        parameter where None is an error, parents first, as eager converts."""
        table = []

        def walk(index, node, path):
            for child in node.children:
                sub = path + (child.name,)
                message = self.boundary.none_error(index, list(sub))
                if message:
                    table.append((index, sub, message))
                if not child.is_leaf:
                    walk(index, child, sub)

        for i, p in enumerate(self.params):
            if not p.node.is_leaf:
                walk(i, p.node, ())
        return tuple(table)

    def _missing_fields(self, node, t: TypeInfo, expr: str, in_optional: bool) -> list[str]:
        """Conditions that hold when a required field of the struct `expr` is
        None inside an Optional struct. The flat leaves there all take None
        (for an absent struct), so the dispatcher would let it through:
        `cfg: Optional[Cfg]` -> ['(cfg is not None and (cfg.scale is None))']."""
        if node.optional and not in_optional:
            inner = self._missing_fields(node, t, expr, True)
            return [f"({expr} is not None and ({' or '.join(inner)}))"] if inner else []
        conds = []
        for child in node.children:
            ct, e = t.fields[child.name], f"{expr}.{child.name}"
            if child.is_leaf:
                if in_optional and not ct.optional:
                    conds.append(f"{e} is None")
            elif child.optional:
                conds.extend(self._missing_fields(child, ct, e, False))
            else:
                if in_optional:
                    conds.append(f"{e} is None")
                conds.extend(self._missing_fields(child, ct, e, in_optional))
        return conds


_INT64 = (-(2**63), 2**63 - 1)


def _describe(value) -> str:
    """A value as the boundary's messages show it: 'float 1.5', "str 'a'", 'None'."""
    if value is None:
        return "None"
    name = type(value).__name__
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return name if text == name else f"{name} {text}"


def _bad_leaf(kind: str, value) -> bool:
    """Whether `value` is one the boundary refuses for a leaf of `kind`; only
    clear cases (what torch's conversion would take is left to it)."""
    if kind == "tensor":
        return not isinstance(value, torch.Tensor)
    if kind == "int":
        return isinstance(value, (float, str, list, tuple))
    if kind == "float" or kind == "bool":
        return isinstance(value, (str, list, tuple))
    if kind == "str":
        return not isinstance(value, str)
    element = kind[5:]  # "list:int"
    if not isinstance(value, (list, tuple)):
        return isinstance(value, str) or element == "tensor"
    return any(item is None or _bad_leaf(element, item) or _past_int64(element, item) for item in value)


def _past_int64(kind: str, value) -> bool:
    return kind == "int" and type(value) is int and not _INT64[0] <= value <= _INT64[1]


def _traced_leaf_test(expr: str, tensor: str, kind: str, where: str, expected: str, none_ok: bool) -> str:
    """A Python expression, true where `_check_traced_leaves` may find the
    leaf `expr` bad (`_bad_leaf` and `_past_int64` written out), reading
    builtins, literals and `tensor`, the generated code's name for
    torch.Tensor (no guards beyond them); a list's items are left to that
    function. Dynamo runs it once per call site it traces, so a value of the
    leaf's own type is accepted first, by one isinstance (on a constant: no
    guard; `type(..)` would add one per leaf), and the full test is evaluated
    only past it (it accepts whatever that accepts)."""
    none = f"{expr} is None" if not none_ok else "False"
    if kind == "tensor":
        # None is no Tensor: the one isinstance covers it where None is an error.
        return f"not isinstance({expr}, {tensor})" if not none_ok else \
            f"({expr} is not None and not isinstance({expr}, {tensor}))"
    if kind == "int":
        low, high = _INT64
        return (f"((not isinstance({expr}, int) or not {low} <= {expr} <= {high}) and ({none} or "
                f"isinstance({expr}, (float, str, list, tuple)) or (type({expr}) is int and not "
                f"{low} <= {expr} <= {high})))")
    if kind in ("float", "bool"):
        return f"(not isinstance({expr}, {kind}) and ({none} or isinstance({expr}, (str, list, tuple))))"
    if kind == "str":
        return f"(not isinstance({expr}, str) and ({expr} is not None and not isinstance({expr}, str) or {none}))"
    return "True"  # list:<kind>


# (kind, None allowed) of each non-Tensor leaf -> its test (`_leaf_test`).
_LEAF_TESTS: dict[tuple, Callable] = {}


def _leaf_test(spec: tuple) -> Callable:
    """`ok(*values)`: whether `_check_traced_leaves` accepts these values for
    leaves of `spec`'s kinds, the test of a traced `_call`. Dynamo calls it
    as it is where every value is a constant (registered with
    `torch.compiler.substitute_in_graph(..., can_constant_fold_through=True)`:
    one step of tracing, not one per leaf) and otherwise traces
    `_traced_leaf_test`'s expressions (a SymInt, say), which accept whatever
    it accepts; where torch cannot register it, Dynamo traces it as Python.
    One function per spec, shared by every op with it."""
    test = _LEAF_TESTS.get(spec)
    if test is not None:
        return test

    def ok(*values):
        for value, (kind, none_ok) in zip(values, spec):
            if value is None:
                if not none_ok:
                    return False
            elif _past_int64(kind, value) or _bad_leaf(kind, value):
                return False
        return True

    names = [f"v{i}" for i in range(len(spec))]
    tests = " or ".join(_traced_leaf_test(n, "_Tensor", kind, "", "", none_ok)
                        for n, (kind, none_ok) in zip(names, spec))
    namespace = {"_Tensor": torch.Tensor}
    exec(compile(f"def traced_ok({', '.join(names)}):\n    return not ({tests})\n", "<opforge>", "exec"),
         namespace)
    try:
        test = torch.compiler.substitute_in_graph(ok, can_constant_fold_through=True)(namespace["traced_ok"])
    except Exception:  # a torch without it, or that refuses: `ok` is traced as Python
        test = ok
    if len(_LEAF_TESTS) >= 4096:
        _LEAF_TESTS.clear()
    _LEAF_TESTS[spec] = test
    return test


def _check_traced_leaves(values: tuple, table: tuple) -> None:
    """Raises the boundary's error for a flat leaf value it refuses, where
    torch.compile traces the op (it cannot call into the boundary there)."""
    for value, (op, kind, where, expected, none_ok) in zip(values, table):
        if value is None:
            if none_ok:
                continue
        elif _past_int64(kind, value):
            raise OverflowError(f"{op}: {where}: {_describe(value)} is outside the range of torch's int (64-bit: "
                                f"-2**63 to 2**63-1). Pass a value in that range, or a float or Tensor parameter "
                                f"for larger values.")
        elif not _bad_leaf(kind, value):
            continue
        raise TypeError(f"{op}: {where}: expected {expected}, got {_describe(value)}. Pass {expected}.")


def _raise_none_error(values: tuple, table: tuple) -> None:
    """Raises the boundary's TypeError for the first field in `table` that
    is None while its struct is there; traceable by Dynamo."""
    for index, path, message in table:
        value = values[index]
        for name in path[:-1]:
            if value is None:
                break
            value = getattr(value, name)
        if value is not None and getattr(value, path[-1]) is None:
            raise TypeError(message)
