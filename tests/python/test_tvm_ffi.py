"""TVM-FFI functions as op kernels (docs/tvm_ffi.md): the op's leaves reach
the function in schema order on every path, its errors name the op, and
nothing a user gets wrong kills the process."""

import dataclasses
import enum
import os
import re
import subprocess
import sys
import textwrap
from typing import Literal, Optional

import pytest
import torch
import torch._dynamo.testing
from torch import Tensor

tvm_ffi = pytest.importorskip("tvm_ffi")

import opforge  # noqa: E402
from opforge import _C  # noqa: E402
from child_batch import printed, run_batch  # noqa: E402
from tvm_ffi_kernels import kernels  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def mod():
    return kernels()


_COUNT = [0]


def fresh(name: str) -> str:
    _COUNT[0] += 1
    return f"ffi_t{_COUNT[0]}::{name}"


@dataclasses.dataclass(frozen=True)
class NormCfg:
    eps: float = 1e-6
    add_one: bool = False


class Mode(enum.Enum):
    FAST = "fast"
    EXACT = "exact"


@dataclasses.dataclass(frozen=True)
class Affine:
    scale: float
    shift: float = 0.0


def rms_ref(x, w, eps, add_one):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (w + (1.0 if add_one else 0.0))


@pytest.fixture(scope="module")
def rms_norm(mod):
    @opforge.op(fresh("rms_norm"), mutates_args=("out",), kernel=mod.rms_norm)
    def rms_norm(out: Tensor, x: Tensor, w: Tensor, cfg: NormCfg) -> None:
        """The signature: the TVM-FFI function is the kernel."""

    return rms_norm


def test_a_struct_op_passes_the_struct_fields_to_the_function_as_leaves(rms_norm):
    x, w, out = torch.randn(4, 16), torch.randn(16), torch.full((4, 16), float("nan"))
    assert rms_norm(out, x, w, NormCfg(1e-5, True)) is None
    torch.testing.assert_close(out, rms_ref(x, w, 1e-5, True))
    assert rms_norm.schema.endswith("float cfg__eps=9.9999999999999995e-07, bool cfg__add_one=False) -> ()")


def test_the_flat_op_through_torch_ops_calls_the_same_function(rms_norm):
    x, w, out = torch.randn(3, 8), torch.randn(8), torch.zeros(3, 8)
    ns, name = rms_norm.name.split("::")
    getattr(getattr(torch.ops, ns), name)(out, x, w, 0.5, False)
    torch.testing.assert_close(out, rms_ref(x, w, 0.5, False))


def test_the_eager_call_converts_arguments_as_the_dispatcher_does(rms_norm):
    # An int for the float field arrives as a float; a str for it is refused.
    x, w, out = torch.randn(2, 8), torch.randn(8), torch.zeros(2, 8)
    rms_norm(out, x, w, NormCfg(1, False))
    torch.testing.assert_close(out, rms_ref(x, w, 1.0, False))
    with pytest.raises(TypeError, match="cfg"):
        rms_norm(out, x, w, NormCfg("small", False))


def test_the_version_of_the_written_tensor_is_bumped_on_the_eager_path(rms_norm):
    x, w, out = torch.randn(2, 8), torch.randn(8), torch.zeros(2, 8)
    before = out._version
    rms_norm(out, x, w, NormCfg())
    assert out._version == before + 1


def test_an_enum_and_a_literal_reach_the_function_as_their_values(mod):
    @opforge.op(fresh("pick"), mutates_args=("out",), kernel=mod.pick)
    def pick(out: Tensor, mode: Mode, k: Literal[1, 2] = 1) -> None: ...

    out = torch.zeros(2)
    pick(out, Mode.EXACT, 2)
    assert out.tolist() == [202.0, 202.0]
    pick(out, "fast")
    assert out.tolist() == [101.0, 101.0]
    with pytest.raises(ValueError, match="k"):
        pick(out, Mode.FAST, 3)


