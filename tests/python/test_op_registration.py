"""Defining an op: the registered schema, the OpDef object, flat calls through
torch.ops, the decorators, and atomic registration."""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from op_testing import both_paths, in_torch_ops, ns  # noqa: F401
from torch._subclasses.fake_tensor import FakeTensorMode

import opforge
from opforge import _C, _op, _types

Tensor = torch.Tensor


@dataclass(frozen=True)
class ScaleCfg:
    factor: float
    shift: float = 0.0


@dataclass(frozen=True)
class Inner:
    bias: float


@dataclass(frozen=True)
class Outer:
    inner: Inner
    gain: float = 1.0


def test_struct_parameter_is_registered_as_its_leaves(ns):
    @opforge.op(f"{ns}::scale")
    def scale(x: Tensor, cfg: ScaleCfg) -> Tensor:
        return x * cfg.factor + cfg.shift

    # A required struct's field defaults become its leaves' defaults, so
    # torch.ops callers may omit them too.
    assert scale.schema == f"{ns}::scale(Tensor x, float cfg__factor, float cfg__shift=0.) -> Tensor"
    assert str(getattr(torch.ops, ns).scale.default._schema) == scale.schema
    out = getattr(torch.ops, ns).scale(torch.ones(2), 3.0)
    assert torch.equal(out, torch.full((2,), 3.0))


def test_nested_struct_leaves_are_joined_with_double_underscore(ns):
    @opforge.op(f"{ns}::nested")
    def nested(x: Tensor, cfg: Outer) -> Tensor:
        return x + cfg.inner.bias * cfg.gain

    assert nested.schema == f"{ns}::nested(Tensor x, float cfg__inner__bias, float cfg__gain=1.) -> Tensor"


def test_a_struct_default_is_carried_by_its_leaves(ns):
    @opforge.op(f"{ns}::dflt")
    def dflt(x: Tensor, cfg: Outer = Outer(Inner(0.5), gain=2.0)) -> Tensor:
        return x + cfg.inner.bias * cfg.gain

    assert dflt.schema == f"{ns}::dflt(Tensor x, float cfg__inner__bias=0.5, float cfg__gain=2.) -> Tensor"
    assert torch.equal(getattr(torch.ops, ns).dflt(torch.zeros(1)), torch.ones(1))
    fast, slow = both_paths(dflt, torch.zeros(1))
    assert torch.equal(fast, torch.ones(1)) and torch.equal(slow, fast)


def test_opdef_exposes_name_schema_overload_and_spec(ns):
    @opforge.op(f"{ns}::scale")
    def scale(x: Tensor, cfg: ScaleCfg) -> Tensor:
        """Scales x."""
        return x * cfg.factor

    assert isinstance(scale, opforge.OpDef)
    assert scale.name == f"{ns}::scale"
    assert scale.overload is getattr(torch.ops, ns).scale.default
    assert isinstance(scale.overload, torch._ops.OpOverload)
    assert scale.spec == f"{ns}::scale(Tensor x, {_types.STRUCTS[ScaleCfg].name} cfg) -> Tensor"
    assert scale.__name__ == "scale"
    assert scale.__doc__ == "Scales x."
    assert scale.__wrapped__.__name__ == "scale"
    assert repr(scale).startswith(f"<opforge.OpDef {ns}::scale:")


def test_op_is_callable_with_the_original_signature_and_through_torch_ops_with_leaves(ns):
    @opforge.op(f"{ns}::scale")
    def scale(x: Tensor, cfg: ScaleCfg) -> Tensor:
        return x * cfg.factor + cfg.shift

    x = torch.tensor([1.0, 2.0])
    expected = torch.tensor([4.0, 7.0])
    assert torch.equal(scale(x, ScaleCfg(3.0, 1.0)), expected)
    assert torch.equal(scale(x, cfg=ScaleCfg(factor=3.0, shift=1.0)), expected)
    assert torch.equal(getattr(torch.ops, ns).scale(x, 3.0, 1.0), expected)
    assert torch.equal(getattr(torch.ops, ns).scale.default(x, 3.0, 0.0), torch.tensor([3.0, 6.0]))


def test_flatten_gives_the_dispatcher_arguments(ns):
    @opforge.op(f"{ns}::scale")
    def scale(x: Tensor, cfg: Outer, *, k: int = 2) -> Tensor:
        return x

    x = torch.ones(1)
    args, kwargs = scale.flatten(x, Outer(Inner(0.5)), k=3)
    assert args == (x, 0.5, 1.0)
    assert kwargs == {"k": 3}


