"""Python type stubs for the operators of one namespace.

    >>> print(stub_source("myaten", [entry("myaten::abs(Tensor self, *, Tensor(a!) out) -> Tensor(a!)")]))
    ...
    class _Op_abs__default:
        '''myaten::abs(Tensor self, *, Tensor(a!) out) -> Tensor(a!)'''
        def __call__(_op, /, self: Tensor, *, out: Tensor) -> Tensor: ...

    class _Op_abs:
        default: _Op_abs__default
        def __call__(_op, /, self: Tensor, *, out: Tensor) -> Tensor: ...

    abs: _Op_abs

The stub describes a small runtime module (`myaten.py`, written next to it)
whose attributes are `torch.ops.myaten`'s, so `import myaten; myaten.abs(x,
out=y)` is the very op packet and a type checker sees its signature. Types
come from opforge's schema parser.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass

from .. import _C
from ._aten import GenError

_HEADER = '''\
from __future__ import annotations

from typing import Any, Optional, Sequence, Union, overload

import torch
from torch import Tensor

_Number = Union[int, float, bool, complex]
_SymInt = Union[int, torch.SymInt]
_Device = Union[torch.device, str, int]
_Storage = Union[torch.UntypedStorage, torch.TypedStorage]
'''

_LEAF_TYPES = {
    "Tensor": "Tensor",
    "int": "int",
    "SymInt": "_SymInt",
    "float": "float",
    "bool": "bool",
    "SymBool": "bool",
    "str": "str",
    "complex": "complex",
    "Scalar": "_Number",
    "ScalarType": "torch.dtype",
    "Layout": "torch.layout",
    "MemoryFormat": "torch.memory_format",
    "Device": "_Device",
    "Generator": "torch.Generator",
    # torch's own stubs accept a name or None for a Dimname.
    "Dimname": "Optional[str]",
    "Storage": "_Storage",
    "Stream": "torch.Stream",
    "QScheme": "torch.qscheme",
    "NoneType": "None",
}
# Defaults that print as Python literals; others (a ScalarType code, a
# MemoryFormat) are shown as `...`.
_LITERAL_DEFAULT_KINDS = frozenset(["int", "SymInt", "float", "bool", "SymBool", "str", "Scalar", "complex"])


@dataclass(frozen=True)
class StubEntry:
    name: str  # "add"
    overload: str  # "" for the default overload
    schema: object  # opforge._C.Schema
    doc: str  # shown on hover


def entry(schema_text: str, doc: str = "") -> StubEntry:
    schema = _C.parse_schema(schema_text)
    name = schema.name.split("::", 1)[1]
    return StubEntry(name=name, overload=schema.overload, schema=schema, doc=doc or schema_text)


def python_type(type_, sized: bool = False, returning: bool = False) -> str:
    """'int[]' -> 'Sequence[int]'; 'Tensor?' -> 'Optional[Tensor]'; 'Scalar' -> '_Number'"""
    kind = type_.kind
    if kind in _LEAF_TYPES:
        return _LEAF_TYPES[kind]
    if kind == "Optional":
        inner = python_type(type_.elements[0], sized=sized, returning=returning)
        return inner if inner.startswith("Optional[") or inner == "Any" else f"Optional[{inner}]"
    if kind == "List":
        inner = python_type(type_.elements[0], returning=returning)
        if returning:
            return f"list[{inner}]"
        # torch takes a single int where a sized list `int[2]` is expected.
        if sized and type_.elements[0].kind in ("int", "SymInt"):
            return f"Union[{inner}, Sequence[{inner}]]"
        return f"Sequence[{inner}]"
    if kind == "Tuple":
        return "tuple[" + ", ".join(python_type(e, returning=returning) for e in type_.elements) + "]"
    if kind == "Dict":
        key, value = (python_type(e, returning=returning) for e in type_.elements)
        return f"dict[{key}, {value}]"
    return "Any"


def _default_literal(argument) -> str:
    value = argument.default_value
    if value is None:
        return "None"
    type_ = argument.type
    while type_.kind in ("Optional", "List"):
        type_ = type_.elements[0]
    if type_.kind in _LITERAL_DEFAULT_KINDS and isinstance(value, (bool, int, float, complex, str, list)):
        return repr(value)
    return "..."


def parameters(schema) -> str:
    """Python parameters for a schema, after the positional-only `_op`.

    '(Tensor self, Scalar other, *, Scalar alpha=1)' -> '_op, /, self: Tensor, other: _Number, *, alpha: _Number = 1'
    """
    arguments = list(schema.arguments)
    names = []
    last_renamed = -1
    for index, argument in enumerate(arguments):
        name = argument.name
        if keyword.iskeyword(name) or name == "_op":
            # A keyword cannot be a parameter; callers pass it by position.
            name += "_"
            if not argument.kwarg_only:
                last_renamed = index
        names.append(name)
    parts = ["_op"]
    if last_renamed < 0:
        parts.append("/")
    star = False
    for index, (argument, name) in enumerate(zip(arguments, names)):
        if argument.kwarg_only and not star:
            parts.append("*")
            star = True
        text = f"{name}: {python_type(argument.type, sized=argument.N is not None)}"
        if argument.has_default:
            text += f" = {_default_literal(argument)}"
        parts.append(text)
        if index == last_renamed:
            parts.append("/")
    return ", ".join(parts)


def return_type(schema) -> str:
    returns = list(schema.returns)
    if not returns:
        return "None"
    if len(returns) == 1:
        return python_type(returns[0].type, returning=True)
    return "tuple[" + ", ".join(python_type(r.type, returning=True) for r in returns) + "]"


def _class_name(name: str, overload: str | None = None) -> str:
    return f"_Op_{name}" if overload is None else f"_Op_{name}__{overload or 'default'}"


def _doc(text: str, indent: str) -> str:
    text = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = text.split("\n")
    body = "\n".join([lines[0]] + [indent + line if line else "" for line in lines[1:]])
    return f'{indent}"""{body}"""'


def stub_source(namespace: str, entries: list[StubEntry], origin: str = "") -> str:
    """The `.pyi` text for a namespace; see the module doc."""
    import torch

    packets: dict[str, list[StubEntry]] = {}
    for e in entries:
        packets.setdefault(e.name, []).append(e)
    out = [
        f"# Type stubs for torch.ops.{namespace}, generated by `opforge gen` from torch "
        f"{torch.__version__}{origin}; do not edit.",
        _HEADER,
    ]
    for name in sorted(packets):
        overloads = sorted(packets[name], key=lambda e: (e.overload != "", e.overload))
        for e in overloads:
            out += [
                "",
                f"class {_class_name(name, e.overload)}:",
                _doc(e.doc, "    "),
                f"    def __call__({parameters(e.schema)}) -> {return_type(e.schema)}: ...",
            ]
        out += ["", f"class {_class_name(name)}:"]
        for e in overloads:
            attribute = e.overload or "default"
            if attribute.isidentifier() and not keyword.iskeyword(attribute):
                out.append(f"    {attribute}: {_class_name(name, e.overload)}")
        for e in overloads:
            if len(overloads) > 1:
                out.append("    @overload")
            out.append(f"    def __call__({parameters(e.schema)}) -> {return_type(e.schema)}: ...")
        out += ["", f"{name}: {_class_name(name)}" if not keyword.iskeyword(name) else f"# {name}: a keyword"]
    return "\n".join(out) + "\n"


def runtime_source(namespace: str, names: list[str], library: str | None = None) -> str:
    """The module the stub describes: its attributes are torch.ops.<namespace>'s.

    With `library` (a path relative to the module), importing the module loads
    it first, so the generated ops exist.
    """
    lines = [
        f'"""torch.ops.{namespace}, with the signatures in {namespace}.pyi for type checkers.',
        "",
        f"    >>> import {namespace}",
        f"    >>> {namespace}.{names[0] if names else 'op'} is torch.ops.{namespace}.{names[0] if names else 'op'}",
        "    True",
        '"""',
        "",
        "import os as _os",
        "",
        "import torch as _torch",
        "",
    ]
    if library:
        lines += [
            "# Loading is idempotent: torch.ops remembers the libraries it loaded.",
            f"_torch.ops.load_library(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), {library!r}))",
            "",
        ]
    lines += [
        f"_NAMES = {sorted(names)!r}",
        "",
        "",
        "def __getattr__(name):",
        f"    return getattr(_torch.ops.{namespace}, name)",
        "",
        "",
        "def __dir__():",
        "    return list(_NAMES)",
        "",
    ]
    return "\n".join(lines)


def registered_schemas(namespace: str) -> list[str]:
    """The schema text of every operator registered under `namespace`."""
    import torch

    prefix = namespace + "::"
    return [str(s) for s in torch._C._jit_get_all_schemas() if s.name.startswith(prefix)]


def registered_entries(namespace: str) -> list[StubEntry]:
    """Every operator registered under `namespace`, from the live registry."""
    texts = registered_schemas(namespace)
    if not texts:
        raise GenError(
            f"no operators are registered under namespace {namespace!r}; load the library or import "
            "the module that defines them first (--load PATH or --import MODULE)."
        )
    return [entry(text) for text in sorted(set(texts))]
