"""Triton ops over a library written the way Liger-Kernel is (docs/triton.md):
backward helpers that launch kernels, helpers imported inside the body,
kernel parameters left to their defaults, host code that reads tensor
values, kernels that write the tensors they are given.

Graphs are captured as AOTAutograd hands them to Inductor, without running
them; eager values run on Triton's interpreter (see test_triton.py).
"""

import dataclasses
import inspect
import os
import sys
import traceback
import warnings

import pytest
import torch

triton = pytest.importorskip("triton")

import opforge  # noqa: E402
import opforge.triton as ot  # noqa: E402
from opforge import cli  # noqa: E402
from opforge.triton import _kernels, _writes  # noqa: E402
from triton_helpers import lazy  # noqa: E402
from triton_helpers import library as lib  # noqa: E402
from triton_helpers import kernels as K  # noqa: E402
from triton_testing import (  # noqa: E402
    calls, chain_text, compile_error, graph_kernels, graphs, interpreter_fixture, kernel_nodes, launch_arguments,
    mutation_analysis_on_cpu)

Tensor = torch.Tensor
_counter = iter(range(10**6))



# Before 2.13, AOTAutograd rejects an in-place write into a saved tensor that
# requires grad ("a leaf Variable that requires grad is being used in an
# in-place operation") while tracing the backward, before opforge's write
# analysis runs; torch 2.13+ traces it and opforge warns.
_TRACES_SAVED_INPUT_WRITES = torch.torch_version.TorchVersion(torch.__version__) >= "2.13"

def fresh(name: str) -> str:
    return f"tt_lib::{name}_{next(_counter)}"


def scaled_body(x: Tensor) -> Tensor:
    return lib.scale_forward(x, 3.0)


def scaled_backward(ctx, grad: Tensor):
    return lib.scale_backward(grad.contiguous(), 3.0)


def grad_input(n=64):
    torch.manual_seed(0)
    return torch.randn(n, requires_grad=True)


def _scales_by_two(package) -> bool:
    x = torch.randn(40)
    return torch.allclose(package.library.scale_forward(x, 2.0), x * 2)


interp = interpreter_fixture(_scales_by_two)


@pytest.fixture
def analysis():
    """torch's kernel mutation analysis needs a GPU target; name one."""
    with mutation_analysis_on_cpu():
        yield


class BackwardCalled(Exception):
    """What raise_if_asked raises inside a backward or setup_context."""


_ASKED: list = []


def raise_if_asked() -> None:
    if _ASKED:
        raise BackwardCalled


def opforge_frames_above(run) -> list[str]:
    """Runs `run` with raise_if_asked() raising, and returns opforge's frames
    in the traceback ('file.py:function'), between autograd and the user's
    function that raised: [] when autograd calls the user's function itself."""
    package = os.path.dirname(opforge.__file__) + os.sep
    _ASKED.append(True)
    try:
        with pytest.raises(BackwardCalled) as info:
            run()
    finally:
        _ASKED.clear()
    return [f"{os.path.basename(f.filename)}:{f.name}" for f in traceback.extract_tb(info.tb)
            if f.filename.startswith(package)]


def inspect_text(op, capsys) -> str:
    """What `opforge inspect NAME` prints for the op."""
    assert cli.main(["inspect", op.name]) == 0
    return capsys.readouterr().out


# --- backward and setup_context ------------------------------------------------------------


def test_backward_calling_a_launching_helper_puts_its_kernel_in_the_backward_graph():
    op = opforge.op(fresh("bw"), backward=scaled_backward)(scaled_body)
    g = graphs(op, grad_input())
    assert graph_kernels(g["forward"]) == [lib.scale_kernel]
    assert graph_kernels(g["backward"]) == [lib.scale_kernel]
    assert not calls(g["forward"], op)


def test_backward_given_with_register_autograd_is_traced_too():
    op = opforge.op(fresh("register_autograd"))(scaled_body)
    op.register_autograd(scaled_backward)
    assert graph_kernels(graphs(op, grad_input())["backward"]) == [lib.scale_kernel]


def test_backward_that_imports_its_helper_inside_is_traced():
    op = opforge.op(fresh("lazy_bw"), backward=lazy.lazy_backward)(scaled_body)
    assert graph_kernels(graphs(op, grad_input())["backward"]) == [lib.scale_kernel]