def test_an_optional_struct_reaches_the_function_as_its_presence_then_its_fields(mod):
    @opforge.op(fresh("affine"), mutates_args=("out",), kernel=mod.affine)
    def affine(out: Tensor, x: Tensor, a: Optional[Affine] = None) -> None: ...

    x, out = torch.arange(3.0), torch.zeros(3)
    affine(out, x, Affine(2.0, 1.0))
    assert out.tolist() == [1.0, 3.0, 5.0]
    affine(out, x)
    assert out.tolist() == [0.0, 1.0, 2.0]


def test_a_function_taking_owned_tensors_gets_them_and_its_tensor_comes_back_without_a_copy(mod):
    @opforge.op(fresh("ident"), kernel=opforge.TvmFfiKernel(mod.ident, owned_tensors=True),
                fake=lambda x: torch.empty_like(x))
    def ident(x: Tensor) -> Tensor: ...

    x = torch.randn(5)
    y = ident(x)
    assert y.data_ptr() == x.data_ptr() and torch.equal(y, x)
    assert ident.overload(x).data_ptr() == x.data_ptr()


def test_a_function_taking_owned_tensors_without_saying_so_is_an_error_naming_the_op_and_the_option(mod):
    @opforge.op(fresh("ident"), kernel=mod.ident, fake=lambda x: torch.empty_like(x))
    def ident(x: Tensor) -> Tensor: ...

    x = torch.randn(5)
    for call in (ident, ident.overload):
        with pytest.raises(TypeError, match=rf"^{ident.name}: its TVM-FFI kernel takes owned tensors \(an ffi::Tensor "
                                            r"parameter\), .* kernel=opforge\.TvmFfiKernel\(function, "
                                            r"owned_tensors=True\), or declare the parameter ffi::TensorView"):
            call(x)
    # Told nothing, it is not told by a failed call either: no second try with owned tensors.
    assert not opforge._ffi.make_kernel("ns::ident", mod.ident).owned_tensors
    with pytest.raises(TypeError, match="takes owned tensors"):
        ident(x)


def test_each_leaf_s_way_to_the_function_is_planned_from_the_schema_when_the_kernel_is_registered(mod):
    @opforge.op(fresh("planned"), mutates_args=("out",), kernel=mod.rms_norm)
    def planned(out: Tensor, x: Tensor, w: Tensor, cfg: NormCfg, dt: Optional[torch.dtype] = None,
                sizes: list[int] = (1,), mode: Mode = Mode.FAST) -> None: ...

    k = opforge._ffi.make_kernel(planned.name, mod.rms_norm)
    assert k.plan == []
    registration = _C.register_ffi_kernel(k, "CPU")
    assert k.plan == ["tensor", "tensor", "tensor", "float", "bool", "dtype?", "list of int", "str"]
    del registration


def test_a_kernel_allocates_its_output_with_torch_through_the_environment_allocator(mod):
    @opforge.op(fresh("doubled"), kernel=mod.doubled, fake=lambda x: torch.empty_like(x))
    def doubled(x: Tensor) -> Tensor: ...

    x = torch.arange(4.0)
    assert doubled(x).tolist() == [0.0, 2.0, 4.0, 6.0]
    assert doubled.overload(x).tolist() == [0.0, 2.0, 4.0, 6.0]
    compiled = torch.compile(lambda t: doubled(t) + 1, backend="aot_eager", fullgraph=True)
    assert compiled(x).tolist() == [1.0, 3.0, 5.0, 7.0]


def test_a_function_of_another_arity_keeps_tensor_views(mod):
    # Its TypeError quotes a signature with DLTensor*, which is no sign that it takes owned tensors.
    k = opforge._ffi.make_kernel("ns::arity", mod.scale_out)

    @opforge.op(fresh("arity"), mutates_args=("out",))
    def arity(out: Tensor, x: Tensor) -> None: ...

    arity._set_kernel(None, k)
    with pytest.raises(TypeError, match="Mismatched number of arguments"):
        arity(torch.zeros(2), torch.ones(2))
    assert not k.owned_tensors


