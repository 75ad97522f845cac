"""Every opforge op in the code Inductor's Python wrapper emits is called
through `_C.FlatCall`, not `torch.ops` (opforge._inductor,
docs/performance.md#start-up-and-compile-time): the code says so, the values
are eager's, the errors are the op's own, and what Inductor lowers itself or
decomposes is left alone."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from op_testing import ns  # noqa: F401
from torch import Tensor
from torch._inductor.utils import fresh_cache, run_and_get_code

import opforge
from opforge import _C, _inductor


def compile_and_code(fn, *args):
    torch._dynamo.reset()
    with fresh_cache():
        out, code = run_and_get_code(torch.compile(fn, fullgraph=True), *args)
    return out, "\n".join(code)


def flat_call(opdef) -> str:
    """What the wrapper emits for the op: the FlatCall, or torch's op where it is not registered."""
    name = _inductor.flat_call_name(opdef.overload)
    return f"(getattr(extern_kernels, {name!r}, None) or torch.ops.{opdef.name.replace('::', '.')}.default)("


@dataclasses.dataclass(frozen=True)
class Mix:
    a: float
    n: int


@pytest.fixture
def ops(ns):
    @opforge.op(f"{ns}::scale", fake=lambda x, s: torch.empty_like(x))
    def scale(x: Tensor, s: float) -> Tensor:
        return x * s

    @opforge.op(f"{ns}::mix", fake=lambda x, cfg: torch.empty_like(x))
    def mix(x: Tensor, cfg: Mix) -> Tensor:
        return x * cfg.a + cfg.n

    @opforge.op(f"{ns}::bump", mutates_args=("x",), fake=lambda x, s: None)
    def bump(x: Tensor, s: float) -> None:
        x.add_(s)

    return scale, mix, bump


def test_python_struct_and_mutating_ops_are_called_from_c(ops):
    from torch._inductor.lowering import lowerings
    from torch._inductor.select_algorithm import extern_kernels

    scale, mix, bump = ops

    def f(x):
        y = mix(scale(x + 1, 2.0), Mix(0.5, 3))
        w = y.clone()
        bump(w, 1.0)
        return w

    x = torch.arange(4.0)
    out, code = compile_and_code(f, x)
    torch.testing.assert_close(out, f(x))
    assert re.search(rf"= {re.escape(flat_call(scale))}buf\d+, 2\.0\)", code), code
    assert re.search(rf"= {re.escape(flat_call(mix))}buf\d+, 0\.5, 3\)", code), code  # the struct's leaves, flat
    assert re.search(rf"\n\s*{re.escape(flat_call(bump))}buf\d+, 1\.0\)", code), code  # writes its buffer
    for op in ops:
        assert lowerings[op.overload]._opforge_flat_call is op.overload
        call = getattr(extern_kernels, _inductor.flat_call_name(op.overload))
        assert isinstance(call, _C.FlatCall) and call.overload is op.overload


def test_a_kernel_error_under_compile_is_the_ops_own(ns):
    @opforge.op(f"{ns}::picky", fake=lambda x: torch.empty_like(x))
    def picky(x: Tensor) -> Tensor:
        if x.sum() > 100:
            raise ValueError(f"picky: too large a sum, {float(x.sum())}")
        return x + 1

    fn = torch.compile(lambda x: picky(x * 2), fullgraph=True)
    torch._dynamo.reset()
    with fresh_cache():
        torch.testing.assert_close(fn(torch.ones(3)), torch.full((3,), 3.0))
        with pytest.raises(ValueError, match=r"picky: too large a sum, 600\.0") as compiled:
            fn(torch.full((3,), 100.0))
    with pytest.raises(ValueError) as eager:
        picky(torch.full((3,), 200.0))
    assert str(compiled.value) == str(eager.value)


def test_an_op_defined_after_inductor_was_imported_is_installed_as_it_is_defined(ns):
    from torch._inductor.lowering import lowerings

    assert _inductor.loaded()

    @opforge.op(f"{ns}::late", fake=lambda x: torch.empty_like(x))
    def late(x: Tensor) -> Tensor:
        return x - 1

    assert lowerings[late.overload]._opforge_flat_call is late.overload
    out, code = compile_and_code(lambda x: late(x * 3), torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0))
    assert flat_call(late) in code


def test_a_users_lowering_is_left_alone(ns):
    from torch._inductor.lowering import lowerings, register_lowering

    @opforge.op(f"{ns}::own", fake=lambda x: torch.empty_like(x))
    def own(x: Tensor) -> Tensor:
        return x + 100

    @register_lowering(own.overload)
    def lowered(x):  # Inductor's own pointwise code instead of a call
        from torch._inductor.lowering import lowerings as L

        return L[torch.ops.aten.add.Tensor](x, 100)

    try:
        _inductor.sync()
        assert lowerings[own.overload] is lowered
        out, code = compile_and_code(lambda x: own(x * 2), torch.ones(2))
        assert torch.equal(out, torch.full((2,), 102.0))
        assert _inductor.flat_call_name(own.overload) not in code and f"torch.ops.{ns}" not in code
    finally:
        lowerings.pop(own.overload, None)


def test_an_op_with_a_decomposition_in_inductors_table_is_left_to_inductor(ns):
    from torch._inductor.decomposition import decompositions, register_decomposition
    from torch._inductor.lowering import lowerings

    @opforge.op(f"{ns}::decomposed", fake=lambda x: torch.empty_like(x))
    def decomposed(x: Tensor) -> Tensor:
        return x * 10

    try:
        assert _inductor.remove(decomposed.overload)  # as if the decomposition came before Inductor's import
        assert not _inductor.remove(decomposed.overload)
        register_decomposition(decomposed.overload)(lambda x: x * 10)
        _inductor.sync()
        assert decomposed.overload not in lowerings
        try:
            out, code = compile_and_code(lambda x: decomposed(x + 1), torch.ones(2))
        except Exception as e:  # noqa: BLE001 - Inductor's own verdict on such an op, in some releases (2.11)
            assert "both a fallback and a decomp for same op" in str(e), e
        else:
            assert torch.equal(out, torch.full((2,), 20.0))
            assert _inductor.flat_call_name(decomposed.overload) not in code
    finally:
        decompositions.pop(decomposed.overload, None)


def test_without_implicit_fallbacks_inductor_refuses_the_op_as_it_would(ns):
    from torch._inductor import config

    @opforge.op(f"{ns}::strict", fake=lambda x: torch.empty_like(x))
    def strict(x: Tensor) -> Tensor:
        return x + 1

    compile_and_code(lambda x: strict(x), torch.ones(2))  # installed
    with config.patch(implicit_fallbacks=False), \
            pytest.raises(Exception, match=r"(?s)missing lowering.*" + re.escape(f"{ns}.strict.default")):
        compile_and_code(lambda x: strict(x * 2), torch.ones(2))
    assert config.implicit_fallbacks


def test_ops_defined_before_inductor_is_imported_are_installed_when_it_is():
    script = """
        import sys, torch, opforge
        from torch import Tensor

        @opforge.op("early::twice", fake=lambda x: torch.empty_like(x))
        def twice(x: Tensor) -> Tensor:
            return x * 2

        assert "torch._inductor.lowering" not in sys.modules, "defining an op imported Inductor"
        from torch._inductor.lowering import lowerings
        from torch._inductor.select_algorithm import extern_kernels
        print(getattr(lowerings.get(twice.overload), "_opforge_flat_call", None) is twice.overload,
              type(getattr(extern_kernels, "opforge_5_early_5_twice_default", None)).__name__)
    """
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "FlatCall"]
