"""Every parameter and return form of docs/python_ops.md: what the schema says, what the
body receives, and what the caller gets back, on the fast path and through
the dispatcher (the `path` fixture runs each test both ways)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest
import torch
from op_testing import ns, path  # noqa: F401

import opforge

Tensor = torch.Tensor


class Mode(enum.Enum):
    FAST = "fast"
    EXACT = "exact"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass(frozen=True)
class Leaf3:
    c: float


@dataclass(frozen=True)
class Mid:
    b: Leaf3
    w: Optional[Tensor] = None


@dataclass(frozen=True)
class Top:
    a: Mid
    k: int = 2


@dataclass(frozen=True, kw_only=True)
class KwCfg:
    scale: float
    bias: float = 0.5


@dataclass(frozen=True)
class Defaults:
    dims: list[int] = field(default_factory=lambda: [0, 1])
    eps: float = 1e-6
    name: str = "x"


@dataclass(frozen=True)
class Everything:
    mode: Mode = Mode.FAST
    level: Level = Level.HIGH
    kind: Literal["a", "b"] = "a"
    dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")
    maybe: Optional[float] = None


@dataclass(frozen=True)
class Pair:
    lo: Tensor
    hi: Tensor


def recorder():
    seen = {}

    def record(**kwargs):
        seen.clear()
        seen.update(kwargs)

    return seen, record


def test_a_struct_argument_reaches_the_body_as_an_equal_instance(ns, path):
    seen, record = recorder()

    @opforge.op(f"{ns}::f")
    def f(x: Tensor, cfg: KwCfg) -> Tensor:
        record(cfg=cfg)
        return x * cfg.scale + cfg.bias

    out = f(torch.ones(2), KwCfg(scale=3.0))
    assert torch.equal(out, torch.full((2,), 3.5))
    assert seen["cfg"] == KwCfg(scale=3.0, bias=0.5) and type(seen["cfg"]) is KwCfg


def test_structs_nest_to_any_depth(ns, path):
    seen, record = recorder()

    @opforge.op(f"{ns}::deep")
    def deep(x: Tensor, t: Top) -> Tensor:
        record(t=t)
        out = x * t.a.b.c * t.k
        return out if t.a.w is None else out + t.a.w

    assert deep.schema == f"{ns}::deep(Tensor x, float t__a__b__c, Tensor? t__a__w=None, SymInt t__k=2) -> Tensor"
    w = torch.tensor([10.0, 20.0])
    out = deep(torch.ones(2), Top(Mid(Leaf3(1.5), w), k=3))
    assert torch.equal(out, torch.tensor([14.5, 24.5]))
    assert seen["t"].a.b == Leaf3(1.5) and seen["t"].a.w is w
    assert torch.equal(deep(torch.ones(2), Top(Mid(Leaf3(2.0)))), torch.full((2,), 4.0))


def test_default_and_default_factory_fields_apply(ns, path):
    seen, record = recorder()

    @opforge.op(f"{ns}::dflt")
    def dflt(x: Tensor, d: Defaults = Defaults()) -> Tensor:
        record(d=d)
        return x.sum(dim=d.dims) + d.eps

    assert dflt.schema == (f'{ns}::dflt(Tensor x, SymInt[] d__dims=[0, 1], float d__eps=9.9999999999999995e-07, '
                           f'str d__name="x") -> Tensor')
    out = dflt(torch.ones(2, 3))
    assert out.item() == pytest.approx(6.0 + 1e-6)
    assert seen["d"] == Defaults()
    dflt(torch.ones(2, 3), Defaults(dims=[1], name="y"))
    assert seen["d"] == Defaults(dims=[1], name="y")


def test_leaf_defaults_fill_in_for_a_flat_call_that_omits_them(ns):
    seen, record = recorder()

    @opforge.op(f"{ns}::dflt")
    def dflt(x: Tensor, d: Defaults = Defaults(eps=0.25)) -> Tensor:
        record(d=d)
        return x + d.eps

    assert torch.equal(getattr(torch.ops, ns).dflt(torch.zeros(1)), torch.full((1,), 0.25))
    assert seen["d"] == Defaults(eps=0.25)


def test_optional_struct_is_none_or_an_instance(ns, path):
    seen, record = recorder()

    @opforge.op(f"{ns}::opt")
    def opt(x: Tensor, cfg: Optional[KwCfg] = None, other: KwCfg | None = None) -> Tensor:
        record(cfg=cfg, other=other)
        return x.clone() if cfg is None else x * cfg.scale

    assert opt.schema == (f"{ns}::opt(Tensor x, bool cfg__is_set=False, float? cfg__scale=None, float? cfg__bias=None, "
                          f"bool other__is_set=False, float? other__scale=None, float? other__bias=None) -> Tensor")
    assert torch.equal(opt(torch.ones(1)), torch.ones(1))
    assert seen == {"cfg": None, "other": None}
    assert torch.equal(opt(torch.ones(1), KwCfg(scale=4.0), other=KwCfg(scale=1.0, bias=2.0)), torch.full((1,), 4.0))
    assert seen == {"cfg": KwCfg(scale=4.0), "other": KwCfg(scale=1.0, bias=2.0)}


def test_optional_tensor_and_pep604_union(ns, path):
    @opforge.op(f"{ns}::add")
    def add(x: Tensor, y: Optional[Tensor] = None, z: Tensor | None = None) -> Tensor:
        return x + (0 if y is None else y) + (0 if z is None else z)

    assert add.schema == f"{ns}::add(Tensor x, Tensor? y=None, Tensor? z=None) -> Tensor"
    assert torch.equal(add(torch.ones(1)), torch.ones(1))
    assert torch.equal(add(torch.ones(1), z=torch.ones(1)), torch.full((1,), 2.0))


def test_lists_and_their_defaults_are_kept(ns, path):
    seen, record = recorder()

    @opforge.op(f"{ns}::lists")
    def lists(xs: list[Tensor], dims: list[int] = [0], ws: list[float] = [0.5, 1.5],
              flags: list[bool] = [True], *, names: list[str] = ["a"]) -> Tensor:
        record(dims=dims, ws=ws, flags=flags, names=names)
        return torch.stack(xs).sum(dims[0]) * ws[0]

    assert lists.schema == (f"{ns}::lists(Tensor[] xs, SymInt[] dims=[0], float[] ws=[0.5, 1.5], "
                            f"bool[] flags=[True], *, str[] names) -> Tensor")
    out = lists([torch.ones(2), torch.ones(2)])
    assert torch.equal(out, torch.ones(2))
    assert seen == {"dims": [0], "ws": [0.5, 1.5], "flags": [True], "names": ["a"]}
    lists([torch.ones(2)], [1], ws=[2.0], names=["p", "q"])
    assert seen == {"dims": [1], "ws": [2.0], "flags": [True], "names": ["p", "q"]}


def test_a_default_torch_cannot_express_drops_earlier_positional_defaults_with_a_warning(ns):
    with pytest.warns(UserWarning, match="the default of 'dims' is not in the flat schema"):
        @opforge.op(f"{ns}::late")
        def late(x: Tensor, dims: list[int] = [0], names: list[str] = ["a"]) -> Tensor:
            return x.clone()

    assert late.schema == f"{ns}::late(Tensor x, SymInt[] dims, str[] names) -> Tensor"
    assert torch.equal(late(torch.ones(1)), torch.ones(1))


def test_dtype_and_device_parameters_and_fields(ns, path):
    seen, record = recorder()

    @opforge.op(f"{ns}::make")
    def make(x: Tensor, dtype: torch.dtype = torch.float64, device: torch.device = torch.device("cpu"),
             e: Everything = Everything()) -> Tensor:
        record(dtype=dtype, device=device, e=e)
        return x.to(dtype=dtype, device=device)

    assert make.schema.startswith(f"{ns}::make(Tensor x, ScalarType dtype=7, Device device=cpu, str e__mode=\"fast\"")
    out = make(torch.ones(1))
    assert out.dtype == torch.float64
    assert seen["e"] == Everything() and seen["device"] == torch.device("cpu")
    out = make(torch.ones(1), torch.int32, e=Everything(dtype=torch.bfloat16, maybe=0.5))
    assert out.dtype == torch.int32
    assert seen["e"].dtype == torch.bfloat16 and seen["e"].maybe == 0.5


def test_literal_parameters_lower_to_str_and_int_and_are_checked_at_call_time(ns, path):
    @opforge.op(f"{ns}::lit")
    def lit(x: Tensor, how: Literal["sum", "max"] = "sum", k: Literal[1, 2] = 1) -> Tensor:
        return (x.sum() if how == "sum" else x.max()) * k

    assert lit.schema == f'{ns}::lit(Tensor x, str how="sum", int k=1) -> Tensor'
    x = torch.tensor([1.0, 3.0])
    assert lit(x).item() == 4.0
    assert lit(x, "max", 2).item() == 6.0
    with pytest.raises(ValueError, match=rf"^{ns}::lit: parameter 'how': 'min' is not one of the allowed values \['sum', 'max'\]"):
        lit(x, "min")
    with pytest.raises(ValueError, match=rf"^{ns}::lit: parameter 'k': 3 is not one of the allowed values \[1, 2\]"):
        lit(x, k=3)
    with pytest.raises(ValueError, match="parameter 'k': '1' is not one of the allowed values"):
        lit(x, k="1")


def test_literal_fields_are_checked_at_call_time(ns, path):
    @opforge.op(f"{ns}::litf")
    def litf(x: Tensor, e: Everything) -> Tensor:
        return x.clone()

    with pytest.raises(ValueError, match=rf"^{ns}::litf: parameter 'e', field Everything.kind: 'c' is not one of"):
        litf(torch.ones(1), Everything(kind="c"))


def test_enum_parameters_accept_members_and_values_and_the_body_gets_members(ns, path):
    seen, record = recorder()

    @opforge.op(f"{ns}::en")
    def en(x: Tensor, mode: Mode = Mode.FAST, level: Level = Level.LOW, *, modes: list[Mode] = [Mode.FAST],
           maybe: Optional[Mode] = None) -> Tensor:
        record(mode=mode, level=level, modes=modes, maybe=maybe)
        return x * level.value

    assert en.schema == (f'{ns}::en(Tensor x, str mode="fast", int level=1, *, str[] modes, str? maybe=None) -> Tensor')
    en(torch.ones(1))
    assert seen == {"mode": Mode.FAST, "level": Level.LOW, "modes": [Mode.FAST], "maybe": None}
    out = en(torch.ones(1), "exact", 2, modes=["exact", Mode.FAST], maybe="fast")
    assert torch.equal(out, torch.full((1,), 2.0))
    assert seen == {"mode": Mode.EXACT, "level": Level.HIGH, "modes": [Mode.EXACT, Mode.FAST], "maybe": Mode.FAST}
    assert all(type(v) in (Mode, Level) for v in (seen["mode"], seen["level"], *seen["modes"], seen["maybe"]))
    with pytest.raises(ValueError, match=rf"^{ns}::en: parameter 'mode': 'slow' is not a member or value of Mode. "
                                         r"Pass one of Mode.FAST, Mode.EXACT."):
        en(torch.ones(1), "slow")


def test_enum_fields_accept_values_and_the_body_gets_members(ns, path):
    seen, record = recorder()

    @opforge.op(f"{ns}::enf")
    def enf(x: Tensor, e: Everything, o: Optional[Everything] = None) -> Tensor:
        record(e=e, o=o)
        return x.clone()

    enf(torch.ones(1), Everything(mode="exact", level=1), Everything(level=2))
    assert seen["e"] == Everything(mode=Mode.EXACT, level=Level.LOW)
    assert type(seen["e"].mode) is Mode and type(seen["e"].level) is Level
    assert type(seen["o"].level) is Level
    with pytest.raises(ValueError, match=rf"^{ns}::enf: parameter 'e', field Everything.mode: 'x' is not a member"):
        enf(torch.ones(1), Everything(mode="x"))


def test_an_optional_struct_field_may_be_none_at_any_level(ns, path):
    @dataclass(frozen=True)
    class Opt2:
        inner: Optional[Mid] = None

    seen, record = recorder()

    @opforge.op(f"{ns}::opt2")
    def opt2(x: Tensor, o: Opt2) -> Tensor:
        record(o=o)
        return x.clone() if o.inner is None or o.inner.w is None else x + o.inner.w

    assert opt2.schema == f"{ns}::opt2(Tensor x, bool o__inner__is_set=False, float? o__inner__b__c=None, Tensor? o__inner__w=None) -> Tensor"
    assert torch.equal(opt2(torch.ones(1), Opt2()), torch.ones(1))
    assert seen["o"] == Opt2()
    assert torch.equal(opt2(torch.ones(1), Opt2(Mid(Leaf3(1.0), torch.ones(1)))), torch.full((1,), 2.0))


def test_a_struct_return_is_rebuilt_for_the_caller(ns, path):
    @opforge.op(f"{ns}::split")
    def split(x: Tensor, k: int) -> Pair:
        return Pair(x[:k].clone(), x[k:].clone())

    assert split.schema == f"{ns}::split(Tensor x, SymInt k) -> (Tensor, Tensor)"
    out = split(torch.arange(5.0), 2)
    assert type(out) is Pair
    assert torch.equal(out.lo, torch.tensor([0.0, 1.0])) and torch.equal(out.hi, torch.tensor([2.0, 3.0, 4.0]))
    lo, hi = getattr(torch.ops, ns).split(torch.arange(5.0), 2)
    assert torch.equal(hi, out.hi)


def test_struct_returns_mix_with_tensors_in_a_tuple(ns, path):
    @opforge.op(f"{ns}::mix")
    def mix(x: Tensor) -> tuple[Tensor, Pair]:
        return x + 1, Pair(x + 2, x + 3)

    assert mix.schema == f"{ns}::mix(Tensor x) -> (Tensor, Tensor, Tensor)"
    a, p = mix(torch.zeros(1))
    assert (a.item(), p.lo.item(), p.hi.item()) == (1.0, 2.0, 3.0)


@pytest.mark.parametrize(
    "ann, value, schema_ret",
    [
        (int, 3, "SymInt"),
        (float, 2.5, "float"),
        (bool, True, "bool"),
        (list[Tensor], None, "Tensor[]"),
        (tuple[Tensor, Tensor], None, "(Tensor, Tensor)"),
        (None, None, "()"),
    ],
)
def test_scalar_tuple_list_and_none_returns(ns, path, ann, value, schema_ret):
    def body(x: Tensor):
        if ann is None:
            return None
        if value is not None:
            return value
        return [x + 1, x + 2] if ann == list[Tensor] else (x + 1, x + 2)

    body.__annotations__["return"] = ann
    op = opforge.op(f"{ns}::r")(body)
    assert op.schema == f"{ns}::r(Tensor x) -> {schema_ret}"
    out = op(torch.zeros(1))
    if value is not None or ann is None:
        assert out == value
    else:
        assert [t.item() for t in out] == [1.0, 2.0]


def test_positional_and_keyword_calls_agree(ns, path):
    @opforge.op(f"{ns}::pk")
    def pk(x: Tensor, cfg: KwCfg, mode: Mode = Mode.FAST) -> Tensor:
        return x * cfg.scale + (1 if mode is Mode.EXACT else 0)

    a = pk(torch.ones(1), KwCfg(scale=2.0), Mode.EXACT)
    b = pk(mode="exact", cfg=KwCfg(scale=2.0), x=torch.ones(1))
    assert torch.equal(a, b) and a.item() == 3.0


def test_many_arguments_flatten_in_order(ns, path):
    names = [f"a{i}" for i in range(30)]
    src = f"def many(x: Tensor, {', '.join(f'{n}: float' for n in names)}) -> Tensor:\n" \
          f"    return x + {' + '.join(names)}\n"
    scope = {"Tensor": Tensor}
    exec(src, scope)
    many = opforge.op(f"{ns}::many")(scope["many"])
    assert many(torch.zeros(1), *range(30)).item() == sum(range(30))


@pytest.mark.parametrize("flat_value, values", [(99, "1, 2"), ("fast2", "'fast', 'exact'")], ids=["int", "str"])
def test_a_flat_value_no_enum_member_has_is_an_error_naming_the_enum_the_value_and_its_values(ns, flat_value,
                                                                                              values):
    # What a graph compiled for another definition of the Enum would pass (docs/compile_cache.md).
    enum_type = Level if isinstance(flat_value, int) else Mode

    @opforge.op(f"{ns}::scaled", fake=lambda x, how: torch.empty_like(x))
    def scaled(x: torch.Tensor, how: enum_type) -> torch.Tensor:
        return x * 2

    name = enum_type.__qualname__
    members = ", ".join(f"{name}.{m.name}" for m in enum_type)
    with pytest.raises(ValueError) as info:
        scaled.overload(torch.ones(2), flat_value)
    assert str(info.value) == (f"{ns}::scaled: parameter 'how': {flat_value!r} is not a value of {name} (its values: "
                               f"{values}). Pass one of {members}. A compiled graph that passed it was compiled for "
                               f"another definition of {name}.")