def test_setup_context_that_launches_a_kernel_is_traced():
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(lib.scale_forward(x, 2.0))

    def backward(ctx, grad):
        (saved,) = ctx.saved_tensors
        return grad * saved

    op = opforge.op(fresh("setup"), backward=backward, setup_context=setup_context)(scaled_body)
    g = graphs(op, grad_input())
    assert graph_kernels(g["forward"]) == [lib.scale_kernel, lib.scale_kernel]
    assert graph_kernels(g["backward"]) == []


def test_an_opaque_forward_still_gets_its_backward_kernels_traced():
    def body(x: Tensor) -> Tensor:
        return x * 3.0

    op = opforge.op(fresh("opaque_fw"), backward=scaled_backward, fake=lambda x: torch.empty_like(x))(body)
    g = graphs(op, grad_input())
    assert graph_kernels(g["backward"]) == [lib.scale_kernel]
    assert op.triton_kernels == (lib.scale_kernel,)
    assert op.triton_kernels.forward == () and op.triton_kernels.backward == (lib.scale_kernel,)


def test_a_backward_that_launches_nothing_is_kept_as_given(interp):
    def body(x: Tensor) -> Tensor:
        return interp.library.scale_forward(x, 3.0)

    def backward(ctx, grad):
        raise_if_asked()
        return grad * 3.0

    assert ot.autograd(fresh("plain_bw_plan"), body, backward, None) == (backward, None)
    op = opforge.op(fresh("plain_bw"), backward=backward)(body)
    assert op.triton_kernels.forward == (interp.library.scale_kernel,) and op.triton_kernels.backward == ()
    # Autograd calls the user's backward itself, with no opforge frame between.
    assert opforge_frames_above(lambda: op(grad_input(50)).sum().backward()) == []
    x = grad_input(50)
    op(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))


def test_a_backward_that_launches_nothing_has_no_kernel_in_the_backward_graph():
    def backward(ctx, grad):
        return grad * 3.0

    op = opforge.op(fresh("plain_bw_graph"), backward=backward)(scaled_body)
    assert graph_kernels(graphs(op, grad_input())["backward"]) == []


def test_a_backward_that_launches_nothing_is_kept_as_given_next_to_a_launching_setup_context(interp):
    def body(x: Tensor) -> Tensor:
        return interp.library.scale_forward(x, 3.0)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(interp.library.scale_forward(inputs[0], 2.0))

    def backward(ctx, grad):
        raise_if_asked()
        (doubled,) = ctx.saved_tensors
        return grad * doubled

    new_backward, new_setup_context = ot.autograd(fresh("plain_bw_setup_plan"), body, backward, setup_context)
    assert new_backward is backward
    assert new_setup_context is not setup_context and new_setup_context.__wrapped__ is setup_context
    op = opforge.op(fresh("plain_bw_setup"), backward=backward, setup_context=setup_context)(body)
    assert op.triton_kernels.backward == (interp.library.scale_kernel,)  # setup_context's launch
    assert opforge_frames_above(lambda: op(grad_input(50)).sum().backward()) == []
    x = grad_input(50)
    op(x).sum().backward()
    torch.testing.assert_close(x.grad, x.detach() * 2.0)


def test_a_launching_setup_context_next_to_a_plain_backward_is_traced():
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(lib.scale_forward(inputs[0], 2.0))

    def backward(ctx, grad):
        (doubled,) = ctx.saved_tensors
        return grad * doubled

    op = opforge.op(fresh("plain_bw_setup_graph"), backward=backward, setup_context=setup_context)(scaled_body)
    g = graphs(op, grad_input())
    assert graph_kernels(g["forward"]) == [lib.scale_kernel, lib.scale_kernel]
    assert graph_kernels(g["backward"]) == []


def launching_backward(ctx, grad: Tensor):
    raise_if_asked()
    return lib.scale_backward(grad.contiguous(), 3.0)


