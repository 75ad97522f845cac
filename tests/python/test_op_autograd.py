"""The autograd bridge (docs/python_ops.md): setup_context sees the original inputs,
backward returns one gradient per original parameter, struct slots take None,
an instance or a dict, and ops without backward fail clearly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from op_testing import fast_path, ns, path  # noqa: F401

import opforge

Tensor = torch.Tensor


@dataclass(frozen=True)
class Weights:
    w: Tensor
    b: Optional[Tensor] = None
    scale: float = 1.0


@dataclass(frozen=True)
class Wrapped:
    inner: Weights
    gain: float = 1.0


def affine_op(name: str, grad_style: str = "dict"):
    """y = (x * w + b) * scale, with a backward that returns the struct
    gradient as `grad_style` (dict, instance or none)."""
    calls = {"setup": [], "backward": []}

    def setup_context(ctx, inputs, output):
        x, p = inputs
        calls["setup"].append((type(p), type(output)))
        ctx.save_for_backward(x, p.w)
        ctx.scale = p.scale
        ctx.has_b = p.b is not None

    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        calls["backward"].append(ctx.needs_input_grad)
        g = grad * ctx.scale
        gx = g * w if ctx.needs_input_grad[0] else None
        gb = g if ctx.has_b else None
        if grad_style == "dict":
            return gx, {"w": g * x, "b": gb}
        if grad_style == "instance":
            return gx, Weights(w=g * x, b=gb, scale=None)
        return gx, None

    @opforge.op(name, setup_context=setup_context, backward=backward)
    def affine(x: Tensor, p: Weights) -> Tensor:
        out = x * p.w
        if p.b is not None:
            out = out + p.b
        return out * p.scale

    @affine.register_fake
    def _(x, p):
        return torch.empty_like(x)

    return affine, calls


def inputs():
    torch.manual_seed(0)
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    return x, w, b


def test_tensor_fields_of_a_struct_receive_their_gradients(ns, path):
    affine, _ = affine_op(f"{ns}::affine")
    x, w, b = inputs()
    affine(x, Weights(w, b, scale=2.0)).sum().backward()
    assert torch.allclose(x.grad, 2 * w.detach())
    assert torch.allclose(w.grad, 2 * x.detach())
    assert torch.allclose(b.grad, torch.full((3,), 2.0))


def test_gradients_match_the_same_computation_in_plain_torch(ns, path):
    affine, _ = affine_op(f"{ns}::affine")
    x, w, b = inputs()
    gy = torch.randn(3)
    affine(x, Weights(w, b, scale=0.5)).backward(gy)
    ours = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    ((x * w + b) * 0.5).backward(gy)
    assert all(torch.allclose(a, t.grad) for a, t in zip(ours, (x, w, b)))


def test_setup_context_sees_the_original_inputs_and_output(ns, path):
    affine, calls = affine_op(f"{ns}::affine")
    x, w, _ = inputs()
    affine(x, Weights(w)).sum().backward()
    assert calls["setup"] == [(Weights, Tensor)]


def test_needs_input_grad_is_given_per_original_parameter(ns, path):
    affine, calls = affine_op(f"{ns}::affine")
    x, w, b = inputs()
    affine(x.detach(), Weights(w, b)).sum().backward()
    assert calls["backward"] == [(False, True)]
    affine(x, Weights(w.detach())).sum().backward()
    assert calls["backward"][-1] == (True, False)


@pytest.mark.parametrize("style", ["dict", "instance"])
def test_a_struct_gradient_may_be_a_dict_or_an_instance(ns, path, style):
    affine, _ = affine_op(f"{ns}::affine", grad_style=style)
    x, w, b = inputs()
    affine(x, Weights(w, b)).sum().backward()
    assert torch.allclose(w.grad, x.detach())
    assert torch.allclose(b.grad, torch.ones(3))


def test_a_none_struct_gradient_means_no_gradient_for_its_fields(ns, path):
    affine, _ = affine_op(f"{ns}::affine", grad_style="none")
    x, w, _ = inputs()
    affine(x, Weights(w)).sum().backward()
    assert torch.allclose(x.grad, w.detach())
    assert w.grad is None


def test_nested_struct_gradients_are_nested_dicts_and_missing_fields_mean_none(ns, path):
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad * w, {"inner": {"w": grad * x}}

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1].inner.w)

    @opforge.op(f"{ns}::nested", setup_context=setup_context, backward=backward)
    def nested(x: Tensor, p: Wrapped) -> Tensor:
        out = x * p.inner.w
        return out + p.inner.b if p.inner.b is not None else out

    x, w, b = inputs()
    nested(x, Wrapped(Weights(w, b))).sum().backward()
    assert torch.allclose(w.grad, x.detach())
    assert b.grad is None  # the dict has no "b": no gradient


def test_optional_struct_slot_accepts_none_input_and_none_gradient(ns, path):
    def backward(ctx, grad):
        return grad * 2, None

    @opforge.op(f"{ns}::maybe", backward=backward)
    def maybe(x: Tensor, p: Optional[Weights] = None) -> Tensor:
        return x * 2 if p is None else x * p.w

    x, _, _ = inputs()
    maybe(x).sum().backward()
    assert torch.allclose(x.grad, torch.full((3,), 2.0))


def test_multiple_outputs_give_one_gradient_each(ns, path):
    def backward(ctx, ga, gb):
        return ga + 2 * gb

    @opforge.op(f"{ns}::two", backward=backward)
    def two(x: Tensor) -> tuple[Tensor, Tensor]:
        return x.clone(), 2 * x

    x, _, _ = inputs()
    a, b = two(x)
    (a.sum() + b.sum()).backward()
    assert torch.allclose(x.grad, torch.full((3,), 3.0))


def test_a_wrong_gradient_count_is_an_error_naming_the_op(ns, path):
    @opforge.op(f"{ns}::bad", backward=lambda ctx, g: (g, g, g))
    def bad(x: Tensor, p: Weights) -> Tensor:
        return x * 2

    x, w, _ = inputs()
    with pytest.raises(RuntimeError, match=rf"^{ns}::bad: backward returned 3 gradient\(s\) but the op has 2 "
                                           r"parameter\(s\) \(x, p\); return one per parameter, None where there is none."):
        bad(x, Weights(w)).sum().backward()


def test_a_gradient_for_a_scalar_field_is_an_error_naming_the_field(ns, path):
    @opforge.op(f"{ns}::bad", backward=lambda ctx, g: (g, {"scale": g.sum()}))
    def bad(x: Tensor, p: Weights) -> Tensor:
        return x * 2

    x, w, _ = inputs()
    with pytest.raises(TypeError, match=rf"^{ns}::bad: backward returned a Tensor for parameter 'p', field "
                                        r"Weights.scale, which is not a Tensor argument; return None there."):
        bad(x, Weights(w)).sum().backward()


def test_a_struct_gradient_of_the_wrong_kind_is_an_error(ns, path):
    @opforge.op(f"{ns}::bad", backward=lambda ctx, g: (g, [g]))
    def bad(x: Tensor, p: Weights) -> Tensor:
        return x * 2

    x, w, _ = inputs()
    with pytest.raises(TypeError, match=rf"^{ns}::bad: backward returned a list for parameter 'p', which has no "
                                        r"field 'w'; return None, a Weights, an object with its fields or a dict "
                                        r"keyed by field name."):
        bad(x, Weights(w)).sum().backward()


def test_a_dict_gradient_with_unknown_fields_is_an_error(ns, path):
    @opforge.op(f"{ns}::bad", backward=lambda ctx, g: (g, {"weight": g}))
    def bad(x: Tensor, p: Weights) -> Tensor:
        return x * 2

    x, w, _ = inputs()
    with pytest.raises(TypeError, match=r"keys \['weight'\] that are not fields of Weights"):
        bad(x, Weights(w)).sum().backward()


def test_an_op_without_backward_raises_a_clear_error_when_differentiated(ns, path):
    @opforge.op(f"{ns}::nob")
    def nob(x: Tensor, p: Weights) -> Tensor:
        return x * p.w

    x, w, _ = inputs()
    y = nob(x, Weights(w))
    assert y.requires_grad
    with pytest.raises(RuntimeError, match=rf"{ns}::nob: a gradient was requested through this op, but it has no "
                                           r"backward. Pass backward= to @opforge.op or call nob.register_autograd"):
        y.sum().backward()


def test_an_op_without_backward_is_fine_when_no_gradient_is_requested(ns, path):
    @opforge.op(f"{ns}::nob")
    def nob(x: Tensor) -> Tensor:
        return x * 2

    x, _, _ = inputs()
    with torch.no_grad():
        y = nob(x)
    assert not y.requires_grad
    z = nob(x.detach())
    assert z.grad_fn is None


def test_register_autograd_after_definition_installs_the_bridge(ns, path):
    @opforge.op(f"{ns}::late")
    def late(x: Tensor, p: Weights) -> Tensor:
        return x * p.w

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[1].w)

    late.register_autograd(lambda ctx, g: (g * ctx.saved_tensors[0], None), setup_context=setup_context)
    x, w, _ = inputs()
    late(x, Weights(w)).sum().backward()
    assert torch.allclose(x.grad, w.detach())
    assert w.grad is None


def test_register_autograd_again_replaces_the_backward(ns, path):
    @opforge.op(f"{ns}::twice", backward=lambda ctx, g: g)
    def twice(x: Tensor) -> Tensor:
        return x.clone()

    twice.register_autograd(lambda ctx, g: 3 * g)
    x, _, _ = inputs()
    twice(x).sum().backward()
    assert torch.allclose(x.grad, torch.full((3,), 3.0))


def test_the_fast_path_and_the_dispatcher_give_the_same_gradients(ns):
    affine, _ = affine_op(f"{ns}::affine")
    grads = []
    for enabled in (True, False):
        with fast_path(enabled):
            x, w, b = inputs()
            affine(x, Weights(w, b, 3.0)).pow(2).sum().backward()
            grads.append([t.grad for t in (x, w, b)])
    assert all(torch.allclose(a, b) for a, b in zip(*grads))


def test_gradients_flow_through_a_compiled_call(ns):
    affine, _ = affine_op(f"{ns}::affine")
    x, w, b = inputs()

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(x, w, b):
        return affine(x, Weights(w, b, 2.0)).sum()

    f(x, w, b).backward()
    assert torch.allclose(x.grad, 2 * w.detach())
    assert torch.allclose(w.grad, 2 * x.detach())
    assert torch.allclose(b.grad, torch.full((3,), 2.0))
    torch._dynamo.reset()


def test_a_tensor_list_parameter_receives_a_list_of_gradients(ns, path):
    @opforge.op(f"{ns}::weighted_sum", backward=lambda ctx, g: ([g, 2 * g], None))
    def weighted_sum(xs: list[Tensor], k: float) -> Tensor:
        return xs[0] + 2 * xs[1]

    a, b = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    weighted_sum([a, b], 1.0).sum().backward()
    assert torch.equal(a.grad, torch.ones(2)) and torch.equal(b.grad, torch.full((2,), 2.0))


def test_gradient_errors_name_the_parameter_of_a_flat_op(ns, path):
    @opforge.op(f"{ns}::count", backward=lambda ctx, g: g)
    def count(x: Tensor, k: float) -> Tensor:
        return x * k

    @opforge.op(f"{ns}::scalar", backward=lambda ctx, g: (g, g.sum()))
    def scalar(x: Tensor, k: float) -> Tensor:
        return x * k

    x = torch.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=rf"^{ns}::count: backward returned 1 gradient\(s\) but the op has 2"):
        count(x, 2.0).sum().backward()
    with pytest.raises(TypeError, match=rf"^{ns}::scalar: backward returned a Tensor for parameter 'k', which is "
                                        r"not a Tensor argument; return None there."):
        scalar(x, 2.0).sum().backward()
