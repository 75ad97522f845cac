"""What the shims share: the op-name check and a dry run of the lowering."""

from __future__ import annotations

from .. import _C, _op
from .._codegen import Param
from .._types import Registrations, TypeInfo


class OpNameTakenError(ValueError, RuntimeError):
    """An op name is already registered. It is a ValueError, as in the rest
    of opforge, and a RuntimeError, as torch.library and MagiCompiler raise,
    so existing `except` clauses keep working."""


def check_name_free(name: str) -> None:
    """Raises ValueError for a malformed name and OpNameTakenError for a
    taken one (by opforge or anything else torch knows)."""
    _C.check_op_name(name)
    try:
        _op._check_free(name)
    except ValueError as e:
        raise OpNameTakenError(str(e)) from None


def signature_types(name: str, fn, caller) -> tuple[list[Param], list[TypeInfo]]:
    """The parameters and return types `@opforge.op` will see for `fn`,
    without registering anything. Raises exactly the errors `define` raises."""
    regs = Registrations()
    try:
        sig = _op._read_signature(name, fn, regs, caller)
    finally:
        regs.rollback()
    return sig.params, sig.return_types


def holds_tensors(t: TypeInfo) -> bool:
    if t.kind == "tensor":
        return True
    if t.kind == "list":
        return t.element is not None and holds_tensors(t.element)
    if t.kind == "struct":
        return any(holds_tensors(f) for f in t.fields.values())
    return False


def all_tensor_params(params: list[Param]) -> list[str]:
    """mutates_args="unknown" (torch.library's spelling for "any tensor may be
    mutated") as a list of names."""
    return [p.name for p in params if holds_tensors(p.type)]
