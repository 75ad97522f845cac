"""Differential test of the call boundary: for every leaf type an op may
take, alone, inside a struct, inside a nested struct and inside an optional
struct, over a corpus of Python values, the eager fast path and the
dispatcher path give the same result (what the body saw, what the op
returned) or the same exception type and message. For flat leaves the op
also agrees with a raw `torch.ops` call on what is accepted and what the body
sees, apart from the deviations listed in docs/python_ops.md ("The call
boundary")."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Literal, Optional

import numpy as np
import pytest
import torch
from op_testing import fast_path, unregister_namespace

import opforge

Tensor = torch.Tensor
NS = "opforge_differential"


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.Enum):
    LOW = 1
    HIGH = 2


class MyInt(int):
    pass


class MyFloat(float):
    pass


class MyStr(str):
    pass


class MyList(list):
    pass


class MyTensor(torch.Tensor):
    pass


LEAF_TYPES = {
    "Tensor": Tensor,
    "Tensor?": Optional[Tensor],
    "Tensor[]": list[Tensor],
    "Tensor?[]": list[Optional[Tensor]],
    "int": int,
    "int?": Optional[int],
    "float": float,
    "float?": Optional[float],
    "bool": bool,
    "str": str,
    "str?": Optional[str],
    "Scalar": torch.types.Number,
    "dtype": torch.dtype,
    "dtype?": Optional[torch.dtype],
    "device": torch.device,
    "layout": torch.layout,
    "memory_format": torch.memory_format,
    "Generator?": Optional[torch.Generator],
    "int[]": list[int],
    "int[]?": Optional[list[int]],
    "float[]": list[float],
    "bool[]": list[bool],
    "Literal[str]": Literal["a", "b"],
    "Literal[int]": Literal[1, 2],
    "Enum[str]": Color,
    "Enum[int]": Level,
    "Enum[]": list[Color],
}

# Types whose flat form torch.ops takes directly (Literal and Enum leaves
# are str/int there, and their checks are opforge's own).
TORCH_OPS_COMPARABLE = {k for k in LEAF_TYPES if not k.startswith(("Literal", "Enum"))}


def corpus() -> list:
    t = torch.arange(3.0)
    return [
        0, 1, -3, 2**40, True, False, MyInt(4), np.int64(3), np.int32(-2), np.bool_(True),
        1.5, -0.0, 2.0, float("nan"), float("inf"), MyFloat(2.5), np.float32(0.25), np.float64(3.0), 1 + 2j,
        "a", "red", "été", MyStr("b"), b"a", None,
        (1, 2), [1, 2], [1.5, 2], [True, False], [], MyList([1]), (t,), [t, None], [None], {1, 2}, {1: 2},
        t, torch.tensor(3), torch.tensor(2.5), torch.tensor(True), t.as_subclass(MyTensor),
        torch.float32, torch.int64, torch.device("cpu"), "cpu", torch.strided, torch.sparse_coo,
        torch.contiguous_format, torch.channels_last, torch.Generator(),
        Color.RED, Color.BLUE, Level.HIGH, [Color.RED, "blue"], object(),
    ]


def describe(v, identity=True):
    """A comparable description of a value: its type and its content (for an
    input tensor, which storage it is; for an output, its values)."""
    if isinstance(v, torch.Tensor):
        return (type(v).__name__, str(v.dtype), tuple(v.shape), v.data_ptr() if identity else v.tolist())
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [describe(x, identity) for x in v])
    if isinstance(v, float):
        return (type(v).__name__, "nan" if math.isnan(v) else repr(v))
    if isinstance(v, torch.Generator):
        return ("Generator", str(v.device), v.initial_seed())
    if isinstance(v, enum.Enum):
        return (type(v).__name__, v.name)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return (type(v).__name__, [describe(getattr(v, f.name)) for f in dataclasses.fields(v)])
    if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return (type(v).__name__, str(v))
    return (type(v).__name__, repr(v))


def outcome(fn, *args):
    """('ok', what the body saw, what the op returned) or (exception type, message)."""
    seen.clear()
    try:
        out = fn(*args)
    except Exception as e:  # noqa: BLE001 - the comparison is over whatever is raised
        return (type(e).__name__, str(e))
    return ("ok", describe(seen[0]) if seen else None, describe(out, identity=False))


seen: list = []


def make_ops(key: str, tp) -> dict:
    """One op per context for the leaf type `tp`: 'flat', 'struct',
    'nested', 'optional struct'; each maps a value to the op's call args."""
    slug = "".join(c if c.isalnum() else "_" for c in key)
    leaf = dataclasses.make_dataclass(f"Leaf_{slug}", [("v", tp)], frozen=True)
    outer = dataclasses.make_dataclass(f"Outer_{slug}", [("inner", leaf), ("k", int)], frozen=True)
    ops = {}

    def body_flat(x: Tensor, v: tp) -> Tensor:
        seen.append(v)
        return x.clone()

    def body_struct(x: Tensor, s: leaf) -> Tensor:
        seen.append(s)
        return x.clone()

    def body_nested(x: Tensor, o: outer) -> Tensor:
        seen.append(o)
        return x.clone()

    def body_optional(x: Tensor, s: Optional[leaf] = None) -> Tensor:
        seen.append(s)
        return x.clone()

    for context, body, wrap in (
        ("flat", body_flat, lambda v: v),
        ("struct", body_struct, lambda v: leaf(v)),
        ("nested", body_nested, lambda v: outer(leaf(v), 1)),
        ("optional struct", body_optional, lambda v: leaf(v)),
    ):
        name = f"{NS}::{slug}_{context.replace(' ', '_')}"
        op = opforge.op(name)(body)
        ops[context] = (op, wrap)
    return ops


