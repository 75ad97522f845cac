"""Kernels found where they are launched (docs/triton.md), over a library
written the way FlagGems is (`triton_helpers/flaglike.py`): a launcher class
holding the kernel at `.fn`, an Autotuner subclass, kernels generated into a
file and imported at run time, helpers reached through a module.

Graphs are captured as AOTAutograd hands them to Inductor, without running
them; eager values run on Triton's interpreter.
"""

import sys

import pytest
import torch

triton = pytest.importorskip("triton")

from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table  # noqa: E402

import opforge  # noqa: E402
import opforge.triton as ot  # noqa: E402
from opforge import cli  # noqa: E402
from opforge.triton import _flatten, _kernels, _trace, _writes  # noqa: E402
from triton_helpers import flaglike as fl  # noqa: E402
from triton_testing import (  # noqa: E402
    TargetOnlyDriver, chain_text, compile_error, graphs, interpreter_fixture, kernel_nodes, launch_arguments,
    mutation_analysis_on_cpu)

Tensor = torch.Tensor
_counter = iter(range(10**6))


def fresh(name: str) -> str:
    return f"tt_launch::{name}_{next(_counter)}"


def x100():
    torch.manual_seed(0)
    return torch.randn(100)


def graph_kernel_objects(gm) -> list:
    """What each kernel node launches, as the kernel side table holds it."""
    return [kernel_side_table.get_kernel(n.kwargs["kernel_idx"]) for n in kernel_nodes(gm)]


def originals(gm) -> list:
    """The user's @triton.jit functions behind the graph's kernels."""
    return [_flatten.original(k) for k in graph_kernel_objects(gm)]


@pytest.fixture
def target_driver():
    """torch's own analysis of which arguments a kernel writes (and so the
    graph's cloned tensors) needs a GPU target; name one."""
    config = triton.runtime.driver
    previous = config._active
    config.set_active(TargetOnlyDriver())
    try:
        yield
    finally:
        config._active = previous


def inspect_text(op, capsys) -> str:
    """What `opforge inspect NAME` prints for the op."""
    assert cli.main(["inspect", op.name]) == 0
    return capsys.readouterr().out


def _scales(package) -> bool:
    return torch.equal(package.flaglike.scale(torch.arange(40.0), 2.0), torch.arange(40.0) * 2)


interp = interpreter_fixture(_scales)


# --- a launcher holding the kernel at .fn ----------------------------------------------------


def scale_body(x: Tensor) -> Tensor:
    return fl.scale(x, 3.0)


def test_a_kernel_behind_a_library_launcher_is_found_when_the_op_is_defined():
    plan = ot.plan("tt_launch_plan::scale", scale_body)
    assert plan.kernels == (fl.scale_kernel,)
    op = opforge.op(fresh("scale"))(scale_body)
    assert op.triton_kernels == (fl.scale_kernel,)
    gm = graphs(op, x100())["forward"]
    assert graph_kernel_objects(gm) == [fl.scale_kernel.fn]  # the @triton.jit function the launcher holds
    assert launch_arguments(kernel_nodes(gm)[0])["factor"] == 3.0


def test_a_launcher_is_accepted_in_extra_triton_kernels():
    def body(x: Tensor) -> Tensor:
        return x * 2

    op = opforge.op(fresh("extra_launcher"), extra_triton_kernels=(fl.scale_kernel,))(body)
    assert op.triton_kernels == (fl.scale_kernel,)


def test_the_launchers_own_code_runs_eagerly(interp):
    def body(x: Tensor) -> Tensor:
        return interp.flaglike.scale(x, 3.0)

    op = opforge.op(fresh("scale_eager"))(body)
    before = sum(interp.flaglike.scale_kernel.launches.values())
    x = x100()
    torch.testing.assert_close(op(x), x * 3.0)
    assert sum(interp.flaglike.scale_kernel.launches.values()) == before + 1


def test_heuristics_under_a_launcher_are_applied_at_launch(target_driver):
    def body(x: Tensor) -> Tensor:
        return fl.square(x)

    gm = graphs(opforge.op(fresh("square"))(body), x100())["forward"]
    (node,) = kernel_nodes(gm)
    assert launch_arguments(node)["BLOCK"] == 64  # next_power_of_2(100) // 2, as the heuristic says
    assert node.kwargs["grid"] == [(2, 1, 1)]  # the grid function saw BLOCK too
    (kernel,) = graph_kernel_objects(gm)
    assert [c.num_warps for c in kernel.configs] == [2]  # the heuristic's num_warps, a launch option
    assert originals(gm) == [fl.square_kernel.fn.fn]