def test_a_tuple_comes_back_as_the_schema_returns_and_a_count_that_differs_is_an_error(mod):
    owned = opforge.TvmFfiKernel(mod.with_size, owned_tensors=True)

    @opforge.op(fresh("with_size"), kernel=owned, fake=lambda x: (torch.empty_like(x), x.numel()))
    def with_size(x: Tensor) -> tuple[Tensor, int]: ...

    @opforge.op(fresh("with_size3"), kernel=owned)
    def three(x: Tensor) -> tuple[Tensor, int, int]: ...

    x = torch.arange(3.0)
    y, n = with_size(x)
    assert y.data_ptr() == x.data_ptr() and n == 3
    with pytest.raises(RuntimeError, match=rf"^{three.name}: its TVM-FFI kernel returned 2 values where the schema "
                                           r"returns 3\.$"):
        three(x)


def test_scalar_returns_come_back_as_the_schema_types(mod):
    @opforge.op(fresh("add_ints"), kernel=mod.add_ints)
    def add_ints(a: int, b: int) -> int: ...

    @opforge.op(fresh("half"), kernel=mod.half)
    def half(a: float) -> float: ...

    assert add_ints(2, 40) == 42
    assert half(3) == 1.5


def test_lists_reach_the_function_as_arrays(mod):
    @opforge.op(fresh("sum_list"), kernel=mod.sum_list)
    def sum_list(xs: list[int]) -> int: ...

    @opforge.op(fresh("fill_all"), mutates_args=("ts",), kernel=mod.fill_all)
    def fill_all(ts: list[Tensor], v: float) -> None: ...

    assert sum_list((1, 2, 39)) == 42
    a, b = torch.zeros(2), torch.zeros(3, dtype=torch.float64)
    fill_all([a, b], 7)
    assert a.tolist() == [7.0, 7.0] and b.tolist() == [7.0, 7.0, 7.0]


def test_a_dtype_reaches_the_function_as_a_dl_data_type(mod):
    @opforge.op(fresh("dtype_bits"), kernel=mod.dtype_bits)
    def dtype_bits(dt: torch.dtype) -> int: ...

    assert dtype_bits(torch.float16) == 16
    assert dtype_bits(torch.float64) == 64
    assert [dtype_bits(t) for t in (torch.bfloat16, torch.bool, torch.int8, torch.uint8, torch.complex64)] == \
        [16, 8, 8, 8, 64]


def test_register_kernel_takes_a_tvm_ffi_function_for_one_device(mod):
    calls = []

    @opforge.op(fresh("scale"), mutates_args=("out",))
    def scale(out: Tensor, x: Tensor, s: float) -> None:
        calls.append(s)
        out.copy_(x * s)

    scale.register_kernel("cpu", mod.scale_out)
    out = torch.zeros(3)
    scale(out, torch.ones(3), 3.0)
    ns, name = scale.name.split("::")
    getattr(getattr(torch.ops, ns), name)(out, torch.ones(3), 4.0)
    assert out.tolist() == [4.0, 4.0, 4.0] and calls == []


def test_kernel_as_a_dict_registers_one_function_per_device(mod):
    @opforge.op(fresh("scale"), mutates_args=("out",), kernel={"cpu": mod.scale_out})
    def scale(out: Tensor, x: Tensor, s: float) -> None: ...

    out = torch.zeros(2)
    scale(out, torch.ones(2), 5.0)
    assert out.tolist() == [5.0, 5.0]


def test_under_compile_the_op_traces_with_no_graph_break_and_gives_eager_values(rms_norm):
    x, w = torch.randn(4, 16), torch.randn(16)

    def step(x, w):
        out = torch.empty_like(x)
        rms_norm(out, x * 2, w, NormCfg(1e-5, True))
        return out + 1

    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), step(x, w))
    assert counter.frame_count == 1
    torch.testing.assert_close(torch.compile(step, backend="aot_eager", fullgraph=True)(x, w), step(x, w))


