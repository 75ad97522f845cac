"""Straight-line Python for the per-call paths of one op, built from the core's
mapping tree.

For `attn(q: Tensor, cfg: AttnCfg, mode: Literal["a", "b"] = "a") -> Tensor`
lowered to `(Tensor q, float cfg__scale, bool cfg__causal, str mode="a")`:

    def _call(_self, q, cfg, mode=_D1):                   # OpDef.__call__, as Dynamo traces it
        if type(mode) is not str or mode not in _A2: _bad3(mode)
        if not (isinstance(cfg, _S4)):
            if _compiling(): _none6((q, cfg, mode, ), _table5)
            _convert(q, cfg, mode)  # raises the boundary's error
        _l1 = cfg.scale
        _l2 = cfg.causal
        if (not isinstance(q, _Tensor7) or not _ok8(_l1, _l2)) and _compiling():
            _leaves10((q, _l1, _l2, ), _table9)   # raises the boundary's error for a bad leaf
        return _op(q, _l1, _l2, mode)

`_ok8` (`_leaf_test`) is one function per list of leaf kinds that Dynamo
folds to a constant where the leaves are constants.

Eager calls do not run `_call`: they enter C (opforge._C.OpBase), where the
op's boundary binds and converts the arguments, then either runs the body or
flattens them for the dispatcher; the dispatcher's kernel is C++ as well
(`_C.register_kernel`). Only `_call` (and `_rebuild_output` for an op that
returns a struct) is generated when the op is defined; the helpers fake
tensors, opcheck and autograd need are generated on first use. Ops whose
generated source is the same share its compiled code. `OpCode.source`
prints all of it.
"""

from __future__ import annotations

import dataclasses
import inspect
import linecache
import re
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import handles
from ._traced_call import TracedCall
from ._types import ENUMS, TypeInfo, Where
from ._writer import Writer as _Writer

EMPTY = inspect.Parameter.empty

class GradientCountError(RuntimeError, ValueError):
    """A backward returned more or fewer gradients than the op has
    parameters. A RuntimeError, as torch.autograd raises for this, and a
    ValueError, as MagiCompiler's decorator raises."""


class GradientTypeError(RuntimeError, TypeError):
    """A backward returned something other than a Tensor or None where a
    tensor's gradient goes. A RuntimeError, as torch.autograd raises for
    this, and a TypeError."""


_GRADIENT_COUNT = "backward returned {returned} gradient(s) but the op has {expected} parameter(s) ({names})"


def gradients_per_parameter(op: str, grads, names: list[str], said: str = _GRADIENT_COUNT) -> tuple:
    """What a backward returned, as one gradient per parameter: a bare
    gradient is a 1-tuple, another count a GradientCountError whose first
    words are `said` (a front end may use its own), then the fix:

        gradients_per_parameter("ns::f", g, ["x"])       -> (g,)
        gradients_per_parameter("ns::f", (g, g), ["x"])  -> GradientCountError: ns::f: backward returned 2
            gradient(s) but the op has 1 parameter(s) (x); return one per parameter, None where there is none.
    """
    if not isinstance(grads, tuple):
        grads = (grads,)
    if len(grads) != len(names):
        first = said.format(returned=len(grads), expected=len(names), names=", ".join(names))
        raise GradientCountError(f"{op}: {first}; return one per parameter, None where there is none.")
    return grads


@dataclass
class Param:
    name: str
    kw_only: bool
    default: Any  # EMPTY when none
    type: TypeInfo
    node: Any  # the core's MappingNode


@dataclass
class Leaf:
    name: str
    type_text: str  # flat schema type
    kw_only: bool
    default: Any  # Python value, EMPTY when none
    allowed: tuple
    enum: type | None
    handle: str
    is_presence: bool
    mutated: bool


@dataclass
class Site:
    """One leaf as reached from its parameter: `cfg.inner.w` for leaf
    `cfg__inner__w`; `value` is None-guarded for optional structs on the way."""

    index: int
    expr: str
    value: str
    type: TypeInfo
    where: Where
    guarded: bool


_PARAM_VAR = re.compile(r"\b__p\d+\b")
_READABLE: dict[tuple, str] = {}  # (source, parameter names) -> the source with those names

