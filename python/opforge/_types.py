"""Python annotations -> op-spec type text, and Python defaults -> default text.

    >>> spec_type(torch.Tensor)                    # 'Tensor'
    >>> spec_type(Optional[list[int]])             # 'SymInt[]?'
    >>> spec_type(Literal["a", "b"])               # 'Literal["a", "b"]'
    >>> spec_type(AttnCfg)                         # 'mymod.AttnCfg' (registered with the core)

The core owns every lowering rule; this module only names types. Dataclasses
and enums are registered with the core's type registry under a stable name,
and remembered here so the runtime can rebuild them.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import math
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import torch

from . import _C

_NoneType = type(None)


@dataclass(frozen=True)
class Where:
    """Where a value sits in an op's signature, for error messages:

        str(Where.parameter("cfg"))                            # "parameter 'cfg'"
        str(Where.parameter("cfg").at_field(AttnCfg, "scale"))  # "parameter 'cfg', field AttnCfg.scale"
        str(Where.RETURN)                                      # "return value"
    """

    top: str                     # "parameter 'cfg'" or "return value"
    fields: tuple[str, ...] = ()  # the path to a struct field: ("Outer.inner", "Inner.scale")

    @staticmethod
    def parameter(name: str) -> "Where":
        return Where(f"parameter '{name}'")

    def at_field(self, owner: type, name: str) -> "Where":
        return Where(self.top, (*self.fields, f"{owner.__qualname__}.{name}"))

    def __str__(self) -> str:
        return "".join((self.top, *(f", field {f}" for f in self.fields)))


Where.RETURN = Where("return value")


class HandleAnnotation:
    """What `opforge.Handle[Runner]` evaluates to."""

    __slots__ = ("target",)

    def __init__(self, target: Any):
        self.target = target

    def __repr__(self):
        return f"opforge.Handle[{getattr(self.target, '__qualname__', self.target)!r}]"

    def __eq__(self, other):
        return isinstance(other, HandleAnnotation) and other.target is self.target

    def __hash__(self):
        return hash((HandleAnnotation, self.target))


@dataclass
class TypeInfo:
    """The parsed form of one annotation, parallel to the core's spec type."""

    text: str  # spec type text
    kind: str  # tensor | scalar | list | struct | enum | literal | handle
    optional: bool = False
    py: Any = None  # dataclass / Enum class / handle target
    element: TypeInfo | None = None  # for lists
    fields: dict[str, TypeInfo] = field(default_factory=dict)  # for structs
    allowed: tuple = ()  # literal values


@dataclass
class StructInfo:
    """A dataclass registered with the core."""

    name: str
    cls: type
    fields: dict[str, TypeInfo]
    all_scalar: bool  # no Tensor leaves anywhere below: instances can be cached
    defaults: dict[str, Any] = field(default_factory=dict)  # field -> default value


@dataclass
class EnumInfo:
    name: str
    cls: type
    by_value: dict  # raw value -> member


class Registrations:
    """Types registered while defining one op, so a failure can undo them."""

    def __init__(self):
        self.names: list[str] = []

    def rollback(self):
        for name in reversed(self.names):
            _C.remove_type(name)
            info = STRUCTS_BY_NAME.pop(name, None) or ENUMS_BY_NAME.pop(name, None)
            if info is not None:
                (STRUCTS if isinstance(info, StructInfo) else ENUMS).pop(info.cls, None)
        self.names.clear()


STRUCTS: dict[type, StructInfo] = {}
STRUCTS_BY_NAME: dict[str, StructInfo] = {}
ENUMS: dict[type, EnumInfo] = {}
ENUMS_BY_NAME: dict[str, EnumInfo] = {}

_SIMPLE = {
    torch.Tensor: ("Tensor", "tensor"),
    int: ("SymInt", "scalar"),
    float: ("float", "scalar"),
    bool: ("bool", "scalar"),
    str: ("str", "scalar"),
    torch.dtype: ("ScalarType", "scalar"),
    torch.device: ("Device", "scalar"),
    torch.layout: ("Layout", "scalar"),
    torch.memory_format: ("MemoryFormat", "scalar"),
    torch.Generator: ("Generator", "scalar"),
    torch.types.Number: ("Scalar", "scalar"),
}

# The other direction, for classes opforge generates (C++ structs seen from
# Python): schema type text -> the annotation of a field of that type.
PY_TYPES = {text: py for py, (text, _kind) in _SIMPLE.items()} | {"int": int, "SymBool": bool}

_LIST_ORIGINS = (list, collections.abc.Sequence, collections.abc.MutableSequence)