def test_opcheck_passes_for_an_out_variant_ffi_op(rms_norm):
    x, w, out = torch.randn(4, 16), torch.randn(16), torch.zeros(4, 16)
    result = opforge.opcheck(rms_norm, (out, x, w, NormCfg()))
    assert set(result.values()) == {"SUCCESS"}


@pytest.fixture(scope="module")
def scaled(mod):
    """A functional op whose forward and backward both call an FFI op (the
    FlashInfer pattern: Python allocates, the out-variant kernel writes)."""
    @opforge.op(fresh("scale_out"), mutates_args=("out",), kernel=mod.scale_out)
    def scale_out(out: Tensor, x: Tensor, s: float) -> None: ...

    def backward(ctx, g):
        g = g.contiguous()  # .sum()'s gradient is an expanded view; the kernel takes dense tensors
        grad = torch.empty_like(g)
        scale_out(grad, g, ctx.s)
        return grad, None

    def setup_context(ctx, inputs, output):
        ctx.s = inputs[1]

    @opforge.op(fresh("scaled"), backward=backward, setup_context=setup_context, fake=lambda x, s: torch.empty_like(x))
    def scaled(x: Tensor, s: float) -> Tensor:
        out = torch.empty_like(x)
        scale_out(out, x, s)
        return out

    return scaled


def test_a_backward_through_an_ffi_op_passes_gradcheck(scaled):
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: scaled(t, 1.5), (x,))


def test_a_backward_through_an_ffi_op_compiles_forward_and_backward(scaled):
    x = torch.randn(6, requires_grad=True)
    compiled = torch.compile(lambda t: scaled(t, 3.0).sum(), backend="aot_eager", fullgraph=True)
    compiled(x).backward()
    torch.testing.assert_close(x.grad, torch.full((6,), 3.0))


def test_an_ffi_kernel_op_with_a_backward_passes_gradcheck_eagerly_and_compiled(mod):
    @opforge.op(fresh("doubled"), kernel=mod.doubled, fake=lambda x: torch.empty_like(x),
                backward=lambda ctx, g: g * 2)
    def doubled(x: Tensor) -> Tensor: ...

    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(doubled, (x,))
    compiled = torch.compile(lambda t: doubled(t).sum(), backend="aot_eager", fullgraph=True)
    compiled(x).backward()
    torch.testing.assert_close(x.grad, torch.full((4,), 2.0, dtype=torch.float64))


def test_a_backward_calling_a_raw_ffi_function_says_to_make_it_an_op_when_compiled(mod):
    def backward(ctx, g):
        g = g.contiguous()
        grad = torch.empty_like(g)
        mod.scale_out(grad, g, 2.0)
        return grad

    @opforge.op(fresh("doubled"), backward=backward, fake=lambda x: torch.empty_like(x))
    def doubled(x: Tensor) -> Tensor:
        return x * 2

    x = torch.randn(3, requires_grad=True)
    doubled(x).sum().backward()  # eagerly the raw call is fine
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    compiled = torch.compile(lambda t: doubled(t).sum(), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=r"its backward calls the TVM-FFI function 'mod' directly.*op too"):
        compiled(torch.randn(3, requires_grad=True)).backward()


def test_meta_tensors_run_the_free_fake_of_an_out_variant_op(rms_norm):
    ns, name = rms_norm.name.split("::")
    x = torch.empty(2, 8, device="meta")
    assert getattr(getattr(torch.ops, ns), name)(x, x, torch.empty(8, device="meta"), 1e-6, False) is None


def test_decorating_a_tvm_ffi_function_directly_says_to_use_a_stub(mod):
    name = fresh("direct")
    with pytest.raises(TypeError, match=rf"{name}: a tvm_ffi.Function records no parameter names.*kernel=fn"):
        opforge.op(name)(mod.rms_norm)


