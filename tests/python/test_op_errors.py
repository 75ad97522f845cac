"""Decoration-time errors (docs/python_ops.md): each names the op, the parameter or
field, and a fix, and is raised before anything is registered. Also: string
annotations (PEP 563) and closure-local dataclasses resolve.

This module deliberately has no `from __future__ import annotations`, so
annotations are objects here; the PEP 563 tests compile their own source."""

import __future__
import enum
import typing
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

import pytest
import torch
from op_testing import in_torch_ops, ns  # noqa: F401

import opforge
from opforge import _op

Tensor = torch.Tensor


@dataclass
class Mutable:
    a: float


@dataclass(frozen=True)
class HoldsMutable:
    inner: Mutable


@dataclass(frozen=True)
class Deeper:
    holder: HoldsMutable


@dataclass(frozen=True)
class Scalars:
    a: float
    n: int = 1


@dataclass(frozen=True)
class BadField:
    t: tuple[int, int]


class Mixed(enum.Enum):
    A = "a"
    B = 1


class FloatEnum(enum.Enum):
    A = 1.5


class Opaque:
    pass


def _f(ann, ret=Tensor, **extra):
    """A function `f(x: Tensor, p: ann) -> ret`."""

    def f(x: Tensor, p):
        return x

    f.__annotations__ = {"x": Tensor, "p": ann, "return": ret}
    f.__annotations__.update(extra)
    return f


def _varargs(x: Tensor, *rest: Tensor) -> Tensor:
    return x


def _varkw(x: Tensor, **opts: int) -> Tensor:
    return x


def _posonly(x: Tensor, /) -> Tensor:
    return x


def _no_param_annotation(x: Tensor, p) -> Tensor:
    return x


def _no_return_annotation(x: Tensor):
    return x


def _none_default(x: Tensor, n: int = None) -> Tensor:
    return x


def _bad_literal_default(x: Tensor, how: Literal["a", "b"] = "c") -> Tensor:
    return x


def _scalar_struct(x: Tensor, s: Scalars, n: int) -> Tensor:
    return x


