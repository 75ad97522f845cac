"""Mistakes in a user's C++ (tests/cpp_ext/mistakes) never kill the process
and never pass silently, in both ABI modes. Each case runs in a fresh
process of its mode, so one that would abort shows as a dead child (its exit
status), not as a lost test run; the cases of a mode share one child while
none dies (tests/python/child_batch.py)."""

import os

import pytest
import torch

from child_batch import printed, run_batch
from cpp_ext import build
from kernel_library import STABLE_BUILDS

MODES = ["unstable", pytest.param("stable", marks=pytest.mark.skipif(
    not STABLE_BUILDS, reason=f"needs torch 2.10 (this is {torch.__version__}): a stable-ABI library"))]
HERE = os.path.dirname(os.path.abspath(__file__))
CASES = {}  # case id -> its body, a function of the mode


def case(case_id):
    def add(body):
        CASES[case_id] = body
        return body
    return add


@pytest.fixture(scope="module")
def built():
    return build("tests/cpp_ext/mistakes", "mistakes", f"MISTAKES_STABLE={'ON' if STABLE_BUILDS else 'OFF'}")


@pytest.fixture(scope="module")
def run(built):
    """run(mode, case_id): what the case printed in a process that has loaded
    the mode's library. Every case of the mode runs on the first call."""
    done = {}

    def get(mode, case_id):
        if mode not in done:
            prologue = f"""
                import opforge, torch
                try:
                    opforge.load_library({os.path.join(built, f"libopforge_test_mistakes_{mode}.so")!r})
                except RuntimeError as e:
                    load_error = str(e)
                ops, flat = opforge.ops.mistakes_{mode}, torch.ops.mistakes_{mode}

                def outcome(fn, *args):
                    try:
                        fn(*args)
                    except Exception as e:
                        return f"{{type(e).__name__}}: {{str(e).splitlines()[0]}}"
                    return "no error"
            """
            done[mode] = run_batch(prologue, {i: body(mode) for i, body in CASES.items()}, cwd=HERE,
                                   between="opforge.set_fast_path_enabled(True)", timeout=300)
        return printed(done[mode][case_id], f"{mode}: {case_id}")

    return get


for _kind in (0, 1, 2):
    case(f"throws {_kind}")(lambda mode, kind=_kind: f"""
        x = torch.ones(2)
        print(outcome(ops.throws, x, {kind}))
        print(outcome(flat.throws, x, {kind}))
        print(outcome(opforge._C.FlatCall(flat.throws.default), x, {kind}))  # the compiled symm-mem ops' call
        opforge.set_fast_path_enabled(False)
        print(outcome(ops.throws, x, {kind}))
    """)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", [0, 1, 2], ids=["int", "struct", "string"])
def test_a_kernel_throwing_what_is_not_a_std_exception_raises_on_every_path(run, mode, kind):
    out = run(mode, f"throws {kind}")
    expected = (f"RuntimeError: mistakes_{mode}::throws: the CompositeExplicitAutograd kernel threw something "
                "that is not a std::exception; throw one (TORCH_CHECK does).")
    assert out.splitlines() == [expected] * 4


for _kind in (3, 4, 5):
    case(f"std exception {_kind}")(lambda mode, kind=_kind: f"""
        x = torch.ones(2)
        print(outcome(flat.throws, x, {kind}))
        print(outcome(ops.throws, x, {kind}))
        print(outcome(opforge._C.FlatCall(flat.throws.default), x, {kind}))
        opforge.set_fast_path_enabled(False)
        print(outcome(ops.throws, x, {kind}))
    """)

# What torch.ops raises for a std::exception: pybind11's translation before
# torch 2.15, torch's own from 2.15 (RuntimeError but for std::out_of_range).
TORCH_TRANSLATES = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 15)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind, error", [
    (3, "RuntimeError" if TORCH_TRANSLATES else "MemoryError"),
    (4, "IndexError"),
    (5, "RuntimeError" if TORCH_TRANSLATES else "ValueError"),
], ids=["bad_alloc", "out_of_range", "invalid_argument"])
def test_a_std_exception_is_the_same_python_error_on_every_path(run, mode, kind, error):
    out = run(mode, f"std exception {kind}").splitlines()
    assert out[0].startswith(error + ":"), out
    assert out == [out[0]] * 4


case("bad backward")(lambda mode: """
        x = torch.ones(2, requires_grad=True)
        print(outcome(lambda: ops.bad_backward(x).sum().backward()))
        print(outcome(lambda: flat.bad_backward(x).sum().backward()))
    """)


@pytest.mark.parametrize("mode", MODES)
def test_a_backward_throwing_an_int_raises_naming_the_op(run, mode):
    out = run(mode, "bad backward")
    expected = (f"RuntimeError: mistakes_{mode}::bad_backward: the backward threw something that is not a "
                "std::exception; throw one (TORCH_CHECK does).")
    assert out.splitlines() == [expected] * 2


case("bad setup")(lambda mode: """
        x = torch.ones(2, requires_grad=True)
        print(outcome(ops.bad_setup, x))
        print(outcome(flat.bad_setup, x))
        print(outcome(ops.bad_setup, torch.ones(2)))  # no gradient wanted: no setup_context
    """)


@pytest.mark.parametrize("mode", MODES)
def test_a_setup_context_throwing_an_int_raises_naming_the_op(run, mode):
    out = run(mode, "bad setup").splitlines()
    assert out[0] == out[1], out
    assert out[0].startswith(f"RuntimeError: mistakes_{mode}::bad_setup: "), out
    assert "setup_context threw something that is not a std::exception" in out[0]
    assert out[2] == "no error"


