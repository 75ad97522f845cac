"""torch APIs renamed between the releases opforge supports (docs/versions.md).

torch 2.14 renamed the opaque-object API: `register_opaque_type(cls,
typ="reference" | "value")` became `register_custom_class(cls, typ="symbolic"
| "constant")`, `torch._opaque_base.OpaqueBase` became
`torch._custom_class_base.CustomClassBase`, and the old names log a
deprecation warning on every call. opforge speaks the new names and maps them
onto whichever API the running torch has:

    class Runner(OpaqueBase): ...
    register_opaque_class(Runner, kind="symbolic")
    # torch 2.14+:       register_custom_class(Runner, typ="symbolic")
    # torch 2.11-2.13:   register_opaque_type(Runner, typ="reference")
    is_opaque_class(Runner)   # True
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from torch._library import opaque_object as _opaque_object

# The old API's names for the two kinds.
_OLD_KIND = {"symbolic": "reference", "constant": "value"}
_NEW_KIND = {old: new for new, old in _OLD_KIND.items()}


def _base_class() -> type:
    # torch 2.14+ still ships torch._opaque_base, but importing it logs a
    # deprecation warning; take the new module where there is one.
    try:
        from torch._custom_class_base import CustomClassBase
        return CustomClassBase
    except ImportError:
        from torch._opaque_base import OpaqueBase
        return OpaqueBase


# Symbolic (stateful, by reference) opaque classes derive from this base.
OpaqueBase = _base_class()


def uses_new_names(api: ModuleType = _opaque_object) -> bool:
    """True on torch 2.14+, whose opaque-object API says custom_class."""
    return hasattr(api, "register_custom_class")


def register_opaque_class(cls: type, *, kind: str = "symbolic", api: ModuleType = _opaque_object,
                          **options: Any) -> None:
    """Registers `cls` as a torch opaque type, so custom ops can take its objects.

    `kind` is "symbolic" (a stateful object, a graph input under torch.compile;
    `cls` must derive from OpaqueBase) or "constant" (a value the graph
    specializes on); the old names "reference" and "value" are accepted too.
    `options` (guard_fn, members, hoist, ...) go to torch unchanged.
    """
    new_kind = _NEW_KIND.get(kind, kind)
    if new_kind not in _OLD_KIND:
        raise ValueError(f"opforge: opaque class {cls.__qualname__}: kind={kind!r} is not 'symbolic' or "
                         f"'constant'. Pass kind='symbolic' for a stateful object, 'constant' for a value.")
    if uses_new_names(api):
        api.register_custom_class(cls, typ=new_kind, **options)
    else:
        api.register_opaque_type(cls, typ=_OLD_KIND[new_kind], **options)


def is_opaque_class(cls: Any, api: ModuleType = _opaque_object) -> bool:
    """Whether `cls` (or a base of it) is registered as a torch opaque type."""
    return api.is_custom_class(cls) if uses_new_names(api) else api.is_opaque_type(cls)


def opaque_class_name(cls: type, api: ModuleType = _opaque_object) -> str:
    """The type name torch schemas use for a registered opaque class:
    Runner in module app -> 'app.Runner'."""
    return api.get_opaque_type_name(cls)
