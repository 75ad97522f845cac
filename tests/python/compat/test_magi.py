"""opforge.compat.magi used the way MagiCompiler's own tests use
magi_register_custom_op: eager, torch.compile, autograd, dataclass inputs,
meta-function forms, flags and errors."""

import enum
import sys
import types
from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing import assert_close

from opforge.compat import magi
from opforge.compat.magi import compute_sensitive_ops, magi_register_custom_op, subgraph_boundary_ops


def compiled(fn, backend="eager", **options):
    return torch.compile(fn, backend=backend, fullgraph=True, **options)


@dataclass(frozen=True)
class ScaleCfg:
    scale: float
    bias: float = 0.0


class Mode(enum.Enum):
    A = "a"
    B = "b"


class TestRegistration:
    def test_forward_only_op_runs_eagerly(self):
        @magi_register_custom_op(name="magi_test::forward_only", mutates_args=())
        def forward_only(x: torch.Tensor) -> torch.Tensor:
            return x * 2 + 1

        x = torch.randn(4, 8)
        assert_close(forward_only(x), x * 2 + 1)

    def test_op_is_reachable_through_torch_ops_with_the_flat_leaves(self):
        @dataclass(frozen=True)
        class AddCfg:
            scale: float
            bias: float

        @magi_register_custom_op(name="magi_test::scaled_add")
        def scaled_add(a: torch.Tensor, b: torch.Tensor, cfg: AddCfg) -> torch.Tensor:
            return (a + b) * cfg.scale + cfg.bias

        a, b = torch.randn(3), torch.randn(3)
        assert scaled_add.name == "magi_test::scaled_add"
        assert scaled_add.schema == (
            "magi_test::scaled_add(Tensor a, Tensor b, float cfg__scale, float cfg__bias) -> Tensor"
        )
        assert_close(scaled_add(a, b, AddCfg(2.5, 1.0)), (a + b) * 2.5 + 1.0)
        assert_close(torch.ops.magi_test.scaled_add(a, b, 2.5, 1.0), (a + b) * 2.5 + 1.0)
        assert scaled_add._magi_torch_registered_op is torch.ops.magi_test.scaled_add.default

    def test_default_name_is_file_stem_and_function_name(self):
        @magi_register_custom_op()
        def _auto_named_double(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        assert _auto_named_double.name == "test_magi::_auto_named_double"
        x = torch.randn(2, 3)
        assert_close(torch.ops.test_magi._auto_named_double(x), x * 2)
        assert_close(compiled(lambda t: _auto_named_double(t) + 1)(x), x * 2 + 1)

    def test_default_name_falls_back_to_magi_custom_without_a_source_file(self):
        assert magi.default_op_name(len) == "magi_custom::len"

    def test_default_namespace_replaces_characters_torch_rejects(self):
        namespace = {}
        exec(compile("def op(x):\n    return x\n", "kernels/my-ops.v2.py", "exec"), namespace)
        assert magi.default_op_name(namespace["op"]) == "my_ops_v2::op"

    def test_duplicate_name_raises_runtime_error_naming_the_op(self):
        @magi_register_custom_op(name="magi_test::dup_first")
        def first(x: torch.Tensor) -> torch.Tensor:
            return x + 1

        with pytest.raises(RuntimeError, match="magi_test::dup_first: an operator with this name is already"):

            @magi_register_custom_op(name="magi_test::dup_first")
            def second(x: torch.Tensor) -> torch.Tensor:
                return x + 2

        assert_close(first(torch.zeros(2)), torch.ones(2))

    def test_duplicate_name_is_also_a_value_error_like_the_rest_of_opforge(self):
        with pytest.raises(ValueError, match="already registered"):

            @magi_register_custom_op(name="aten::add")
            def add(x: torch.Tensor) -> torch.Tensor:
                return x

    def test_missing_namespace_is_rejected(self):
        with pytest.raises(ValueError, match="namespace"):

            @magi_register_custom_op(name="missing_namespace_op")
            def op(x: torch.Tensor) -> torch.Tensor:
                return x

    def test_bare_decorator_without_parentheses_is_a_clear_error(self):
        def op(x: torch.Tensor) -> torch.Tensor:
            return x

        with pytest.raises(TypeError, match=r"@magi_register_custom_op\(\) with parentheses"):
            magi_register_custom_op(op)

    def test_rejected_signature_registers_nothing(self):
        with pytest.raises(TypeError, match="parameter 'x': missing type annotation"):

            @magi_register_custom_op(name="magi_test::unannotated", is_subgraph_boundary=True)
            def unannotated(x) -> torch.Tensor:
                return x

        assert not hasattr(torch.ops.magi_test, "unannotated")
        assert "magi_test::unannotated" not in subgraph_boundary_ops()


class TestMetaFunction:
    def test_identity_meta_copies_the_first_tensor_input(self):
        @magi_register_custom_op(name="magi_test::identity_single")
        def identity_single(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        with FakeTensorMode():
            out = identity_single(torch.empty(4, 8, dtype=torch.float64))
        assert (out.shape, out.dtype) == ((4, 8), torch.float64)

    def test_identity_meta_skips_non_tensor_arguments_for_several_outputs(self):
        @magi_register_custom_op(name="magi_test::identity_mixed")
        def identity_mixed(scale: float, x: torch.Tensor, offset: int, y: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.clone(x * scale + offset), torch.clone(y * scale + offset)

        x, y = torch.randn(3, 5), torch.randn(2)
        out1, out2 = compiled(lambda s, a, o, b: identity_mixed(s, a, o, b))(2.0, x, 10, y)
        assert_close(out1, x * 2.0 + 10)
        assert_close(out2, y * 2.0 + 10)

    def test_identity_meta_takes_tensors_inside_dataclasses_in_field_order(self):
        @dataclass(frozen=True)
        class Weights:
            w: torch.Tensor
            scale: float

        @magi_register_custom_op(name="magi_test::identity_leaf_order")
        def identity_leaf_order(cfg: Weights, x: torch.Tensor) -> torch.Tensor:
            return cfg.w * cfg.scale + x.sum()

        with FakeTensorMode():
            out = identity_leaf_order(Weights(torch.empty(7), 2.0), torch.empty(3, 3))
        assert out.shape == (7,)

    def test_parameter_name_list_gives_one_output_per_name(self):
        @magi_register_custom_op(name="magi_test::grads_like", infer_output_meta_fn=["weight", "bias"])
        def grads_like(grad_output: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
            return grad_output.sum(0).view_as(weight).clone(), grad_output.sum(0).view_as(bias).clone()

        with FakeTensorMode():
            gw, gb = grads_like(torch.empty(4, 6), torch.empty(2, 3), torch.empty(6))
        assert (gw.shape, gb.shape) == ((2, 3), (6,))
        gw, gb = grads_like(torch.ones(4, 6), torch.empty(2, 3), torch.empty(6))
        assert_close(gw, torch.full((2, 3), 4.0))

    def test_parameter_name_list_may_name_a_dataclass_tensor_leaf(self):
        @dataclass(frozen=True)
        class Proj:
            weight: torch.Tensor
            bias: Optional[torch.Tensor] = None

        @magi_register_custom_op(name="magi_test::proj_leaf_meta", infer_output_meta_fn=["cfg__weight"])
        def proj_leaf_meta(x: torch.Tensor, cfg: Proj) -> torch.Tensor:
            return cfg.weight * x.mean()

        with FakeTensorMode():
            out = proj_leaf_meta(torch.empty(2), Proj(torch.empty(5, 5)))
        assert out.shape == (5, 5)

    def test_callable_meta_sees_the_original_dataclass_under_compile(self):
        @dataclass(frozen=True)
        class ProjCfg:
            out_dim: int

        def proj_meta(x: torch.Tensor, cfg: ProjCfg) -> torch.Tensor:
            return x.new_empty((*x.shape[:-1], cfg.out_dim))

        @magi_register_custom_op(name="magi_test::dc_meta", infer_output_meta_fn=proj_meta)
        def dc_meta(x: torch.Tensor, cfg: ProjCfg) -> torch.Tensor:
            return x[..., : cfg.out_dim].clone()

        x = torch.randn(2, 8)
        out = compiled(lambda t: dc_meta(t, ProjCfg(out_dim=3)) * 2)(x)
        assert_close(out, x[..., :3] * 2)

    def test_op_returning_none_needs_no_meta(self):
        @magi_register_custom_op(name="magi_test::fill_out", mutates_args=("out",))
        def fill_out(x: torch.Tensor, out: torch.Tensor) -> None:
            out.copy_(x + 1)

        def fn(x):
            out = torch.empty_like(x)
            fill_out(x, out)
            return out * 2

        x = torch.randn(3)
        assert_close(compiled(fn)(x), (x + 1) * 2)

    def test_identity_meta_without_enough_tensor_inputs_names_the_op_and_the_fix(self):
        @magi_register_custom_op(name="magi_test::no_tensor_in")
        def no_tensor_in(cfg: ScaleCfg) -> torch.Tensor:
            return torch.full((2, 3), cfg.scale + cfg.bias)

        assert_close(no_tensor_in(ScaleCfg(2.0, 1.0)), torch.full((2, 3), 3.0))
        with pytest.raises(ValueError, match=r"magi_test::no_tensor_in: the default meta function needs 1 "
                                             r"tensor input.*infer_output_meta_fn="):
            with FakeTensorMode():
                no_tensor_in(ScaleCfg(2.0))

    def test_identity_meta_for_a_list_return_names_the_op_and_the_fix(self):
        @magi_register_custom_op(name="magi_test::list_out")
        def list_out(x: torch.Tensor) -> list[torch.Tensor]:
            return [x.clone(), x.clone()]

        assert len(list_out(torch.ones(2))) == 2
        with pytest.raises(TypeError, match=r"magi_test::list_out: the default meta function describes "
                                            r"Tensor outputs only.*Tensor\[\]"):
            with FakeTensorMode():
                list_out(torch.empty(2))

    def test_unknown_name_in_the_meta_list_is_rejected_at_decoration(self):
        with pytest.raises(ValueError, match=r"magi_test::bad_meta_name: infer_output_meta_fn: 'nope' is not "
                                             r"a parameter. Name Tensor parameters, e\.g\. \['x'\]"):

            @magi_register_custom_op(name="magi_test::bad_meta_name", infer_output_meta_fn=["nope"])
            def bad_meta_name(x: torch.Tensor, k: int) -> torch.Tensor:
                return x

        assert not hasattr(torch.ops.magi_test, "bad_meta_name")

    def test_non_tensor_name_in_the_meta_list_is_rejected_at_decoration(self):
        with pytest.raises(ValueError, match="parameter 'k' is SymInt, not a Tensor"):

            @magi_register_custom_op(name="magi_test::scalar_meta_name", infer_output_meta_fn=["k"])
            def scalar_meta_name(x: torch.Tensor, k: int) -> torch.Tensor:
                return x

    def test_meta_of_another_kind_is_rejected(self):
        with pytest.raises(TypeError, match="infer_output_meta_fn must be a function, a list of parameter names"):

            @magi_register_custom_op(name="magi_test::meta_int", infer_output_meta_fn=3)
            def meta_int(x: torch.Tensor) -> torch.Tensor:
                return x


class TestCompile:
    def test_dataclass_and_enum_op_compiles_on_inductor(self):
        @dataclass(frozen=True)
        class NormCfg:
            eps: float
            mode: Mode = Mode.A

        @magi_register_custom_op(name="magi_test::inductor_norm")
        def inductor_norm(x: torch.Tensor, cfg: NormCfg, mode: Literal["sum", "mean"]) -> torch.Tensor:
            centre = x.sum() if mode == "sum" else x.mean()
            return (x - centre) / (cfg.eps + (1.0 if cfg.mode == "a" else 2.0))

        x = torch.randn(8)
        fn = compiled(lambda t: inductor_norm(t, NormCfg(0.5, Mode.B), "mean").relu(), backend="inductor")
        assert_close(fn(x), ((x - x.mean()) / 2.5).relu())

    def test_dynamic_batch_sizes_reuse_one_graph(self):
        @magi_register_custom_op(name="magi_test::triple")
        def triple(x: torch.Tensor) -> torch.Tensor:
            return x * 3

        fn = compiled(lambda t: triple(t) + 1, dynamic=True)
        for rows in (4, 8):
            x = torch.randn(rows, 8)
            assert_close(fn(x), x * 3 + 1)


class TestDataclassInputs:
    def test_nested_dataclass_is_lowered_to_double_underscore_leaves(self):
        @dataclass(frozen=True)
        class Inner:
            scale: float
            bias: float

        @dataclass(frozen=True)
        class Outer:
            inner: Inner
            offset: float

        @magi_register_custom_op(name="magi_test::nested_dc")
        def nested_dc(x: torch.Tensor, cfg: Outer) -> torch.Tensor:
            return x * cfg.inner.scale * cfg.inner.bias + cfg.offset

        x = torch.randn(2, 3)
        cfg = Outer(inner=Inner(scale=2.0, bias=3.0), offset=1.5)
        assert_close(nested_dc(x, cfg), x * 6.0 + 1.5)
        assert_close(nested_dc(x=x, cfg=cfg), x * 6.0 + 1.5)
        assert nested_dc._magi_param_mapping_tree == [
            ("primitive", "x", "x", None),
            ("dataclass", "cfg", Outer, [
                ("dataclass", "inner", Inner, [
                    ("primitive", "scale", "cfg__inner__scale", None),
                    ("primitive", "bias", "cfg__inner__bias", None),
                ]),
                ("primitive", "offset", "cfg__offset", None),
            ]),
        ]
        assert nested_dc._magi_flat_plan is nested_dc._magi_param_mapping_tree

    def test_optional_and_list_fields_round_trip(self):
        @dataclass(frozen=True)
        class Cfg:
            bias: Optional[torch.Tensor]
            scale: Optional[float]
            biases: list[torch.Tensor]
            block_sizes: list[int] = field(default_factory=lambda: [4, 8])

        @magi_register_custom_op(name="magi_test::dc_optional_list")
        def dc_optional_list(x: torch.Tensor, cfg: Cfg) -> torch.Tensor:
            out = x.clone()
            if cfg.bias is not None:
                out = out + cfg.bias
            for b in cfg.biases:
                out = out + b
            if cfg.scale is not None:
                out = out * cfg.scale
            return out * float(sum(cfg.block_sizes))

        x = torch.ones(3)
        assert_close(dc_optional_list(x, Cfg(None, None, [])), torch.full((3,), 12.0))
        cfg = Cfg(bias=torch.tensor([1.0, 2.0, 3.0]), scale=2.0, biases=[torch.ones(3)], block_sizes=[1])
        assert_close(dc_optional_list(x, cfg), torch.tensor([6.0, 8.0, 10.0]))

    def test_dtype_and_device_fields_keep_their_defaults(self):
        @dataclass(frozen=True)
        class CastCfg:
            out_dtype: torch.dtype = torch.float16
            out_device: Optional[torch.device] = None

        @magi_register_custom_op(name="magi_test::dc_cast")
        def dc_cast(x: torch.Tensor, cfg: CastCfg) -> torch.Tensor:
            return x.to(dtype=cfg.out_dtype, device=cfg.out_device)

        assert dc_cast(torch.randn(4), CastCfg()).dtype == torch.float16
        assert dc_cast(torch.randn(4), CastCfg(out_dtype=torch.bfloat16)).dtype == torch.bfloat16

    def test_string_annotations_resolve_closure_local_dataclasses(self):
        @dataclass(frozen=True)
        class LocalCfg:
            factor: float

        @magi_register_custom_op(name="magi_test::string_annotations")
        def string_annotations(x: "torch.Tensor", cfg: "LocalCfg", mode: "Mode") -> "torch.Tensor":
            return x * cfg.factor * (1.0 if mode == "a" else -1.0)

        assert_close(string_annotations(torch.ones(2), LocalCfg(3.0), Mode.B), torch.full((2,), -3.0))

    def test_mutable_dataclass_is_rejected_naming_the_class_and_the_fix(self):
        @dataclass
        class MutableInner:
            val: float

        @dataclass(frozen=True)
        class OuterCfg:
            inner: MutableInner

        with pytest.raises(TypeError, match=r"magi_test::mutable_nested: parameter 'cfg', field .*OuterCfg\.inner: "
                                            r"dataclass .*MutableInner is not frozen.*frozen=True"):

            @magi_register_custom_op(name="magi_test::mutable_nested")
            def mutable_nested(x: torch.Tensor, cfg: OuterCfg) -> torch.Tensor:
                return x

    def test_tuple_and_dict_parameters_are_rejected_with_a_hint(self):
        with pytest.raises(TypeError, match=r"tuple annotations .* Use list\[torch.Tensor\] instead"):

            @magi_register_custom_op(name="magi_test::top_tuple")
            def top_tuple(xs: tuple[torch.Tensor, ...]) -> torch.Tensor:
                return xs[0]

        with pytest.raises(TypeError, match="dict annotations"):

            @magi_register_custom_op(name="magi_test::top_dict")
            def top_dict(xs: dict[str, torch.Tensor]) -> torch.Tensor:
                return xs["a"]


class TestLiteralAndEnum:
    def test_literal_str_reaches_the_body_as_the_string(self):
        @magi_register_custom_op(name="magi_test::literal_str")
        def literal_str(x: torch.Tensor, mode: Literal["a", "b"]) -> torch.Tensor:
            assert type(mode) is str
            return x * (2.0 if mode == "a" else 3.0)

        x = torch.ones(3)
        assert_close(literal_str(x, "a"), torch.full((3,), 2.0))
        assert_close(literal_str(x, "b"), torch.full((3,), 3.0))
        assert "str mode" in literal_str.schema

    def test_literal_value_outside_the_set_is_rejected_at_call(self):
        @magi_register_custom_op(name="magi_test::literal_checked")
        def literal_checked(x: torch.Tensor, mode: Literal["a", "b"]) -> torch.Tensor:
            return x.clone()

        with pytest.raises(ValueError, match=r"'c' is not one of the allowed values \['a', 'b'\]"):
            literal_checked(torch.ones(1), "c")

    def test_enum_body_receives_the_raw_value_for_a_member_or_a_value(self):
        seen = []

        @magi_register_custom_op(name="magi_test::enum_str")
        def enum_str(x: torch.Tensor, mode: Mode) -> torch.Tensor:
            seen.append(mode)
            return x * (2.0 if mode == "a" else 3.0)

        x = torch.ones(3)
        assert_close(enum_str(x, "a"), torch.full((3,), 2.0))
        assert_close(enum_str(x, Mode.B), torch.full((3,), 3.0))
        assert_close(enum_str(x, mode=Mode.A), torch.full((3,), 2.0))
        assert seen == ["a", "b", "a"] and all(type(m) is str for m in seen)
        assert "str mode" in enum_str.schema

    def test_enum_field_inside_a_dataclass_reaches_the_body_as_the_raw_value(self):
        @dataclass(frozen=True)
        class AttnCfg:
            scale: float
            mode: Mode = Mode.A

        @magi_register_custom_op(name="magi_test::enum_field")
        def enum_field(x: torch.Tensor, cfg: AttnCfg) -> torch.Tensor:
            assert cfg.mode in ("a", "b") and not isinstance(cfg.mode, Mode)
            return x * cfg.scale * (1.0 if cfg.mode == "a" else -1.0)

        x = torch.ones(2)
        assert_close(enum_field(x, AttnCfg(2.0)), torch.full((2,), 2.0))
        assert_close(compiled(lambda t: enum_field(t, AttnCfg(2.0, Mode.B)))(x), torch.full((2,), -2.0))

    def test_int_literals_and_int_enums_are_accepted(self):
        class Bits(enum.Enum):
            FOUR = 4
            EIGHT = 8

        @magi_register_custom_op(name="magi_test::int_choices")
        def int_choices(x: torch.Tensor, k: Literal[1, 2], bits: Bits) -> torch.Tensor:
            assert type(bits) is int
            return x * k * bits

        assert_close(int_choices(torch.ones(2), 2, Bits.EIGHT), torch.full((2,), 16.0))


def _save_x(ctx, inputs, output):
    (x,) = inputs
    ctx.save_for_backward(x)


def _square_backward(ctx, grad_output):
    (x,) = ctx.saved_tensors
    return grad_output * 2 * x


class TestAutograd:
    def test_backward_may_return_a_bare_tensor_for_one_input(self):
        @magi_register_custom_op(name="magi_test::square", setup_context_fn=_save_x, backward_fn=_square_backward)
        def square(x: torch.Tensor) -> torch.Tensor:
            return x * x

        x = torch.randn(4, 8, requires_grad=True)
        square(x).sum().backward()
        assert_close(x.grad, 2 * x.detach())

    def test_backward_under_compile(self):
        def cube_backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            return grad_output * 3 * x * x

        @magi_register_custom_op(name="magi_test::cube", setup_context_fn=_save_x, backward_fn=cube_backward)
        def cube(x: torch.Tensor) -> torch.Tensor:
            return x * x * x

        x = torch.randn(4, 8, requires_grad=True)
        compiled(lambda t: cube(t))(x).sum().backward()
        assert_close(x.grad, 3 * x.detach() ** 2)

    def test_setup_context_gets_the_original_dataclass_and_raw_enum_values(self):
        @dataclass(frozen=True)
        class Cfg:
            scale: float
            mode: Mode

        seen = []

        def setup(ctx, inputs, output):
            x, cfg = inputs
            seen.append(cfg)
            ctx.save_for_backward(x)
            ctx.scale = cfg.scale

        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * ctx.scale * 2 * x, None

        @magi_register_custom_op(name="magi_test::dc_square", setup_context_fn=setup, backward_fn=backward)
        def dc_square(x: torch.Tensor, cfg: Cfg) -> torch.Tensor:
            return x * x * cfg.scale

        x = torch.randn(3, requires_grad=True)
        dc_square(x, Cfg(1.5, Mode.B)).sum().backward()
        assert_close(x.grad, 3.0 * x.detach())
        assert seen == [Cfg(1.5, "b")]

    def test_dataclass_gradient_may_be_a_dict_by_field_name(self):
        @dataclass(frozen=True)
        class Affine:
            weight: torch.Tensor
            bias: torch.Tensor
            eps: float

        def setup(ctx, inputs, output):
            x, cfg = inputs
            ctx.save_for_backward(x, cfg.weight)

        def backward(ctx, grad):
            x, weight = ctx.saved_tensors
            return grad * weight, {"weight": grad * x, "bias": grad}

        @magi_register_custom_op(name="magi_test::affine_dict", setup_context_fn=setup, backward_fn=backward)
        def affine_dict(x: torch.Tensor, cfg: Affine) -> torch.Tensor:
            return x * cfg.weight + cfg.bias + cfg.eps

        x, w, b = (torch.randn(3, requires_grad=True) for _ in range(3))
        affine_dict(x, Affine(w, b, 1e-3)).sum().backward()
        assert_close(x.grad, w.detach())
        assert_close(w.grad, x.detach())
        assert_close(b.grad, torch.ones(3))

    def test_dataclass_gradient_may_be_an_instance_with_none_fields(self):
        @dataclass(frozen=True)
        class Affine:
            weight: torch.Tensor
            bias: Optional[torch.Tensor]

        def setup(ctx, inputs, output):
            x, cfg = inputs
            ctx.save_for_backward(x)

        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return None, Affine(weight=grad * x, bias=None)

        @magi_register_custom_op(name="magi_test::affine_instance", setup_context_fn=setup, backward_fn=backward)
        def affine_instance(x: torch.Tensor, cfg: Affine) -> torch.Tensor:
            return x * cfg.weight + cfg.bias

        x = torch.randn(3)
        w, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        affine_instance(x, Affine(w, b)).sum().backward()
        assert_close(w.grad, x)
        assert b.grad is None

    def test_dataclass_gradient_may_be_any_object_with_its_field_names(self):
        @dataclass(frozen=True)
        class Affine:
            weight: torch.Tensor
            bias: torch.Tensor

        def setup(ctx, inputs, output):
            x, cfg = inputs
            ctx.save_for_backward(x)

        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return None, types.SimpleNamespace(weight=grad * x, bias=grad * 2)

        @magi_register_custom_op(name="magi_test::affine_namespace", setup_context_fn=setup,
                                 backward_fn=backward)
        def affine_namespace(x: torch.Tensor, cfg: Affine) -> torch.Tensor:
            return x * cfg.weight + cfg.bias

        x = torch.randn(3)
        w, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        affine_namespace(x, Affine(w, b)).sum().backward()
        assert_close(w.grad, x)
        assert_close(b.grad, torch.full((3,), 2.0))

    def test_none_for_a_whole_dataclass_means_no_gradient_for_any_field(self):
        @dataclass(frozen=True)
        class Holder:
            t: torch.Tensor

        def backward(ctx, grad):
            return grad * 2, None

        @magi_register_custom_op(name="magi_test::dc_none_grad", backward_fn=backward)
        def dc_none_grad(x: torch.Tensor, h: Holder) -> torch.Tensor:
            return x * 2 + h.t

        x, t = torch.randn(2, requires_grad=True), torch.randn(2, requires_grad=True)
        dc_none_grad(x, Holder(t)).sum().backward()
        assert_close(x.grad, torch.full((2,), 2.0))
        assert t.grad is None

    def test_tuple_outputs_get_one_gradient_each(self):
        def backward(ctx, grad_a, grad_b):
            return grad_a + 2 * grad_b

        @magi_register_custom_op(name="magi_test::two_outputs", backward_fn=backward)
        def two_outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.clone(), x * 2

        x = torch.randn(3, requires_grad=True)
        a, b = two_outputs(x)
        (a.sum() + b.sum()).backward()
        assert_close(x.grad, torch.full((3,), 3.0))

    def test_wrong_number_of_gradients_names_the_op(self):
        @magi_register_custom_op(name="magi_test::grad_count", backward_fn=lambda ctx, g: (g, g))
        def grad_count(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        x = torch.randn(2, requires_grad=True)
        # MagiCompiler raises ValueError here; torch's autograd would raise
        # RuntimeError: the error is both.
        with pytest.raises(ValueError, match=r"magi_test::grad_count: backward returned 2 gradient\(s\) "
                                             r"but the op has 1 parameter") as info:
            grad_count(x).sum().backward()
        assert isinstance(info.value, RuntimeError)

    def test_gradient_without_backward_is_a_clear_error(self):
        @magi_register_custom_op(name="magi_test::no_backward")
        def no_backward(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        x = torch.randn(2, requires_grad=True)
        with pytest.raises(RuntimeError, match="magi_test::no_backward: a gradient was requested"):
            no_backward(x).sum().backward()

    def test_setup_context_without_backward_warns_that_it_is_ignored(self):
        with pytest.warns(UserWarning, match="magi_test::setup_only: setup_context_fn is ignored without "
                                             "backward_fn"):

            @magi_register_custom_op(name="magi_test::setup_only", setup_context_fn=_save_x)
            def setup_only(x: torch.Tensor) -> torch.Tensor:
                return x + 1

        assert_close(setup_only(torch.zeros(2)), torch.ones(2))


class TestMutation:
    def test_a_dataclass_name_in_mutates_args_marks_its_tensor_leaves_only(self):
        @dataclass(frozen=True)
        class Cache:
            keys: torch.Tensor
            length: int

        @magi_register_custom_op(name="magi_test::append_cache", mutates_args=("cache",))
        def append_cache(x: torch.Tensor, cache: Cache) -> None:
            cache.keys[cache.length] = x

        assert append_cache.schema == (
            "magi_test::append_cache(Tensor x, Tensor(a1!) cache__keys, SymInt cache__length) -> ()"
        )
        keys = torch.zeros(3)
        append_cache(torch.tensor(5.0), Cache(keys, 1))
        assert_close(keys, torch.tensor([0.0, 5.0, 0.0]))

    def test_unknown_mutates_args_marks_every_tensor(self):
        @magi_register_custom_op(name="magi_test::mutate_unknown", mutates_args="unknown")
        def mutate_unknown(a: torch.Tensor, b: torch.Tensor, k: int) -> None:
            a.add_(k)

        assert mutate_unknown.schema == (
            "magi_test::mutate_unknown(Tensor(a0!) a, Tensor(a1!) b, SymInt k) -> ()"
        )

    def test_unknown_mutates_args_entry_is_rejected(self):
        with pytest.raises(ValueError, match="magi_test::mutate_typo"):

            @magi_register_custom_op(name="magi_test::mutate_typo", mutates_args=("outt",))
            def mutate_typo(x: torch.Tensor, out: torch.Tensor) -> None:
                out.copy_(x)


class TestFlags:
    def test_compute_sensitive_and_subgraph_boundary_are_recorded(self):
        @magi_register_custom_op(name="magi_test::flagged", is_compute_sensitive=True, is_subgraph_boundary=True)
        def flagged(x: torch.Tensor, cfg: ScaleCfg) -> torch.Tensor:
            return x * cfg.scale

        @magi_register_custom_op(name="magi_test::boundary_only", is_subgraph_boundary=True)
        def boundary_only(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        assert "magi_test::flagged" in compute_sensitive_ops()
        assert "magi_test::boundary_only" not in compute_sensitive_ops()
        boundaries = subgraph_boundary_ops()
        assert boundaries.index("magi_test::flagged") < boundaries.index("magi_test::boundary_only")
        assert_close(flagged(torch.ones(2), ScaleCfg(2.0)), torch.full((2,), 2.0))

    def test_flags_reach_magi_compilers_config_when_it_is_installed(self, monkeypatch):
        config = types.SimpleNamespace(
            splitting_ops=[], recompute_config=types.SimpleNamespace(custom_compute_sensitive_ops=[])
        )
        module = types.ModuleType("magi_compiler.config")
        module.get_compile_config = lambda: config
        monkeypatch.setitem(sys.modules, "magi_compiler.config", module)

        @magi_register_custom_op(name="magi_test::forwarded", is_compute_sensitive=True, is_subgraph_boundary=True)
        def forwarded(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        assert config.recompute_config.custom_compute_sensitive_ops == ["magi_test::forwarded"]
        assert config.splitting_ops == ["magi_test::forwarded"]

    def test_unknown_force_register_mode_is_rejected(self):
        with pytest.raises(ValueError, match="force_register_mode='triton' is not one of"):
            magi_register_custom_op(name="magi_test::bad_mode", force_register_mode="triton")


def test_opdef_is_returned_and_keeps_the_original_function():
    def body(x: torch.Tensor) -> torch.Tensor:
        """Adds one."""
        return x + 1

    op = magi_register_custom_op(name="magi_test::keeps_fn")(body)
    assert op.__wrapped__ is body and op.__doc__ == "Adds one."
    assert_close(op(torch.zeros(1)), torch.ones(1))


@dataclass(frozen=True)
class Pair:
    low: torch.Tensor
    high: torch.Tensor


def test_a_dataclass_of_tensors_returned_works_eagerly_and_compiled_with_the_default_meta():
    @magi_register_custom_op(name="magi_test::split_pair")
    def split_pair(x: torch.Tensor, y: torch.Tensor) -> Pair:
        return Pair(torch.minimum(x, y), torch.maximum(x, y))

    x, y = torch.randn(5), torch.randn(5)
    eager = split_pair(x, y)
    graph = compiled(lambda a, b: split_pair(a, b))(x, y)
    assert type(eager) is Pair and type(graph) is Pair
    assert_close(graph.low, torch.minimum(x, y))
    assert_close(graph.high, eager.high)


def test_a_returned_dataclass_the_default_meta_cannot_describe_is_rejected_at_decoration():
    @dataclass(frozen=True)
    class Stats:
        value: torch.Tensor
        count: int

    with pytest.raises(TypeError, match=r"magi_test::stats: the default meta function describes Tensor outputs "
                                        r"only, and the returned .*Stats has fields that are not Tensors. Pass "
                                        r"infer_output_meta_fn="):

        @magi_register_custom_op(name="magi_test::stats")
        def stats(x: torch.Tensor) -> Stats:
            return Stats(x.sum(), x.numel())

    with pytest.raises(AttributeError):
        torch.ops.magi_test.stats.default

    @magi_register_custom_op(name="magi_test::stats", infer_output_meta_fn=lambda x: Stats(x.sum(), 3))
    def stats_with_meta(x: torch.Tensor) -> Stats:
        return Stats(x.sum(), x.numel())

    assert stats_with_meta(torch.ones(3)).count == 3


def test_an_outermost_triton_heuristics_kernel_is_a_runtime_error_as_in_magi():
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.heuristics({"BLOCK": lambda args: 16})
    @triton.jit
    def copy_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
        pass

    with pytest.raises(RuntimeError, match=r"magi_test::heuristic_top: Triton kernel 'copy_kernel' has "
                                           r"@triton.heuristics as its outermost decorator"):

        @magi_register_custom_op(name="magi_test::heuristic_top")
        def heuristic_top(x: torch.Tensor) -> torch.Tensor:
            out = torch.empty_like(x)
            copy_kernel[(1,)](x, out)
            return out

    with pytest.raises(AttributeError):
        torch.ops.magi_test.heuristic_top.default