# Compiled module code by source text: ops with the same signature shape
# compile once.
_CODE_CACHE: dict[str, types.CodeType] = {}


def _compile(source: str, filename: str) -> types.CodeType:
    code = _CODE_CACHE.get(source)
    if code is None:
        code = compile(source, "<opforge>", "exec")
        if len(_CODE_CACHE) >= 4096:
            _CODE_CACHE.clear()
        _CODE_CACHE[source] = code
    return _retarget(code, filename)


def _retarget(code: types.CodeType, filename: str) -> types.CodeType:
    """The same code, reported under `filename` in tracebacks."""
    consts = code.co_consts
    if any(isinstance(c, types.CodeType) for c in consts):
        consts = tuple(_retarget(c, filename) if isinstance(c, types.CodeType) else c for c in consts)
        return code.replace(co_filename=filename, co_consts=consts)
    return code.replace(co_filename=filename)


# Chunk name -> the function it defines.
_CHUNKS = {
    "call": "_call",
    "make_fake_kernel": "_make_fake_kernel",
    "flatten_call": "_flatten_call",
    "flat_full": "_flat_full",
    "rebuild_inputs": "_rebuild_inputs",
    "flatten_output": "_flatten_output",
    "rebuild_output": "_rebuild_output",
    "body_positional": "_body_positional",
}


class OpCode:
    """The generated functions of one op. `call` exists from the start; the
    other attributes are generated on first use."""

    def __init__(self, builder: "Builder"):
        self._builder = builder
        self.namespace = builder.ns
        self._sources: dict[str, str] = {}
        self.params = builder.params
        self.tensor_leaf_positions = [i for i, leaf in enumerate(builder.leaves) if _is_tensor_text(leaf.type_text)]
        if not builder.leaf_returns:
            self._function("rebuild_output")  # `call` uses it
        self.call = self._function("call")

    def _function(self, chunk: str) -> Callable:
        name = _CHUNKS[chunk]
        fn = self.namespace.get(name)
        if fn is None:
            builder = self._builder
            source = getattr(builder, "chunk_" + chunk)()
            op = builder.op_name
            filename = f"<opforge {op}>" if chunk == "call" else f"<opforge {op} {chunk}>"
            code = _compile(source, filename)
            inner = next(c for c in code.co_consts if isinstance(c, types.CodeType))
            names = builder.param_names
            changes = {"co_varnames": tuple(names.get(v, v) for v in inner.co_varnames)}
            if chunk == "call":
                # Python's own binding errors then name the op:
                # "mylib::attn() got an unexpected keyword argument 'x'".
                changes["co_name"] = op
                if hasattr(inner, "co_qualname"):
                    changes["co_qualname"] = op
            renamed = inner.replace(**changes)
            code = code.replace(co_consts=tuple(renamed if c is inner else c for c in code.co_consts))
            exec(code, self.namespace)  # noqa: S102
            readable = builder.readable(source)
            linecache.cache[filename] = (len(readable), None, readable.splitlines(True), filename)
            self._sources[chunk] = readable
            fn = self.namespace[name]
        return fn

    def __getattr__(self, name: str):
        # make_fake_kernel, flatten_call, flat_full,
        # rebuild_inputs, flatten_output, rebuild_output, body_positional:
        # generated on first use, then plain attributes.
        if name in _CHUNKS:
            fn = self._function(name)
        elif name == "flatten_grads":
            fn = _make_flatten_grads(self._builder)
        else:
            raise AttributeError(name)
        setattr(self, name, fn)
        return fn

    @property
    def one_graph_call(self) -> bool:
        """Whether what the op takes and returns Dynamo can hold as it is
        (opforge._in_graph): no struct return (rebuilt in Python), no handle
        (resolved in Python), no mutated argument (tracked by Dynamo)."""
        builder = self._builder
        return builder.leaf_returns and not builder.any_handles and not any(leaf.mutated for leaf in builder.leaves)

    @property
    def source(self) -> str:
        """Every generated function, in a fixed order."""
        for chunk in _CHUNKS:
            self._function(chunk)
        return "\n".join(self._sources[c] for c in _CHUNKS)