def test_triton_off_leaves_backward_as_given():
    def body(x: Tensor) -> Tensor:
        return x * 3.0

    def make(triton):
        return opforge.op(fresh(f"off_bw_{triton}"), backward=launching_backward, triton=triton,
                          fake=lambda x: torch.empty_like(x))(body)

    assert ot.autograd(fresh("off_bw_plan"), body, launching_backward, None, mode="off") == (launching_backward, None)
    op = make("off")
    assert op.triton_kernels == ()
    assert opforge_frames_above(lambda: op(grad_input()).sum().backward()) == []
    # The same op with triton="auto" runs its backward through opforge's switch.
    assert opforge_frames_above(lambda: make("auto")(grad_input()).sum().backward()) != []


def test_the_traced_backward_is_used_only_while_tracing(interp):
    def body(x: Tensor) -> Tensor:
        return interp.library.scale_forward(x, 3.0)

    ran_as_written = []

    def backward(ctx, grad):
        ran_as_written.append(sys._getframe().f_code is backward.__code__)  # False in opforge's traced copy
        return interp.library.scale_backward(grad.contiguous(), 3.0)

    switch, _ = ot.autograd(fresh("switch_plan"), body, backward, None)
    assert switch is not backward and switch.__wrapped__ is backward
    assert inspect.signature(switch) == inspect.signature(backward)

    op = opforge.op(fresh("switch"), backward=backward)(body)
    x = grad_input(50)
    op(x).sum().backward()  # eagerly: the user's function
    assert ran_as_written == [True]
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))


def test_the_traced_backward_gives_inductor_its_kernels():
    ran_as_written = []

    def backward(ctx, grad):
        ran_as_written.append(sys._getframe().f_code is backward.__code__)
        return lib.scale_backward(grad.contiguous(), 3.0)

    op = opforge.op(fresh("switch_traced"), backward=backward)(scaled_body)
    assert graph_kernels(graphs(op, grad_input())["backward"]) == [lib.scale_kernel]
    assert ran_as_written and not any(ran_as_written)  # while tracing: opforge's traced copy


def test_backward_gives_the_gradient_eagerly_on_the_interpreter(interp):
    def body(x: Tensor) -> Tensor:
        return interp.library.scale_forward(x, 3.0)

    def backward(ctx, grad):
        return interp.library.scale_backward(grad.contiguous(), 3.0)

    op = opforge.op(fresh("interp_bw"), backward=backward)(body)
    x = grad_input(50)
    op(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))


def test_backward_and_setup_context_from_a_lazy_relative_import_run_eagerly(interp):
    op = opforge.op(fresh("interp_lazy"), backward=interp.lazy.lazy_backward)(interp.lazy.relative_import)
    x = grad_input(50)
    torch.testing.assert_close(op(x), x.detach() * 2.0)
    op(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))


# --- helpers imported inside the body -------------------------------------------------------


@pytest.mark.parametrize("form", list(lazy.FORMS))
def test_a_helper_imported_inside_the_body_is_followed(form):
    body = lazy.FORMS[form]
    plan = ot.plan(f"tt_lib_plan::{form}", body)
    assert plan is not None and plan.kernels == (lib.scale_kernel,)
    op = opforge.op(fresh(form))(body)
    g = graphs(op, torch.randn(64))
    assert graph_kernels(g["forward"]) == [lib.scale_kernel] and not calls(g["forward"], op)