@pytest.fixture(scope="module")
def all_ops():
    ops = {key: make_ops(key, tp) for key, tp in LEAF_TYPES.items()}
    yield ops
    unregister_namespace(NS)


def torch_ops_accepts(op, value) -> tuple:
    seen.clear()
    try:
        op.overload(torch.ones(1), value)
    except Exception:  # noqa: BLE001 - only acceptance is compared
        return ("error",)
    return ("ok", describe(seen[0]))


# Where a raw torch.ops call and the op deliberately differ (docs/python_ops.md,
# "The call boundary"): torch.ops accepts these, the op rejects them with a
# message naming the parameter. Nothing the op accepts is rejected by torch.ops.
def documented_deviation(key: str, value, ours: tuple, theirs: tuple) -> bool:
    if ours[0] == "ok" or theirs[0] != "ok":
        return False
    base = key.rstrip("?")
    if value is None and not key.endswith("?"):
        # torch.ops hands a kernel None for a Tensor and False for a bool.
        return True
    if base.endswith("[]") and isinstance(value, list) and None in value and "?" not in base:
        return True  # ... and False for a None inside a bool[]
    if base.endswith("[]"):
        # A str, bytes, dict, set or Tensor is not a list, though torch
        # iterates some of them.
        return isinstance(value, (str, bytes, dict, set, torch.Tensor))
    return False


def test_fast_path_and_dispatcher_agree_on_every_leaf_type_context_and_value(all_ops):
    values = corpus()
    assert len(values) >= 30
    combinations = differences = 0
    report = []
    for key, contexts in all_ops.items():
        for context, (op, wrap) in contexts.items():
            for value in values:
                args = (torch.ones(1), wrap(value))
                with fast_path(True):
                    fast = outcome(op, *args)
                with fast_path(False):
                    slow = outcome(op, *args)
                combinations += 1
                if fast != slow:
                    differences += 1
                    report.append(f"{key} / {context} / {value!r}:\n  fast: {fast}\n  dispatcher: {slow}")
    print(f"\n{combinations} combinations ({len(all_ops)} leaf types x 4 contexts x {len(values)} values), "
          f"{differences} differences")
    assert differences == 0, "\n".join(report[:20])
    assert combinations >= len(LEAF_TYPES) * 4 * 30


def crashes_torch(key: str, value) -> bool:
    """torch.ops takes any int for a dtype, layout or memory format and
    crashes the process on a code out of range; the op rejects those."""
    code_types = ("dtype", "layout", "memory_format")
    return key.rstrip("?") in code_types and isinstance(value, (int, np.integer)) and not 0 <= int(value) <= 1


def test_flat_leaves_accept_what_torch_ops_accepts_and_the_body_sees_the_same_value(all_ops):
    values = corpus()
    compared = deviations = 0
    report = []
    for key in sorted(TORCH_OPS_COMPARABLE):
        op, _ = all_ops[key]["flat"]
        for value in values:
            if crashes_torch(key, value):
                continue
            ours = outcome(op, torch.ones(1), value)
            ours = ours[:2] if ours[0] == "ok" else ("error",)
            theirs = torch_ops_accepts(op, value)
            compared += 1
            if ours == theirs:
                continue
            if documented_deviation(key, value, ours, theirs):
                deviations += 1
                continue
            report.append(f"{key} / {value!r}: op {ours}, torch.ops {theirs}")
    print(f"\n{compared} flat calls compared with torch.ops, {deviations} documented deviations, "
          f"{len(report)} other differences")
    assert not report, "\n".join(report[:30])


def test_a_rejected_value_names_the_op_and_the_parameter_at_every_depth(all_ops):
    op, wrap = all_ops["float"]["nested"]
    with pytest.raises(TypeError) as info:
        op(torch.ones(1), wrap("a"))
    assert str(info.value) == (f"{NS}::float_nested: parameter 'o', field Outer_float.inner, field Leaf_float.v: "
                               f"expected a float, got str 'a'. Pass a float.")
