"""opforge.compat.vllm used the way vLLM's compile tests use
direct_register_custom_op: a module-level library, a mutating "silly"
attention op called through torch.ops, eager and compiled."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.library import Library, infer_schema
from torch.testing import assert_close

from opforge.compat import OpNameTakenError, vllm
from opforge.compat.vllm import direct_register_custom_op

# create a library to hold the custom op
silly_lib = Library("vllm_silly", "FRAGMENT")  # noqa

global_counter = 0


def silly_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    global global_counter
    global_counter += 1
    out.copy_(q)
    out += k
    out += v


def silly_attention_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    return


direct_register_custom_op(
    op_name="attention",
    op_func=silly_attention,
    mutates_args=["out"],
    fake_impl=silly_attention_fake,
    target_lib=silly_lib,
    dispatch_key="CPU",
)


def silly_model(x: torch.Tensor) -> torch.Tensor:
    x = x + 1
    out = torch.empty_like(x)
    torch.ops.vllm_silly.attention(x, x, x, out)
    x = out * 2
    out = torch.empty_like(x)
    torch.ops.vllm_silly.attention(x, x, x, out)
    return out - 1


def reference_model(x: torch.Tensor) -> torch.Tensor:
    return ((x + 1) * 3 * 2) * 3 - 1


def test_silly_attention_mutates_out_eagerly():
    global global_counter
    global_counter = 0
    x = torch.randn(4, 8)
    assert_close(silly_model(x), reference_model(x))
    assert global_counter == 2


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_silly_attention_compiles_with_fullgraph(backend):
    global global_counter
    model = torch.compile(silly_model, backend=backend, fullgraph=True)
    x = torch.randn(4, 8)
    global_counter = 0
    assert_close(model(x), reference_model(x))
    assert global_counter == 2


def test_registered_schema_is_what_infer_schema_gives():
    def many_kinds(
        x: torch.Tensor,
        bias: Optional[torch.Tensor],
        weights: list[torch.Tensor],
        sizes: list[int],
        eps: float,
        flag: bool,
        layer_name: str,
        dtype: torch.dtype,
        group: int = 1,
        scale: Optional[float] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return x.clone(), x.clone()

    def mutating(x: torch.Tensor, out: torch.Tensor, scales: list[torch.Tensor]) -> None:
        out.copy_(x)

    for fn, mutates in ((many_kinds, None), (mutating, ["out", "scales"]), (mutating, "unknown")):
        op_name = f"{fn.__name__}_{len(mutates or ())}"
        op = direct_register_custom_op(op_name, fn, mutates_args=mutates, target_lib=silly_lib)
        assert op.schema == f"vllm_silly::{op_name}" + infer_schema(fn, mutates_args=mutates or [])


def test_default_library_is_the_vllm_namespace():
    def add_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    op = direct_register_custom_op("compat_add_one", add_one, fake_impl=lambda x: torch.empty_like(x))
    assert op.name == "vllm::compat_add_one"
    assert vllm.vllm_lib.ns == "vllm"
    # The kernel is registered for the platform's device, as in vLLM.
    device = "cuda" if vllm.default_dispatch_key() == "CUDA" else "cpu"
    x = torch.zeros(2, device=device)
    assert_close(torch.ops.vllm.compat_add_one(x), torch.ones(2, device=device))
    assert_close(op(x), torch.ones(2, device=device))


def test_mutates_args_none_means_nothing_is_mutated():
    def scaled(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return x * out

    op = direct_register_custom_op("compat_no_mutation", scaled, mutates_args=None, target_lib=silly_lib)
    assert "!" not in op.schema


def test_cpu_dispatch_key_registers_the_cpu_kernel_only():
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    direct_register_custom_op("compat_double_cpu", double, dispatch_key="CPU", target_lib=silly_lib)
    assert_close(torch.ops.vllm_silly.compat_double_cpu(torch.ones(2)), torch.full((2,), 2.0))
    assert torch._C._dispatch_has_kernel_for_dispatch_key("vllm_silly::compat_double_cpu", "CPU")
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("vllm_silly::compat_double_cpu", "CUDA")


def test_cuda_dispatch_key_leaves_cpu_tensors_without_a_kernel():
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    direct_register_custom_op("compat_double_cuda", double, dispatch_key="CUDA", target_lib=silly_lib)
    with pytest.raises(NotImplementedError, match="Could not run 'vllm_silly::compat_double_cuda' with "
                                                  "arguments from the 'CPU' backend"):
        torch.ops.vllm_silly.compat_double_cuda(torch.ones(2))


def test_composite_dispatch_key_registers_the_kernel_for_every_device():
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    direct_register_custom_op("compat_double_any", double, dispatch_key="CompositeExplicitAutograd",
                              target_lib=silly_lib)
    assert_close(torch.ops.vllm_silly.compat_double_any(torch.ones(2)), torch.full((2,), 2.0))
    assert torch._C._dispatch_has_kernel_for_dispatch_key("vllm_silly::compat_double_any",
                                                          "CompositeExplicitAutograd")


def test_default_dispatch_key_follows_the_platform(monkeypatch):
    expected = "CUDA" if torch.cuda.is_available() else "CPU"
    monkeypatch.delitem(sys.modules, "vllm.platforms", raising=False)
    assert vllm.default_dispatch_key() == expected

    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(dispatch_key="XPU")
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    assert vllm.default_dispatch_key() == "XPU"


def test_tags_are_attached_to_the_op():
    def strided(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    op = direct_register_custom_op("compat_tagged", strided, target_lib=silly_lib,
                                   tags=(torch.Tag.needs_fixed_stride_order,))
    assert torch.Tag.needs_fixed_stride_order in op.overload.tags


def test_fake_impl_gives_shapes_under_fake_tensors():
    calls = []

    def pool(x: torch.Tensor, k: int) -> torch.Tensor:
        return x[::k].clone()

    def pool_fake(x: torch.Tensor, k: int) -> torch.Tensor:
        calls.append(k)
        return x.new_empty(((x.shape[0] + k - 1) // k, *x.shape[1:]))

    direct_register_custom_op("compat_pool", pool, fake_impl=pool_fake, target_lib=silly_lib)
    with FakeTensorMode():
        out = torch.ops.vllm_silly.compat_pool(torch.empty(10, 3), 4)
    assert out.shape == (3, 3) and calls == [4]


def test_missing_fake_impl_fails_tracing_with_the_fix():
    def relu(x: torch.Tensor) -> torch.Tensor:
        return x.relu()

    direct_register_custom_op("compat_no_fake", relu, target_lib=silly_lib)
    with pytest.raises(RuntimeError, match="vllm_silly::compat_no_fake: no fake"):
        with FakeTensorMode():
            torch.ops.vllm_silly.compat_no_fake(torch.empty(2))


def test_dataclass_parameters_work_through_the_returned_op():
    @dataclass(frozen=True)
    class RopeCfg:
        base: float
        is_neox: bool

    def rope(x: torch.Tensor, cfg: RopeCfg) -> torch.Tensor:
        return x * cfg.base if cfg.is_neox else x - cfg.base

    op = direct_register_custom_op("compat_rope", rope, fake_impl=lambda x, cfg: torch.empty_like(x),
                                   target_lib=silly_lib, dispatch_key="CPU")
    x = torch.randn(3)
    assert op.schema == "vllm_silly::compat_rope(Tensor x, float cfg__base, bool cfg__is_neox) -> Tensor"
    assert_close(op(x, RopeCfg(2.0, True)), x * 2.0)
    assert_close(torch.ops.vllm_silly.compat_rope(x, 2.0, False), x - 2.0)


def test_op_name_with_a_namespace_or_an_overload_is_rejected():
    def ident(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    for bad in ("vllm::ident", "ident.out"):
        with pytest.raises(ValueError, match="op_name must be a bare name"):
            direct_register_custom_op(bad, ident, target_lib=silly_lib)


def test_registering_a_name_twice_raises_like_library_define():
    with pytest.raises(RuntimeError, match="vllm_silly::attention: an operator with this name is already"):
        direct_register_custom_op("attention", silly_attention, mutates_args=["out"], target_lib=silly_lib)
    with pytest.raises(OpNameTakenError):
        direct_register_custom_op("attention", silly_attention, mutates_args=["out"], target_lib=silly_lib)


def test_unknown_dispatch_key_is_rejected_naming_the_op():
    def ident(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    with pytest.raises(ValueError, match="vllm_silly::compat_bad_key: dispatch_key 'Cuda' is not a device's"):
        direct_register_custom_op("compat_bad_key", ident, dispatch_key="Cuda", target_lib=silly_lib)
    assert not hasattr(torch.ops.vllm_silly, "compat_bad_key")


def test_impl_library_is_rejected():
    impl_lib = Library("vllm_silly", "IMPL")

    def ident(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    with pytest.raises(ValueError, match="target_lib is an IMPL library"):
        direct_register_custom_op("compat_impl_lib", ident, target_lib=impl_lib)


def test_unknown_mutates_args_entry_names_the_op():
    def copy_to(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(x)

    with pytest.raises(ValueError, match="vllm_silly::compat_typo"):
        direct_register_custom_op("compat_typo", copy_to, mutates_args=["outt"], target_lib=silly_lib)
