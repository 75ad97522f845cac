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


def test_import_opforge_leaves_dynamo_unimported_and_hooks_the_compile_start_when_it_is_imported():
    # A fresh process: Dynamo's import (seconds) waits for the first compile,
    # and a C++ op loaded with plain torch.ops.load_library before it is
    # still made at that compile's start, also after torch._dynamo.reset().
    from kernel_library import run_python
    from op_testing import load_test_extension  # noqa: F401  (builds the library this process loads)
    from cpp_ext import EXT_BUILD
    import os

    library = os.path.join(EXT_BUILD, "libopforge_test_ext.so")
    load_test_extension()
    ran = run_python(f"""
        import sys, torch, opforge
        print("dynamo_at_import", "torch._dynamo" in sys.modules, "inductor_at_import", "torch._inductor" in sys.modules)
        torch.ops.load_library({library!r})
        import torch._dynamo
        from torch._dynamo.callback import callback_handler
        from opforge import _registry
        print("hooked", callback_handler.start_callbacks.count(_registry.compile_start),
              getattr(callback_handler.clear, "_opforge_keeps", False))
        torch._dynamo.reset()
        def f(x):
            return torch.ops.opforge_ext.scale(x, 2.0, 1) + 1
        out = torch.compile(f, backend="eager", fullgraph=True)(torch.ones(3))
        print("compiled", out.tolist(), _registry.get("opforge_ext::scale") is not None)
    """)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    assert "dynamo_at_import False inductor_at_import False" in lines, ran.stdout
    assert "hooked 1 True" in lines, ran.stdout
    assert "compiled [3.0, 3.0, 3.0] True" in lines, ran.stdout + ran.stderr


def test_a_callback_that_raises_after_an_import_is_logged_and_the_import_succeeds(tmp_path, monkeypatch, caplog):
    from opforge._after_import import after_import, watching

    (tmp_path / "opforge_watched_mod.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def fails(module):
        seen.append(module.VALUE)
        raise RuntimeError("boom")

    after_import("opforge_watched_mod", fails)
    after_import("opforge_watched_mod", seen.append)
    assert watching("opforge_watched_mod")
    try:
        with caplog.at_level("ERROR", logger="opforge"):
            import opforge_watched_mod
        assert opforge_watched_mod.VALUE == 7
        assert seen == [7, opforge_watched_mod]  # in order, the second after the first raised
        assert "failed after opforge_watched_mod was imported" in caplog.text and "boom" in caplog.text
        assert not watching("opforge_watched_mod")  # once per watch
    finally:
        import sys
        sys.modules.pop("opforge_watched_mod", None)
