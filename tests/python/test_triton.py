"""Ops whose bodies launch Triton kernels (docs/triton.md), on CPU.

Kernels cannot run on CPU, so two copies of the helper package are used:
`triton_helpers` with ordinary @triton.jit kernels, whose launches are traced
(AOTAutograd's forward graph is captured before any backend runs it), and
`triton_helpers_interpreted`, built under TRITON_INTERPRET=1, whose kernels
run eagerly on Triton's interpreter.
"""

import functools
import importlib.util
import inspect
import logging
import sys
import textwrap

import pytest
import torch

triton = pytest.importorskip("triton")

from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table  # noqa: E402
from torch.library import wrap_triton  # noqa: E402

import opforge  # noqa: E402
import opforge.triton as ot  # noqa: E402
from opforge.triton import _launch  # noqa: E402
from triton_helpers import kernels as K  # noqa: E402
from triton_helpers import launchers, rebind  # noqa: E402
from triton_helpers import ops as forms  # noqa: E402
from triton_testing import interpreted_helpers  # noqa: E402

JIT_OPS = forms.define("tt_jit")
ADD_FORMS = list(forms.FORMS)
EXPECTED_KERNEL = {
    "add_autotuned": K.add_kernel_autotuned,
    "add_heuristics_inside": K.add_kernel_heuristics_inside,
}
NEEDS_EXTRA = ("add_kernel_on_self", "add_from_globals")
_counter = iter(range(10**6))


def fresh(name: str) -> str:
    return f"tt_misc::{name}_{next(_counter)}"


class _Captured(Exception):
    pass


def forward_graph(fn, *args) -> torch.fx.GraphModule:
    """The forward graph AOTAutograd hands to the backend for fn(*args), as
    Inductor would receive it; captured without running it."""
    graphs = []

    def fw_compiler(gm, example_inputs):
        graphs.append(gm)
        raise _Captured

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=fw_compiler), fullgraph=True)
    # Without a GPU driver torch cannot analyse which arguments a kernel
    # writes and says so at warning level; it then assumes all of them.
    log = logging.getLogger("torch._dynamo")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        compiled(*args)
    except Exception:
        if not graphs:
            raise
    finally:
        log.setLevel(level)
    return graphs[0]


def kernel_nodes(gm) -> list:
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and "triton_kernel_wrapper" in getattr(n.target, "__name__", str(n.target))]


def jit_function(kernel):
    """The @triton.jit function under any autotune/heuristics layers (torch
    rebuilds the Autotuner of an autotune-over-heuristics kernel)."""
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn
    return kernel


def graph_kernels(gm) -> list:
    """The @triton.jit functions the graph launches, in order."""
    return [jit_function(kernel_side_table.get_kernel(n.kwargs["kernel_idx"])) for n in kernel_nodes(gm)]


def calls_op(gm, op) -> bool:
    return any(n.target is op.overload for n in gm.graph.nodes)


def xy(n=100):
    torch.manual_seed(0)
    return torch.randn(n), torch.randn(n)


def _adds(package) -> bool:
    x, y = xy(40)
    out = torch.empty_like(x)
    package.kernels.add_kernel[(2,)](x, y, out, 40, BLOCK=32)
    return torch.allclose(out, x + y)


@functools.lru_cache(maxsize=None)
def _interpreter():
    """The interpreted helper package and its ops, or the reason it cannot run here."""
    package, reason = interpreted_helpers(_adds)
    return ((package, package.ops.define("tt_interp")), None) if package is not None else (None, reason)


@pytest.fixture
def interp(monkeypatch):
    loaded, reason = _interpreter()
    if loaded is None:
        pytest.skip(reason)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # interpreter launches read it too
    return loaded