class Problem(enum.Enum):
    """What a SignatureError is about."""

    NO_ANNOTATION = "no annotation"
    UNRESOLVED = "unresolved string annotation"
    TUPLE = "tuple annotation"
    DICT = "dict annotation"


class SignatureError(TypeError):
    """A decoration-time error about one annotation, its parts named so that
    a front end can word it its own way (opforge.compat.magi says what
    MagiCompiler says, then the fix):

        e.op 'mylib::f', e.where Where("parameter 'p'"), e.problem Problem.TUPLE,
        e.annotation 'tuple[int, int]', e.fix 'Use list[int] instead.'
    """

    def __init__(self, op: str, where: Where, problem: Problem, what: str, annotation: str, fix: str):
        super().__init__(f"{op}: {where}: {what} {fix}")
        self.op = op
        self.where = where
        self.problem = problem
        self.annotation = annotation
        self.fix = fix


def fail(exc: type, op: str, where: Where, what: str, fix: str = "") -> typing.NoReturn:
    raise exc(f"{op}: {where}: {what}" + (f" {fix}" if fix else ""))


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__qualname__ if tp.__module__ == "builtins" else f"{tp.__module__}.{tp.__qualname__}"
    return repr(tp)


def _union_args(tp: Any) -> tuple | None:
    origin = typing.get_origin(tp)
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return typing.get_args(tp)
    return None


def registered_name(cls: type) -> str:
    """A stable, schema-friendly name for a Python class: `module.Qual_name`."""
    qual = cls.__qualname__.replace("<locals>", "locals")
    name = f"{cls.__module__}.{qual}"
    return ".".join(re.sub(r"\W", "_", part) or "_" for part in name.split("."))