def test_an_outermost_heuristics_kernel_launched_directly_is_still_rejected():
    def body(x: Tensor) -> Tensor:
        out = torch.empty_like(x)
        fl.square_kernel.fn[(4,)](x, out, x.numel())
        return out

    with pytest.raises(ValueError, match=r"'square_kernel' has @triton.heuristics as its outermost decorator"):
        opforge.op(fresh("bare_heuristics"))(body)


# --- an Autotuner subclass -------------------------------------------------------------------


def test_an_autotuner_subclass_is_traced_with_its_configs():
    def body(x: Tensor) -> Tensor:
        return fl.negate(x)

    op = opforge.op(fresh("negate"))(body)
    assert op.triton_kernels == (fl.negate_kernel,)
    (kernel,) = graph_kernel_objects(graphs(op, x100())["forward"])
    assert kernel is fl.negate_kernel


def test_an_autotuner_subclass_behind_a_launcher_keeps_its_configs():
    def body(x: Tensor) -> Tensor:
        return fl.double(x)

    gm = graphs(opforge.op(fresh("double"))(body), x100())["forward"]
    (kernel,) = graph_kernel_objects(gm)
    assert isinstance(kernel, fl.Tuner) and kernel.configs == fl.double_kernel.fn.configs
    assert originals(gm) == [fl.double_kernel.fn.fn]


# --- kernels generated and imported at run time -----------------------------------------------


def multiply_body(x: Tensor, y: Tensor) -> Tensor:
    return fl.multiply(x, y)


def test_a_kernel_generated_at_run_time_is_found_when_the_op_is_traced(target_driver, capsys):
    plan = ot.plan("tt_launch_plan::multiply", multiply_body)
    assert plan.kernels == () and plan.at_run_time == (
        f"mul(...) at flaglike.py:{fl.multiply.__code__.co_firstlineno + 1}",)
    op = opforge.op(fresh("multiply"))(multiply_body)
    assert op.triton_kernels == ()
    assert "triton     a Triton op whose kernels are found when it is traced: none traced yet" in \
        inspect_text(op, capsys)
    x, y = x100(), x100()
    gm = graphs(lambda a, b: op(a, b) * 2, x, y)["forward"]
    (node,) = kernel_nodes(gm)
    generated = fl.mul.overloads[1].__globals__["mul_kernel_rank_1"]
    assert originals(gm) == [generated.fn]
    # Each Buffer reached the kernel as the tensor it stands for.
    args = launch_arguments(node)
    assert all(isinstance(node_arg, torch.fx.Node) for node_arg in (args["in0_ptr"], args["in1_ptr"],
                                                                     args["out0_ptr"]))
    assert node.kwargs["tensors_to_clone"] == ["out0_ptr"]
    assert op.triton_kernels == (generated,)
    assert f"triton     forward: mul_kernel_rank_1 ({generated.fn.__module__})" in inspect_text(op, capsys)


def test_a_kernel_generated_at_run_time_in_backward_is_listed_after_tracing(target_driver):
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return fl.multiply(grad, y), fl.multiply(grad, x)

    op = opforge.op(fresh("multiply_bw"), setup_context=setup_context, backward=backward)(multiply_body)
    x, y = x100().requires_grad_(), x100().requires_grad_()
    g = graphs(op, x, y)
    assert [k.fn.__name__ for k in originals(g["backward"])] == ["mul_kernel_rank_1", "mul_kernel_rank_1"]
    assert [_kernels.kernel_name(k) for k in op.triton_kernels.backward] == ["mul_kernel_rank_1"]


def test_a_pointer_argument_into_its_tensor_at_an_offset_is_rejected(tmp_path):
    class Shifted(fl.Buffer):
        def data_ptr(self):
            return super().data_ptr() + 4

    def body(x: Tensor) -> Tensor:
        out = torch.empty_like(x)
        fl.scale_kernel[(4,)](Shifted(x), out, x.numel(), 1.0, BLOCK=32)
        return out

    e = compile_error(opforge.op(fresh("shifted"))(body), x100())
    assert "Triton kernel 'scale_kernel' gets its argument 'X_ptr' as a Shifted, which Triton passes as a " \
           "pointer (it has data_ptr() and dtype), pointing into its tensor at an offset" in chain_text(e)