CASES = [
    # (id, function, decorator options, exception, message after "ns::f: ")
    ("star_args", _varargs, {}, TypeError,
     r"parameter '\*rest': variadic parameters cannot be op parameters. Spell out each parameter."),
    ("star_kwargs", _varkw, {}, TypeError,
     r"parameter '\*\*opts': variadic parameters cannot be op parameters."),
    ("positional_only", _posonly, {}, TypeError,
     r"parameter 'x': positional-only parameters are not supported. Remove the '/'"),
    ("missing_parameter_annotation", _no_param_annotation, {}, TypeError,
     r"parameter 'p': missing type annotation. Annotate it, e.g. 'p: torch.Tensor'."),
    ("missing_return_annotation", _no_return_annotation, {}, TypeError,
     r"return value: missing annotation. Add one, e.g. '-> torch.Tensor' or '-> None'."),
    ("mutable_dataclass", _f(Mutable), {}, TypeError,
     r"parameter 'p': dataclass Mutable is not frozen. Declare it with @dataclass\(frozen=True\)"),
    ("mutable_dataclass_in_a_field", _f(HoldsMutable), {}, TypeError,
     r"parameter 'p', field HoldsMutable.inner: dataclass Mutable is not frozen."),
    ("mutable_dataclass_two_levels_down", _f(Deeper), {}, TypeError,
     r"parameter 'p', field Deeper.holder, field HoldsMutable.inner: dataclass Mutable is not frozen."),
    ("mutable_dataclass_in_optional", _f(Optional[Mutable]), {}, TypeError,
     r"parameter 'p': dataclass Mutable is not frozen."),
    ("unresolvable_string_annotation", _f("NoSuchType"), {}, TypeError,
     r"parameter 'p': annotation 'NoSuchType' cannot be resolved \(NameError: name 'NoSuchType' is not defined\)."
     r" Make the names it uses importable"),
    ("tuple_parameter", _f(tuple[int, int]), {}, TypeError,
     r"parameter 'p': tuple annotations \(tuple\[int, int\]\) are not supported. Use list\[int\] instead."),
    ("bare_tuple_parameter", _f(tuple), {}, TypeError,
     r"parameter 'p': tuple annotations .* Use list\[...\] instead."),
    ("tuple_field", _f(BadField), {}, TypeError,
     r"parameter 'p', field BadField.t: tuple annotations \(tuple\[int, int\]\) are not supported. Use list\[int\]"),
    ("dict_parameter", _f(dict[str, int]), {}, TypeError,
     r"parameter 'p': dict annotations \(dict\[str, int\]\) are not supported. Use a frozen dataclass"),
    ("literal_with_mixed_values", _f(Literal["a", 1]), {}, TypeError,
     r"parameter 'p': Literal\['a', 1\] mixes value types .* Use Literal of str values only or of int"),
    ("literal_of_floats", _f(Literal[1.5, 2.5]), {}, TypeError, r"parameter 'p': .* mixes value types"),
    ("literal_of_bools", _f(Literal[True, False]), {}, TypeError, r"parameter 'p': .* mixes value types"),
    ("enum_with_mixed_values", _f(Mixed), {}, TypeError,
     r"parameter 'p': enum Mixed: mixes str and int values. Use one value type for all members."),
    ("enum_with_float_values", _f(FloatEnum), {}, TypeError,
     r"parameter 'p': enum FloatEnum: member A has a value that is neither str nor int \(1.5\). Use str or int"),
    ("unknown_mutates_args", _f(Tensor), {"mutates_args": ("y",)}, ValueError,
     r"mutates_args: 'y' is not a parameter or a struct field of the op. Name a parameter \(x, p\)"),
    ("mutates_args_as_a_string", _f(Tensor), {"mutates_args": "x"}, TypeError,
     r"mutates_args must be a sequence of parameter names, not a string. Write mutates_args=\('x',\)."),
    ("mutating_a_scalar", _scalar_struct, {"mutates_args": ("n",)}, ValueError,
     r"mutates_args: 'n' has type SymInt; only Tensor arguments can be mutated. Remove it from mutates_args."),
    ("mutating_a_struct_without_tensors", _scalar_struct, {"mutates_args": ("s",)}, ValueError,
     r"mutates_args: 's' is a struct with no Tensor fields.* Remove it from mutates_args."),
    ("mutating_a_scalar_field", _scalar_struct, {"mutates_args": ("s.a",)}, ValueError,
     r"mutates_args: 's.a' has type float; only Tensor arguments can be mutated."),
    ("mutating_a_scalar_leaf", _scalar_struct, {"mutates_args": ("s__n",)}, ValueError,
     r"mutates_args: 's__n' has type SymInt; only Tensor arguments can be mutated."),
    ("inexpressible_class", _f(Opaque), {}, TypeError,
     r"parameter 'p': annotation test_op_errors.Opaque cannot be expressed in a torch schema. Use Tensor, int"),
    ("inexpressible_set", _f(set[int]), {}, TypeError,
     r"parameter 'p': annotation set\[int\] cannot be expressed in a torch schema."),
    ("inexpressible_any", _f(Any), {}, TypeError, r"parameter 'p': annotation typing.Any cannot be expressed"),
    ("union_of_two_types", _f(Union[int, str]), {}, TypeError,
     r"parameter 'p': annotation typing.Union\[int, str\] is a Union, which torch schemas cannot express."),
    ("complex_parameter", _f(complex), {}, TypeError,
     r"parameter 'p': complex parameters are not supported by torch custom ops."),
    ("list_of_dataclasses", _f(list[Scalars]), {}, TypeError,
     r"parameter 'p': a list of dataclasses \(test_op_errors.Scalars\) is not supported. Pass one list per field"),
    ("list_without_element_type", _f(list), {}, TypeError,
     r"parameter 'p': annotation <class 'list'> has no element type."),
    ("none_default_on_a_non_optional", _none_default, {}, TypeError,
     r"parameter 'n' \(its default\): the default is None but the type is not Optional. Annotate it as Optional"),
    ("literal_default_not_allowed", _bad_literal_default, {}, ValueError,
     r"parameter 'how': default .*c.* is not one of the allowed values."),
    ("dict_return", _f(Tensor, ret=dict), {}, TypeError, r"return value: dict annotations"),
    ("str_return", _f(Tensor, ret=str), {}, TypeError,
     r"return value: type str cannot be returned from an op. Return Tensor, tuple\[Tensor, ...\]"),
    ("optional_return", _f(Tensor, ret=Optional[Tensor]), {}, TypeError,
     r"return value: type Tensor\? cannot be returned from an op."),
    ("open_tuple_return", _f(Tensor, ret=tuple[Tensor, ...]), {}, TypeError,
     r"return value: tuple\[torch.Tensor, ...\] has no fixed length."),
    ("setup_context_without_backward", _f(Tensor), {"setup_context": lambda ctx, i, o: None}, TypeError,
     r"setup_context was given without backward. Pass backward= as well."),
    ("unknown_triton_mode", _f(Tensor), {"triton": "maybe"}, ValueError,
     r"triton='maybe' is not one of 'auto', 'off', 'force'."),
    ("unknown_device_type", _f(Tensor), {"device_types": "gpu0"}, ValueError,
     r"device_types: 'gpu0' is not a device type. Use e.g. 'cpu' or 'cuda'."),
]