class Resolver:
    """Turns annotations into TypeInfo for one op, registering what it meets."""

    def __init__(self, op: str, regs: Registrations, globalns: dict, localns: dict | None):
        self.op = op
        self.regs = regs
        self.globalns = globalns
        self.localns = localns
        self._resolving: set[type] = set()  # structs being registered, to catch cycles

    def evaluate(self, ann: Any, where: Where, globalns: dict | None = None) -> Any:
        """Resolves string annotations (PEP 563, forward references)."""
        if isinstance(ann, typing.ForwardRef):
            ann = ann.__forward_arg__
        if not isinstance(ann, str):
            return ann
        globalns = globalns if globalns is not None else self.globalns
        found = _lookup_dotted(ann, globalns, self.localns)
        if found is not _MISSING:
            return found
        try:
            return eval(ann, globalns, self.localns)  # noqa: S307
        except Exception as e:  # NameError, SyntaxError, ...
            raise SignatureError(
                self.op, where, Problem.UNRESOLVED,
                f"annotation {ann!r} cannot be resolved ({type(e).__name__}: {e}).", repr(ann),
                "Make the names it uses importable where the function is defined.",
            ) from None

    def resolve(self, ann: Any, where: Where, globalns: dict | None = None) -> TypeInfo:
        ann = self.evaluate(ann, where, globalns)
        try:
            simple = _SIMPLE.get(ann)
        except TypeError:  # unhashable
            simple = None
        if simple is not None:
            return TypeInfo(simple[0], simple[1])
        union = _union_args(ann)
        if union is not None:
            rest = [a for a in union if a is not _NoneType]
            if len(rest) == len(union) or len(rest) != 1:
                fail(
                    TypeError,
                    self.op,
                    where,
                    f"annotation {ann} is a Union, which torch schemas cannot express.",
                    "Use one type, optionally with None (Optional[T]).",
                )
            inner = self.resolve(rest[0], where, globalns)
            if inner.optional:
                return inner
            return dataclasses.replace(inner, text=inner.text + "?", optional=True)
        if ann in _SIMPLE:
            text, kind = _SIMPLE[ann]
            return TypeInfo(text, kind)
        if isinstance(ann, HandleAnnotation):
            target = self.evaluate(ann.target, where, globalns)
            if not isinstance(target, type):
                fail(TypeError, self.op, where, f"Handle[{target!r}] needs a class.", "Write opforge.Handle[RunnerClass].")
            return TypeInfo(f"Handle({registered_name(target)})", "handle", py=target)
        origin = typing.get_origin(ann)
        if origin is Literal:
            return self._literal(ann, where)
        if origin in _LIST_ORIGINS or ann in (list, collections.abc.Sequence):
            args = typing.get_args(ann)
            if not args:
                fail(TypeError, self.op, where, f"annotation {ann} has no element type.", "Write list[int], list[Tensor], ...")
            elem = self.resolve(args[0], where, globalns)
            if elem.kind == "struct":
                fail(
                    TypeError,
                    self.op,
                    where,
                    f"a list of dataclasses ({_type_name(elem.py)}) is not supported.",
                    "Pass one list per field instead.",
                )
            return TypeInfo(elem.text + "[]", "list", element=elem)
        if origin is tuple or ann is tuple:
            args = [a for a in typing.get_args(ann) if a is not Ellipsis]
            hint = f"list[{_type_name(args[0])}]" if args else "list[...]"
            raise SignatureError(self.op, where, Problem.TUPLE, f"tuple annotations ({ann}) are not supported.",
                                 str(ann), f"Use {hint} instead.")
        if origin is dict or ann is dict or origin is collections.abc.Mapping:
            raise SignatureError(self.op, where, Problem.DICT, f"dict annotations ({ann}) are not supported.",
                                 str(ann), "Use a frozen dataclass or separate parameters.")
        if isinstance(ann, type) and issubclass(ann, enum.Enum):
            return self._enum(ann, where)
        if isinstance(ann, type) and dataclasses.is_dataclass(ann):
            return self._struct(ann, where)
        if ann is complex:
            fail(TypeError, self.op, where, "complex parameters are not supported by torch custom ops.", "Pass a Tensor or two floats.")
        fail(
            TypeError,
            self.op,
            where,
            f"annotation {_type_name(ann)} cannot be expressed in a torch schema.",
            "Use Tensor, int, float, bool, str, torch.dtype, torch.device, a list, Optional, "
            "Literal, an Enum, a frozen dataclass or opforge.Handle[T].",
        )

    def _literal(self, ann: Any, where: Where) -> TypeInfo:
        values = typing.get_args(ann)
        try:
            _C.check_literal(list(values))  # the core's rule: all str or all int
        except (TypeError, ValueError) as e:
            raise type(e)(f"{self.op}: {where}: {e}") from None
        text = "Literal[" + ", ".join(_quote(v) if isinstance(v, str) else str(v) for v in values) + "]"
        return TypeInfo(text, "literal", allowed=tuple(values))

    def _enum(self, cls: type, where: Where) -> TypeInfo:
        info = ENUMS.get(cls)
        if info is None:
            members = list(cls)
            values = [m.value for m in members]
            name = self._free_name(cls, lambda n: _C.describe_enum(n) == ([m.name for m in members], values))
            try:
                added = _C.register_enum(name, [m.name for m in members], values)  # the core checks the values
            except (TypeError, ValueError) as e:
                raise type(e)(f"{self.op}: {where}: {str(e).replace(repr(name), cls.__qualname__)}") from None
            if added:
                self.regs.names.append(name)
            info = EnumInfo(name, cls, {m.value: m for m in members})
            ENUMS[cls] = info
            ENUMS_BY_NAME[name] = info
        return TypeInfo(info.name, "enum", py=cls)

    def _free_name(self, cls: type, same: typing.Callable[[str], bool]) -> str:
        base = registered_name(cls)
        name, n = base, 1
        while _C.has_type(name) and not same(name):
            n += 1
            name = f"{base}_{n}"
        return name

    def _struct(self, cls: type, where: Where) -> TypeInfo:
        info = STRUCTS.get(cls)
        if info is None:
            if cls in self._resolving:
                fail(TypeError, self.op, where, f"dataclass {cls.__qualname__} contains itself, which a flat "
                     f"schema cannot express.", "Break the cycle: pass the nested part as its own parameter.")
            self._resolving.add(cls)
            try:
                info = self._register_struct(cls, where)
            finally:
                self._resolving.discard(cls)
        return TypeInfo(info.name, "struct", py=cls, fields=info.fields)

    def _register_struct(self, cls: type, where: Where) -> StructInfo:
        qual = cls.__qualname__
        if not cls.__dataclass_params__.frozen:
            fail(
                TypeError,
                self.op,
                where,
                f"dataclass {qual} is not frozen.",
                "Declare it with @dataclass(frozen=True) so its instances can be reused safely.",
            )
        module_globals = getattr(sys.modules.get(cls.__module__), "__dict__", self.globalns)
        fields: dict[str, TypeInfo] = {}
        defaults: dict[str, Any] = {}
        texts = []
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            finfo = self.resolve(f.type, where.at_field(cls, f.name), module_globals)
            fields[f.name] = finfo
            default = dataclasses.MISSING
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            if default is not dataclasses.MISSING:
                defaults[f.name] = default
            dtext = None if default is dataclasses.MISSING else default_text(default, finfo)
            texts.append((f.name, finfo.text, dtext))
        all_scalar = all(_is_scalar_tree(t) for t in fields.values())
        name = self._free_name(cls, lambda n: _C.struct_matches(n, texts))
        try:
            added = _C.register_struct(name, texts)
        except (TypeError, ValueError) as e:
            msg = str(e)
            # The core names the field by the registered name; show the class.
            msg = msg.replace(f"field {name}.", f"field {qual}.")
            raise type(e)(f"{self.op}: {where}, {msg}") from None
        if added:
            self.regs.names.append(name)
        info = StructInfo(name, cls, fields, all_scalar, defaults)
        STRUCTS[cls] = info
        STRUCTS_BY_NAME[name] = info
        return info


