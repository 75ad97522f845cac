"""register_fake / register_autograd / register_kernel on ops defined in C++,
written in Python against the original signature with structs rebuilt
(tests/cpp_ext/ext.cc: mix, halves, py_kernel)."""

import pytest
import torch

import opforge

from cpp_ext import load


@pytest.fixture(scope="module")
def ext():
    return load()


@pytest.fixture(scope="module")
def structs(ext):
    return opforge.structs.opforge_ext


@pytest.fixture(scope="module")
def mix(ext, structs):
    """ext.mix with a fake and a backward from Python; what they saw is recorded."""
    seen = {}

    @ext.mix.register_fake
    def _(x, lin):
        seen["fake"] = type(lin)
        return x.new_empty(x.shape[0], lin.w.shape[1])

    def setup_context(ctx, inputs, output):
        x, lin = inputs
        seen["setup"] = (type(lin), lin.scale, output.shape)
        ctx.save_for_backward(x, lin.w)
        ctx.scale = lin.scale

    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        seen["needs"] = ctx.needs_input_grad
        gx = grad @ w.t() * ctx.scale if ctx.needs_input_grad[0] else None
        glin = structs.Lin(w=x.t() @ grad * ctx.scale, b=grad.sum(0), scale=None) if ctx.needs_input_grad[1] else None
        return gx, glin

    ext.mix.register_autograd(backward, setup_context=setup_context)
    return ext.mix, seen


def _inputs():
    torch.manual_seed(0)
    return (torch.randn(3, 4, dtype=torch.double, requires_grad=True),
            torch.randn(4, 2, dtype=torch.double, requires_grad=True),
            torch.randn(2, dtype=torch.double, requires_grad=True))


def test_the_python_backward_gets_struct_inputs_and_gives_struct_field_gradients(mix, structs):
    op, seen = mix
    x, w, b = _inputs()
    y = op(x, structs.Lin(w=w, b=b, scale=0.5))
    assert y.grad_fn.name() == "opforge_ext::mixBackward"  # the same autograd node as a Python op's
    g = torch.randn_like(y)
    y.backward(g)
    assert seen["setup"] == (structs.Lin, 0.5, (3, 2))
    assert seen["needs"] == (True, True)
    torch.testing.assert_close(x.grad, g @ w.detach().t() * 0.5)
    torch.testing.assert_close(w.grad, x.detach().t() @ g * 0.5)
    torch.testing.assert_close(b.grad, g.sum(0))


def test_gradcheck_passes_through_the_python_backward_of_a_cpp_op(mix, structs):
    op, seen = mix
    x, w, b = _inputs()
    assert torch.autograd.gradcheck(lambda x, w, b: op(x, structs.Lin(w=w, b=b, scale=1.5)), (x, w, b))
    x.requires_grad_(False)
    op(x, structs.Lin(w=w, b=b)).sum().backward()
    assert seen["needs"] == (False, True)


def test_the_python_fake_gets_the_struct_rebuilt(mix, structs):
    op, seen = mix
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        y = torch.ops.opforge_ext.mix(torch.empty(5, 4), torch.empty(4, 7), None, 1.0)
    assert seen["fake"] is structs.Lin
    assert y.shape == (5, 7)


def test_opcheck_passes_with_the_python_fake_and_backward(mix, structs):
    op, _ = mix
    x, w, b = _inputs()
    flat_args, flat_kwargs = op.flatten(x, structs.Lin(w=w, b=b, scale=0.25))
    torch.library.opcheck(op.overload, flat_args, flat_kwargs)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_op_compiles_with_fullgraph_forward_and_backward(mix, structs, backend):
    op, _ = mix
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()

    def f(x, w, b):
        return op(x, structs.Lin(w=w, b=b, scale=0.5)).relu().sum()

    x, w, b = _inputs()
    loss = torch.compile(f, fullgraph=True, backend=backend)(x, w, b)
    loss.backward()
    got = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    expected = f(x, w, b)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for g, t in zip(got, (x, w, b)):
        torch.testing.assert_close(g, t.grad)
    assert not torch._dynamo.utils.counters["graph_break"]