@pytest.mark.parametrize("fn, options, exc, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decoration_error_names_the_op_the_place_and_the_fix_and_registers_nothing(ns, fn, options, exc, message):
    name = f"{ns}::f"
    with pytest.raises(exc, match=rf"^{name}: {message}"):
        opforge.op(name, **options)(fn)
    assert not in_torch_ops(name)
    assert name not in _op.registered_ops()


def test_a_name_without_namespace_is_rejected_with_a_suggestion():
    with pytest.raises(ValueError, match=r"^scale: the op name must have the form 'namespace::name'. "
                                         r"Add a namespace, e.g. 'mylib::scale'."):
        opforge.op("scale")(_f(Tensor))


def test_a_function_where_the_name_goes_is_rejected_with_the_decorator_to_write():
    def scale(x: Tensor) -> Tensor:
        return x

    registered = set(_op.registered_ops())
    with pytest.raises(TypeError) as info:
        opforge.op(scale)  # `@opforge.op` above a function, without the name
    assert str(info.value) == ("opforge.op was given the function scale where it takes the op's name: write "
                               "@opforge.op(\"mylib::scale\") above it, with your namespace.")
    assert set(_op.registered_ops()) == registered


@pytest.mark.parametrize("name, shown", [(None, "NoneType None"), (3, "int 3"), (b"ns::f", "bytes b'ns::f'"),
                                         (["ns::f"], "list ['ns::f']")])
def test_a_name_that_is_not_a_str_is_rejected_naming_what_was_passed(name, shown):
    with pytest.raises(TypeError) as info:
        opforge.op(name)
    assert str(info.value) == (f"opforge.op takes the op's name as a str 'namespace::name', not {shown}. "
                               "Write e.g. @opforge.op(\"mylib::scale\").")


def test_a_name_that_is_not_an_identifier_is_rejected():
    with pytest.raises(ValueError, match=r"^my-lib::scale: 'my-lib' is not a valid identifier"):
        opforge.op("my-lib::scale")(_f(Tensor))


def test_a_name_already_registered_is_rejected_before_the_signature_is_read(ns):
    opforge.op(f"{ns}::f")(_f(Tensor))
    with pytest.raises(ValueError, match=rf"^{ns}::f: an operator with this name is already registered. "
                                         rf"Choose another name, or another namespace than '{ns}'."):
        opforge.op(f"{ns}::f")(_varargs)


# --- string annotations ------------------------------------------------------------

PEP563_SOURCE = '''
from __future__ import annotations
import enum
from dataclasses import dataclass
from typing import Literal, Optional
import torch
import opforge

class Mode(enum.Enum):
    A = "a"
    B = "b"

@dataclass(frozen=True)
class Cfg:
    scale: float
    mode: Mode = Mode.A
    inner: Optional[Inner] = None

@dataclass(frozen=True)
class Inner:          # defined after Cfg: a forward reference
    bias: float

def define(name):
    @opforge.op(name)
    def f(x: torch.Tensor, cfg: Cfg, how: Literal["x", "y"] = "x") -> torch.Tensor:
        out = x * cfg.scale
        return out if cfg.inner is None else out + cfg.inner.bias
    return f

def define_local(name):
    @dataclass(frozen=True)
    class Local:
        k: float

    @opforge.op(name)
    def g(x: torch.Tensor, c: Local, o: Optional[Local] = None) -> torch.Tensor:
        return x * c.k
    return g, Local

def define_unresolvable(name):
    @opforge.op(name)
    def h(x: torch.Tensor, c: Missing) -> torch.Tensor:
        return x
'''


@pytest.fixture(scope="module")
def pep563_module():
    import types

    module = types.ModuleType("opforge_pep563_ops")
    code = compile(PEP563_SOURCE, "<pep563>", "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    import sys

    sys.modules[module.__name__] = module
    exec(code, module.__dict__)
    yield module
    sys.modules.pop(module.__name__, None)


def test_pep563_string_annotations_resolve_including_forward_references(ns, pep563_module):
    f = pep563_module.define(f"{ns}::f")
    assert isinstance(f.__wrapped__.__annotations__["cfg"], str)
    assert f.schema == (f'{ns}::f(Tensor x, float cfg__scale, str cfg__mode="a", bool cfg__inner__is_set=False, '
                        f'float? cfg__inner__bias=None, str how="x") -> Tensor')
    cfg = pep563_module.Cfg(2.0, inner=pep563_module.Inner(1.0))
    assert torch.equal(f(torch.ones(1), cfg), torch.full((1,), 3.0))


def test_closure_local_dataclasses_resolve_under_pep563(ns, pep563_module):
    g, local = pep563_module.define_local(f"{ns}::g")
    assert g.schema.startswith(f"{ns}::g(Tensor x, float c__k, bool o__is_set=False, float? o__k=None)")
    assert torch.equal(g(torch.ones(1), local(4.0)), torch.full((1,), 4.0))


def test_closure_local_dataclasses_resolve_without_pep563(ns):
    @dataclass(frozen=True)
    class Local:
        k: float

    def make():
        @opforge.op(f"{ns}::g")
        def g(x: Tensor, c: Local) -> Tensor:
            return x * c.k

        return g

    g = make()
    assert torch.equal(g(torch.ones(1), Local(3.0)), torch.full((1,), 3.0))


def test_an_unresolvable_name_under_pep563_is_reported_with_the_parameter(ns, pep563_module):
    with pytest.raises(TypeError, match=rf"^{ns}::h: parameter 'c': annotation 'Missing' cannot be resolved"):
        pep563_module.define_unresolvable(f"{ns}::h")
    assert not in_torch_ops(f"{ns}::h")


def test_typing_forward_ref_objects_resolve(ns):
    def f(x: Tensor, s: "Scalars") -> Tensor:
        return x * s.a

    f.__annotations__["s"] = typing.ForwardRef("Scalars")
    op = opforge.op(f"{ns}::f")(f)
    assert torch.equal(op(torch.ones(1), Scalars(2.0)), torch.full((1,), 2.0))


def test_an_op_whose_struct_leaves_pass_torchs_argument_limit_is_refused_naming_the_count_and_the_parameter(ns):
    import dataclasses

    Wide = dataclasses.make_dataclass("Wide", [(f"f{i}", float) for i in range(70)], frozen=True)

    def body(x: Tensor, cfg: Wide) -> Tensor:
        return x.clone()

    name = f"{ns}::wide"
    with pytest.raises(ValueError, match=rf"^{name}: lowers to 71 flat arguments \(each struct field is one: "
                                         r"parameter 'cfg' brings 70\); torch's dispatcher takes at most 64\. "
                                         r"Take fewer leaves"):
        opforge.op(name)(body)
    assert not in_torch_ops(name)
    assert name not in _op.registered_ops()


def test_an_op_name_with_a_nul_byte_says_what_is_wrong_and_shows_the_byte(ns):
    def f(x: Tensor) -> Tensor:
        return x

    with pytest.raises(ValueError) as e:
        opforge.op(f"{ns}::f\x00g")(f)
    assert str(e.value) == (f"{ns}::f\\x00g: the op name holds the control byte \\x00 at position "
                            f"{len(ns) + 3} (a NUL byte, which ends the name for torch). Use letters, digits and "
                            f"underscores: 'namespace::name'.")


def test_a_parameter_name_torch_cannot_hold_is_refused_naming_it(ns):
    def body(x: Tensor, λ: float) -> Tensor:
        return x * λ

    name = f"{ns}::f"
    with pytest.raises(ValueError, match=rf"^{name}: parameter 'λ': torch's schemas take ASCII names only\. "
                                         r"Rename the parameter"):
        opforge.op(name)(body)
    assert not in_torch_ops(name)


def test_a_registry_listener_that_raises_leaves_nothing_registered(ns):
    # opforge._registry.add: every listener sees the op, or the op is not added
    # and define undoes every registration it made.
    from opforge import _registry

    name = f"{ns}::watched"

    def refuse(op):
        if op.name == name:
            raise RuntimeError(f"{name}: refused by a listener")

    _registry._listeners.append(refuse)
    try:
        with pytest.raises(RuntimeError, match="refused by a listener"):
            @opforge.op(name)
            def watched(x: torch.Tensor) -> torch.Tensor:
                return x + 1
    finally:
        _registry._listeners.remove(refuse)
    assert _registry.get(name) is None and name not in _op.registered_ops()
    assert not in_torch_ops(name)

    @opforge.op(name)  # the name is free again
    def watched(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    assert torch.equal(watched(torch.ones(2)), torch.full((2,), 2.0))


def test_the_registry_refuses_a_second_op_of_one_name(ns):
    from opforge import _registry

    @opforge.op(f"{ns}::once")
    def once(x: torch.Tensor) -> torch.Tensor:
        return x

    with pytest.raises(ValueError, match=f"{ns}::once: an opforge op with this name is already registered"):
        _registry.add(once)
    assert _registry.get(f"{ns}::once") is once
