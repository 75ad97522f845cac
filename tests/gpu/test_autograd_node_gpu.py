"""The autograd node of ops with a Python backward on CUDA tensors
(docs/python_ops.md#autograd), against a torch.autograd.Function with the
same code. Its cost next to the Function's is a row of
`python benchmarks/bench_python_ops.py --device cuda` (`opforge bench`).

    python -m pytest tests/gpu/test_autograd_node_gpu.py -v
"""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

import opforge  # noqa: E402
from op_testing import fast_path, ns  # noqa: E402,F401

Tensor = torch.Tensor


def twins(ns, name):
    """(opforge op, Function.apply): (x * w, x + w), x and w saved."""

    def body(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        return x * w, x + w

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, g_mul, g_add):
        x, w = ctx.saved_tensors
        g_add = torch.zeros_like(g_mul) if g_add is None else g_add
        return g_mul * w + g_add, g_mul * x + g_add

    op = opforge.op(f"{ns}::{name}", setup_context=setup, backward=backward)(body)

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            out = body(x, w)
            setup(ctx, (x, w), out)
            return out

        @staticmethod
        def backward(ctx, g_mul, g_add):
            return backward(ctx, g_mul, g_add)

    return op, Function.apply


def inputs(dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(64, 128, device="cuda", dtype=dtype, generator=g).requires_grad_() for _ in range(2)]


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_on_cuda_equal_a_functions(ns, fast, dtype):
    op, function = twins(ns, "mul_add")
    grads = []
    with fast_path(fast):
        for f in (op, function):
            x, w = inputs(dtype)
            a, b = f(x, w)
            assert a.device.type == "cuda" and a.grad_fn is not None
            (a.sum() + 2 * b.sum()).backward()
            grads.append((x.grad, w.grad))
    assert all(torch.equal(p, q) for p, q in zip(*grads))


def test_materialized_gradients_are_zeros_on_the_outputs_device(ns):
    op, _ = twins(ns, "mul_add_unused")
    x, w = inputs()
    op(x, w)[0].sum().backward()  # the second output gets no gradient: zeros on its device
    assert torch.equal(x.grad, w.detach()) and torch.equal(w.grad, x.detach())


def test_a_compiled_call_on_cuda_gives_the_eager_gradients(ns):
    op, function = twins(ns, "mul_add_c")
    op.register_fake(lambda x, w: (torch.empty_like(x), torch.empty_like(x)))
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: sum(t.sum() for t in op(x, w)), fullgraph=True)
    grads = []
    for f in (compiled, lambda x, w: sum(t.sum() for t in function(x, w))):
        x, w = inputs()
        f(x, w).backward()
        grads.append((x.grad, w.grad))
    assert all(torch.allclose(p, q) for p, q in zip(*grads))