def test_a_flat_signature_registers_exactly_what_infer_schema_gives(ns):
    def f(x: Tensor, y: Optional[Tensor], n: int, s: float = 1.5, *, b: bool = True,
          dt: torch.dtype = torch.float32, dev: torch.device = torch.device("cpu"), st: str = "ab",
          ls: list[Tensor], on: Optional[int] = None) -> tuple[Tensor, Tensor]:
        return x, x

    op = opforge.op(f"{ns}::f", mutates_args=("x",))(f)
    expected = str(torch._C.parse_schema(f"{ns}::f" + torch.library.infer_schema(f, mutates_args=("x",))))
    assert op.schema == expected
    assert op.lowered.is_identity


def test_keyword_only_parameters_follow_the_star_in_the_schema(ns):
    @opforge.op(f"{ns}::kw")
    def kw(x: Tensor, *, cfg: ScaleCfg, flag: bool = False) -> Tensor:
        return x * cfg.factor if flag else x

    assert kw.schema == f"{ns}::kw(Tensor x, *, float cfg__factor, float cfg__shift=0., bool flag=False) -> Tensor"
    fast, slow = both_paths(kw, torch.ones(2), cfg=ScaleCfg(2.0), flag=True)
    assert torch.equal(fast, torch.full((2,), 2.0)) and torch.equal(slow, fast)
    assert torch.equal(getattr(torch.ops, ns).kw(torch.ones(2), cfg__factor=4.0, cfg__shift=0.0, flag=True), torch.full((2,), 4.0))


def test_tags_are_forwarded_with_pt2_compliant(ns):
    @opforge.op(f"{ns}::tagged", tags=torch.Tag.needs_fixed_stride_order)
    def tagged(x: Tensor) -> Tensor:
        return x.clone()

    assert torch.Tag.needs_fixed_stride_order in tagged.overload.tags
    assert torch.Tag.pt2_compliant_tag in tagged.overload.tags


def test_register_fake_is_written_against_the_original_signature(ns):
    @opforge.op(f"{ns}::rows")
    def rows(x: Tensor, cfg: ScaleCfg) -> Tensor:
        return x[: int(cfg.factor)].clone()

    seen = []

    @rows.register_fake
    def _(x, cfg):
        seen.append(cfg)
        return x.new_empty((int(cfg.factor), *x.shape[1:]))

    with FakeTensorMode():
        out = rows(torch.empty(5, 3), ScaleCfg(2.0))
    assert out.shape == (2, 3)
    assert seen == [ScaleCfg(2.0)]


def test_fake_passed_to_the_decorator_is_used(ns):
    @opforge.op(f"{ns}::double", fake=lambda x: x.new_empty(2 * x.shape[0]))
    def double(x: Tensor) -> Tensor:
        return torch.cat([x, x])

    with FakeTensorMode():
        assert double(torch.empty(3)).shape == (6,)


def test_missing_fake_is_a_clear_error_under_fake_tensors(ns):
    @opforge.op(f"{ns}::nofake")
    def nofake(x: Tensor) -> Tensor:
        return x.clone()

    with FakeTensorMode(), pytest.raises(RuntimeError, match=rf"{ns}::nofake: no fake \(shape\) implementation"):
        nofake(torch.empty(3))


def test_register_kernel_replaces_the_body_for_a_device(ns):
    @opforge.op(f"{ns}::which")
    def which(x: Tensor, cfg: ScaleCfg) -> Tensor:
        return x + 1

    @which.register_kernel("cpu")
    def _(x, cfg):
        return x * cfg.factor

    fast, slow = both_paths(which, torch.ones(2), ScaleCfg(5.0))
    assert torch.equal(fast, torch.full((2,), 5.0))
    assert torch.equal(slow, fast)


def test_device_types_restricts_the_body_to_those_devices(ns):
    @opforge.op(f"{ns}::cpu_only", device_types="cpu")
    def cpu_only(x: Tensor) -> Tensor:
        return x + 1

    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::cpu_only", "CPU")
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::cpu_only", "CompositeExplicitAutograd")
    fast, slow = both_paths(cpu_only, torch.zeros(2))
    assert torch.equal(fast, torch.ones(2)) and torch.equal(slow, fast)


def test_an_op_without_tensor_arguments_works(ns):
    @opforge.op(f"{ns}::arange")
    def arange(n: int, cfg: ScaleCfg) -> Tensor:
        return torch.arange(n) * cfg.factor

    fast, slow = both_paths(arange, 3, ScaleCfg(2.0))
    assert torch.equal(fast, torch.tensor([0.0, 2.0, 4.0])) and torch.equal(slow, fast)