def test_a_kernel_that_is_not_a_tvm_ffi_function_is_refused_and_nothing_is_registered():
    name = fresh("bad_kernel")
    with pytest.raises(TypeError, match=rf"{name}: kernel= must be a tvm_ffi.Function.*not function"):
        @opforge.op(name, kernel=lambda x: x)
        def f(x: Tensor) -> Tensor: ...
    ns, op = name.split("::")
    assert not hasattr(getattr(torch.ops, ns), op)


def test_kernel_as_a_dict_takes_no_device_types_no_empty_dict_and_only_device_names(mod):
    for kernel, extra, error, message in (
            ({"cpu": mod.add_ints}, {"device_types": "cpu"}, TypeError, "kernel= names its devices as a dict; drop "
                                                                        "device_types=."),
            ({}, {}, ValueError, "kernel= is an empty dict. Map device types to functions"),
            ({0: mod.add_ints}, {}, TypeError, "kernel= maps device types ('cpu', 'cuda') to functions, not int 0.")):
        name = fresh("bad_dict")
        with pytest.raises(error, match=f"^{name}: {re.escape(message)}"):
            @opforge.op(name, kernel=kernel, **extra)
            def f(a: int, b: int) -> int: ...
        ns, op = name.split("::")
        assert not hasattr(getattr(torch.ops, ns), op)


def test_without_tvm_ffi_imported_a_kernel_that_is_not_one_says_how_to_get_it():
    code = textwrap.dedent("""
        import torch, opforge
        try:
            @opforge.op("noffi::f", kernel=print)
            def f(x: torch.Tensor) -> torch.Tensor: ...
        except TypeError as e:
            print(e)
    """)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    assert child.stdout.startswith("noffi::f: kernel= must be a tvm_ffi.Function"), child.stdout
    assert "TVM-FFI kernels need the apache-tvm-ffi package: pip install 'opforge[tvm-ffi]'" in child.stdout


def test_a_value_no_tvm_ffi_type_holds_is_an_error_naming_the_op_and_the_argument(mod):
    @opforge.op(fresh("half"), kernel=mod.half)
    def half(a: torch.types.Number) -> float: ...

    assert half(3) == 1.5
    with pytest.raises(RuntimeError, match=rf"^{half.name}: argument 'a' is a ComplexDouble, which opforge does not "
                                           r"pass to a TVM-FFI kernel\."):
        half(1j)


def test_the_kernel_attribute_of_an_ffi_kernel_names_the_op(mod):
    k = opforge._ffi.make_kernel("ns::f", mod.add_ints)
    assert isinstance(k, _C.FfiKernel) and k.op == "ns::f" and not k.owned_tensors


def test_a_module_as_kernel_is_a_type_error_naming_the_op_and_the_module_s_functions(mod):
    mod.rms_norm, mod.scale_out  # looked up: the module keeps them
    with pytest.raises(TypeError, match=r"^ns::m: kernel= got a tvm_ffi\.Module, which holds several functions, "
                                        r"not one\. Pass kernel=mod\.\w+; the module has: .*rms_norm, .*scale_out"):
        @opforge.op("ns::m", mutates_args=("out",), kernel=mod)
        def m(out: Tensor, x: Tensor, s: float) -> None: ...
    assert not hasattr(torch.ops.ns, "m")

    @opforge.op(fresh("scale"), mutates_args=("out",))
    def scale(out: Tensor, x: Tensor, s: float) -> None:
        out.copy_(x * s)

    with pytest.raises(TypeError, match=rf"^{scale.name}: register_kernel got a tvm_ffi\.Module, .* Pass "
                                        r"mod\.\w+; the module has: "):
        scale.register_kernel("cpu", mod)
    with pytest.raises(TypeError, match="tvm_ffi.Module"):
        opforge._ffi.make_kernel("ns::m", opforge.TvmFfiKernel(mod, owned_tensors=True))