def test_a_lazy_import_of_a_module_not_imported_yet_is_followed(tmp_path, monkeypatch):
    import importlib
    import sys

    (tmp_path / "tt_lazy_late.py").write_text("from triton_helpers.library import scale_forward as helper\n")
    (tmp_path / "tt_lazy_body.py").write_text(
        "def body(x):\n    from tt_lazy_late import helper\n    return helper(x, 2.0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    body = importlib.import_module("tt_lazy_body").body
    assert "tt_lazy_late" not in sys.modules
    plan = ot.plan("tt_lib_plan::late", body)
    assert plan is not None and plan.kernels == (lib.scale_kernel,)


def test_a_lazy_import_that_fails_is_reported_by_the_plan():
    def body(x: Tensor) -> Tensor:
        if x.dim() > 8:
            from triton_helpers.no_such_module import helper

            return helper(x)
        return lib.scale_forward(x, 2.0)

    plan = ot.plan("tt_lib_plan::missing", body)
    assert plan.kernels == (lib.scale_kernel,)
    assert any("no_such_module" in u and "ModuleNotFoundError" in u for u in plan.unresolved)


def test_a_body_that_only_imports_the_standard_library_is_not_scanned():
    def body(x: Tensor) -> Tensor:
        import math

        return x * math.pi

    before = ot.cache_info()
    assert ot.plan("tt_lib_plan::stdlib_import", body) is None
    assert ot.cache_info().code_misses == before.code_misses


# --- kernel parameters with defaults ---------------------------------------------------------


def test_a_launch_that_leaves_out_a_defaulted_parameter_records_the_default():
    op = opforge.op(fresh("defaults"))(scaled_body)
    (node,) = kernel_nodes(graphs(op, torch.randn(64))["forward"])
    args = launch_arguments(node)
    assert args["X_stride"] == 1
    assert set(args) == set(lib.scale_kernel.arg_names)


def test_the_backward_launch_of_an_in_place_kernel_records_its_default():
    def body(x: Tensor) -> tuple[Tensor, Tensor]:
        return x * 2.0, torch.ones(1)

    def fake(x):
        return torch.empty_like(x), x.new_empty(1)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def backward(ctx, grad, _grad_one):
        (x,) = ctx.saved_tensors
        dx = torch.full_like(x, 2.0)
        return lib.mul_by_scalar_(dx, grad[:1])

    op = opforge.op(fresh("defaults_bw"), backward=backward, setup_context=setup_context, fake=fake)(body)
    g = graphs(lambda x: op(x)[0], grad_input())
    (node,) = kernel_nodes(g["backward"])
    assert launch_arguments(node)["X_stride"] == 1


def test_defaults_are_bound_only_for_parameters_the_launch_leaves_out():
    k = lib.scale_kernel
    assert _kernels.bind_defaults(k, (1, 2, 3, 4), {"BLOCK": 32}) == {"BLOCK": 32, "X_stride": 1}
    assert _kernels.bind_defaults(k, (1, 2, 3, 4), {"BLOCK": 32, "X_stride": 4}) == {"BLOCK": 32, "X_stride": 4}
    assert _kernels.bind_defaults(k, (1, 2, 3, 4, 32, 7), {}) == {}
    assert _kernels.bind_defaults(K.add_kernel, (1, 2, 3, 4), {"BLOCK": 32}) == {"BLOCK": 32}


def test_defaults_an_autotune_config_sets_are_left_to_the_config():
    tuned = triton.autotune(configs=[triton.Config({"X_stride": 1, "BLOCK": 32})], key=[])(lib.scale_kernel)
    assert _kernels.bind_defaults(tuned, (1, 2, 3, 4), {}) == {}


# --- host code that reads tensor values -----------------------------------------------------------


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_item_in_the_body_is_reported_with_the_users_line_and_the_fix():
    def body(x: Tensor) -> Tensor:
        n = int((x > 0).sum().item())
        return lib.scale_forward(x, 1.0 / max(n, 1))

    op = opforge.op(fresh("item"))(body)
    e = compile_error(op, torch.randn(64))
    text = chain_text(e)
    line = _line_of(body, ".item()")
    assert f"test_triton_library.py:{line}" in text
    assert "reads a tensor's value" in text and "n = int((x > 0).sum().item())" in text
    assert "fake=" in text and "out of the op" in text
    assert op.name in text


def test_an_assert_on_tensor_values_is_reported_with_its_line():
    def body(x: Tensor) -> Tensor:
        assert (x < 1e9).all(), "too large"
        return lib.scale_forward(x, 2.0)

    op = opforge.op(fresh("assert"))(body)
    text = chain_text(compile_error(op, torch.randn(64)))
    assert f"test_triton_library.py:{_line_of(body, 'assert (x')}" in text


def test_host_code_in_a_library_helper_names_the_helper_line_and_the_body_line():
    def body(x: Tensor) -> Tensor:
        return lib.count_positive_then_scale(x)

    op = opforge.op(fresh("item_in_helper"))(body)
    text = chain_text(compile_error(op, torch.randn(64)))
    # torch 2.9 stops at the .item() itself; later torch at the first use of its value.
    where = "max(n_positive" if torch.torch_version.TorchVersion(torch.__version__) >= "2.10" else ".sum().item()"
    assert f"library.py:{_line_of(lib.count_positive_then_scale, where)}" in text
    assert f"reached from {__file__}:{_line_of(body, 'count_positive_then_scale')}" in text


@pytest.mark.filterwarnings("ignore:Error detected in")  # AOTAutograd traces backward in anomaly mode
def test_host_code_in_backward_is_reported_as_backward():
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return lib.equal_one_or_scale(grad, y)

    op = opforge.op(fresh("equal_bw"), backward=backward, setup_context=setup_context)(scaled_body)
    text = chain_text(compile_error(lambda x: op(x) * 2, grad_input()))
    assert f"{op.name}: backward reads a tensor's value" in text
    assert f"library.py:{_line_of(lib.equal_one_or_scale, 'if torch.equal')}" in text
    assert "ctx attributes only" in text


def test_the_host_code_error_is_a_runtime_error_so_dynamo_can_graph_break():
    assert issubclass(ot.HostCodeError, RuntimeError)


# --- kernels that write undeclared arguments ---------------------------------------------------------


def writes_its_input(x: Tensor) -> Tensor:
    lib.scale_kernel[lib.grid(x.numel())](x, x, x.numel(), 2.0, BLOCK=lib.BLOCK)
    return x.clone()


def test_a_kernel_writing_an_undeclared_input_is_reported(analysis):
    op = opforge.op(fresh("undeclared"))(writes_its_input)
    text = chain_text(compile_error(op, torch.randn(64)))
    line = _line_of(writes_its_input, "lib.scale_kernel[")
    assert (f"{op.name}: Triton kernel 'scale_kernel' (launched at test_triton_library.py:{line}) writes its "
            f"argument 'Y_ptr', which is the op's parameter 'x', but mutates_args does not declare 'x'.") in text
    assert "mutates_args=('x',)" in text and "x.clone()" in text


def test_a_library_kernel_writing_an_input_through_a_view_is_reported(analysis):
    def body(x: Tensor, g: Tensor) -> Tensor:
        lib.mul_by_scalar_(x.view(-1), g)
        return g.clone()

    op = opforge.op(fresh("undeclared_view"))(body)
    text = chain_text(compile_error(op, torch.randn(8, 8), torch.ones(1)))
    assert "Triton kernel 'mul_by_scalar_kernel'" in text and "argument 'X_ptr'" in text
    assert "the op's parameter 'x'" in text and "parameter 'g'" not in text


def test_a_declared_mutation_is_not_reported(analysis):
    def body(x: Tensor) -> None:
        lib.scale_kernel[lib.grid(x.numel())](x, x, x.numel(), 2.0, BLOCK=lib.BLOCK)

    op = opforge.op(fresh("declared"), mutates_args=("x",))(body)
    g = graphs(lambda x: op(x), torch.randn(64))
    assert graph_kernels(g["forward"]) == [lib.scale_kernel]


@dataclasses.dataclass(frozen=True)
class Buffers:
    src: Tensor
    dst: Tensor


def test_a_write_into_a_dataclass_field_names_the_field(analysis):
    def body(b: Buffers) -> Tensor:
        lib.scale_kernel[lib.grid(b.src.numel())](b.src, b.dst, b.src.numel(), 2.0, BLOCK=lib.BLOCK)
        return b.src * 1

    op = opforge.op(fresh("struct_write"))(body)
    text = chain_text(compile_error(lambda s, d: op(Buffers(s, d)), torch.randn(64), torch.randn(64)))
    assert "writes its argument 'Y_ptr', which is the op's parameter 'b.dst'" in text


def test_reads_of_inputs_and_writes_to_new_tensors_are_not_reported(analysis):
    op = opforge.op(fresh("clean"), backward=scaled_backward)(scaled_body)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ot.UndeclaredWriteWarning)
        g = graphs(op, grad_input())
    assert graph_kernels(g["backward"]) == [lib.scale_kernel]


