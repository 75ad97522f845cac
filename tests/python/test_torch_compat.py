"""The opaque-object API under both of torch's names: register_opaque_type
(torch 2.11 to 2.13) and register_custom_class (torch 2.14 and later)."""

from __future__ import annotations

import logging
import types

import pytest
import torch
from torch._library import opaque_object

from opforge import _torch_compat as compat

NEW_NAMES = hasattr(opaque_object, "register_custom_class")


class Counter(compat.OpaqueBase):
    """A stateful object a custom op takes as it is (a symbolic opaque type)."""

    def __init__(self) -> None:
        self.calls = 0


compat.register_opaque_class(Counter, kind="symbolic")


lib = torch.library.Library("opforge_compat_test", "FRAGMENT")


@torch.library.custom_op("opforge_compat_test::bump", mutates_args=())
def bump(x: torch.Tensor, counter: Counter) -> torch.Tensor:
    counter.calls += 1
    return x + counter.calls


def test_the_running_torch_is_asked_by_the_name_it_has():
    assert compat.uses_new_names() is NEW_NAMES
    assert compat.uses_new_names() is (tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 14))


def test_a_registered_class_is_an_opaque_type_a_custom_op_takes():
    assert compat.is_opaque_class(Counter)
    assert not compat.is_opaque_class(dict)
    name = compat.opaque_class_name(Counter)
    assert name == f"{__name__}.Counter"
    # torch's schema parser knows the class by this name (and prints PyObject).
    lib.define(f"peek(Tensor x, {name} counter) -> Tensor")
    assert [str(a.type) for a in torch.ops.opforge_compat_test.peek.default._schema.arguments] == [
        "Tensor", "PyObject"]
    assert str(torch.ops.opforge_compat_test.bump.default._schema.arguments[1].type) == "PyObject"
    counter = Counter()
    torch.testing.assert_close(bump(torch.zeros(2), counter), torch.ones(2))
    torch.testing.assert_close(bump(torch.zeros(2), counter), torch.full((2,), 2.0))
    assert counter.calls == 2


def test_registration_logs_no_deprecation_warning(caplog):
    class Quiet(compat.OpaqueBase):
        pass

    with caplog.at_level(logging.WARNING):
        compat.register_opaque_class(Quiet, kind="symbolic")
        assert compat.is_opaque_class(Quiet)
    assert [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()] == []


class RecordingApi(types.SimpleNamespace):
    """Stands in for torch._library.opaque_object of the other torch line."""


def old_api(calls: list) -> RecordingApi:
    return RecordingApi(register_opaque_type=lambda cls, **kw: calls.append(("register_opaque_type", cls, kw)),
                        is_opaque_type=lambda cls: calls.append(("is_opaque_type", cls)) or True)


def new_api(calls: list) -> RecordingApi:
    return RecordingApi(register_custom_class=lambda cls, **kw: calls.append(("register_custom_class", cls, kw)),
                        is_custom_class=lambda cls: calls.append(("is_custom_class", cls)) or True)


@pytest.mark.parametrize("kind, old_typ, new_typ", [
    ("symbolic", "reference", "symbolic"),
    ("constant", "value", "constant"),
    ("reference", "reference", "symbolic"),
    ("value", "value", "constant"),
])
def test_each_kind_maps_onto_both_apis(kind, old_typ, new_typ):
    calls: list = []
    compat.register_opaque_class(Counter, kind=kind, api=old_api(calls), guard_fn=len)
    compat.register_opaque_class(Counter, kind=kind, api=new_api(calls), guard_fn=len)
    assert calls == [("register_opaque_type", Counter, {"typ": old_typ, "guard_fn": len}),
                     ("register_custom_class", Counter, {"typ": new_typ, "guard_fn": len})]


def test_is_opaque_class_asks_each_api_by_its_name():
    calls: list = []
    assert compat.is_opaque_class(Counter, api=old_api(calls))
    assert compat.is_opaque_class(Counter, api=new_api(calls))
    assert calls == [("is_opaque_type", Counter), ("is_custom_class", Counter)]


def test_an_unknown_kind_is_a_clear_error_and_registers_nothing():
    calls: list = []
    with pytest.raises(ValueError, match=r"^opforge: opaque class Counter: kind='mutable' is not 'symbolic' or "
                                         r"'constant'\. Pass kind='symbolic' for a stateful object"):
        compat.register_opaque_class(Counter, kind="mutable", api=new_api(calls))
    assert calls == []
