"""opforge.compat.magi used the way MagiCompiler's own tests use
magi_register_custom_op: eager, torch.compile, autograd, dataclass inputs,
meta-function forms, flags and errors."""

import enum
import os
import subprocess
import sys
import textwrap
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

    def test_several_tensor_and_scalar_inputs_run_eagerly(self):
        @magi_register_custom_op(name="magi_test::multi_input")
        def multi_input(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
            return (a + b) * scale

        a, b = torch.randn(4, 8), torch.randn(4, 8)
        assert_close(multi_input(a, b, 2.5), (a + b) * 2.5)

    def test_a_missing_return_annotation_is_rejected_in_magis_words(self):
        with pytest.raises(TypeError, match=r"^magi_test::no_return: return value has no type annotation. Add one, "
                                            r"e.g. '-> torch.Tensor' or '-> None'.$"):

            @magi_register_custom_op(name="magi_test::no_return")
            def no_return(x: torch.Tensor):
                return x

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
        with pytest.raises(TypeError, match="parameter 'x' has no type annotation"):

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

    def test_callable_meta_describes_several_outputs(self):
        def split_meta(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            half = x.shape[-1] // 2
            return x.new_empty((*x.shape[:-1], half)), x.new_empty((*x.shape[:-1], half))

        @magi_register_custom_op(name="magi_test::split", infer_output_meta_fn=split_meta)
        def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            half = x.shape[-1] // 2
            return x[..., :half].clone(), x[..., half:].clone()

        x = torch.randn(4, 8)
        low, high = compiled(lambda t: split(t))(x)
        assert_close(low, x[..., :4])
        assert_close(high, x[..., 4:])
        with FakeTensorMode():
            low, high = split(torch.empty(2, 6))
        assert (low.shape, high.shape) == ((2, 3), (2, 3))

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

    def test_an_op_whose_only_parameter_is_a_dataclass_runs(self):
        @magi_register_custom_op(name="magi_test::dc_only")
        def dc_only(cfg: ScaleCfg) -> torch.Tensor:
            return torch.full((2, 3), cfg.scale + cfg.bias)

        assert_close(dc_only(ScaleCfg(2.0, 1.0)), torch.full((2, 3), 3.0))

    def test_three_levels_of_dataclasses_and_a_meta_written_against_them(self):
        @dataclass(frozen=True)
        class Leaf:
            val: float

        @dataclass(frozen=True)
        class Mid:
            leaf: Leaf
            extra: int

        @dataclass(frozen=True)
        class Root:
            mid: Mid
            out_dim: int

        def meta(x: torch.Tensor, cfg: Root, alpha: float) -> torch.Tensor:
            return x.new_empty((*x.shape[:-1], cfg.out_dim))

        @magi_register_custom_op(name="magi_test::deep_dc", infer_output_meta_fn=meta)
        def deep_dc(x: torch.Tensor, cfg: Root, alpha: float) -> torch.Tensor:
            return x[..., : cfg.out_dim] * cfg.mid.leaf.val + cfg.mid.extra + alpha

        x = torch.randn(2, 8)
        cfg = Root(Mid(Leaf(2.0), 3), out_dim=3)
        assert_close(deep_dc(x, cfg, alpha=1.0), x[..., :3] * 2.0 + 4.0)
        with FakeTensorMode():
            assert deep_dc(torch.empty(5, 8), cfg, 1.0).shape == (5, 3)

    def test_pep604_and_none_defaulted_optional_fields(self):
        @dataclass(frozen=True)
        class Cfg:
            bias: torch.Tensor | None
            softcap: float | None = None
            causal: bool | None = None

        @magi_register_custom_op(name="magi_test::dc_pep604")
        def dc_pep604(x: torch.Tensor, cfg: Cfg) -> torch.Tensor:
            y = x.clone() if cfg.bias is None else x + cfg.bias
            if cfg.softcap is not None:
                y = torch.tanh(y / cfg.softcap) * cfg.softcap
            return y * 0.5 if cfg.causal else y

        x = torch.randn(2)
        assert_close(dc_pep604(x, Cfg(None)), x)
        assert_close(dc_pep604(x, Cfg(torch.ones(2), softcap=2.0, causal=True)), torch.tanh((x + 1) / 2.0))

    def test_list_fields_of_every_element_type_including_an_empty_one(self):
        @dataclass(frozen=True)
        class Cfg:
            biases: list[torch.Tensor]
            maybe: list[Optional[torch.Tensor]]
            scales: list[float]
            sizes: list[int]
            flags: list[bool]

        @magi_register_custom_op(name="magi_test::dc_lists")
        def dc_lists(x: torch.Tensor, cfg: Cfg) -> torch.Tensor:
            assert all(type(s) is int for s in cfg.sizes) and all(type(f) is bool for f in cfg.flags)
            out = x.clone()
            for b in [*cfg.biases, *(m for m in cfg.maybe if m is not None)]:
                out = out + b
            return out * float(sum(cfg.scales))

        x = torch.ones(3)
        cfg = Cfg([torch.ones(3), torch.full((3,), 10.0)], [None, torch.ones(3)], [2.0, 0.5], [4, 8], [True, False])
        assert_close(dc_lists(x, cfg), torch.full((3,), 32.5))
        assert_close(dc_lists(x, Cfg([], [], [1.0], [], [])), x)

    def test_an_optional_list_of_tensors_field_is_accepted(self):
        @dataclass(frozen=True)
        class Cfg:
            biases: Optional[list[torch.Tensor]] = None

        @magi_register_custom_op(name="magi_test::dc_optional_tensor_list")
        def dc_optional_tensor_list(x: torch.Tensor, cfg: Cfg) -> torch.Tensor:
            return x + sum(cfg.biases or [torch.zeros(())])

        assert_close(dc_optional_tensor_list(torch.ones(2), Cfg()), torch.ones(2))
        assert_close(dc_optional_tensor_list(torch.ones(2), Cfg([torch.ones(2)] * 2)), torch.full((2,), 3.0))

    def test_field_defaults_and_default_factories_fill_in(self):
        @dataclass(frozen=True)
        class Inner:
            val: float = 3.0

        @dataclass(frozen=True)
        class Cfg:
            inner: Inner = Inner()
            block_sizes: list[int] = field(default_factory=lambda: [4, 8])

        @magi_register_custom_op(name="magi_test::dc_defaults")
        def dc_defaults(x: torch.Tensor, cfg: Cfg) -> torch.Tensor:
            return x * cfg.inner.val * sum(cfg.block_sizes)

        x = torch.ones(2)
        assert_close(dc_defaults(x, Cfg()), torch.full((2,), 36.0))
        assert_close(dc_defaults(x, Cfg(Inner(1.0), [1, 2])), torch.full((2,), 3.0))

    def test_tuple_and_dict_fields_are_rejected_in_magis_words(self):
        @dataclass(frozen=True)
        class TupleCfg:
            qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor]

        @dataclass(frozen=True)
        class DictCfg:
            weight_by_name: dict[str, torch.Tensor]

        with pytest.raises(TypeError, match=r"parameter 'cfg', field .*TupleCfg.qkv has tuple annotation .*; use "
                                            r"list\[\.\.\.\]. Use list\[torch.Tensor\] instead.$"):

            @magi_register_custom_op(name="magi_test::dc_tuple_field")
            def dc_tuple_field(x: torch.Tensor, cfg: TupleCfg) -> torch.Tensor:
                return x

        with pytest.raises(TypeError, match=r"field .*DictCfg.weight_by_name has dict-typed annotation"):

            @magi_register_custom_op(name="magi_test::dc_dict_field")
            def dc_dict_field(x: torch.Tensor, cfg: DictCfg) -> torch.Tensor:
                return x

    def test_an_unresolvable_field_annotation_is_rejected_in_magis_words(self):
        @dataclass(frozen=True)
        class OuterCfg:
            inner: "_DefinitelyNotInScope"  # noqa: F821

        with pytest.raises(TypeError, match=r"^magi_test::dc_unresolvable: parameter 'cfg', field .*OuterCfg.inner "
                                            r"has unresolved string annotation '_DefinitelyNotInScope'. Make the "
                                            r"names it uses importable where the function is defined.$"):

            @magi_register_custom_op(name="magi_test::dc_unresolvable")
            def dc_unresolvable(x: torch.Tensor, cfg: OuterCfg) -> torch.Tensor:
                return x

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
        with pytest.raises(TypeError, match=r"^magi_test::top_tuple: parameter 'xs' has tuple annotation "
                                            r"tuple\[torch.Tensor, \.\.\.\]; use list\[\.\.\.\]. "
                                            r"Use list\[torch.Tensor\] instead.$"):

            @magi_register_custom_op(name="magi_test::top_tuple")
            def top_tuple(xs: tuple[torch.Tensor, ...]) -> torch.Tensor:
                return xs[0]

        with pytest.raises(TypeError, match=r"^magi_test::top_dict: parameter 'xs' has dict-typed annotation "
                                            r"dict\[str, torch.Tensor\]. Use a frozen dataclass or separate "
                                            r"parameters.$"):

            @magi_register_custom_op(name="magi_test::top_dict")
            def top_dict(xs: dict[str, torch.Tensor]) -> torch.Tensor:
                return xs["a"]


class TestTopLevelParameters:
    def test_optional_tensor_with_and_without_a_default(self):
        @magi_register_custom_op(name="magi_test::opt_bias")
        def opt_bias(x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            return x.clone() if bias is None else x + bias

        @magi_register_custom_op(name="magi_test::opt_bias_required")
        def opt_bias_required(x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
            return x.clone() if bias is None else x + bias

        x, b = torch.randn(3, 4), torch.randn(3, 4)
        assert_close(opt_bias(x), x)
        assert_close(opt_bias(x, b), x + b)
        assert_close(opt_bias_required(x, None), x)

    def test_a_list_int_default_is_kept_and_may_be_passed(self):
        @magi_register_custom_op(name="magi_test::list_default")
        def list_default(x: torch.Tensor, dims: list[int] = [0]) -> torch.Tensor:
            return x.sum(dim=dims, keepdim=True)

        x = torch.randn(3, 4)
        assert list_default(x, [0]).shape == (1, 4)
        assert list_default(x).shape == (1, 4)
        assert list_default(x, [1]).shape == (3, 1)

    def test_a_list_of_tensors_is_returned_with_its_meta(self):
        def meta(x, n):
            return [torch.empty_like(x.chunk(n, dim=0)[0]) for _ in range(n)]

        @magi_register_custom_op(name="magi_test::chunks", infer_output_meta_fn=meta)
        def chunks(x: torch.Tensor, n: int) -> list[torch.Tensor]:
            return [c.clone() for c in x.chunk(n, dim=0)]

        out = chunks(torch.randn(8, 4), 4)
        assert isinstance(out, list) and [o.shape for o in out] == [(2, 4)] * 4
        with FakeTensorMode():
            assert [o.shape for o in chunks(torch.empty(6, 2), 3)] == [(2, 2)] * 3


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
        with pytest.raises(ValueError, match=r"^magi_test::grad_count: backward_fn returned 2 grad\(s\) but the "
                                             r"function has 1 input\(s\); return one per parameter, None where "
                                             r"there is none.$") as info:
            grad_count(x).sum().backward()
        assert isinstance(info.value, RuntimeError)

    def test_gradients_for_two_tensors_and_none_for_a_float(self):
        def setup(ctx, inputs, output):
            ctx.weight = inputs[2]

        def backward(ctx, grad):
            return grad * ctx.weight, grad * (1 - ctx.weight), None

        @magi_register_custom_op(name="magi_test::weighted_sum", setup_context_fn=setup, backward_fn=backward)
        def weighted_sum(a: torch.Tensor, b: torch.Tensor, weight: float) -> torch.Tensor:
            return a * weight + b * (1 - weight)

        a, b = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
        weighted_sum(a, b, 0.75).sum().backward()
        assert_close(a.grad, torch.full((4,), 0.75))
        assert_close(b.grad, torch.full((4,), 0.25))

    def test_a_dataclass_only_op_with_a_backward_runs_forward(self):
        def setup(ctx, inputs, output):
            (cfg,) = inputs
            ctx.alpha = cfg.scale

        @magi_register_custom_op(name="magi_test::dc_only_bwd", setup_context_fn=setup,
                                 backward_fn=lambda ctx, grad: None)
        def dc_only_bwd(cfg: ScaleCfg) -> torch.Tensor:
            return torch.full((2, 3), cfg.scale)

        assert_close(dc_only_bwd(ScaleCfg(1.5)), torch.full((2, 3), 1.5))

    def test_tensors_around_a_nested_dataclass_get_their_gradients(self):
        @dataclass(frozen=True)
        class Outer:
            inner: ScaleCfg
            tag: float

        def setup(ctx, inputs, output):
            a, cfg, b = inputs
            assert isinstance(cfg, Outer) and isinstance(cfg.inner, ScaleCfg)
            ctx.scale, ctx.tag = cfg.inner.scale, cfg.tag

        def backward(ctx, grad):
            return grad * ctx.scale, None, grad * ctx.tag

        @magi_register_custom_op(name="magi_test::sandwich", setup_context_fn=setup, backward_fn=backward)
        def sandwich(a: torch.Tensor, cfg: Outer, b: torch.Tensor) -> torch.Tensor:
            return a * cfg.inner.scale + b * cfg.tag + cfg.inner.bias

        a, b = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
        ga, gb = torch.autograd.grad(sandwich(a, Outer(ScaleCfg(2.0, 0.5), -3.0), b).sum(), [a, b])
        assert_close(ga, torch.full((4,), 2.0))
        assert_close(gb, torch.full((4,), -3.0))

    def test_backward_may_call_another_registered_op(self):
        @magi_register_custom_op(name="magi_test::matmul_grad_x")
        def matmul_grad_x(gy: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return gy @ w.t()

        def setup(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        def backward(ctx, gy):
            x, w = ctx.saved_tensors
            return matmul_grad_x(gy, w), x.t() @ gy

        @magi_register_custom_op(name="magi_test::matmul", setup_context_fn=setup, backward_fn=backward)
        def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return x @ w

        x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5, requires_grad=True)
        matmul(x, w).sum().backward()
        gy = torch.ones(3, 5)
        assert_close(x.grad, gy @ w.detach().t())
        assert_close(w.grad, x.detach().t() @ gy)

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
        with pytest.raises(ValueError, match=r"^magi_test::mutate_typo: mutates_args entry 'outt' does not match "
                                             r"any parameter. Name a parameter \(x, out\).$"):

            @magi_register_custom_op(name="magi_test::mutate_typo", mutates_args=("outt",))
            def mutate_typo(x: torch.Tensor, out: torch.Tensor) -> None:
                out.copy_(x)


class TestCompositions:
    def test_a_keyword_only_dataclass_with_and_without_a_backward(self):
        @magi_register_custom_op(name="magi_test::kwonly")
        def kwonly(x: torch.Tensor, *, cfg: ScaleCfg) -> torch.Tensor:
            return x * cfg.scale

        def setup(ctx, inputs, output):
            ctx.scale = inputs[1].scale

        @magi_register_custom_op(name="magi_test::kwonly_bwd", setup_context_fn=setup,
                                 backward_fn=lambda ctx, grad: (grad * ctx.scale, None))
        def kwonly_bwd(x: torch.Tensor, *, cfg: ScaleCfg) -> torch.Tensor:
            return x * cfg.scale

        x = torch.randn(3, requires_grad=True)
        assert_close(kwonly(x, cfg=ScaleCfg(4.0)), x * 4.0)
        kwonly_bwd(x, cfg=ScaleCfg(2.5)).sum().backward()
        assert_close(x.grad, torch.full((3,), 2.5))

    def test_a_flat_leaf_name_in_mutates_args_marks_that_leaf(self):
        @dataclass(frozen=True)
        class Pair:
            a: torch.Tensor
            b: torch.Tensor

        @magi_register_custom_op(name="magi_test::mutate_leaf", mutates_args=("cfg__a",))
        def mutate_leaf(x: torch.Tensor, cfg: Pair) -> torch.Tensor:
            cfg.a.add_(x)
            return cfg.a + cfg.b

        assert "Tensor(a1!) cfg__a, Tensor cfg__b" in mutate_leaf.schema
        a = torch.zeros(3)
        assert_close(mutate_leaf(torch.ones(3), Pair(a, torch.zeros(3))), torch.ones(3))
        assert_close(a, torch.ones(3))

    def test_an_op_may_call_other_ops_with_plain_or_dataclass_arguments(self):
        @magi_register_custom_op(name="magi_test::inner_plain")
        def inner_plain(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @magi_register_custom_op(name="magi_test::inner_dc")
        def inner_dc(x: torch.Tensor, cfg: ScaleCfg) -> torch.Tensor:
            return x * cfg.scale

        @magi_register_custom_op(name="magi_test::outer")
        def outer(x: torch.Tensor) -> torch.Tensor:
            return inner_dc(inner_plain(x), ScaleCfg(3.0)) + 1

        x = torch.randn(4)
        assert_close(outer(x), x * 6.0 + 1)


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


@pytest.fixture
def strict():
    previous = magi.set_strict(True)
    yield
    magi.set_strict(previous)


class TestStrictMode:
    """What opforge accepts beyond MagiCompiler, rejected as MagiCompiler
    rejects it, then the way out."""

    def test_int_literals_and_int_enums_are_rejected_at_any_depth(self, strict):
        class Bits(enum.Enum):
            FOUR = 4

        @dataclass(frozen=True)
        class Cfg:
            bits: Bits

        with pytest.raises(TypeError, match=r"^magi_test::strict_literal: parameter 'k' has Literal Literal\[1, 2\]; "
                                            r"only Literal\[str, \.\.\.\] is auto-downgraded. Use str values, or "
                                            r"opforge accepts it: call opforge.compat.magi.set_strict\(False\)"):

            @magi_register_custom_op(name="magi_test::strict_literal")
            def strict_literal(x: torch.Tensor, k: Literal[1, 2]) -> torch.Tensor:
                return x

        with pytest.raises(TypeError, match=r"parameter 'cfg', field .*Cfg.bits has non-string Enum '.*Bits'"):

            @magi_register_custom_op(name="magi_test::strict_enum")
            def strict_enum(x: torch.Tensor, cfg: Cfg) -> torch.Tensor:
                return x

        assert not hasattr(torch.ops.magi_test, "strict_literal")

    def test_an_optional_list_of_tensors_is_an_unsupported_type(self, strict):
        @dataclass(frozen=True)
        class Cfg:
            biases: Optional[list[torch.Tensor]]

        with pytest.raises(ValueError, match=r"field .*Cfg.biases has unsupported type Optional\[list\[Tensor\]\]. "
                                             r"Use list\[Optional\[Tensor\]\]"):

            @magi_register_custom_op(name="magi_test::strict_optional_list")
            def strict_optional_list(x: torch.Tensor, cfg: Cfg) -> torch.Tensor:
                return x

    def test_a_returned_dataclass_is_rejected(self, strict):
        with pytest.raises(TypeError, match=r"^magi_test::strict_return: returns dataclass 'Pair'; only Tensor / "
                                            r"tuple\[Tensor, \.\.\.\] / list\[Tensor\] are supported."):

            @magi_register_custom_op(name="magi_test::strict_return")
            def strict_return(x: torch.Tensor) -> Pair:
                return Pair(x.clone(), x.clone())

    def test_has_internal_collective_is_an_unexpected_keyword(self, strict):
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'has_internal_collective'. MagiCompiler "
                                            r"dropped it"):
            magi_register_custom_op(name="magi_test::strict_collective", has_internal_collective=True)

    def test_what_magi_accepts_is_still_accepted(self, strict):
        @dataclass(frozen=True)
        class Cfg:
            maybe: list[Optional[torch.Tensor]]
            mode: Mode = Mode.A

        @magi_register_custom_op(name="magi_test::strict_ok")
        def strict_ok(x: torch.Tensor, cfg: Cfg, kind: Literal["a", "b"] = "a") -> torch.Tensor:
            return x * (2.0 if cfg.mode == kind else 3.0)

        assert_close(strict_ok(torch.ones(2), Cfg([None], Mode.B), "b"), torch.full((2,), 2.0))

    def test_strict_mode_can_be_set_for_the_process_by_the_environment(self):
        source = textwrap.dedent("""
            import typing, torch
            from opforge.compat.magi import magi_register_custom_op
            try:
                @magi_register_custom_op(name="magi_env::f")
                def f(x: torch.Tensor, k: typing.Literal[1, 2]) -> torch.Tensor:
                    return x
            except TypeError as e:
                print(e)
        """)
        env = dict(os.environ, OPFORGE_MAGI_STRICT="1")
        out = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=300)
        assert "magi_env::f: parameter 'k' has Literal Literal[1, 2]" in out.stdout, out.stderr


@pytest.fixture
def profiling(monkeypatch):
    """A stand-in for `magi_compiler.profiling` as of MagiCompiler's current
    main: every registered op replays in lockstep, some with a hook."""
    module = types.ModuleType("magi_compiler.profiling")
    module.hooks, module.lockstep = {}, set()

    def register_materialize_inputs(op_name, fn=None):
        if fn is not None:
            module.hooks[op_name] = fn
        module.lockstep.add(op_name)

    module.register_materialize_inputs = register_materialize_inputs
    monkeypatch.setitem(sys.modules, "magi_compiler.profiling", module)
    return module


class TestProfiling:
    def test_every_op_is_a_lockstep_replay_op_with_its_hook(self):
        def inputs(x, n):
            return x, 4

        @magi_register_custom_op(name="magi_test::replayed", materialize_inputs=inputs)
        def replayed(x: torch.Tensor, n: int) -> torch.Tensor:
            return x * n

        @magi_register_custom_op(name="magi_test::replayed_plain")
        def replayed_plain(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        ops = magi.lockstep_replay_ops()
        assert ops["magi_test::replayed"] is inputs and ops["magi_test::replayed_plain"] is None

    def test_ops_register_with_magi_compilers_profiling_when_it_is_installed(self, profiling):
        @dataclass(frozen=True)
        class Split:
            sizes: list[int]

        def split_inputs(q, cfg__sizes):
            # The profiler replays the flat op: the hook takes and returns its leaves.
            return q, [q.shape[0] // len(cfg__sizes)] * len(cfg__sizes)

        @magi_register_custom_op(name="magi_test::attn_cp", materialize_inputs=split_inputs)
        def attn_cp(q: torch.Tensor, cfg: Split) -> torch.Tensor:
            assert sum(cfg.sizes) == q.shape[0]
            return q.clone()

        @magi_register_custom_op(name="magi_test::attn_plain")
        def attn_plain(q: torch.Tensor) -> torch.Tensor:
            return q.clone()

        assert profiling.lockstep == {"magi_test::attn_cp", "magi_test::attn_plain"}
        assert profiling.hooks == {"magi_test::attn_cp": split_inputs}
        q = torch.randn(6, 2)
        replay_args = profiling.hooks[attn_cp._magi_torch_registered_op.name()](q, [0, 0])
        assert_close(attn_cp._magi_torch_registered_op(*replay_args), q)

    def test_a_registry_that_flags_lockstep_ops_gets_the_flag(self, profiling):
        calls = []

        def register_materialize_inputs(op_name, fn=None, *, has_internal_collective=False):
            calls.append((op_name, fn, has_internal_collective))

        profiling.register_materialize_inputs = register_materialize_inputs

        @magi_register_custom_op(name="magi_test::flagged_replay")
        def flagged_replay(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        assert calls == [("magi_test::flagged_replay", None, True)]

    def test_an_incompatible_registry_is_a_warning_and_the_op_still_works(self, profiling):
        def register_materialize_inputs(op_name):  # a release that takes no hook
            pass

        profiling.register_materialize_inputs = register_materialize_inputs
        with pytest.warns(UserWarning, match=r"magi_test::unregistered: could not add the op to MagiCompiler's "
                                             r"profiling registry \(TypeError"):

            @magi_register_custom_op(name="magi_test::unregistered", materialize_inputs=lambda x: None)
            def unregistered(x: torch.Tensor) -> torch.Tensor:
                return x + 1

        assert_close(unregistered(torch.zeros(1)), torch.ones(1))

    def test_materialize_inputs_must_be_a_function(self):
        with pytest.raises(TypeError, match=r"materialize_inputs must be a function taking the op's flat "
                                            r"arguments, not list"):
            magi_register_custom_op(name="magi_test::bad_hook", materialize_inputs=[1])

    def test_has_internal_collective_is_accepted_with_a_deprecation_warning(self):
        with pytest.warns(DeprecationWarning, match="has_internal_collective is ignored. MagiCompiler dropped it"):
            decorate = magi_register_custom_op(name="magi_test::collective", has_internal_collective=True)

        @decorate
        def collective(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        assert_close(collective(torch.ones(2)), torch.full((2,), 2.0))
        assert "magi_test::collective" in magi.lockstep_replay_ops()

    def test_max_introspect_depth_must_be_a_count(self):
        with pytest.raises(ValueError, match=r"max_introspect_depth=-1 is not a count of helper calls"):
            magi_register_custom_op(name="magi_test::bad_depth", max_introspect_depth=-1)

    def test_the_triton_scan_follows_helpers_whatever_max_introspect_depth_says(self):
        pytest.importorskip("triton")
        from triton_helpers import library

        @magi_register_custom_op(name="magi_test::scan_depth", max_introspect_depth=0)
        def scan_depth(x: torch.Tensor) -> torch.Tensor:
            return library.scale_forward(x, 3.0)

        assert [k.fn.__name__ for k in scan_depth.triton_kernels] == ["scale_kernel"]
