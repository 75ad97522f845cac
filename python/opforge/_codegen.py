"""Straight-line Python for the per-call paths of one op, built from the core's
mapping tree.

For `attn(q: Tensor, cfg: AttnCfg, mode: Literal["a", "b"] = "a") -> Tensor`
lowered to `(Tensor q, float cfg__scale, bool cfg__causal, str mode="a")`:

    def attn(q, cfg, mode=_D2):                      # the op, as users call it
        if type(mode) is not str or mode not in _A2: _bad(2, mode)
        if not _compiling():
            _r = _fp((q,), q, cfg, mode)              # eager fast path (C++)
            if _r is not _NI: ...
        return _op(q, cfg.scale, cfg.causal, mode)    # the dispatcher path

    def kernel(q, cfg__scale, cfg__causal, mode="a"):  # what torch calls
        cfg = _cache1.get((cfg__scale, cfg__causal)) ... or _S1(scale=..., causal=...)
        return _fn(q, cfg, mode)

Sources are plain text (see `OpCode.source`), so they can be printed and read.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import keyword
from dataclasses import dataclass, field
from typing import Any

import torch

from . import handles
from ._types import ENUMS, STRUCTS, TypeInfo

EMPTY = inspect.Parameter.empty

# Flat leaf types whose values can key a cache of rebuilt frozen structs.
_HASHABLE_LEAF = ("SymInt", "int", "float", "bool", "str", "ScalarType", "Device", "Layout", "MemoryFormat")


@dataclass
class Param:
    name: str
    kw_only: bool
    default: Any  # EMPTY when none
    type: TypeInfo
    node: tuple  # core mapping node


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
class OpCode:
    source: str
    call: Any
    make_kernel: Any  # fn (original signature) -> flat kernel
    make_fake_kernel: Any  # the same, handles passed as ints
    flat_full: Any  # flat kernel signature -> tuple of every leaf
    rebuild_inputs: Any  # every leaf -> tuple of original arguments
    flatten_output: Any  # original output -> flat output
    rebuild_output: Any  # flat output -> original output
    flatten_grads: Any  # per-parameter grads -> per-leaf grads
    flatten_call: Any  # original call -> (positional leaves, keyword-only leaves)
    body_positional: Any  # fn(*all original args) honouring keyword-only params
    tensor_leaf_positions: list[int]  # indices of Tensor-like leaves in flat order
    namespace: dict = field(default_factory=dict)


class _Writer:
    def __init__(self):
        self.lines: list[str] = []
        self.indent = 0

    def line(self, text: str = ""):
        self.lines.append("    " * self.indent + text if text else "")

    def block(self):
        writer = self

        class _Block:
            def __enter__(self):
                writer.indent += 1

            def __exit__(self, *exc):
                writer.indent -= 1

        return _Block()


class Builder:
    def __init__(self, op_name: str, params: list[Param], leaves: list[Leaf], return_nodes: list,
                 return_types: list[TypeInfo | None], num_flat_returns: int):
        self.op_name = op_name
        self.params = params
        self.leaves = leaves
        self.return_nodes = return_nodes
        self.return_types = return_types
        self.num_flat_returns = num_flat_returns
        self.ns: dict[str, Any] = {}
        self.fake_mode = False
        self.w = _Writer()
        self._counter = 0

    def const(self, prefix: str, value: Any) -> str:
        for k, v in self.ns.items():
            if v is value and k.startswith("_" + prefix):
                return k
        self._counter += 1
        name = f"_{prefix}{self._counter}"
        self.ns[name] = value
        return name

    def tmp(self, prefix: str = "t") -> str:
        self._counter += 1
        return f"_{prefix}{self._counter}"

    # --- signatures -------------------------------------------------------

    def original_signature(self) -> str:
        parts, star = [], False
        for p in self.params:
            if p.kw_only and not star:
                parts.append("*")
                star = True
            parts.append(p.name if p.default is EMPTY else f"{p.name}={self.const('D', p.default)}")
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
        return ", ".join(
            f"{leaf.name}={e}" if leaf.kw_only else e for leaf, e in zip(self.leaves, exprs)
        )

    def original_call_args(self, exprs: list[str]) -> str:
        return ", ".join(f"{p.name}={e}" if p.kw_only else e for p, e in zip(self.params, exprs))

    # --- flatten: original arguments -> leaf expressions -------------------

    def flatten_node(self, node: tuple, expr: str, t: TypeInfo, out: dict[int, str], path: str):
        w = self.w
        if node[0] == "leaf":
            index = node[2]
            leaf = self.leaves[index]
            value = expr
            if leaf.enum is not None:
                value = self.emit_enum_value(expr, leaf, t, index, path)
            elif leaf.handle:
                cls = self.const("C", t.py)
                value = (f"({self.const('traced_handle', handles.traced_handle)}({expr}) if _compiling() "
                         f"else {self.const('handle_for', handles.handle_for)}({expr}, {cls}))")
                if t.optional:
                    value = f"(None if {expr} is None else {value})"
            out[index] = value
            return
        _, _name, _struct, optional, presence, children = node
        var = self.tmp("s")
        w.line(f"{var} = {expr}")
        if optional:
            w.line(f"if {var} is None:")
            with w.block():
                for i in _leaf_indices(node):
                    w.line(f"_l{i} = {'False' if self.leaves[i].is_presence else 'None'}")
            w.line("else:")
            with w.block():
                w.line(f"_l{presence} = True")
                self._flatten_children(children, var, t, path)
        else:
            self._flatten_children(children, var, t, path)
        for i in _leaf_indices(node):
            out[i] = f"_l{i}"

    def _flatten_children(self, children, var, t: TypeInfo, path):
        for child in children:
            ft = t.fields[child[1]]
            sub: dict[int, str] = {}
            self.flatten_node(child, f"{var}.{child[1]}", ft, sub, f"{path}.{child[1]}")
            for i, e in sub.items():
                if e != f"_l{i}":
                    self.w.line(f"_l{i} = {e}")

    def emit_enum_value(self, expr: str, leaf: Leaf, t: TypeInfo, index: int, path: str) -> str:
        """The raw value of an enum leaf. Top-level enum parameters were
        normalized to members already; fields may hold a member or a value."""
        is_param = "." not in expr
        if is_param:
            if t.kind == "list":
                inner = f"[_e.value for _e in {expr}]"
            else:
                inner = f"{expr}.value"
        else:
            conv = self.const("to_raw", _make_to_raw(self.op_name, path, leaf.enum))
            inner = f"[{conv}(_e) for _e in {expr}]" if t.kind == "list" else f"{conv}({expr})"
        return f"(None if {expr} is None else {inner})" if t.optional else inner

    def emit_literal_check(self, expr: str, leaf: Leaf, t: TypeInfo, index: int, path: str,
                           may_be_none: bool = False):
        allowed = self.const("A", frozenset(leaf.allowed))
        raw_type = "str" if isinstance(leaf.allowed[0], str) else "int"
        bad = self.const("bad", _make_bad_literal(self.op_name, path, leaf.allowed))
        if t.kind == "list":
            self.w.line(f"for _e in ({expr} or ()):")  # None for an absent optional list
            with self.w.block():
                self.w.line(f"if type(_e) is not {raw_type} or _e not in {allowed}: {bad}(_e)")
            return
        if may_be_none:
            var = self.tmp("v")
            self.w.line(f"{var} = {expr}")
            expr = var
        guard = f"{expr} is not None and " if may_be_none else ""
        self.w.line(f"if {guard}(type({expr}) is not {raw_type} or {expr} not in {allowed}): {bad}({expr})")

    # --- rebuild: leaves -> original arguments -----------------------------

    def rebuild_node(self, node: tuple, t: TypeInfo, leaf_expr) -> str:
        if node[0] == "leaf":
            leaf = self.leaves[node[2]]
            e = leaf_expr(node[2])
            if leaf.enum is not None:
                table = self.const("V", ENUMS[leaf.enum].by_value)
                if t.kind == "list":
                    inner = f"[{table}[_e] for _e in {e}]"
                    return f"(None if {e} is None else {inner})" if t.optional else inner
                return f"(None if {e} is None else {table}[{e}])" if t.optional else f"{table}[{e}]"
            if leaf.handle and not self.fake_mode:
                # Fake kernels get the handle itself: they must not touch the runner.
                resolve = self.const("resolve", handles.resolve)
                cls = self.const("C", t.py)
                return f"(None if {e} is None else {resolve}({e}, {cls}))" if t.optional else f"{resolve}({e}, {cls})"
            return e
        _, _name, _struct, optional, presence, children = node
        info = STRUCTS[t.py]
        cls = self.const("S", t.py)
        kwargs = []
        for child in children:
            kwargs.append(f"{child[1]}={self.rebuild_node(child, t.fields[child[1]], leaf_expr)}")
        construct = f"{cls}({', '.join(kwargs)})"
        indices = _leaf_indices(node)
        if _cacheable(info, [self.leaves[i] for i in indices if not self.leaves[i].is_presence]):
            cache = self.const("cache", {})
            get = self.const("cached", _cached)
            key_leaves = [leaf_expr(i) for i in indices if not self.leaves[i].is_presence]
            construct = f"{get}({cache}, ({', '.join(key_leaves)},), lambda: {construct})"
            zero_floats = [leaf_expr(i) for i in indices if self.leaves[i].type_text.startswith("float")]
            if zero_floats:
                # 0.0 == -0.0, so a zero float must not hit the cache.
                plain = f"{cls}({', '.join(kwargs)})"
                cond = " and ".join(f"{z}" for z in zero_floats)
                construct = f"({construct} if {cond} else {plain})"
        if optional:
            return f"({construct} if {leaf_expr(presence)} else None)"
        return construct

    # --- outputs ------------------------------------------------------------

    def output_expr(self, flat_var: str) -> str:
        """flat op output -> original output"""
        if all(n[0] == "leaf" for n in self.return_nodes):
            return flat_var
        single = self.num_flat_returns == 1
        item = (lambda i: flat_var) if single else (lambda i: f"{flat_var}[{i}]")
        parts = [self.rebuild_node(n, rt, item) for n, rt in zip(self.return_nodes, self.return_types)]
        return parts[0] if len(self.return_nodes) == 1 else f"({', '.join(parts)},)"

    def flatten_output_expr(self, var: str) -> str:
        """original output -> flat output"""
        if all(n[0] == "leaf" for n in self.return_nodes):
            return var
        exprs: dict[int, str] = {}
        many = len(self.return_nodes) > 1
        for k, node in enumerate(self.return_nodes):
            base = f"{var}[{k}]" if many else var
            self._flatten_return(node, base, exprs)
        ordered = [exprs[i] for i in range(self.num_flat_returns)]
        return ordered[0] if self.num_flat_returns == 1 else f"({', '.join(ordered)},)"

    def _flatten_return(self, node, expr, out):
        if node[0] == "leaf":
            out[node[2]] = expr
            return
        for child in node[5]:
            self._flatten_return(child, f"{expr}.{child[1]}", out)

    # --- the whole module ---------------------------------------------------

    def build(self, fast_path, needs_autograd, op_overload, autograd_apply) -> OpCode:
        w = self.w
        ns = self.ns
        ns.update(
            _compiling=torch.compiler.is_compiling,
            _NI=NotImplemented,
            _fp=fast_path,
            _op=op_overload,
            _AG=needs_autograd,
            _autograd=autograd_apply,
        )
        tensor_positions = [i for i, leaf in enumerate(self.leaves) if _is_tensor_text(leaf.type_text)]
        opname = _py_ident(self.op_name.split("::")[1])

        # The op as users call it: OpDef.__call__, hence `_self`.
        w.line(f"def {opname}(_self, {self.original_signature()}):")
        with w.block():
            self.emit_validation()
            if fast_path is not None:
                self.emit_fast_path(tensor_positions)
            leaf_exprs: dict[int, str] = {}
            for p in self.params:
                self.flatten_node(p.node, p.name, p.type, leaf_exprs, f"parameter '{p.name}'")
            exprs = [leaf_exprs[i] for i in range(len(self.leaves))]
            w.line(f"return {self._wrap_output(f'_op({self.flat_call_args(exprs)})')}")
        w.line()

        # The dispatcher-path arguments, for opcheck and tests.
        w.line(f"def _flatten_call({self.original_signature()}):")
        with w.block():
            self.emit_validation()
            leaf_exprs = {}
            for p in self.params:
                self.flatten_node(p.node, p.name, p.type, leaf_exprs, f"parameter '{p.name}'")
            pos = [leaf_exprs[i] for i, leaf in enumerate(self.leaves) if not leaf.kw_only]
            kw = [f"{leaf.name!r}: {leaf_exprs[i]}" for i, leaf in enumerate(self.leaves) if leaf.kw_only]
            w.line(f"return ({', '.join(pos)}{',' if len(pos) == 1 else ''}), {{{', '.join(kw)}}}")
        w.line()

        # fn (original signature) -> flat kernel.
        w.line("def _make_kernel(_fn):")
        with w.block():
            w.line(f"def kernel({self.flat_signature()}):")
            with w.block():
                args = [self.rebuild_node(p.node, p.type, lambda i: self.leaves[i].name) for p in self.params]
                w.line(f"_o = _fn({self.original_call_args(args)})")
                w.line(f"return {self.flatten_output_expr('_o')}")
            w.line("return kernel")
        w.line()

        # The same for fake kernels: handles stay ints.
        self.fake_mode = True
        w.line("def _make_fake_kernel(_fn):")
        with w.block():
            w.line(f"def fake_kernel({self.flat_signature()}):")
            with w.block():
                args = [self.rebuild_node(p.node, p.type, lambda i: self.leaves[i].name) for p in self.params]
                w.line(f"_o = _fn({self.original_call_args(args)})")
                w.line(f"return {self.flatten_output_expr('_o')}")
            w.line("return fake_kernel")
        w.line()
        self.fake_mode = False

        w.line(f"def _flat_full({self.flat_signature()}):")
        with w.block():
            names = [leaf.name for leaf in self.leaves]
            w.line(f"return ({', '.join(names)}{',' if len(names) == 1 else ''})")
        w.line()

        w.line("def _rebuild_inputs(_leaves):")
        with w.block():
            args = [self.rebuild_node(p.node, p.type, lambda i: f"_leaves[{i}]") for p in self.params]
            w.line(f"return ({', '.join(args)}{',' if len(args) == 1 else ''})")
        w.line()

        w.line("def _flatten_output(_o):")
        with w.block():
            w.line(f"return {self.flatten_output_expr('_o')}")
        w.line()

        w.line("def _rebuild_output(_o):")
        with w.block():
            w.line(f"return {self.output_expr('_o')}")
        w.line()

        w.line("def _body_positional(_fn, *_a):")
        with w.block():
            w.line(f"return _fn({self.original_call_args([f'_a[{i}]' for i in range(len(self.params))])})")
        w.line()

        source = "\n".join(w.lines) + "\n"
        code = compile(source, f"<opforge {self.op_name}>", "exec")
        exec(code, ns)  # noqa: S102
        return OpCode(
            source=source,
            call=ns[opname],
            make_kernel=ns["_make_kernel"],
            make_fake_kernel=ns["_make_fake_kernel"],
            flat_full=ns["_flat_full"],
            rebuild_inputs=ns["_rebuild_inputs"],
            flatten_output=ns["_flatten_output"],
            rebuild_output=ns["_rebuild_output"],
            flatten_grads=_make_flatten_grads(self),
            flatten_call=ns["_flatten_call"],
            body_positional=ns["_body_positional"],
            tensor_leaf_positions=tensor_positions,
            namespace=ns,
        )

    def _wrap_output(self, expr: str) -> str:
        if all(n[0] == "leaf" for n in self.return_nodes):
            return expr
        return f"_rebuild_output({expr})"

    # --- validation and the fast path ----------------------------------------

    def leaf_value(self, param: Param, index: int) -> str:
        """An expression for leaf `index` of `param`, straight from the
        original argument (None when an optional struct above it is None)."""

        def walk(node, expr, guards):
            if node[0] == "leaf":
                if node[2] != index:
                    return None
                value = expr
                for g in reversed(guards):
                    value = f"(None if {g} is None else {value})"
                return value
            for child in node[5]:
                found = walk(child, f"{expr}.{child[1]}", guards + ([expr] if node[3] else []))
                if found is not None:
                    return found
            return None

        return walk(param.node, param.name, [])

    def _param_of_leaf(self, index: int) -> Param:
        for p in self.params:
            if index in _leaf_indices(p.node):
                return p
        raise KeyError(index)

    def emit_validation(self):
        w = self.w
        for p in self.params:
            if p.node[0] != "leaf":
                continue
            leaf = self.leaves[p.node[2]]
            if leaf.enum is None:
                continue
            # Enum parameters: the body gets the member, the schema the value.
            cls = self.const("E", leaf.enum)
            to_member = self.const("to_member", _make_to_member(self.op_name, f"parameter '{p.name}'", leaf.enum))
            if p.type.kind == "list":
                conv = f"[_e if type(_e) is {cls} else {to_member}(_e) for _e in {p.name}]"
                w.line(f"{p.name} = {conv}" if not p.type.optional else f"if {p.name} is not None: {p.name} = {conv}")
            else:
                guard = f"{p.name} is not None and " if p.type.optional else ""
                w.line(f"if {guard}type({p.name}) is not {cls}: {p.name} = {to_member}({p.name})")
        for i, leaf in enumerate(self.leaves):
            if leaf.allowed and leaf.enum is None:
                p = self._param_of_leaf(i)
                path = self.leaves[i].name
                t = _leaf_type(p, i)
                expr = self.leaf_value(p, i)
                where = f"parameter '{p.name}'" if p.node[0] == "leaf" else f"parameter '{p.name}', field {path.split('__', 1)[1].replace('__', '.')}"
                self.emit_literal_check(expr, leaf, t, i, where, may_be_none=t.optional or expr.startswith("("))

    def emit_fast_path(self, tensor_positions: list[int]):
        w = self.w
        tensors = [self.leaf_value(self._param_of_leaf(i), i) for i in tensor_positions]
        body_args = []
        for p in self.params:
            leaf = self.leaves[p.node[2]] if p.node[0] == "leaf" else None
            if leaf is not None and leaf.handle:
                check = self.const("check_handle", _check_handle)
                value = f"{check}({p.name}, {self.const('C', p.type.py)})"
                body_args.append(f"(None if {p.name} is None else {value})" if p.type.optional else value)
            else:
                body_args.append(p.name)
        flat_exprs = []
        w.line("if not _compiling():")
        with w.block():
            tup = ", ".join(tensors) + ("," if len(tensors) == 1 else "")
            w.line(f"_r = _fp(({tup}), {', '.join(body_args)})")
            w.line("if _r is not _NI:")
            with w.block():
                w.line("if _r is _AG:")
                with w.block():
                    leaf_exprs: dict[int, str] = {}
                    for p in self.params:
                        self.flatten_node(p.node, p.name, p.type, leaf_exprs, f"parameter '{p.name}'")
                    flat_exprs = [leaf_exprs[i] for i in range(len(self.leaves))]
                    leaves_tuple = ", ".join(flat_exprs) + ("," if len(flat_exprs) == 1 else "")
                    args_tuple = ", ".join(body_args) + ("," if len(body_args) == 1 else "")
                    w.line(f"return {self._wrap_output(f'_autograd(({leaves_tuple}), ({args_tuple}))')}")
                w.line("return _r")


def _leaf_indices(node) -> list[int]:
    if node[0] == "leaf":
        return [node[2]]
    out = [node[4]] if node[3] else []
    for child in node[5]:
        out.extend(_leaf_indices(child))
    return out


def _cacheable(info, leaves: list[Leaf]) -> bool:
    return info.all_scalar and all(leaf.type_text.rstrip("?") in _HASHABLE_LEAF for leaf in leaves)


def _cached(cache: dict, key: tuple, make):
    value = cache.get(key)
    if value is None:
        value = make()
        if len(cache) >= 256:
            cache.clear()
        cache[key] = value
    return value


def _is_tensor_text(text: str) -> bool:
    return text.startswith("Tensor")


def _py_ident(name: str) -> str:
    return name + "_" if keyword.iskeyword(name) else name


def _make_to_raw(op: str, where: str, cls: type):
    by_value = ENUMS[cls].by_value

    def to_raw(value):
        if isinstance(value, cls):
            return value.value
        if type(value) in (str, int) and value in by_value:
            return value
        allowed = ", ".join(f"{cls.__qualname__}.{m.name}" for m in cls)
        raise ValueError(f"{op}: {where}: {value!r} is not a member or value of {cls.__qualname__}. Pass one of {allowed}.")

    return to_raw


def _make_to_member(op: str, where: str, cls: type):
    by_value = ENUMS[cls].by_value

    def to_member(value):
        if isinstance(value, cls):
            return value
        if type(value) in (str, int) and value in by_value:
            return by_value[value]
        allowed = ", ".join(f"{cls.__qualname__}.{m.name}" for m in cls)
        raise ValueError(f"{op}: {where}: {value!r} is not a member or value of {cls.__qualname__}. Pass one of {allowed}.")

    return to_member


def _leaf_type(param: Param, index: int) -> TypeInfo:
    def walk(node, t):
        if node[0] == "leaf":
            return t if node[2] == index else None
        for child in node[5]:
            found = walk(child, t.fields[child[1]])
            if found is not None:
                return found
        return None

    return walk(param.node, param.type)


def _make_bad_literal(op: str, where: str, allowed: tuple):
    def bad(value):
        raise ValueError(f"{op}: {where}: {value!r} is not one of the allowed values {list(allowed)!r}.")

    return bad


def _check_handle(obj, cls):
    if not isinstance(obj, cls):
        raise TypeError(f"expected a {cls.__qualname__} for a Handle[{cls.__qualname__}] parameter, "
                        f"got {type(obj).__qualname__}.")
    return obj


def _make_flatten_grads(builder: Builder):
    """per-original-parameter grads -> per-leaf grads (backward is not hot)."""
    params = builder.params
    nleaves = len(builder.leaves)
    op = builder.op_name

    def assign(node, t, grad, out, where):
        if node[0] == "leaf":
            out[node[2]] = grad
            return
        for child in node[5]:
            name = child[1]
            if grad is None:
                sub = None
            elif isinstance(grad, dict):
                sub = grad.get(name)
            elif dataclasses.is_dataclass(grad) or hasattr(grad, name):
                sub = getattr(grad, name)
            else:
                raise TypeError(
                    f"{op}: backward returned {type(grad).__name__} for {where}; "
                    f"return None, a {t.py.__qualname__} or a dict keyed by field name."
                )
            assign(child, t.fields[name], sub, out, f"{where}.{name}")

    def flatten_grads(grads):
        if not isinstance(grads, tuple):
            grads = (grads,)
        if len(grads) != len(params):
            names = ", ".join(p.name for p in params)
            raise RuntimeError(
                f"{op}: backward returned {len(grads)} gradient(s) but the op has {len(params)} "
                f"parameter(s) ({names}); return one per parameter, None where there is none."
            )
        out = [None] * nleaves
        for p, g in zip(params, grads):
            assign(p.node, p.type, g, out, f"parameter '{p.name}'")
        return tuple(out)

    return flatten_grads