def new_module(tmp_path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# --- detection ---------------------------------------------------------------


@pytest.mark.parametrize("form", ADD_FORMS)
def test_every_detection_form_decomposes_into_a_triton_kernel_node(form):
    op, _ = JIT_OPS[form]
    gm = forward_graph(op, *xy())
    assert graph_kernels(gm) == [jit_function(EXPECTED_KERNEL.get(form, K.add_kernel))]
    assert not calls_op(gm, op)


@pytest.mark.parametrize("form", [f for f in ADD_FORMS if f not in NEEDS_EXTRA and f != "add_from_factory"])
def test_plan_lists_the_kernel_each_form_launches(form):
    body, options, _ = forms.FORMS[form]
    plan = ot.plan(f"tt_plan::{form}", body, mode="auto", extra_kernels=())
    assert plan.kernels == (EXPECTED_KERNEL.get(form, K.add_kernel),)


@pytest.mark.parametrize("form", NEEDS_EXTRA)
def test_kernels_on_self_and_from_globals_are_found_when_the_op_is_traced(form):
    body, _, _ = forms.FORMS[form]
    plan = ot.plan(f"tt_plan::{form}", body, mode="auto", extra_kernels=())
    assert plan.kernels == () and plan.at_run_time == plan.unresolved and len(plan.unresolved) == 1
    op = opforge.op(fresh(form))(body)
    assert op.triton_kernels == ()
    assert graph_kernels(forward_graph(op, *xy())) == [K.add_kernel]
    assert op.triton_kernels == (K.add_kernel,)


@pytest.mark.parametrize("form", NEEDS_EXTRA)
def test_extra_triton_kernels_lists_kernels_the_scan_cannot_resolve_before_tracing(form):
    body, _, _ = forms.FORMS[form]
    plan = ot.plan(f"tt_plan::{form}", body, mode="auto", extra_kernels=(K.add_kernel,))
    assert plan.kernels == (K.add_kernel,)
    assert plan.unresolved  # the launch the scan saw but could not resolve


def test_a_factory_helper_contributes_the_kernels_it_can_return():
    plan = ot.plan("tt_plan::factory", forms.add_from_factory, mode="auto", extra_kernels=())
    assert set(plan.kernels) == {K.add_kernel, K.sub_kernel}
    assert plan.unresolved == (f"K.pick('add')[...] at ops.py:{forms.add_from_factory.__code__.co_firstlineno + 2}",)


def test_plan_reports_where_each_launch_is():
    plan = ot.plan("tt_plan::where", forms.add_cross_module_helper, mode="auto", extra_kernels=())
    assert plan.launches == (f"K.add_kernel[...] at launchers.py:{launchers._launch_into.__code__.co_firstlineno + 2}",)


def test_class_private_kernel_names_are_mangled_as_in_the_class():
    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return launchers.Mangled.launch(x, y)

    op = opforge.op(fresh("mangled"), extra_triton_kernels=(K.add_kernel,))(body)
    assert graph_kernels(forward_graph(op, *xy())) == [K.add_kernel]


def test_class_private_kernel_reached_by_class_name_is_found():
    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        K.Private.launch(x, y, out, x.numel())
        return out

    plan = ot.plan("tt_plan::private", body, mode="auto", extra_kernels=())
    assert plan.kernels == (K.sub_kernel,)
    op = opforge.op(fresh("private"))(body)
    assert graph_kernels(forward_graph(op, *xy())) == [K.sub_kernel]


def test_kernels_in_a_module_level_dict_are_found():
    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        K.BY_NAME["sub"][(4,)](x, y, out, x.numel(), BLOCK=32)
        return out

    plan = ot.plan("tt_plan::dict", body, mode="auto", extra_kernels=())
    assert set(plan.kernels) == {K.add_kernel, K.sub_kernel}
    op = opforge.op(fresh("dict"))(body)
    assert graph_kernels(forward_graph(op, *xy())) == [K.sub_kernel]


def test_a_local_alias_of_a_kernel_is_launched_through_wrap_triton():
    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        kernel = K.sub_kernel
        launch = kernel[(4,)]
        launch(x, y, out, x.numel(), BLOCK=32)
        return out

    op = opforge.op(fresh("alias"))(body)
    assert graph_kernels(forward_graph(op, *xy())) == [K.sub_kernel]


def test_launch_in_a_nested_function_of_the_body_is_traced():
    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)

        def launch(kernel):
            kernel[(4,)](x, y, out, x.numel(), BLOCK=32)

        launch(K.sub_kernel)
        return out

    op = opforge.op(fresh("nested_def"))(body)
    assert graph_kernels(forward_graph(op, *xy())) == [K.sub_kernel]


