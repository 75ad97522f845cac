"""Ops defined in C++ with OPFORGE_LIBRARY, called from Python with structs.

    torch.ops.load_library("libmyops.so")
    Cfg = opforge.structs.mylib.AttnCfg           # a generated frozen dataclass
    opforge.ops.mylib.attn(q, k, Cfg(scale=0.5))  # -> torch.ops.mylib.attn(q, k, 0.5, True)

Any object with the struct's fields works in place of the generated class.
The call goes through the dispatcher (the kernel is C++), with the same
generated flatten code as `@opforge.op`, so it compiles with fullgraph=True.
"""

from __future__ import annotations

import dataclasses
import enum
import keyword
from typing import Any, Literal, Optional

import torch

from . import _C, _types
from ._codegen import EMPTY, Builder, Param
from ._cpp_register import Decorators
from ._types import EnumInfo, StructInfo, TypeInfo

_SCALARS = {
    "Tensor": torch.Tensor,
    "int": int,
    "SymInt": int,
    "float": float,
    "bool": bool,
    "SymBool": bool,
    "str": str,
    "Scalar": float,
    "ScalarType": torch.dtype,
    "Device": torch.device,
    "Layout": torch.layout,
    "MemoryFormat": torch.memory_format,
    "Generator": torch.Generator,
}
_CODE_TO_DTYPE = {code: getattr(torch, name) for name, code in _types._DTYPE_CODES.items() if hasattr(torch, name)}

_classes: dict[str, type] = {}  # registered struct/enum name -> generated class


def _python_value(value: Any, type_: Any) -> Any:
    kind = type_.kind
    if kind == "Optional":
        return None if value is None else _python_value(value, type_.elements[0])
    if kind == "ScalarType" and isinstance(value, int):
        return _CODE_TO_DTYPE.get(value, value)
    if kind == "Device" and isinstance(value, str):
        return torch.device(value)
    if kind == "Enum" and not isinstance(value, enum.Enum):
        return _enum_class(type_.name)(value)  # a C++ default arrives as the member's value
    return value


def _enum_class(name: str) -> type:
    cls = _classes.get(name)
    if cls is None:
        members, values = _C.describe_enum(name)
        cls = enum.Enum(name.split(".")[-1], list(zip(members, values)), module=f"opforge.structs")
        cls.__qualname__ = name
        _classes[name] = cls
        info = EnumInfo(name, cls, {m.value: m for m in cls})
        _types.ENUMS.setdefault(cls, info)
        _types.ENUMS_BY_NAME.setdefault(name, info)
    return cls


def struct_class(name: str) -> type:
    """The generated frozen dataclass for a registered struct."""
    cls = _classes.get(name)
    if cls is not None:
        return cls
    fields = _C.describe_struct(name)
    if fields is None:
        raise AttributeError(f"opforge.structs: no struct named {name!r} is registered.")
    specs, infos = [], {}
    for fname, ftype, default, has_default in fields:
        info = _type_info(ftype)
        infos[fname] = info
        annotation = _annotation(info)
        if has_default:
            value = _python_value(default, ftype)
            if isinstance(value, (list, dict)):
                specs.append((fname, annotation, dataclasses.field(default_factory=lambda v=value: type(v)(v))))
            else:
                specs.append((fname, annotation, dataclasses.field(default=value)))
        else:
            specs.append((fname, annotation))
    # A field without default after one with a default needs keyword-only
    # construction; otherwise fields stay positional, in C++ order.
    defaults_seen, kw_only = False, False
    for spec in specs:
        if len(spec) == 3:
            defaults_seen = True
        elif defaults_seen:
            kw_only = True
    cls = dataclasses.make_dataclass(name.split(".")[-1], specs, frozen=True, kw_only=kw_only)
    cls.__qualname__ = name
    cls.__module__ = "opforge.structs"
    _classes[name] = cls
    all_scalar = all(_types._is_scalar_tree(t) for t in infos.values())
    info = StructInfo(name, cls, infos, all_scalar)
    _types.STRUCTS.setdefault(cls, info)
    _types.STRUCTS_BY_NAME.setdefault(name, info)
    return cls


def _annotation(info: TypeInfo) -> Any:
    if info.kind == "list":
        ann = list[_annotation(info.element)]
    elif info.kind in ("struct", "enum"):
        ann = info.py
    elif info.kind == "literal":
        ann = Literal[info.allowed]
    else:
        ann = _SCALARS.get(info.text.rstrip("?"), Any)
    return Optional[ann] if info.optional else ann


def _type_info(t: Any) -> TypeInfo:
    """A core Type as the TypeInfo the code generator reads."""
    if t.kind == "Optional":
        inner = _type_info(t.elements[0])
        return dataclasses.replace(inner, text=inner.text + "?", optional=True)
    if t.kind == "List":
        elem = _type_info(t.elements[0])
        return TypeInfo(elem.text + "[]", "list", element=elem)
    if t.kind == "Struct":
        cls = struct_class(t.name)
        return TypeInfo(t.name, "struct", py=cls, fields=_types.STRUCTS[cls].fields)
    if t.kind == "Enum":
        return TypeInfo(t.name, "enum", py=_enum_class(t.name))
    if t.kind == "Literal":
        return TypeInfo(str(t), "literal", allowed=tuple(t.literals))
    if t.kind == "Handle":
        # C++ runners live in the C++ handle table: Python passes the int.
        return TypeInfo("int", "scalar")
    return TypeInfo(str(t), "tensor" if t.kind == "Tensor" else "scalar")