def test_a_value_returned_for_an_op_that_returns_nothing_is_an_error_naming_the_op(mod):
    @opforge.op(fresh("lost"), kernel=mod.add_ints)
    def lost(a: int, b: int) -> None: ...

    for call in (lost, lost.overload):
        with pytest.raises(RuntimeError, match=rf"^{lost.name}: its TVM-FFI kernel returned an int, but the op's "
                                               r"schema returns nothing \(-> \(\)\), so it would be lost\. "
                                               r"Annotate the return \(-> Tensor\) or make the function return "
                                               r"nothing \(void\)\.$"):
            call(1, 2)


def python_calls(fn, *args) -> list[str]:
    """The Python functions that one call of `fn(*args)` runs, after a warm-up."""
    fn(*args)
    calls: list[str] = []

    def profile(frame, event, _arg):
        if event == "call":
            calls.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return calls


def test_an_eager_call_that_needs_a_gradient_records_the_node_from_c_as_a_body_op_does(mod):
    def backward(ctx, grad):
        return grad * 2

    @opforge.op(fresh("doubled"), kernel=mod.doubled, fake=lambda x: torch.empty_like(x), backward=backward)
    def doubled(x: Tensor) -> Tensor: ...

    @opforge.op(fresh("doubled_body"), backward=backward)
    def doubled_body(x: Tensor) -> Tensor:
        return x * 2

    x = torch.arange(4.0, requires_grad=True)
    assert python_calls(doubled, x) == []
    assert python_calls(doubled_body, x) == ["test_tvm_ffi.py:doubled_body"]  # its body, nothing of opforge's
    y = doubled(x)
    assert y.grad_fn is not None and y.tolist() == [0.0, 2.0, 4.0, 6.0]
    (grad,) = torch.autograd.grad((y * torch.arange(4.0)).sum(), x)
    (body_grad,) = torch.autograd.grad((doubled_body(x) * torch.arange(4.0)).sum(), x)
    assert grad.tolist() == body_grad.tolist() == [0.0, 2.0, 4.0, 6.0]
    # Through torch.ops, the op's Autograd kernel gives the same.
    ns, name = doubled.name.split("::")
    (flat_grad,) = torch.autograd.grad(getattr(getattr(torch.ops, ns), name)(x).sum(), x)
    assert flat_grad.tolist() == [2.0, 2.0, 2.0, 2.0]


# Bodies that each run in a fresh process with the test kernels built: one
# that killed its process would show as a dead child. They share one child
# while none dies (tests/python/child_batch.py).
OWN_PROCESS = {
    # First: the process's first call of a TVM-FFI kernel, which makes the
    # adapter's dtype table, prints nothing (torch warns when a ComplexHalf
    # or quantized tensor is made).
    "quiet": """
        import os, tempfile
        @opforge.op("quiet::f", mutates_args=("out",), kernel=mod.scale_out)
        def f(out: Tensor, x: Tensor, factor: float) -> None: ...
        out = torch.zeros(2)
        with tempfile.TemporaryFile() as err:
            saved = os.dup(2)
            os.dup2(err.fileno(), 2)
            try:
                f(out, torch.ones(2), 3.0)
                torch.ops.quiet.f(out, torch.ones(2), 3.0)
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            err.seek(0)
            print(repr(err.read().decode()))
        print(out.tolist())
    """,
    "arity": """
        @opforge.op("arity::f", mutates_args=("out",), kernel=mod.scale_out)
        def f(out: Tensor, x: Tensor) -> None: ...
        print(outcome(f, torch.zeros(2), torch.ones(2)))
        print(outcome(torch.ops.arity.f, torch.zeros(2), torch.ones(2)))
    """,
    "types": """
        @opforge.op("types::f", mutates_args=("out",), kernel=mod.takes_int)
        def f(out: Tensor, n: float) -> None: ...
        print(outcome(f, torch.zeros(2), 1.5))
    """,
    "throws": """
        @opforge.op("throws::pick", mutates_args=("out",), kernel=mod.pick)
        def pick(out: Tensor, mode: str, k: int) -> None: ...
        @opforge.op("throws::norm", mutates_args=("out",), kernel=mod.rms_norm)
        def norm(out: Tensor, x: Tensor, w: Tensor, eps: float, add_one: bool) -> None: ...
        print(outcome(pick, torch.zeros(2), "slow", 1))
        print(outcome(torch.ops.throws.pick, torch.zeros(2), "slow", 1))
        print(outcome(norm, torch.zeros(2), torch.zeros(2), torch.ones(2), 1e-6, False))
    """,
    "nofake": """
        @opforge.op("nofake::ident", kernel=opforge.TvmFfiKernel(mod.ident, owned_tensors=True))
        def ident(x: Tensor) -> Tensor: ...
        f = torch.compile(lambda x: ident(x) + 1, backend="aot_eager", fullgraph=True)
        print(outcome(f, torch.ones(2)))
        print(ident(torch.ones(2)).tolist())
    """,
    "ret": """
        @opforge.op("ret::f", kernel=mod.add_ints)
        def f(a: int, b: int) -> Tensor: ...
        print(outcome(f, 1, 2))
    """,
}