def test_a_struct_return_reaches_the_python_backward_as_a_struct(ext, structs):
    seen = {}

    @ext.halves.register_fake
    def _(x, k):
        n = x.shape[0] // 2
        return structs.Halves(lo=x.new_empty(n), hi=x.new_empty(x.shape[0] - n))

    def backward(ctx, grads):
        seen["grads"] = type(grads)
        return torch.cat([grads.lo * ctx.k, grads.hi * 2 * ctx.k]), None

    def setup_context(ctx, inputs, output):
        seen["output"] = type(output)
        ctx.k = inputs[1]

    ext.halves.register_autograd(backward, setup_context=setup_context)
    x = torch.arange(4.0, dtype=torch.double, requires_grad=True)
    halves = ext.halves(x, 3.0)
    (halves.lo.sum() + 10 * halves.hi.sum()).backward()
    assert seen == {"grads": structs.Halves, "output": structs.Halves}
    torch.testing.assert_close(x.grad, torch.tensor([3.0, 3.0, 60.0, 60.0], dtype=torch.double))


def test_a_python_kernel_runs_a_cpp_schema_with_its_defaults_filled_in(ext, structs):
    seen = []

    @ext.py_kernel.register_kernel("cpu")
    def _(x, cfg):
        seen.append(cfg)
        return x * cfg.scale + cfg.window

    x = torch.ones(2)
    torch.testing.assert_close(ext.py_kernel(x, structs.AttnCfg(2.0)), torch.full((2,), 1.0))
    assert seen[-1] == structs.AttnCfg(2.0)
    torch.testing.assert_close(torch.ops.opforge_ext.py_kernel(x, 3.0, cfg__window=4), torch.full((2,), 7.0))
    assert seen[-1].window == 4 and seen[-1].tag == "attn"

    # Registering again replaces the kernel, as for Python ops.
    ext.py_kernel.register_kernel("cpu", lambda x, cfg: x - cfg.scale)
    torch.testing.assert_close(ext.py_kernel(x, structs.AttnCfg(2.0)), torch.full((2,), -1.0))


def test_what_cpp_registered_is_not_overridden_from_python(ext):
    with pytest.raises(RuntimeError, match=r"opforge_ext::linear: register_autograd: the op already has a "
                                           r"backward from C\+\+"):
        ext.linear.register_autograd(lambda ctx, g: (g, None))
    with pytest.raises(RuntimeError, match=r"opforge_ext::mix: register_kernel: the op already has a CPU kernel "
                                           r"from C\+\+"):
        ext.mix.register_kernel("cpu", lambda x, lin: x)
    with pytest.raises(RuntimeError, match=r"opforge_ext::mix_with_fake: register_fake: the op already has a "
                                           r"fake \(Meta\) kernel from C\+\+ \(m.fake\(...\)\)"):
        ext.mix_with_fake.register_fake(lambda x, lin: x)
    with pytest.raises(RuntimeError, match=r"opforge_ext::scale: register_fake: the op already has a "
                                           r"fake \(Meta\) kernel from C\+\+"):
        ext.scale.register_fake(lambda x, cfg: x)
    with pytest.raises(RuntimeError, match=r"opforge_ext::composite: register_fake cannot take effect: the op's "
                                           r"C\+\+ kernel is a CompositeImplicitAutograd kernel"):
        ext.composite.register_fake(lambda x, lin: x)
    with pytest.raises(ValueError, match=r"opforge_ext::mix: device_types: 'gpu' is not a device type"):
        ext.mix.register_kernel("gpu", lambda x, lin: x)


def test_a_failed_registration_leaves_nothing_behind(ext):
    before = torch._C._dispatch_dump("opforge_ext::scale")
    with pytest.raises(RuntimeError):
        ext.scale.register_fake(lambda x, cfg: x)
    assert torch._C._dispatch_dump("opforge_ext::scale") == before