# --- helpers reached through a module ------------------------------------------------------------


def _emitted(kernel) -> str:
    """The source Inductor compiles for a traced kernel: the kernel and every
    helper it reaches by name."""
    from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code

    return user_defined_triton_kernel_transitive_closure_source_code(_kernels.jit_of(kernel))


def test_a_helper_reached_through_a_module_is_in_the_source_inductor_compiles(tmp_path):
    def body(x: Tensor) -> Tensor:
        return fl.square(x)

    (kernel,) = graph_kernel_objects(graphs(opforge.op(fresh("square_src"))(body), x100())["forward"])
    source = _emitted(kernel)
    assert "offsets = program_id(0) * BLOCK" in source and "def program_id(axis" in source
    assert "device.program_id" in fl.square_kernel.fn.fn.src  # the library's kernel is unchanged

    # The module Inductor writes for it compiles to Triton IR.
    path = tmp_path / "inductor_square.py"
    path.write_text("import triton\nimport triton.language as tl\n\n@triton.jit\n" + source)
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__("inductor_square")
    finally:
        sys.path.remove(str(tmp_path))
    with mutation_analysis_on_cpu():
        written = _writes.written_arguments(module.square_kernel, {
            "x_ptr": torch.ones(4), "out_ptr": torch.ones(4), "n": 4, "BLOCK": 32})
    assert written == {"out_ptr"}


def test_a_kernel_without_module_helpers_is_traced_as_it_is():
    (kernel,) = graph_kernel_objects(graphs(opforge.op(fresh("scale_as_is"))(scale_body), x100())["forward"])
    assert kernel is fl.scale_kernel.fn

    def body(x: Tensor) -> Tensor:
        return fl.double(x)

    # double_kernel calls a helper through a module (device.twice): Inductor gets a copy that calls it by name.
    (copy,) = graph_kernel_objects(graphs(opforge.op(fresh("double_copy"))(body), x100())["forward"])
    assert copy is not fl.double_kernel.fn and copy.fn is not fl.double_kernel.fn.fn
    assert "twice(tl.load" in copy.fn.src and "device.twice" in fl.double_kernel.fn.fn.src


# --- what cannot be made traceable --------------------------------------------------------------


def test_a_launcher_that_hides_its_kernel_is_rejected_naming_its_type_and_the_fix():
    def body(x: Tensor) -> Tensor:
        return fl.hidden_scale(x, 2.0)

    name = fresh("hidden")
    with pytest.raises(ValueError, match=rf"^{name}: launcher Unfollowable \(a triton.KernelInterface\) holds "
                                         r"nothing at \.fn, not a @triton.jit function.*triton='off'"):
        opforge.op(name)(body)
    # triton="off" takes it as an opaque op: Inductor calls the op, and no kernel is looked for.
    op = opforge.op(fresh("hidden_off"), triton="off", fake=lambda x: torch.empty_like(x))(body)
    assert op.triton_kernels == ()
    gm = graphs(lambda x: op(x) * 2, x100())["forward"]
    assert any(n.target is op.overload for n in gm.graph.nodes) and kernel_nodes(gm) == []


def test_a_launcher_that_hides_its_kernel_is_rejected_in_extra_triton_kernels():
    def body(x: Tensor) -> Tensor:
        return x * 2

    with pytest.raises(ValueError, match=r"launcher Unfollowable \(a triton.KernelInterface\) holds nothing"):
        opforge.op(fresh("hidden_extra"), extra_triton_kernels=(fl.hidden_kernel,))(body)


def test_triton_reading_a_traced_tensors_data_pointer_still_fails():
    from torch._subclasses.fake_tensor import FakeTensorMode

    watch = _trace.Watch("tt_launch::raw", "body", {}, True)
    scope = {"__name__": "triton.runtime.jit"}
    exec("def specialize(t):\n    return t.data_ptr()\n", scope)  # noqa: S102 - stands for Triton's launcher
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.ones(4))
        with _trace._Pointers(watch):
            view = fake[2:]
            assert view.data_ptr() - fake.data_ptr() == 2 * 4  # host code sees consistent stand-ins
            with pytest.raises(RuntimeError, match="Cannot access data pointer"):
                scope["specialize"](fake)