def test_body_without_source_is_traced_through_its_globals():
    namespace = {"torch": torch, "add_kernel": K.add_kernel}
    exec(textwrap.dedent("""
        def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = torch.empty_like(x)
            add_kernel[(4,)](x, y, out, x.numel(), BLOCK=32)
            return out
    """), namespace)
    op = opforge.op(fresh("exec"))(namespace["body"])
    assert graph_kernels(forward_graph(op, *xy())) == [K.add_kernel]


def test_bound_method_body_keeps_its_signature_and_is_traced():
    class Adder:
        block = 32

        def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = torch.empty_like(x)
            K.add_kernel[(4,)](x, y, out, x.numel(), BLOCK=self.block)
            return out

    adder = Adder()
    plan = ot.plan("tt_plan::method", adder.add, mode="auto", extra_kernels=())
    assert inspect.signature(plan.traced_body) == inspect.signature(adder.add)
    op = opforge.op(fresh("method"))(adder.add)
    assert graph_kernels(forward_graph(op, *xy())) == [K.add_kernel]


def test_body_that_only_uses_torch_is_a_plain_op():
    def body(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2

    assert ot.plan("tt_plan::plain", body, mode="auto", extra_kernels=()) is None


def test_plain_bodies_are_not_parsed():
    def body(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x) + torch.ones_like(x)

    before = ot.cache_info()
    ot.plan("tt_plan::plain_unparsed", body, mode="auto", extra_kernels=())
    after = ot.cache_info()
    assert (after.code_hits, after.code_misses) == (before.code_hits, before.code_misses)


# --- eager, on the interpreter ----------------------------------------------


def _wrap_triton_accepts_interpreted_kernels(package) -> bool:
    try:
        torch.library.wrap_triton(package.kernels.add_kernel)
        return True
    except RuntimeError:
        return False


@pytest.mark.parametrize("form", ADD_FORMS)
def test_every_detection_form_computes_the_sum_eagerly(interp, form):
    if form == "add_autotuned":
        pytest.skip("autotuning over several configs benchmarks them, which needs a GPU driver")
    if form == "add_user_wrapped" and not _wrap_triton_accepts_interpreted_kernels(interp[0]):
        pytest.skip(f"needs torch 2.13 (this is {torch.__version__}): wrap_triton accepting interpreter-mode "
                    f"kernels; the GPU tests run this form")
    _, ops = interp
    op, reference = ops[form]
    x, y = xy()
    torch.testing.assert_close(op(x, y), reference(x, y))


def test_eager_results_match_through_the_dispatcher(interp):
    _, ops = interp
    op, _ = ops["add_module_attribute"]
    x, y = xy()
    previous = opforge.set_fast_path_enabled(False)
    try:
        torch.testing.assert_close(op(x, y), x + y)
        torch.testing.assert_close(op.overload(x, y), x + y)
    finally:
        opforge.set_fast_path_enabled(previous)


def test_dataclass_parameter_reaches_the_kernel(interp):
    package, ops = interp
    op, _ = ops["scale"]
    x, _ = xy()
    torch.testing.assert_close(op(x, package.ops.ScaleCfg(factor=3.0, bias=1.0)), x * 3.0 + 1.0)


def test_backward_gives_the_gradient_of_a_triton_op(interp):
    package, ops = interp
    op, _ = ops["scale_with_backward"]
    x = torch.randn(50, requires_grad=True)
    op(x, package.ops.ScaleCfg(factor=2.5)).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.5))


def test_mutating_op_writes_its_output(interp):
    _, ops = interp
    op, _ = ops["add_into"]
    x, y = xy()
    out = torch.zeros_like(x)
    version = out._version
    assert op(x, y, out) is None
    torch.testing.assert_close(out, x + y)
    assert out._version > version


def test_traced_body_computes_the_same_result_with_real_tensors(interp):
    package, _ = interp
    plan = ot.plan("tt_plan::interp_traced", package.ops.add_cross_module_helper, mode="auto", extra_kernels=())
    x, y = xy()
    torch.testing.assert_close(plan.traced_body(x, y), x + y)


# --- the two bodies -------------------------------------------------------------


def test_eager_body_is_the_users_function_when_it_wraps_nothing():
    plan = ot.plan("tt_plan::eager", forms.add_module_global, mode="auto", extra_kernels=())
    assert plan.eager_body is forms.add_module_global


