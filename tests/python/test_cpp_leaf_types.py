"""A leaf type added in one place (opforge/detail/leaves.h), bool[], works in
both ABI modes: as a kernel parameter, an optional one, a struct field with a
default, pushed by opforge::Call, and read by a backward's setup_context."""

import os

import pytest
import torch

import opforge
from cpp_ext import build
from kernel_library import STABLE_BUILDS

MODES = ["unstable", pytest.param("stable", marks=pytest.mark.skipif(
    not STABLE_BUILDS, reason=f"needs torch 2.10 (this is {torch.__version__}): a stable-ABI library"))]


@pytest.fixture(scope="module")
def built():
    return build("tests/cpp_ext/flags", "flags", f"FLAGS_STABLE={'ON' if STABLE_BUILDS else 'OFF'}")


@pytest.fixture(params=MODES)
def flags(request, built):
    mode = request.param
    ns = f"leaf_flags_{mode}"
    if not hasattr(torch.ops, ns) or not hasattr(getattr(torch.ops, ns), "masked"):
        opforge.load_library(os.path.join(built, f"libopforge_test_flags_{mode}.so"))
    return getattr(opforge.ops, ns), getattr(opforge.structs, ns), getattr(torch.ops, ns)


def test_a_bool_list_field_lowers_to_a_bool_list_leaf_with_its_default(flags):
    ops, _structs, flat = flags
    schema = str(flat.masked.default._schema)
    assert "(Tensor x, bool[] m__keep=[True, False, True], float m__scale=2.) -> Tensor" in schema


def test_a_bool_list_reaches_the_kernel_inside_a_struct_and_flat(flags):
    ops, structs, flat = flags
    x = torch.arange(1.0, 7.0)
    out = ops.masked(x, structs.Mask(keep=[True, True, False], scale=3.0))
    assert torch.equal(out, torch.tensor([3.0, 6.0, 0.0, 12.0, 15.0, 0.0]))
    assert torch.equal(flat.masked(x, [False, True], 1.0), torch.tensor([0.0, 2.0, 0.0, 4.0, 0.0, 6.0]))
    assert torch.equal(ops.masked(x, structs.Mask()), torch.tensor([2.0, 0.0, 6.0, 8.0, 0.0, 12.0]))


def test_an_optional_bool_list_parameter_takes_none_and_a_list(flags):
    ops, _structs, _flat = flags
    x = torch.ones(1)
    assert ops.count_set(x, None) == -1
    assert ops.count_set(x, [True, False, True, True]) == 3
    assert ops.count_set(x, []) == 0


def test_opforge_call_pushes_a_struct_with_a_bool_list(flags):
    ops, structs, _flat = flags
    x = torch.arange(1.0, 5.0)
    out = ops.masked_twice(x, structs.Mask(keep=[True, False], scale=2.0))
    assert torch.equal(out, torch.tensor([4.0, 0.0, 12.0, 0.0]))


def test_a_backward_reads_the_bool_list_its_setup_context_was_given(flags):
    ops, structs, _flat = flags
    x = torch.arange(1.0, 5.0, requires_grad=True)
    ops.masked(x, structs.Mask(keep=[False, True], scale=0.5)).sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 0.5, 0.0, 0.5]))
