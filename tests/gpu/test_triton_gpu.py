"""Triton ops on a CUDA GPU (docs/triton.md): eager results, and the graph that
reaches Inductor under torch.compile(fullgraph=True).

    python -m pytest tests/gpu/test_triton_gpu.py -v

Each op body comes from tests/python/triton_helpers/ops.py, one per way of
reaching a kernel. The Inductor backend used here is Inductor itself
(`compile_fx`) with its inner compiler wrapped, so the test sees the
AOTAutograd graph Inductor is handed before it compiles it.
"""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
triton = pytest.importorskip("triton")


import opforge  # noqa: E402
from triton_helpers import kernels as K  # noqa: E402
from triton_helpers import launchers, rebind  # noqa: E402
from triton_helpers import ops as forms  # noqa: E402
from triton_testing import RecordingInductor, jit_function  # noqa: E402

ADD_FORMS = list(forms.FORMS)
EXPECTED_KERNEL = {
    "add_autotuned": K.add_kernel_autotuned,
    "add_heuristics_inside": K.add_kernel_heuristics_inside,
}
_counter = iter(range(10**6))


@pytest.fixture(scope="module")
def ops():
    return forms.define("tt_gpu")


@pytest.fixture(autouse=True)
def _fresh(fresh_compile):
    """Every test here inspects the graphs of a compile of its own."""


def xy(n=1000):
    torch.manual_seed(0)
    return torch.randn(n, device="cuda"), torch.randn(n, device="cuda")


def compiled(fn, backend, **options):
    return torch.compile(fn, backend=backend, fullgraph=True, **options)


def fresh(name):
    return f"tt_gpu_misc::{name}_{next(_counter)}"


@pytest.mark.parametrize("form", ADD_FORMS)
def test_eager_result(ops, form):
    op, reference = ops[form]
    x, y = xy()
    torch.testing.assert_close(op(x, y), reference(x, y))


@pytest.mark.parametrize("form", ADD_FORMS)
def test_inductor_sees_the_kernel_and_computes_the_result(ops, form):
    op, reference = ops[form]
    x, y = xy()
    backend = RecordingInductor()
    f = compiled(lambda x, y: op(x, y) * 2 + 1, backend)
    torch.testing.assert_close(f(x, y), reference(x, y) * 2 + 1)
    assert backend.kernels() == [jit_function(EXPECTED_KERNEL.get(form, K.add_kernel))]
    assert not backend.calls(op)
    assert not torch._dynamo.utils.counters["graph_break"]


def test_the_stock_inductor_backend_gets_the_kernel_in_its_post_grad_graph(ops):
    from torch._inductor import config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    seen = []

    class Record(CustomGraphPass):
        def __call__(self, graph):
            seen.extend(str(n.target) for n in graph.nodes)

        def uuid(self):
            return f"opforge-record-{id(self)}"

    op, _ = ops["add_module_global"]
    x, y = xy()
    with inductor_config.patch(post_grad_custom_post_pass=Record()):
        f = torch.compile(lambda x, y: op(x, y) + 1, backend="inductor", fullgraph=True)
        torch.testing.assert_close(f(x, y), x + y + 1)
    assert any("triton_kernel_wrapper" in t for t in seen), seen


def test_dataclass_parameter_eager_and_compiled(ops):
    op, reference = ops["scale"]
    x, _ = xy()
    cfg = forms.ScaleCfg(factor=3.0, bias=0.5)
    torch.testing.assert_close(op(x, cfg), reference(x, cfg))
    backend = RecordingInductor()
    f = compiled(lambda x: op(x, forms.ScaleCfg(factor=3.0, bias=0.5)), backend)
    torch.testing.assert_close(f(x), reference(x, cfg))
    assert backend.kernels() == [K.scale_kernel]


def test_backward_eager_and_compiled(ops):
    op, _ = ops["scale_with_backward"]
    cfg = forms.ScaleCfg(factor=2.5)
    x = torch.randn(1000, device="cuda", requires_grad=True)
    op(x, cfg).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.5))

    x.grad = None
    backend = RecordingInductor()
    f = compiled(lambda x: op(x, forms.ScaleCfg(factor=2.5)).sum(), backend)
    f(x).backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.5))
    assert backend.kernels(0) == [K.scale_kernel]


def test_mutating_op_eager_and_compiled(ops):
    op, _ = ops["add_into"]
    x, y = xy()
    out = torch.zeros_like(x)
    op(x, y, out)
    torch.testing.assert_close(out, x + y)

    backend = RecordingInductor()

    def f(x, y):
        out = torch.empty_like(x)
        op(x, y, out)
        return out * 2

    torch.testing.assert_close(compiled(f, backend)(x, y), (x + y) * 2)
    assert backend.kernels() == [K.add_kernel]


def test_dynamic_shapes(ops):
    op, _ = ops["add_module_global"]
    backend = RecordingInductor()
    f = compiled(lambda x, y: op(x, y), backend, dynamic=True)
    for n in (1000, 3000):
        x, y = xy(n)
        torch.testing.assert_close(f(x, y), x + y)
    assert backend.kernels() == [K.add_kernel]


def test_triton_op_calling_another_triton_op(ops):
    inner, _ = ops["add_module_global"]

    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        K.sub_kernel[(triton.cdiv(n, 32),)](x, y, out, n, BLOCK=32)
        return inner(out, y)

    op = opforge.op(fresh("nested"))(body)
    x, y = xy()
    torch.testing.assert_close(op(x, y), x)
    backend = RecordingInductor()
    torch.testing.assert_close(compiled(op, backend)(x, y), x)
    assert backend.kernels() == [K.sub_kernel, K.add_kernel]


def test_rebound_module_global_is_used_eagerly_and_compiled():
    saved = rebind.current_kernel
    try:
        op = opforge.op(fresh("rebind"))(rebind.apply_current_kernel)
        x, y = xy()
        torch.testing.assert_close(op(x, y), x + y)
        rebind.current_kernel = K.sub_kernel
        torch.testing.assert_close(op(x, y), x - y)
        backend = RecordingInductor()
        torch.testing.assert_close(compiled(op, backend)(x, y), x - y)
        assert backend.kernels() == [K.sub_kernel]
    finally:
        rebind.current_kernel = saved


def test_kernel_on_self_with_extra_kernels():
    launcher = launchers.Launcher(K.sub_kernel)

    def body(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return launcher.launch(x, y)

    op = opforge.op(fresh("on_self"), extra_triton_kernels=(K.sub_kernel,))(body)
    x, y = xy()
    backend = RecordingInductor()
    torch.testing.assert_close(compiled(op, backend)(x, y), x - y)
    assert backend.kernels() == [K.sub_kernel]


def test_opcheck_passes(ops):
    op, _ = ops["add_module_global"]
    opforge.opcheck(op, xy(64))
