"""C++ ops (tests/cpp_ext) on CUDA tensors: the C++ backward, struct
defaults, and kernels / backwards registered from Python on a C++ schema.

    python -m pytest tests/gpu/test_cpp_ops_gpu.py -v

The extension is CPU-only C++; its ops reach CUDA through the ATen calls in
their bodies (m.def(schema, &fn) kernels) or through Python kernels.
"""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

import opforge  # noqa: E402
from cpp_ext import load  # noqa: E402


@pytest.fixture(scope="module")
def ext():
    return load()


@pytest.fixture(scope="module")
def structs(ext):
    return opforge.structs.opforge_ext


def _inputs(device):
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g, dtype=torch.double) for s in ((3, 4), (4, 2), (2,)))
    return [t.to(device).requires_grad_() for t in (x, w, b)]


def test_the_cpp_backward_gives_the_same_gradients_on_cuda_as_on_cpu(ext, structs):
    grads = {}
    for device in ("cpu", "cuda"):
        x, w, b = _inputs(device)
        y = ext.linear(x, structs.Lin(w=w, b=b, scale=0.5))
        assert y.device.type == device
        y.square().sum().backward()
        grads[device] = [t.grad.cpu() for t in (x, w, b)]
    for c, g in zip(grads["cpu"], grads["cuda"]):
        torch.testing.assert_close(c, g)
    x, w, b = _inputs("cuda")
    assert torch.autograd.gradcheck(lambda x, w, b: ext.linear(x, structs.Lin(w=w, b=b, scale=1.5)), (x, w, b))


def test_the_cpp_backward_compiles_with_inductor_on_cuda(ext, structs):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()

    def f(x, w, b):
        return ext.linear(x, structs.Lin(w=w, b=b, scale=0.5)).relu().sum()

    x, w, b = _inputs("cuda")
    loss = torch.compile(f, fullgraph=True, backend="inductor")(x, w, b)
    loss.backward()
    got = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    f(x, w, b).backward()
    for g, t in zip(got, (x, w, b)):
        torch.testing.assert_close(g, t.grad)
    assert not torch._dynamo.utils.counters["graph_break"]


def test_struct_defaults_apply_to_cuda_calls(ext, structs):
    x = torch.arange(3.0, device="cuda")
    # ext::Attn with AttnCfg(scale=2.0): causal 1, window -10, mode 100, tag 40000.
    torch.testing.assert_close(ext.attn(x, structs.AttnCfg(2.0)), x * 2 + 1 - 10 + 100 + 40000)
    torch.testing.assert_close(torch.ops.opforge_ext.attn(x, 2.0), x * 2 + 1 - 10 + 100 + 40000)


def test_a_python_cuda_kernel_and_backward_on_a_cpp_schema(ext, structs):
    """ext.mix has a C++ CPU kernel only: CUDA comes from Python."""

    @ext.mix.register_kernel("cuda")
    def _(x, lin):
        y = x @ lin.w * lin.scale
        return y if lin.b is None else y + lin.b

    @ext.mix.register_fake
    def _(x, lin):
        return x.new_empty(x.shape[0], lin.w.shape[1])

    def setup_context(ctx, inputs, output):
        x, lin = inputs
        ctx.save_for_backward(x, lin.w)
        ctx.scale = lin.scale

    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w.t() * ctx.scale, {"w": x.t() @ grad * ctx.scale, "b": grad.sum(0)}

    ext.mix.register_autograd(backward, setup_context=setup_context)
    x, w, b = _inputs("cuda")
    assert torch.autograd.gradcheck(lambda x, w, b: ext.mix(x, structs.Lin(w=w, b=b, scale=0.5)), (x, w, b))