@pytest.fixture(scope="module")
def own_process():
    """own_process(name): what OWN_PROCESS[name] printed."""
    prologue = """
        import dataclasses, torch, opforge
        from torch import Tensor
        from tvm_ffi_kernels import kernels
        mod = kernels()

        def outcome(fn, *args):
            try:
                fn(*args)
            except Exception as e:
                return f"{type(e).__name__}: {' '.join(str(e).split())}"
            return "no error"
    """
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    results = run_batch(prologue, OWN_PROCESS, cwd=HERE, env=env, timeout=300)
    return lambda name: printed(results[name], name)


def test_the_first_call_of_a_tvm_ffi_kernel_prints_nothing(own_process):
    assert own_process("quiet").splitlines() == ["''", "[3.0, 3.0]"]


def test_a_function_of_another_arity_is_an_error_naming_the_op_in_its_own_process(own_process):
    out = own_process("arity")
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1], out
    assert lines[0].startswith("TypeError: arity::f: its TVM-FFI kernel raised TypeError:") and "3" in lines[0], out


def test_an_argument_of_the_wrong_type_is_an_error_naming_the_op_in_its_own_process(own_process):
    out = own_process("types")
    assert out.startswith("TypeError: types::f: its TVM-FFI kernel raised TypeError:"), out


def test_a_kernel_that_throws_raises_its_error_type_naming_the_op_in_its_own_process(own_process):
    out = own_process("throws")
    lines = out.splitlines()
    assert lines[0] == lines[1] == "ValueError: throws::pick: its TVM-FFI kernel raised ValueError: unknown mode slow"
    assert lines[2].startswith("RuntimeError: throws::norm: its TVM-FFI kernel raised InternalError:"), out
    assert "x must be 2-D" in lines[2]


def test_a_missing_fake_under_compile_is_an_error_naming_the_op_in_its_own_process(own_process):
    out = own_process("nofake")
    lines = out.splitlines()
    assert "nofake::ident: its kernel is a TVM-FFI function" in lines[0] and "register_fake" in lines[0], out
    assert lines[1] == "[1.0, 1.0]"


def test_a_returned_value_that_the_schema_does_not_return_is_an_error_in_its_own_process(own_process):
    out = own_process("ret")
    assert out.startswith("RuntimeError: ret::f: its TVM-FFI kernel returned an int where the schema returns Tensor")


def test_the_example_runs_and_checks_itself():
    root = os.path.dirname(os.path.dirname(HERE))
    child = subprocess.run([sys.executable, os.path.join(root, "examples", "tvm_ffi_op.py")], capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, child.stdout + child.stderr
    assert "eager, torch.ops, torch.compile and the gradient match PyTorch" in child.stdout