def test_an_op_without_backward_gets_no_autograd_bridge(ns):
    @opforge.op(f"{ns}::plain")
    def plain(x: Tensor) -> Tensor:
        return x * 2

    plain(torch.ones(2))
    with torch.no_grad():
        plain(torch.ones(2, requires_grad=True))
    assert not plain._has_autograd


# --- atomic registration -------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Paint:
    color: Color
    alpha: float


def _no_trace_of(qualname: str) -> bool:
    return not in_torch_ops(qualname) and qualname not in _op.registered_ops()


def test_a_rejected_op_leaves_nothing_registered(ns):
    name = f"{ns}::paint"
    types_before = set(_C.type_names())

    def paint(x: Tensor, p: Paint) -> Tensor:
        return x * p.alpha

    with pytest.raises(ValueError, match="mutates_args: 'nope'"):
        opforge.op(name, mutates_args=("nope",))(paint)
    assert _no_trace_of(name)
    assert set(_C.type_names()) == types_before
    assert Paint not in _types.STRUCTS and Color not in _types.ENUMS

    op = opforge.op(name)(paint)  # the name is free again
    assert torch.equal(op(torch.ones(1), Paint(Color.RED, 2.0)), torch.full((1,), 2.0))


def test_a_failure_after_the_schema_is_defined_removes_the_op_from_torch(ns, monkeypatch):
    name = f"{ns}::late"

    @dataclass(frozen=True)
    class Paint:
        color: Color
        alpha: float

    def late(x: Tensor, p: Paint) -> Tensor:
        return x

    def boom(*args, **kwargs):
        raise RuntimeError("registration failed")

    monkeypatch.setattr(_op, "_register_fake", boom)
    with pytest.raises(RuntimeError, match="registration failed"):
        opforge.op(name)(late)
    monkeypatch.undo()
    assert _no_trace_of(name)
    assert not torch._C._dispatch_has_kernel(name)
    assert Paint not in _types.STRUCTS

    op = opforge.op(name)(late)
    assert op.schema.startswith(f"{name}(Tensor x, str p__color, float p__alpha)")


def test_types_registered_by_an_earlier_op_survive_a_later_rejection(ns):
    @dataclass(frozen=True)
    class Kept:
        a: float

    def first(x: Tensor, k: Kept) -> Tensor:
        return x

    def second(x: Tensor, k: Kept) -> str:
        return "no"

    opforge.op(f"{ns}::first")(first)
    kept_name = _types.STRUCTS[Kept].name
    with pytest.raises(TypeError, match="return value"):
        opforge.op(f"{ns}::second")(second)
    assert _C.has_type(kept_name)
    assert Kept in _types.STRUCTS


def test_a_name_registered_by_opforge_is_taken(ns):
    def f(x: Tensor) -> Tensor:
        return x

    opforge.op(f"{ns}::f")(f)
    with pytest.raises(ValueError, match=rf"^{ns}::f: an operator with this name is already registered"):
        opforge.op(f"{ns}::f")(f)


def test_a_name_registered_through_torch_library_is_taken(ns):
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define("g(Tensor x) -> Tensor")

    def g(x: Tensor) -> Tensor:
        return x

    with pytest.raises(ValueError, match=rf"^{ns}::g: an operator with this name is already registered"):
        opforge.op(f"{ns}::g")(g)
    lib._destroy()


def test_a_name_torch_has_only_with_named_overloads_is_taken():
    def pow(x: Tensor) -> Tensor:
        return x

    # aten::pow exists only as aten::pow.Tensor_Tensor, aten::pow.Scalar, ...
    assert all(s.overload_name for s in torch._C._jit_get_schemas_for_operator("aten::pow"))
    with pytest.raises(ValueError, match="^aten::pow: an operator with this name is already registered"):
        opforge.op("aten::pow")(pow)
    assert not any(s.overload_name == "" for s in torch._C._jit_get_schemas_for_operator("aten::pow"))


def test_the_same_function_can_be_registered_under_two_names(ns):
    def f(x: Tensor, cfg: ScaleCfg) -> Tensor:
        return x * cfg.factor

    a = opforge.op(f"{ns}::a")(f)
    b = opforge.op(f"{ns}::b")(f)
    assert torch.equal(a(torch.ones(1), ScaleCfg(2.0)), b(torch.ones(1), ScaleCfg(2.0)))
    assert a.schema.replace("::a", "::b") == b.schema