class Builder(TracedCall):
    """The generated code of one op; `_call`, the function Dynamo traces, is
    TracedCall's (opforge._traced_call)."""

    def __init__(self, op_name: str, params: list[Param], leaves: list[Leaf], return_nodes: list,
                 return_types: list[TypeInfo | None], num_flat_returns: int, duck_structs: bool = False):
        self.op_name = op_name
        self.duck_structs = duck_structs  # any object with a struct's fields is accepted (C++ ops)
        self.params = params
        self.leaves = leaves
        self.return_nodes = return_nodes
        self.return_types = return_types
        self.num_flat_returns = num_flat_returns
        self.leaf_returns = all(n.is_leaf for n in return_nodes)
        self.ns: dict[str, Any] = {}
        self._ids: dict[tuple[str, int], str] = {}
        self._counter = 0
        self._sites: dict[str, list[Site]] = {}
        self._op_tables: dict[str, str] = {}  # const name -> "leaf" or "none": the tables of _call naming the op
        # Parameters are locals named by position in the generated source, so
        # that ops whose parameters differ only in name share compiled code;
        # each function's own names are put back into its code object.
        self.param_names = {f"__p{i}": p.name for i, p in enumerate(params)}
        self.any_handles = any(leaf.handle for leaf in leaves)  # the flatten then names where each one sits
        self._vars = {p.name: f"__p{i}" for i, p in enumerate(params)}

    def const(self, prefix: str, value: Any) -> str:
        """A name for `value` in the generated code's namespace."""
        key = (prefix, id(value))
        name = self._ids.get(key)
        if name is not None and self.ns[name] is value:
            return name
        self._counter += 1
        name = f"_{prefix}{self._counter}"
        self.ns[name] = value
        self._ids[key] = name
        return name

    def var(self, p: Param) -> str:
        """The local that holds parameter `p` in generated code: `__p0`, ..."""
        return self._vars[p.name]

    def readable(self, source: str) -> str:
        """`source` with the parameters' own names, for tracebacks and `OpCode.source`."""
        key = (source, tuple(self.param_names.values()))
        text = _READABLE.get(key)
        if text is None:
            text = _PARAM_VAR.sub(lambda m: self.param_names[m.group(0)], source)
            if len(_READABLE) >= 4096:
                _READABLE.clear()
            _READABLE[key] = text
        return text

    def tmp(self, prefix: str = "t") -> str:
        self._counter += 1
        return f"_{prefix}{self._counter}"

    def build(self, op_overload, boundary) -> OpCode:
        self.boundary = boundary
        self.ns.update(
            _compiling=torch.compiler.is_compiling,
            _op=op_overload,
            _convert=boundary.convert,
            _check_return=boundary.check_return,
        )
        return OpCode(self)

    # --- signatures -------------------------------------------------------

    def original_signature(self) -> str:
        parts, star = [], False
        for p in self.params:
            if p.kw_only and not star:
                parts.append("*")
                star = True
            var = self.var(p)
            parts.append(var if p.default is EMPTY else f"{var}={self.const('D', p.default)}")
        return ", ".join(parts)

    def flat_signature(self) -> str:
        parts, star = [], False
        for leaf in self.leaves:
            if leaf.kw_only and not star:
                parts.append("*")
                star = True
            parts.append(leaf.name if leaf.default is EMPTY else f"{leaf.name}={self.const('F', leaf.default)}")
        return ", ".join(parts)

    def flat_call_args(self, exprs: list[str]) -> str:
        return ", ".join(f"{leaf.name}={e}" if leaf.kw_only else e for leaf, e in zip(self.leaves, exprs))

    def original_call_args(self, exprs: list[str]) -> str:
        return ", ".join(f"{p.name}={e}" if p.kw_only else e for p, e in zip(self.params, exprs))

    # --- leaves as seen from the original arguments -----------------------

    def sites(self, p: Param) -> list[Site]:
        """Every non-presence leaf of `p`, depth-first."""
        found = self._sites.get(p.name)
        if found is None:
            found = []
            self._walk(p.node, p.type, self.var(p), [], Where.parameter(p.name), found)
            self._sites[p.name] = found
        return found

    def _walk(self, node, t: TypeInfo, expr: str, guards: list[str], where: Where, out: list[Site]):
        if node.is_leaf:
            value = expr
            for g in reversed(guards):
                value = f"(None if {g} is None else {value})"
            out.append(Site(node.leaf_index, expr, value, t, where, bool(guards)))
            return
        guards = guards + [expr] if node.optional else guards
        for child in node.children:
            name = child.name
            self._walk(child, t.fields[name], f"{expr}.{name}", guards, where.at_field(t.py, name), out)

    # --- validation ---------------------------------------------------------

    def emit_validation(self, w: _Writer):
        """Enum arguments become members (the body gets members), Literal
        values are checked. Runs before the fast path and under Dynamo."""
        checked = [p for p in self.params
                   if any(self.leaves[i].enum is not None or self.leaves[i].allowed for i in _leaf_indices(p.node))]
        for p in checked:
            var = self.var(p)
            if p.node.is_leaf:
                leaf = self.leaves[p.node.leaf_index]
                if leaf.enum is None:
                    continue
                cls = self.const("E", leaf.enum)
                to_member = self.const("to_member", _make_to_member(self.op_name, Where.parameter(p.name), leaf.enum))
                if p.type.kind == "list":
                    conv = f"[_e if type(_e) is {cls} else {to_member}(_e) for _e in {var}]"
                    w.line(f"{var} = {conv}" if not p.type.optional else f"if {var} is not None: {var} = {conv}")
                else:
                    guard = f"{var} is not None and " if p.type.optional else ""
                    w.line(f"if {guard}type({var}) is not {cls}: {var} = {to_member}({var})")
                continue
            # Enum fields of a struct: rebuild the struct with members when a
            # raw value was passed (rare; the check is a few `type(..) is`).
            conds = []
            for site in self.sites(p):
                leaf = self.leaves[site.index]
                if leaf.enum is None:
                    continue
                cls = self.const("E", leaf.enum)
                if site.type.kind == "list":
                    conds.append(f"any(type(_e) is not {cls} for _e in ({site.value} or ()))")
                elif site.type.optional or site.guarded:
                    var = self.tmp("v")
                    conds.append(f"(({var} := {site.value}) is not None and type({var}) is not {cls})")
                else:
                    conds.append(f"type({site.expr}) is not {cls}")
            if conds:
                norm = self.const("members", _make_struct_normalizer(self.op_name, p))
                var = self.var(p)
                guard = f"{var} is not None and " if p.node.optional else ""
                w.line(f"if {guard}({' or '.join(conds)}): {var} = {norm}({var})")
        for p in checked:
            for site in self.sites(p):
                leaf = self.leaves[site.index]
                if leaf.allowed and leaf.enum is None:
                    self.emit_literal_check(w, site, leaf)

    def emit_literal_check(self, w: _Writer, site: Site, leaf: Leaf):
        allowed = self.const("A", frozenset(leaf.allowed))
        raw_type = "str" if isinstance(leaf.allowed[0], str) else "int"
        bad = self.const("bad", _make_bad_literal(self.op_name, site.where, leaf.allowed))
        if site.type.kind == "list":
            w.line(f"for _e in ({site.value} or ()):")  # None for an absent optional list
            with w.block():
                w.line(f"if type(_e) is not {raw_type} or _e not in {allowed}: {bad}(_e)")
            return
        expr = site.expr
        if site.type.optional or site.guarded:
            expr = self.tmp("v")
            w.line(f"{expr} = {site.value}")
            w.line(f"if {expr} is not None and (type({expr}) is not {raw_type} or {expr} not in {allowed}): "
                   f"{bad}({expr})")
            return
        w.line(f"if type({expr}) is not {raw_type} or {expr} not in {allowed}: {bad}({expr})")

    # --- flatten: original arguments -> leaf expressions -------------------

    def emit_flatten(self, w: _Writer) -> list[str]:
        """Lines that compute every leaf; returns one expression per leaf."""
        out: dict[int, str] = {}
        for p in self.params:
            where = Where.parameter(p.name) if self.any_handles else None
            self._flatten_node(w, p.node, self.var(p), p.type, out, where, top=True)
        return [out[i] for i in range(len(self.leaves))]

    def _flatten_node(self, w: _Writer, node: tuple, expr: str, t: TypeInfo, out: dict[int, str],
                      where: Where | None, top: bool = False):
        if node.is_leaf:
            index = node.leaf_index
            leaf = self.leaves[index]
            value = expr
            if leaf.enum is not None:
                # Validation made every enum value a member.
                inner = f"[_e.value for _e in {expr}]" if t.kind == "list" else f"{expr}.value"
                value = f"(None if {expr} is None else {inner})" if t.optional else inner
            elif leaf.handle:
                cls = self.const("C", t.py)
                at = self.const("W", f"{self.op_name}: {where}")
                value = (f"({self.const('traced_handle', handles.traced_handle)}({expr}, {cls}, {at}) if _compiling() "
                         f"else {self.const('handle_for', handles.handle_for)}({expr}, {cls}, {at}))")
                if t.optional:
                    value = f"(None if {expr} is None else {value})"
            out[index] = value
            return
        optional, presence, children = node.optional, node.presence_index, node.children
        var = expr if top else self.tmp("s")
        if not top:
            w.line(f"{var} = {expr}")
        if optional:
            w.line(f"if {var} is None:")
            with w.block():
                for i in _leaf_indices(node):
                    w.line(f"_l{i} = {'False' if self.leaves[i].is_presence else 'None'}")
            w.line("else:")
            with w.block():
                w.line(f"_l{presence} = True")
                self._flatten_children(w, children, var, t, where)
        else:
            self._flatten_children(w, children, var, t, where)
        for i in _leaf_indices(node):
            out[i] = f"_l{i}"

    def _flatten_children(self, w: _Writer, children, var: str, t: TypeInfo, where: Where | None):
        for child in children:
            sub: dict[int, str] = {}
            self._flatten_node(w, child, f"{var}.{child.name}", t.fields[child.name], sub,
                               where.at_field(t.py, child.name) if where is not None else None)
            for i, e in sub.items():
                if e != f"_l{i}":
                    w.line(f"_l{i} = {e}")

    # --- rebuild: leaves -> original arguments -----------------------------

    def rebuild_node(self, node: tuple, t: TypeInfo, leaf_expr: Callable[[int], str], fake: bool = False,
                     where: Where = Where.RETURN, output: bool = False) -> str:
        """An expression for the original value of `node` from leaf
        expressions. `output`: the leaves are the op's flat returns."""
        if node.is_leaf:
            if output:
                return leaf_expr(node.leaf_index)
            leaf = self.leaves[node.leaf_index]
            e = leaf_expr(node.leaf_index)
            if leaf.enum is not None:
                table = self.const("V", ENUMS[leaf.enum].by_value)
                if t.kind == "list":
                    inner = f"[{table}[_e] for _e in {e}]"
                    return f"(None if {e} is None else {inner})" if t.optional else inner
                return f"(None if {e} is None else {table}[{e}])" if t.optional else f"{table}[{e}]"
            if leaf.handle and not fake:
                # Fake kernels get the handle itself: they must not touch the runner.
                resolve = self.const("resolve", handles.resolve)
                cls = self.const("C", t.py)
                at = self.const("W", f"{self.op_name}: {where}")
                call = f"{resolve}({e}, {cls}, {at})"
                return f"(None if {e} is None else {call})" if t.optional else call
            return e
        optional, presence, children = node.optional, node.presence_index, node.children
        cls = self.const("S", t.py)
        kwargs = []
        for child in children:
            sub = self.rebuild_node(child, t.fields[child.name], leaf_expr, fake,
                                    where.at_field(t.py, child.name), output)
            kwargs.append(f"{child.name}={sub}")
        construct = f"{cls}({', '.join(kwargs)})"
        if optional:
            return f"({construct} if {leaf_expr(presence)} else None)"
        return construct

    # --- outputs ------------------------------------------------------------

    def output_expr(self, flat_var: str) -> str:
        """flat op output -> original output"""
        if self.leaf_returns:
            return flat_var
        single = self.num_flat_returns == 1
        item = (lambda i: flat_var) if single else (lambda i: f"{flat_var}[{i}]")
        parts = [self.rebuild_node(n, rt, item, where=Where.RETURN, output=True)
                 for n, rt in zip(self.return_nodes, self.return_types)]
        return parts[0] if len(self.return_nodes) == 1 else f"({', '.join(parts)},)"

    def flatten_output_expr(self, var: str) -> str:
        """original output -> flat output"""
        if self.leaf_returns:
            return var
        exprs: dict[int, str] = {}
        many = len(self.return_nodes) > 1
        for k, node in enumerate(self.return_nodes):
            self._flatten_return(node, f"{var}[{k}]" if many else var, exprs)
        ordered = [exprs[i] for i in range(self.num_flat_returns)]
        return ordered[0] if self.num_flat_returns == 1 else f"({', '.join(ordered)},)"

    def _flatten_return(self, node, expr, out):
        if node.is_leaf:
            out[node.leaf_index] = expr
            return
        for child in node.children:
            self._flatten_return(child, f"{expr}.{child.name}", out)

    def _wrap_output(self, expr: str) -> str:
        return expr if self.leaf_returns else f"_rebuild_output({expr})"

    # --- the chunks (chunk_call: TracedCall) ------------------------------------

    def chunk_make_fake_kernel(self) -> str:
        """fn (original signature) -> flat fake kernel; handles stay ints."""
        w = _Writer()
        w.line("def _make_fake_kernel(_fn):")
        with w.block():
            w.line(f"def fake_kernel({self.flat_signature()}):")
            with w.block():
                args = [self.rebuild_node(p.node, p.type, lambda i: self.leaves[i].name, True, Where.parameter(p.name))
                        for p in self.params]
                leaves = "".join(f"{leaf.name}, " for leaf in self.leaves)
                w.line(f"_o = _check_return(_fn({self.original_call_args(args)}), ({leaves}))")
                w.line(f"return {self.flatten_output_expr('_o')}")
            w.line("return fake_kernel")
        return w.text()

    def chunk_flatten_call(self) -> str:
        """The dispatcher-path arguments, for opcheck and tests."""
        w = _Writer()
        w.line("def _flatten_call(*_a, **_k):")
        with w.block():
            names = [self.var(p) for p in self.params]
            w.line(f"({', '.join(names)}{',' if len(names) == 1 else ''}) = _convert(*_a, **_k)")
            exprs = self.emit_flatten(w)
            pos = [e for leaf, e in zip(self.leaves, exprs) if not leaf.kw_only]
            kw = [f"{leaf.name!r}: {e}" for leaf, e in zip(self.leaves, exprs) if leaf.kw_only]
            w.line(f"return ({', '.join(pos)}{',' if len(pos) == 1 else ''}), {{{', '.join(kw)}}}")
        return w.text()

    def chunk_flat_full(self) -> str:
        w = _Writer()
        w.line(f"def _flat_full({self.flat_signature()}):")
        with w.block():
            names = [leaf.name for leaf in self.leaves]
            w.line(f"return ({', '.join(names)}{',' if len(names) == 1 else ''})")
        return w.text()

    def chunk_rebuild_inputs(self) -> str:
        w = _Writer()
        w.line("def _rebuild_inputs(_leaves):")
        with w.block():
            args = [self.rebuild_node(p.node, p.type, lambda i: f"_leaves[{i}]", where=Where.parameter(p.name))
                    for p in self.params]
            w.line(f"return ({', '.join(args)}{',' if len(args) == 1 else ''})")
        return w.text()

    def chunk_flatten_output(self) -> str:
        w = _Writer()
        w.line("def _flatten_output(_o):")
        with w.block():
            w.line(f"return {self.flatten_output_expr('_o')}")
        return w.text()

    def chunk_rebuild_output(self) -> str:
        w = _Writer()
        w.line("def _rebuild_output(_o):")
        with w.block():
            w.line(f"return {self.output_expr('_o')}")
        return w.text()

    def chunk_body_positional(self) -> str:
        w = _Writer()
        w.line("def _body_positional(_fn, *_a):")
        with w.block():
            w.line(f"return _fn({self.original_call_args([f'_a[{i}]' for i in range(len(self.params))])})")
        return w.text()