def test_a_backward_writing_its_gradient_warns(analysis):
    def backward(ctx, grad):
        return lib.scale_backward(grad, 3.0, in_place=True)

    op = opforge.op(fresh("bw_in_place"), backward=backward)(scaled_body)
    with pytest.warns(ot.UndeclaredWriteWarning) as record:
        graphs(op, grad_input())
    message = next(str(w.message) for w in record if issubclass(w.category, ot.UndeclaredWriteWarning))
    assert f"{op.name}: backward: Triton kernel 'scale_kernel'" in message
    assert "writes its argument 'Y_ptr', which is backward's parameter 'grad'" in message
    assert "in_place=False" in message


@pytest.mark.skipif(not _TRACES_SAVED_INPUT_WRITES, reason=f"needs torch 2.13 (this is {torch.__version__}): "
                    "earlier torch fails the trace itself with 'a leaf Variable that requires grad is being used "
                    "in an in-place operation'")
def test_a_backward_overwriting_a_saved_input_warns(analysis):
    def body(x: Tensor) -> Tensor:
        return lib.square_forward(x)[1]

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return lib.square_backward(x, grad)

    op = opforge.op(fresh("bw_saved"), backward=backward, setup_context=setup_context)(body)
    with pytest.warns(ot.UndeclaredWriteWarning, match=r"'square_backward_kernel' .* writes its argument 'X_ptr', "
                                                        r"which is the op's parameter 'x' \(saved for backward"):
        graphs(op, grad_input())