def test_symm_mem_args_are_declared_and_a_bad_name_registers_nothing(ns):
    def ar(input: Tensor, buf: ScaleCfg, group_name: str) -> Tensor:
        return input.clone()

    with pytest.raises(ValueError, match=rf"^{ns}::bad: symm_mem_args: 'nope'"):
        opforge.op(f"{ns}::bad", symm_mem_args=("nope",))(ar)
    assert _no_trace_of(f"{ns}::bad")
    assert opforge.symm_mem_args(f"{ns}::bad") == []

    op = opforge.op(f"{ns}::ar", symm_mem_args=("input",))(ar)
    try:
        assert opforge.symm_mem_args(op.name) == ["input"]
    finally:
        opforge.symm_mem.forget(op.name)


def test_threads_defining_one_name_at_once_get_opforges_error_and_one_op(ns):
    barrier = threading.Barrier(8)
    errors, made = [], []

    def define(i):
        barrier.wait()
        def contested(x: Tensor) -> Tensor:
            return x + i

        try:
            made.append(opforge.op(f"{ns}::contested")(contested))
        except ValueError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=define, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len(errors) == 7
    assert set(errors) == {f"{ns}::contested: an operator with this name is already registered. "
                           f"Choose another name, or another namespace than '{ns}'."}
    x = torch.zeros(2)
    assert torch.equal(made[0](x), getattr(torch.ops, ns).contested(x))


@dataclass(frozen=True)
class SharedShape:
    scale: float
    n: int
    on: bool


def test_ops_of_one_signature_share_compiled_code_and_each_names_itself_under_compile(ns):
    from opforge import _codegen

    def define(name):
        @opforge.op(f"{ns}::{name}", fake=lambda x, cfg: torch.empty_like(x))
        def f(x: torch.Tensor, cfg: SharedShape) -> torch.Tensor:
            return x * cfg.scale

        return f

    first = define("first")
    before = dict(_codegen._CODE_CACHE)
    generated = []
    real = _codegen.Builder._generate_call

    def counting(self):
        generated.append(self.op_name)
        return real(self)

    _codegen.Builder._generate_call = counting
    try:
        second = define("second")
        third_cfg = define("third")
    finally:
        _codegen.Builder._generate_call = real
    # The later ops generate and compile nothing: the first's source is theirs (the op name sits in constants).
    assert generated == []
    assert _codegen._CODE_CACHE.keys() == before.keys()
    assert second._code.call.__code__.co_code == first._code.call.__code__.co_code
    # Each op's tables name that op.
    for op, name in ((first, "first"), (second, "second"), (third_cfg, "third")):
        tables = [v for k, v in op._code.namespace.items() if k.startswith("_table")]
        assert tables and all(f"{ns}::{name}" in repr(t) for t in tables), (name, tables)
        assert all(f"{ns}::{other}" not in repr(tables) for other in ("first", "second", "third") if other != name)
    # Each still names itself in the error a traced call gives for a bad field.
    for op, name in ((first, "first"), (second, "second")):
        torch._dynamo.reset()
        with pytest.raises(TypeError, match=rf"{ns}::{name}: parameter 'cfg', field SharedShape.scale: expected a "
                                            rf"float, got str 'a'"):
            torch.compile(op, backend="eager")(torch.ones(2), SharedShape("a", 1, True))


def test_ops_that_differ_in_a_default_or_a_parameter_name_keep_their_own(ns):
    def define(name, k_default, pname="k"):
        src = f'''
@opforge.op("{ns}::{name}", fake=lambda x, cfg, {pname}={k_default!r}: torch.empty_like(x))
def f(x: torch.Tensor, cfg: SharedShape, {pname}: float = {k_default!r}) -> torch.Tensor:
    return x * cfg.scale * {pname}
'''
        scope = {"opforge": opforge, "torch": torch, "SharedShape": SharedShape}
        exec(src, scope)  # noqa: S102
        return scope["f"]

    ops = [define("half", 0.5), define("twice", 2.0), define("named", 3.0, "m")]
    cfg = SharedShape(1.0, 1, True)
    for op, factor in zip(ops, (0.5, 2.0, 3.0)):
        torch._dynamo.reset()
        assert torch.equal(op(torch.ones(2), cfg), torch.full((2,), factor))
        assert torch.equal(torch.compile(op, backend="eager", fullgraph=True)(torch.ones(2), cfg),
                           torch.full((2,), factor))
    with pytest.raises(TypeError, match="unexpected keyword argument 'k'"):
        torch.compile(ops[2], backend="eager")(torch.ones(2), cfg, k=1.0)
