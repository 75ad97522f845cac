"""The Python classes of C++ libraries' structs and enums, made from what the
core registered (the C++ layout, defaults included):

    struct_class("mylib.NormCfg")    # <class 'opforge.structs.mylib.NormCfg'>: NormCfg(eps=1e-06, offset=False)
    find_class("mylib", "NormCfg")   # the same, as opforge.structs.mylib.NormCfg finds it
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Literal, Optional

import torch

from . import _C, _types
from ._types import EnumInfo, StructInfo, TypeInfo

_CODE_TO_DTYPE = {code: getattr(torch, name) for name, code in _types._DTYPE_CODES.items() if hasattr(torch, name)}

_classes: dict[str, type] = {}  # registered struct/enum name -> generated class


def python_value(value: Any, type_: Any) -> Any:
    """A core default value as Python gives it: a dtype code as torch.dtype, a device string as torch.device."""
    kind = type_.kind
    if kind == "Optional":
        return None if value is None else python_value(value, type_.elements[0])
    if kind == "ScalarType" and isinstance(value, int):
        return _CODE_TO_DTYPE.get(value, value)
    if kind == "Device" and isinstance(value, str):
        return torch.device(value)
    if kind == "Enum" and not isinstance(value, enum.Enum):
        return enum_class(type_.name)(value)  # a C++ default arrives as the member's value
    return value


def enum_class(name: str) -> type:
    cls = _classes.get(name)
    if cls is None:
        members, values = _C.describe_enum(name)
        cls = enum.Enum(name.split(".")[-1], list(zip(members, values)), module="opforge.structs")
        cls.__qualname__ = name
        _classes[name] = cls
        info = EnumInfo(name, cls, {m.value: m for m in cls})
        _types.ENUMS.setdefault(cls, info)
        _types.ENUMS_BY_NAME.setdefault(name, info)
    return cls


def struct_class(name: str) -> type:
    """The generated frozen dataclass for a registered struct:

        struct_class("mylib.NormCfg")   # <class 'opforge.structs.mylib.NormCfg'>: NormCfg(eps=1e-06, offset=False)
    """
    cls = _classes.get(name)
    if cls is not None:
        return cls
    fields = _C.describe_struct(name)
    if fields is None:
        raise AttributeError(f"opforge.structs: no struct named {name!r} is registered.")
    specs, infos = [], {}
    for fname, ftype, default, has_default in fields:
        info = type_info(ftype)
        infos[fname] = info
        annotation = _annotation(info)
        if has_default:
            value = python_value(default, ftype)
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
        ann = _types.PY_TYPES.get(info.text.rstrip("?"), Any)
    return Optional[ann] if info.optional else ann


def type_info(t: Any) -> TypeInfo:
    """A core Type as the TypeInfo the code generator reads."""
    if t.kind == "Optional":
        inner = type_info(t.elements[0])
        return dataclasses.replace(inner, text=inner.text + "?", optional=True)
    if t.kind == "List":
        elem = type_info(t.elements[0])
        return TypeInfo(elem.text + "[]", "list", element=elem)
    if t.kind == "Struct":
        cls = struct_class(t.name)
        return TypeInfo(t.name, "struct", py=cls, fields=_types.STRUCTS[cls].fields)
    if t.kind == "Enum":
        return TypeInfo(t.name, "enum", py=enum_class(t.name))
    if t.kind == "Literal":
        return TypeInfo(str(t), "literal", allowed=tuple(t.literals))
    if t.kind == "Handle":
        # C++ runners live in the C++ handle table: Python passes the int.
        return TypeInfo("int", "scalar")
    return TypeInfo(str(t), "tensor" if t.kind == "Tensor" else "scalar")


def types_used_by(ns: str) -> set[str]:
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


def find_class(ns: str, name: str) -> type:
    """`opforge.structs.<ns>.<name>`: the type registered as `<ns>.<name>`
    (a C++ library's own types), else one the namespace's ops use whose last
    name part is `name`, else one registered as `name`."""
    used = sorted(n for n in types_used_by(ns) if n.split(".")[-1] == name)
    for candidate in (f"{ns}.{name}", *used, name):
        if _C.describe_struct(candidate) is not None:
            return struct_class(candidate)
        if _C.describe_enum(candidate) is not None:
            return enum_class(candidate)
    raise AttributeError(f"opforge.structs.{ns}: no struct or enum named {name!r} is used by the ops "
                         f"of {ns} or registered as {ns}.{name}.")