def test_without_a_gpu_driver_nothing_is_guessed(analysis):
    # With a driver, this op's undeclared write is an error (test_a_kernel_writing_an_undeclared_input_is_reported);
    # without one torch's analysis could only guess, so opforge reports nothing and Inductor gets the kernel.
    ready = _writes._driver_ready
    _writes._driver_ready = lambda: False
    try:
        op = opforge.op(fresh("no_driver"))(writes_its_input)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ot.UndeclaredWriteWarning)
            assert graph_kernels(graphs(op, torch.randn(64))["forward"]) == [lib.scale_kernel]
    finally:
        _writes._driver_ready = ready


def test_the_analysis_runs_once_per_kernel_and_constants(analysis, monkeypatch):
    from torch._higher_order_ops import triton_kernel_wrap as tkw

    # torch's analysis, which opforge asks (identify_accessed_tensors from torch 2.12).
    name = "identify_accessed_tensors" if hasattr(tkw, "identify_accessed_tensors") else "identify_mutated_tensors"
    analysed = []
    real = getattr(tkw, name)
    monkeypatch.setattr(tkw, name, lambda jit, args, *rest: analysed.append(dict(args)) or real(jit, args, *rest))

    args = {"X_ptr": torch.ones(4), "Y_ptr": torch.ones(4), "n": 4, "factor": 1.0, "BLOCK": 32, "X_stride": 1}
    assert _writes.written_arguments(lib.scale_kernel, args) == {"Y_ptr"}
    before = len(analysed)  # 0 if an earlier test analysed these constants already
    assert _writes.written_arguments(lib.scale_kernel, {**args, "n": 8}) == {"Y_ptr"}  # n is not a constant
    assert len(analysed) == before
    assert _writes.written_arguments(lib.scale_kernel, {**args, "BLOCK": 64}) == {"Y_ptr"}
    assert len(analysed) == before + 1 and analysed[-1]["BLOCK"] == 64


# --- which kernels an op launches ---------------------------------------------------------------------


def test_triton_kernels_lists_forward_then_backward_kernels():
    def backward(ctx, grad):
        dx = grad.clone()
        return lib.mul_by_scalar_(dx, torch.ones(1))

    op = opforge.op(fresh("kernels"), backward=backward)(scaled_body)
    assert op.triton_kernels == (lib.scale_kernel, lib.mul_by_scalar_kernel)
    assert op.triton_kernels.forward == (lib.scale_kernel,)
    assert op.triton_kernels.backward == (lib.mul_by_scalar_kernel,)


def test_triton_kernels_is_empty_for_an_opaque_op():
    def body(x: Tensor) -> Tensor:
        return x * 2

    assert opforge.op(fresh("opaque"))(body).triton_kernels == ()


def test_inspect_prints_the_kernels_and_says_when_there_are_none(capsys):
    op = opforge.op(fresh("inspect"), backward=scaled_backward)(scaled_body)
    text = inspect_text(op, capsys)
    assert ("  triton     forward: scale_kernel (triton_helpers.library); "
            "backward: scale_kernel (triton_helpers.library)") in text

    def body(x: Tensor) -> Tensor:
        return x * 2

    assert "  triton     no Triton kernels" in inspect_text(opforge.op(fresh("inspect_none"))(body), capsys)