for _op in ("undefined", "undefined_in_tuple", "undefined_in_list"):
    case(_op)(lambda mode, op=_op: f"""
        x = torch.ones(2)
        print(outcome(ops.{op}, x))
        print(outcome(flat.{op}, x))
    """)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op, schema_type", [("undefined", "Tensor"), ("undefined_in_tuple", "Tensor"),
                                             ("undefined_in_list", "Tensor[]")])
def test_an_undefined_tensor_returned_for_a_tensor_is_an_error_naming_the_op(run, mode, op, schema_type):
    out = run(mode, op)
    expected = (f"RuntimeError: mistakes_{mode}::{op}: the CompositeExplicitAutograd kernel returned an undefined "
                f"tensor where the schema says {schema_type}; return a defined one.")
    assert out.splitlines() == [expected] * 2


case("types at load")(lambda mode: f"""
        print(load_error)
        print(hasattr(torch.ops.mistakes_optional_{mode}, "optional_as_tensor"))
        print(hasattr(torch.ops.mistakes_arity_{mode}, "too_few"))
        print(ops.throws(torch.ones(2), 9).tolist())
    """)


@pytest.mark.parametrize("mode", MODES)
def test_kernels_whose_types_are_not_their_schema_are_refused_at_load_and_the_rest_loads(run, mode):
    out = run(mode, "types at load")
    assert (f"mistakes_optional_{mode}::optional_as_tensor: CompositeExplicitAutograd kernel, parameter 'w': is "
            "const opforge::Tensor& (Tensor) in C++ but Tensor? in the schema. Write it as "
            "const std::optional<opforge::Tensor>&, or change the schema.") in out
    assert (f"mistakes_arity_{mode}::too_few: CompositeExplicitAutograd kernel: has 1 parameters but the schema "
            "has 2 (Tensor x, float eps).") in out
    assert out.splitlines()[-3:] == ["False", "False", "[1.0, 1.0]"]


case("bytes")(lambda mode: """
        errors = [e for e in opforge.load_errors() if "mistakes_bytes" in e]
        print(len(errors), len(opforge.load_errors()) == len(opforge.load_errors()))
        print(errors[0])
    """)


@pytest.mark.parametrize("mode", MODES)
def test_a_schema_with_bytes_that_are_not_utf8_is_a_readable_load_error(run, mode):
    out = run(mode, "bytes")
    count, message = out.split("\n", 1)
    assert count == "1 True"
    assert f"mistakes_bytes_{mode}::bytes: unexpected character '\\xff'" in message, message


case("calls wrongly")(lambda mode: """
        x = torch.ones(2)
        for wrong in (0, 1):
            print(outcome(ops.calls_wrongly, x, wrong))
            print(outcome(flat.calls_wrongly, x, wrong))
    """)


@pytest.mark.parametrize("mode", MODES)
def test_call_with_a_return_type_or_arguments_unlike_the_op_is_refused_before_reading(run, mode):
    out = run(mode, "calls wrongly").splitlines()
    returns = (f"RuntimeError: mistakes_{mode}::throws: opforge::Call<R> reads 2 returns but the op has 1; "
               f"name the op's own return type as R (a tuple for several returns).")
    assert out[0] == out[1] and out[0].startswith(returns[:60]), out
    if mode == "stable":  # the C++ API mode's typed call checks the arguments as torch does
        assert out[2] == out[3] == (f"RuntimeError: mistakes_{mode}::throws: opforge::Call passes 1 flat arguments "
                                    f"but the op takes 2; pass the op's own parameters (structs as structs), "
                                    f"defaults included."), out
    else:
        assert out[2] == out[3] and out[2].startswith("RuntimeError: ") and "mistakes_unstable::throws" in out[2], out


case("no such op")(lambda mode: """
        x = torch.ones(2)
        print(outcome(ops.calls_wrongly, x, 2))
        print(outcome(flat.calls_wrongly, x, 2))
    """)


@pytest.mark.parametrize("mode", MODES)
def test_call_of_an_op_that_does_not_exist_names_the_op_and_what_to_check(run, mode):
    out = run(mode, "no such op").splitlines()
    assert out[0] == out[1], out
    assert out[0].startswith(f"RuntimeError: mistakes_{mode}::no_such_op: opforge::Call could not call this op"), out
    assert "load the library that defines it before the call." in out[0], out


case("bad tag")(lambda mode: f"""
        errors = [e for e in opforge.load_errors() if "mistakes_tag_{mode}" in e]
        print(len(errors))
        print(errors[0])
        print([hasattr(torch.ops.mistakes_tag_{mode}, n) for n in ("plain", "unsafe", "bad_tag")])
        print([d for d in torch._C._dispatch_find_dangling_impls() if "mistakes_tag" in d])
        print(ops.throws(torch.ones(2), 9).tolist())
    """)


@pytest.mark.parametrize("mode", MODES)
def test_an_op_tag_torch_does_not_have_is_refused_at_load_naming_the_op_and_its_block_defines_nothing(run, mode):
    out = run(mode, "bad tag").splitlines()
    assert out[0] == "1", out
    assert (f"mistakes_tag_{mode}::bad_tag: 'not_a_tag' is not an op tag opforge can give a C++ op. Use one of: "
            "cudagraph_unsafe, needs_fixed_stride_order, flexible_layout, nondeterministic_seeded, "
            "nondeterministic_bitwise, pt2_compliant_tag. Nothing of this block was registered.") in out[1], out
    assert out[2:] == ["[False, False, False]", "[]", "[1.0, 1.0]"]