class CppOp(_C.OpBase, Decorators):
    """An op defined in C++, callable with its original (struct) signature.
    Calls enter C like `@opforge.op` ops: the boundary binds and converts the
    arguments, then the call goes through the dispatcher to the C++ kernel.
    register_fake / register_autograd / register_kernel come from Decorators."""

    __slots__ = ("name", "overload", "lowered", "model", "boundary", "_code", "__dict__")

    @property
    def schema(self) -> str:
        return str(self.overload._schema)

    @property
    def spec(self) -> str:
        return str(self.lowered.original)

    def flatten(self, *args, **kwargs):
        return self._code.flatten_call(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<opforge C++ op {self.name}: {self.spec}>"


def _make_op(name: str) -> CppOp:
    from . import _op

    lowered = _C.op_spec(name)
    if lowered is None:
        raise AttributeError(f"opforge.ops: {name} was not defined with OPFORGE_LIBRARY (or is not loaded). "
                             f"Load its library with torch.ops.load_library first.")
    ns, opname = name.split("::")
    overload = getattr(getattr(torch.ops, ns), opname).default
    params = []
    for arg in lowered.original.arguments:
        info = _type_info(arg.type)
        default = _python_value(arg.default_value, arg.type) if arg.has_default else EMPTY
        if arg.has_default and info.kind == "struct" and isinstance(default, dict):
            default = info.py(**default)
        params.append(Param(_py_name(arg.name), arg.kwarg_only, default, info, None))
    ret_types = [_type_info(r.type) for r in lowered.original.returns]
    model = _op.OpModel.of(lowered)
    sig = _op.Signature(params, ret_types, str(lowered.original))
    # Any object with a struct's fields is accepted; handles are C++ handles,
    # passed as ints.
    boundary = _op._make_boundary(name, sig, model, duck_structs=True, handles_as_ints=True)
    for p, node in zip(params, model.params):
        p.node = node
    leaves = _op._leaves(model, boundary)
    for leaf in leaves:
        leaf.handle = ""  # see _type_info: handles stay ints
    builder = Builder(name, params, leaves, list(model.returns), ret_types, len(model.return_types),
                      duck_structs=True)
    code = builder.build(overload, boundary)
    cls = type(f"CppOp[{name}]", (CppOp,), {"__call__": code.call, "__slots__": ()})
    _C.install_fast_call(cls)
    op = cls.__new__(cls)
    op.name = name
    op.overload = overload
    op.lowered = lowered
    op.model = model
    op.boundary = boundary
    op._code = code
    op._bind(boundary, None, {}, code.dispatch, None, cls.__call__, False)
    return op


def _py_name(name: str) -> str:
    if keyword.iskeyword(name):
        raise TypeError(f"a parameter named {name!r} cannot be used from Python.")
    return name


class _Namespace:
    def __init__(self, ns: str, kind: str):
        self._ns = ns
        self._kind = kind
        self._cache: dict[str, Any] = {}

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = self._cache.get(name)
        if value is None:
            if self._kind == "ops":
                value = _make_op(f"{self._ns}::{name}")
            else:
                value = _find_class(self._ns, name)
            self._cache[name] = value
        return value

    def __dir__(self):
        if self._kind == "ops":
            return [n.split("::")[1] for n in _C.op_spec_names() if n.startswith(self._ns + "::")]
        return [n.split(".")[-1] for n in _C.type_names()]

    def __repr__(self):
        return f"<opforge.{self._kind}.{self._ns}>"


def _types_used_by(ns: str) -> set[str]:
    """Struct and enum names the ops of namespace `ns` use, nested ones too."""
    seen: set[str] = set()

    def walk(t):
        if t.kind in ("Struct", "Enum") and t.name not in seen:
            seen.add(t.name)
            if t.kind == "Struct":
                for _name, ftype, _default, _has in _C.describe_struct(t.name) or ():
                    walk(ftype)
        for e in t.elements:
            walk(e)

    for op_name in _C.op_spec_names():
        if op_name.startswith(ns + "::"):
            spec = _C.op_spec(op_name).original
            for arg in (*spec.arguments, *spec.returns):
                walk(arg.type)
    return seen


def _find_class(ns: str, name: str) -> type:
    """`opforge.structs.<ns>.<name>`: a type the namespace's ops use whose
    last name part is `name`, else one registered as `<ns>.<name>` or `name`."""
    used = sorted(n for n in _types_used_by(ns) if n.split(".")[-1] == name)
    for candidate in (*used, f"{ns}.{name}", name):
        if _C.describe_struct(candidate) is not None:
            return struct_class(candidate)
        if _C.describe_enum(candidate) is not None:
            return _enum_class(candidate)
    raise AttributeError(f"opforge.structs.{ns}: no struct or enum named {name!r} is used by the ops "
                         f"of {ns} or registered as {ns}.{name}.")


class _Root:
    def __init__(self, kind: str):
        self._kind = kind
        self._namespaces: dict[str, _Namespace] = {}

    def __getattr__(self, ns: str) -> _Namespace:
        if ns.startswith("__"):
            raise AttributeError(ns)
        space = self._namespaces.get(ns)
        if space is None:
            space = self._namespaces[ns] = _Namespace(ns, self._kind)
        return space

    def __repr__(self):
        return f"<opforge.{self._kind}>"


ops = _Root("ops")
structs = _Root("structs")