_MISSING = object()
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def _lookup_dotted(text: str, globalns: dict, localns: dict | None):
    """What eval(text) gives for a plain (dotted) name such as 'Tensor' or
    'torch.Tensor', without compiling anything; _MISSING otherwise."""
    if not _DOTTED.match(text):
        return _MISSING
    head, *rest = text.split(".")
    if localns is not None and head in localns:
        value = localns[head]
    elif head in globalns:
        value = globalns[head]
    else:
        builtins = globalns.get("__builtins__", __builtins__)
        builtins = builtins if isinstance(builtins, dict) else vars(builtins)
        if head not in builtins:
            return _MISSING
        value = builtins[head]
    for part in rest:
        value = getattr(value, part, _MISSING)
        if value is _MISSING:
            return _MISSING
    return value


def _is_scalar_tree(t: TypeInfo) -> bool:
    if t.kind == "tensor" or (t.kind == "list" and t.element.kind == "tensor"):
        return False
    if t.kind == "struct":
        return all(_is_scalar_tree(f) for f in t.fields.values())
    return True


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\v": "\\v"}


def _quote(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("\\%03o" % ord(ch))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


# c10::ScalarType codes, as TorchScript serializes them.
_DTYPE_CODES = {
    name: code
    for code, name in enumerate(
        [
            "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
            "complex32", "complex64", "complex128", "bool", "qint8", "quint8", "qint32",
            "bfloat16", "quint4x2", "quint2x4", "bits1x8", "bits2x4", "bits4x2", "bits8",
            "bits16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz",
            "uint16", "uint32", "uint64",
        ]
    )
}
_LAYOUT_CODES = {"strided": 0, "sparse_coo": 1, "sparse_csr": 2, "sparse_csc": 3, "sparse_bsr": 4, "sparse_bsc": 5, "_mkldnn": 6, "jagged": 7}
_MEMORY_FORMAT_CODES = {"contiguous_format": 0, "preserve_format": 1, "channels_last": 2, "channels_last_3d": 3}


def dtype_code(dtype: torch.dtype) -> int | None:
    return _DTYPE_CODES.get(str(dtype).replace("torch.", ""))


def default_text(value: Any, t: TypeInfo) -> str | None:
    """The schema text for a Python default, or None when torch's grammar
    cannot express it (the front end then applies it itself)."""
    if value is None:
        return "None" if t.optional or t.kind in ("tensor",) else None
    if t.kind == "struct":
        if not isinstance(value, t.py):
            return None
        parts = []
        for name, finfo in t.fields.items():
            text = default_text(getattr(value, name), finfo)
            if text is not None:
                parts.append(f"{name}={text}")
        return "{" + ", ".join(parts) + "}"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, torch.dtype):
        code = dtype_code(value)
        return None if code is None else str(code)
    if isinstance(value, torch.device):
        return _quote(str(value))
    if isinstance(value, torch.layout):
        code = _LAYOUT_CODES.get(str(value).replace("torch.", ""))
        return None if code is None else str(code)
    if isinstance(value, torch.memory_format):
        code = _MEMORY_FORMAT_CODES.get(str(value).replace("torch.", ""))
        return None if code is None else str(code)
    if isinstance(value, (list, tuple)) and t.kind == "list":
        # torch's grammar has list defaults for int, float and bool lists only.
        if t.element.text.rstrip("?") not in ("SymInt", "float", "bool") and not (
            t.element.kind == "enum" and all(isinstance(m.value, int) for m in t.element.py)
        ):
            return None
        raw = [v.value if isinstance(v, enum.Enum) else v for v in value]
        if not all(isinstance(v, (int, float, bool)) for v in raw):
            return None
        items = [default_text(v, t.element) for v in raw]
        if any(i is None for i in items):
            return None
        return "[" + ", ".join(items) + "]"
    return None