def test_traced_body_has_the_signature_of_the_body():
    def body(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0, *, flag: bool = False) -> torch.Tensor:
        out = torch.empty_like(x)
        K.add_kernel[(4,)](x, y, out, x.numel(), BLOCK=32)
        return out

    plan = ot.plan("tt_plan::signature", body, mode="auto", extra_kernels=())
    assert inspect.signature(plan.traced_body) == inspect.signature(body)
    assert plan.traced_body.__name__ == "body" and plan.traced_body.__qualname__ == body.__qualname__


def test_user_wrapped_launches_run_eagerly_without_the_traceable_wrapper():
    from torch._library.triton import is_wrap_triton_enabled

    seen = []

    def body(x: torch.Tensor, y: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        seen.append(is_wrap_triton_enabled())
        if x is None:
            wrap_triton(K.add_kernel)[(1,)](x, y, x, 0, BLOCK=32)
        return x * scale

    plan = ot.plan("tt_plan::user_wrapped", body, mode="auto", extra_kernels=())
    assert plan.kernels == (K.add_kernel,)
    assert plan.eager_body is not body
    assert inspect.signature(plan.eager_body) == inspect.signature(body)
    x, y = xy(4)
    torch.testing.assert_close(plan.eager_body(x, y), x * 2.0)
    assert seen == [False] and is_wrap_triton_enabled()


def test_user_wrapped_launch_is_not_wrapped_twice():
    op, _ = JIT_OPS["add_user_wrapped"]
    assert len(kernel_nodes(forward_graph(op, *xy()))) == 1
    already = wrap_triton(K.add_kernel)
    assert _launch.wrap(already) is already


# --- composition ------------------------------------------------------------------


def test_dataclass_parameter_is_a_constant_of_the_kernel_node():
    op, _ = JIT_OPS["scale"]
    x, _ = xy()
    gm = forward_graph(lambda x: op(x, forms.ScaleCfg(factor=3.0, bias=0.5)), x)
    (node,) = kernel_nodes(gm)
    assert graph_kernels(gm) == [K.scale_kernel]
    constants = kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"])
    assert node.kwargs["kwargs"].get("factor", constants.get("factor")) == 3.0


def test_forward_graph_of_an_op_with_backward_holds_the_kernel():
    op, _ = JIT_OPS["scale_with_backward"]
    x = torch.randn(64, requires_grad=True)
    gm = forward_graph(lambda x: op(x, forms.ScaleCfg(factor=2.0)), x)
    assert graph_kernels(gm) == [K.scale_kernel]


def test_mutating_op_decomposes_into_its_kernel():
    op, _ = JIT_OPS["add_into"]
    x, y = xy()
    gm = forward_graph(lambda x, y, out: op(x, y, out), x, y, torch.empty_like(x))
    assert graph_kernels(gm) == [K.add_kernel]


def test_user_fake_is_used_and_the_kernel_stays_visible():
    calls = []

    def fake(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape)
        return torch.empty_like(x)

    op = opforge.op(fresh("user_fake"), fake=fake)(forms.add_module_global)
    gm = forward_graph(op, *xy())
    assert calls and graph_kernels(gm) == [K.add_kernel]


def test_triton_op_may_call_another_triton_op():
    inner, _ = JIT_OPS["add_module_global"]

    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        K.sub_kernel[(4,)](x, y, out, x.numel(), BLOCK=32)
        return inner(out, y)

    op = opforge.op(fresh("nested"))(body)
    assert graph_kernels(forward_graph(op, *xy())) == [K.sub_kernel, K.add_kernel]


def test_a_body_that_only_calls_a_triton_op_decomposes_into_its_kernels():
    inner, _ = JIT_OPS["add_class_attribute"]

    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return inner(x, y) * 2

    plan = ot.plan("tt_plan::calls_triton_op", body, mode="auto", extra_kernels=())
    assert plan.kernels == (K.add_kernel,)
    op = opforge.op(fresh("calls_triton_op"))(body)
    gm = forward_graph(op, *xy())
    assert graph_kernels(gm) == [K.add_kernel] and not calls_op(gm, op) and not calls_op(gm, inner)


def test_a_triton_op_called_through_torch_ops_is_found():
    inner, _ = JIT_OPS["add_run"]

    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.tt_jit.add_run(x, y) + 1

    plan = ot.plan("tt_plan::through_torch_ops", body, mode="auto", extra_kernels=())
    assert plan.kernels == (K.add_kernel,)


def test_a_torch_library_triton_op_counts_as_a_launch():
    sub_kernel = K.sub_kernel  # torch finds wrap_triton(name) arguments only

    @torch.library.triton_op(fresh("torch_triton_op"), mutates_args=())
    def sub(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        wrap_triton(sub_kernel)[(4,)](x, y, out, x.numel(), BLOCK=32)
        return out

    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        K.add_kernel[(4,)](x, y, out, x.numel(), BLOCK=32)
        return sub(out, y)

    plan = ot.plan("tt_plan::torch_triton_op", body, mode="auto", extra_kernels=())
    assert set(plan.kernels) == {K.add_kernel, K.sub_kernel}
    op = opforge.op(fresh("calls_torch_triton_op"))(body)
    assert graph_kernels(forward_graph(op, *xy())) == [K.add_kernel, K.sub_kernel]


def test_aten_ops_next_to_a_launch_are_fine():
    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        K.add_kernel[(4,)](x, y, out, x.numel(), BLOCK=32)
        return torch.ops.aten.mul.Tensor(out, 2)

    op = opforge.op(fresh("aten"))(body)
    gm = forward_graph(op, *xy())
    assert graph_kernels(gm) == [K.add_kernel]
    assert any(n.target is torch.ops.aten.mul.Tensor for n in gm.graph.nodes)


def test_triton_off_keeps_the_op_opaque():
    op = opforge.op(fresh("off"), triton="off", fake=lambda x, y: torch.empty_like(x))(forms.add_module_global)
    gm = forward_graph(op, *xy())
    assert kernel_nodes(gm) == [] and calls_op(gm, op)


def test_triton_force_registers_a_triton_op():
    op = opforge.op(fresh("force"), triton="force")(forms.add_class_attribute)
    assert graph_kernels(forward_graph(op, *xy())) == [K.add_kernel]


# --- rebinding ---------------------------------------------------------------------


@pytest.fixture
def restore_rebind():
    saved = (rebind.current_kernel, rebind.launch)
    yield
    rebind.current_kernel, rebind.launch = saved


def test_a_module_global_rebound_after_registration_is_the_kernel_traced(restore_rebind):
    op = opforge.op(fresh("rebind"))(rebind.apply_current_kernel)
    assert graph_kernels(forward_graph(op, *xy())) == [K.add_kernel]
    rebind.current_kernel = K.sub_kernel
    assert graph_kernels(forward_graph(op, *xy())) == [K.sub_kernel]


def test_a_helper_rebound_after_registration_is_the_helper_traced(restore_rebind):
    op = opforge.op(fresh("rebind_helper"))(rebind.call_current_helper)
    assert graph_kernels(forward_graph(op, *xy())) == [K.add_kernel]
    rebind.launch = launchers.Launcher(K.sub_kernel).launch
    assert graph_kernels(forward_graph(op, *xy())) == [K.sub_kernel]


def test_a_rebound_kernel_runs_eagerly_and_in_the_traced_body(interp):
    package, _ = interp
    module = package.rebind
    saved = module.current_kernel
    try:
        op = opforge.op(fresh("rebind_interp"))(module.apply_current_kernel)
        plan = ot.plan("tt_plan::rebind_interp", module.apply_current_kernel, mode="auto", extra_kernels=())
        x, y = xy()
        torch.testing.assert_close(op(x, y), x + y)
        module.current_kernel = package.kernels.sub_kernel
        torch.testing.assert_close(op(x, y), x - y)
        torch.testing.assert_close(plan.traced_body(x, y), x - y)
    finally:
        module.current_kernel = saved


# --- user code is left alone ---------------------------------------------------------


def _snapshot(*namespaces) -> list:
    return [{k: id(v) for k, v in vars(ns).items()} for ns in namespaces]


def test_registration_and_tracing_leave_user_code_untouched():
    body = forms.make_closure_body(K.add_kernel)
    watched = (forms, K, launchers, K.Holder, K.add_kernel, K.add_kernel_autotuned, launchers.Launcher,
               forms.LAUNCHER)
    before = _snapshot(*watched)
    code, globals_, closure, defaults, attrs = (body.__code__, body.__globals__, body.__closure__,
                                                body.__defaults__, dict(body.__dict__))
    cell_contents = [c.cell_contents for c in closure]

    op = opforge.op(fresh("untouched"))(body)
    op2 = opforge.op(fresh("untouched_self"), extra_triton_kernels=(K.add_kernel,))(forms.add_kernel_on_self)
    op3 = opforge.op(fresh("untouched_static"))(forms.add_static_method)
    for o in (op, op2, op3):
        forward_graph(o, *xy())

    assert _snapshot(*watched) == before
    assert body.__code__ is code and body.__globals__ is globals_ and body.__closure__ is closure
    assert body.__defaults__ is defaults and body.__dict__ == attrs
    assert [c.cell_contents for c in closure] == cell_contents
    assert not any(k.startswith("__opforge") for k in vars(forms))


# --- rejections -------------------------------------------------------------------------


def test_heuristics_outermost_is_rejected_with_the_decorator_order():
    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        K.add_kernel_heuristics_outside[(4,)](x, y, out, x.numel())
        return out

    name = fresh("heuristics")
    with pytest.raises(ValueError, match=rf"^{name}: Triton kernel 'add_kernel_heuristics_outside' has "
                                         r"@triton.heuristics as its outermost decorator.*autotune → heuristics → jit"):
        opforge.op(name)(body)
    assert not hasattr(getattr(torch.ops, "tt_misc"), name.split("::")[1])
    opforge.op(name, triton="off")(body)  # nothing was left registered


def test_heuristics_outermost_in_extra_kernels_is_rejected():
    with pytest.raises(ValueError, match="outermost decorator"):
        opforge.op(fresh("heuristics_extra"), extra_triton_kernels=(K.add_kernel_heuristics_outside,))(
            forms.add_module_global)


def test_two_autotune_decorators_are_rejected():
    twice = triton.autotune(configs=[triton.Config({"BLOCK": 32})], key=["n"])(K.add_kernel_autotuned)
    with pytest.raises(ValueError, match="2 @triton.autotune decorators"):
        opforge.op(fresh("autotune_twice"), extra_triton_kernels=(twice,))(forms.add_module_global)


def test_launch_next_to_an_opaque_custom_op_is_rejected():
    opaque = opforge.op(fresh("opaque"), triton="off")(forms.add_module_global)

    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        K.add_kernel[(4,)](x, y, out, x.numel(), BLOCK=32)
        return opaque(out, y)

    name = fresh("mixed")
    with pytest.raises(ValueError, match=rf"^{name}: the body launches Triton kernel 'add_kernel' .* and also calls "
                                         rf"the custom op '{opaque.name}' .*triton='off'"):
        opforge.op(name)(body)


def test_launch_next_to_a_torch_ops_custom_op_is_rejected():
    @torch.library.custom_op(fresh("custom"), mutates_args=())
    def custom(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    ns, name = custom._qualname.split("::")

    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        K.add_kernel[(4,)](x, y, out, x.numel(), BLOCK=32)
        return getattr(getattr(torch.ops, ns), name)(out)

    # Reached through getattr, the op is invisible to the scan; spelled out, it is not.
    ot.plan("tt_plan::mixed_getattr", body, mode="auto", extra_kernels=())

    def spelled(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        K.add_kernel[(4,)](x, y, out, x.numel(), BLOCK=32)
        return torch.ops.tt_misc.not_a_triton_op(out)

    with pytest.raises(ValueError, match="custom op 'tt_misc::not_a_triton_op'"):
        ot.plan("tt_plan::mixed_spelled", spelled, mode="auto", extra_kernels=())

    def through_helper(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return custom(forms.add_module_global(x, y))

    with pytest.raises(ValueError, match=f"custom op '{custom._qualname}'"):
        ot.plan("tt_plan::mixed_helper", through_helper, mode="auto", extra_kernels=())


def test_force_without_a_kernel_is_rejected_and_names_the_unresolved_launch(tmp_path):
    # A module that does not import Triton: the launch it makes is not one the
    # run time is expected to resolve.
    plain = new_module(tmp_path, "tt_plain_launcher", """
        class Launcher:
            def __init__(self, kernel):
                self.kernel = kernel

            def launch(self, x, out):
                self.kernel[(1,)](x, out)
                return out
    """)
    launcher = plain.Launcher(None)

    def body(x: torch.Tensor) -> torch.Tensor:
        return launcher.launch(x, torch.empty_like(x))

    assert ot.plan("tt_plan::plain_launcher", body, mode="auto", extra_kernels=()) is None
    with pytest.raises(ValueError, match=r"triton='force', but no Triton kernel was found.*self\.kernel\[\.\.\.\] "
                                         r"at tt_plain_launcher\.py.*extra_triton_kernels="):
        opforge.op(fresh("force_none"), triton="force")(body)


def test_force_is_met_by_a_launch_the_run_time_resolves():
    op = opforge.op(fresh("force_runtime"), triton="force")(forms.add_kernel_on_self)
    assert graph_kernels(forward_graph(op, *xy())) == [K.add_kernel]


def test_extra_triton_kernels_must_be_kernels():
    with pytest.raises(TypeError, match=r"extra_triton_kernels\[0\] is a function, not a Triton kernel"):
        opforge.op(fresh("extra_bad"), extra_triton_kernels=(forms.grid,))(forms.add_module_global)


def test_force_needs_a_python_function():
    partial = functools.partial(forms.add_module_global)
    with pytest.raises(TypeError, match="not a Python function"):
        ot.plan("tt_plan::partial", partial, mode="force", extra_kernels=())
    assert ot.plan("tt_plan::partial", partial, mode="auto", extra_kernels=()) is None


# --- caching -------------------------------------------------------------------------------


def test_ops_from_one_module_parse_it_once(tmp_path):
    module = new_module(tmp_path, "tt_cache_one_file", """
        import torch
        from triton_helpers.kernels import add_kernel, sub_kernel

        def first(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = torch.empty_like(x)
            add_kernel[(4,)](x, y, out, x.numel(), BLOCK=32)
            return out

        def second(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = torch.empty_like(x)
            sub_kernel[(4,)](x, y, out, x.numel(), BLOCK=32)
            return out
    """)
    before = ot.cache_info()
    opforge.op(fresh("one_file_a"))(module.first)
    opforge.op(fresh("one_file_b"))(module.second)
    assert ot.cache_info().files_parsed - before.files_parsed == 1


def test_same_code_object_is_analysed_and_compiled_once():
    first = forms.make_closure_body(K.add_kernel)
    second = forms.make_closure_body(K.sub_kernel)
    opforge.op(fresh("same_code_a"))(first)
    before = ot.cache_info()
    op = opforge.op(fresh("same_code_b"))(second)
    after = ot.cache_info()
    assert after.code_hits > before.code_hits and after.code_misses == before.code_misses
    assert after.compile_hits > before.compile_hits and after.compile_misses == before.compile_misses
    assert graph_kernels(forward_graph(op, *xy())) == [K.sub_kernel]


# --- device mistakes ---------------------------------------------------------


def test_a_triton_op_given_cpu_tensors_names_the_op_the_parameter_and_the_device(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    @opforge.op("triton_test::device_named", backward=lambda ctx, g: (g, g))
    def device_named(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        K.add_kernel[(1,)](x, y, out, x.numel(), BLOCK=128)
        return out

    x = torch.ones(4)
    launch_error = None
    try:
        K.add_kernel[(1,)](x, x, torch.empty_like(x), 4, BLOCK=128)
    except (RuntimeError, ValueError) as e:
        launch_error = e
    if launch_error is None:
        pytest.skip("Triton launches on CPU tensors here (an interpreter or a CPU backend)")
    grad = torch.ones(4, requires_grad=True)
    # The body directly, through the dispatcher, and recording the op's graph node.
    for call in (lambda: device_named(x, x), lambda: torch.ops.triton_test.device_named(x, x),
                 lambda: device_named(grad, x)):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert message.startswith("triton_test::device_named: parameter 'x' is a tensor on cpu")
        assert "add_kernel" in message and "register_kernel('cpu')" in message
        assert str(launch_error) in str(info.value.__cause__)


def test_an_error_of_a_triton_ops_body_that_is_not_about_devices_is_unchanged():
    @opforge.op("triton_test::refuses")
    def refuses(x: torch.Tensor) -> torch.Tensor:
        if x.numel() > 2:
            raise ValueError("x is too long for this kernel")
        out = torch.empty_like(x)
        K.add_kernel[(1,)](x, x, out, x.numel(), BLOCK=128)
        return out

    with pytest.raises(ValueError, match="^x is too long for this kernel$"):
        refuses(torch.ones(4))