def _leaf_indices(node) -> list[int]:
    if node.is_leaf:
        return [node.leaf_index]
    out = [node.presence_index] if node.optional else []
    for child in node.children:
        out.extend(_leaf_indices(child))
    return out


def _is_tensor_text(text: str) -> bool:
    return text.startswith("Tensor")


def _enum_error(op: str, where: Where, cls: type, value) -> ValueError:
    allowed = ", ".join(f"{cls.__qualname__}.{m.name}" for m in cls)
    return ValueError(f"{op}: {where}: {value!r} is not a member or value of {cls.__qualname__}. "
                      f"Pass one of {allowed}.")


def _make_to_member(op: str, where: Where, cls: type):
    by_value = ENUMS[cls].by_value

    def to_member(value):
        if isinstance(value, cls):
            return value
        if type(value) in (str, int) and value in by_value:
            return by_value[value]
        raise _enum_error(op, where, cls, value)

    return to_member


def _make_struct_normalizer(op: str, param: Param):
    """A function that rebuilds a struct argument with enum members where the
    caller passed raw values (and rejects values that are neither)."""

    def member(cls, value, where):
        if isinstance(value, cls):
            return value
        by_value = ENUMS[cls].by_value
        if type(value) in (str, int) and value in by_value:
            return by_value[value]
        raise _enum_error(op, where, cls, value)

    def normalize(obj, t: TypeInfo):
        changes = {}
        for name, ft in t.fields.items():
            value = getattr(obj, name)
            where = Where.parameter(param.name).at_field(t.py, name)
            if value is None:
                continue
            if ft.kind == "enum":
                new = member(ft.py, value, where)
            elif ft.kind == "list" and ft.element.kind == "enum":
                new = [member(ft.element.py, v, where) for v in value]
            elif ft.kind == "struct":
                new = normalize(value, ft)
            else:
                continue
            if new is not value:
                changes[name] = new
        return dataclasses.replace(obj, **changes) if changes else obj

    return lambda obj: normalize(obj, param.type)


