"""Ops defined in C++ with OPFORGE_LIBRARY, built against the installed CMake
package like a user's library, and called from Python with dataclasses."""

import pytest
import torch
from op_testing import load_test_extension

import opforge


@pytest.fixture(scope="module")
def ext():
    return load_test_extension()


def test_cpp_op_registers_the_flat_schema_and_keeps_the_original(ext):
    assert ext.scale.schema == (
        "opforge_ext::scale(Tensor x, float cfg__scale, int cfg__mode, bool cfg__bias__is_set=False, "
        "float? cfg__bias__value=None, Tensor? cfg__bias__t=None) -> Tensor")
    assert ext.scale.spec == "opforge_ext::scale(Tensor x, ext.Cfg cfg) -> Tensor"


def test_generated_dataclasses_mirror_the_cpp_structs(ext):
    Cfg = opforge.structs.opforge_ext.Cfg
    Bias = opforge.structs.opforge_ext.Bias
    Mode = opforge.structs.opforge_ext.Mode
    assert [f for f in Cfg.__dataclass_fields__] == ["scale", "mode", "bias"]
    assert Cfg.__dataclass_params__.frozen
    assert [m.name for m in Mode] == ["kAdd", "kMul"] and Mode.kMul.value == 1
    assert Bias(value=1.0, t=torch.zeros(1)).value == 1.0


def test_cpp_op_called_with_a_dataclass_gets_the_struct_rebuilt(ext):
    Cfg, Bias, Mode = (getattr(opforge.structs.opforge_ext, n) for n in ("Cfg", "Bias", "Mode"))
    x = torch.ones(3)
    assert torch.equal(ext.scale(x, Cfg(2.0, Mode.kMul, None)), torch.full((3,), 2.0))
    out = ext.scale(x, Cfg(scale=2.0, mode=Mode.kAdd, bias=Bias(value=1.0, t=torch.full((3,), 0.5))))
    assert torch.equal(out, torch.full((3,), 4.5))


def test_any_object_with_the_fields_works_in_place_of_the_dataclass(ext):
    class Duck:
        scale = 3.0
        mode = opforge.structs.opforge_ext.Mode.kMul
        bias = None

    assert torch.equal(ext.scale(torch.ones(2), Duck()), torch.full((2,), 3.0))


def test_cpp_struct_return_is_rebuilt_as_a_dataclass(ext):
    stats = ext.reduce(torch.arange(4.0))
    assert type(stats).__name__ == "Stats"
    assert stats.sum.item() == 6.0 and stats.max.item() == 3.0


def test_cpp_handles_pass_through_python_as_ints(ext):
    handle = ext.make_runner(3.0)
    assert torch.equal(ext.run(torch.ones(2), handle), torch.full((2,), 3.0))
    message = r"opforge_ext::run: the CompositeExplicitAutograd kernel, parameter 'runner': handle 5: is not an"
    with pytest.raises(RuntimeError, match=message):
        ext.run(torch.ones(2), 5)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.opforge_ext.run(torch.ones(2), 5)


def test_cpp_op_compiles_with_fullgraph_and_its_fake_kernel(ext):
    Cfg, Mode = opforge.structs.opforge_ext.Cfg, opforge.structs.opforge_ext.Mode
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()

    @torch.compile(fullgraph=True, backend="eager")
    def f(x, s: float):
        return ext.scale(x, Cfg(s, Mode.kMul, None)) + 1

    assert torch.equal(f(torch.ones(2), 2.0), torch.full((2,), 3.0))
    assert torch.equal(f(torch.ones(5), 4.0), torch.full((5,), 5.0))
    assert not torch._dynamo.utils.counters["graph_break"]


def test_unknown_cpp_op_is_a_clear_error(ext):
    with pytest.raises(AttributeError, match="was not defined with OPFORGE_LIBRARY"):
        opforge.ops.opforge_ext.nope


def test_a_dynamo_reset_clears_other_start_callbacks_but_keeps_opforges():
    # torch._dynamo.reset() still clears what others registered; opforge's
    # compile start stays, once (opforge._registry._install_compile_hook).
    from torch._dynamo.callback import callback_handler

    from opforge import _registry

    seen = []

    def theirs(*_args):
        seen.append(1)

    callback_handler.register_start_callback(theirs)
    for _ in range(2):
        torch._dynamo.reset()
    assert theirs not in callback_handler.start_callbacks
    assert callback_handler.start_callbacks.count(_registry.compile_start) == 1
    _registry._install_compile_hook()  # a second install registers and wraps nothing twice
    assert callback_handler.start_callbacks.count(_registry.compile_start) == 1
    torch._dynamo.reset()
    assert callback_handler.start_callbacks.count(_registry.compile_start) == 1
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))
    assert seen == []