def _make_bad_literal(op: str, where: Where, allowed: tuple):
    def bad(value):
        raise ValueError(f"{op}: {where}: {value!r} is not one of the allowed values {list(allowed)!r}.")

    return bad


def _make_flatten_grads(builder: Builder):
    """per-original-parameter grads -> per-leaf grads."""
    params = builder.params
    leaves = builder.leaves
    op = builder.op_name
    is_tensor = [_is_tensor_text(leaf.type_text) for leaf in leaves]
    top = [(p, p.node.leaf_index if p.node.is_leaf else None) for p in params]

    def not_a_tensor(grad, where):
        return GradientTypeError(f"{op}: backward returned a {type(grad).__name__} for {where}, which is not a "
                                 f"Tensor argument; return None there.")

    def assign(node, t, grad, out, where):
        if node.is_leaf:
            if grad is not None and not is_tensor[node.leaf_index]:
                raise not_a_tensor(grad, where)
            out[node.leaf_index] = grad
            return
        for child in node.children:
            name = child.name
            field_where = where.at_field(t.py, name)
            if grad is None:
                sub = None
            elif isinstance(grad, dict):
                sub = grad.get(name)
            elif isinstance(grad, t.py) or all(hasattr(grad, c.name) for c in node.children):
                # An instance, or any object with the struct's field names
                # (a types.SimpleNamespace, another dataclass, ...).
                sub = getattr(grad, name)
            else:
                missing = [c.name for c in node.children if not hasattr(grad, c.name)]
                raise TypeError(
                    f"{op}: backward returned a {type(grad).__name__} for {where}, which has no field "
                    f"{missing[0]!r}; return None, a {t.py.__qualname__}, an object with its fields or a dict "
                    f"keyed by field name."
                )
            assign(child, t.fields[name], sub, out, field_where)
        if isinstance(grad, dict):
            unknown = set(grad) - {child.name for child in node.children}
            if unknown:
                raise TypeError(
                    f"{op}: backward returned a dict for {where} with keys {sorted(unknown)} that are not "
                    f"fields of {t.py.__qualname__}; use its field names."
                )

    names = [p.name for p in params]

    def flatten_grads(grads):
        grads = gradients_per_parameter(op, grads, names)
        out = [None] * len(leaves)
        for (p, index), g in zip(top, grads):
            if g is None:
                continue
            if index is None:
                assign(p.node, p.type, g, out, Where.parameter(p.name))
            else:
                if not is_tensor[index]:
                    raise not_a_tensor(g, Where.parameter(p.name))
                out[index] = g
        return out

    return flatten_grads
