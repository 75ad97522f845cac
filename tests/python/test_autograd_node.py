"""The autograd node of ops with a Python backward (docs/python_ops.md#autograd),
compared with a torch.autograd.Function that runs the same body,
setup_context and backward: values, gradients and errors agree, on the eager
fast path and through the dispatcher."""

from __future__ import annotations

import gc
import re
import warnings
import weakref
from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from op_testing import fast_path, ns, path  # noqa: F401

import opforge

Tensor = torch.Tensor


def twins(ns: str, name: str, body, setup_context, backward, **options):
    """(opforge op, Function.apply) with the same body, setup_context and
    backward; the Function's forward is body then setup_context, as an
    opforge op's forward is."""
    op = opforge.op(f"{ns}::{name}", setup_context=setup_context, backward=backward, **options)(body)

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            out = body(*args)
            if setup_context is not None:
                setup_context(ctx, args, out)
            return out

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    return op, Function.apply


def both(op, function, make_inputs, run):
    """run(f, *inputs) for the op and the Function, each on fresh inputs:
    [(result, inputs), (result, inputs)]."""
    out = []
    for f in (op, function):
        inputs = make_inputs()
        out.append((run(f, *inputs), inputs))
    return out


def leaf(*shape, seed=0):
    torch.manual_seed(seed)
    return torch.randn(*shape, requires_grad=True)


def raised(fn) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def cube(ns, name="cube", **options):
    """y = x**3 with backward 3 x**2 g, x saved for backward."""

    def body(x: Tensor) -> Tensor:
        return x**3

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x**2 * g

    return twins(ns, name, body, setup_context, backward, **options)


# --- values, gradients, saved tensors ---------------------------------------------


def test_values_and_gradients_match_a_function(ns, path):
    op, function = cube(ns)
    (a, (xa,)), (b, (xb,)) = both(op, function, lambda: (leaf(4),), lambda f, x: f(x))
    a.sum().backward()
    b.sum().backward()
    assert torch.equal(a, b) and torch.equal(xa.grad, xb.grad)
    assert torch.allclose(xa.grad, 3 * xa.detach() ** 2)


def test_a_saved_input_modified_in_place_fails_the_version_check_as_for_a_function(ns, path):
    op, function = cube(ns)
    errors = []
    for f in (op, function):
        x = leaf(3) * 1
        y = f(x)
        x.add_(1)
        errors.append(raised(lambda: y.sum().backward()))
    assert [type(e) for e in errors] == [RuntimeError, RuntimeError]
    for e in errors:
        assert "modified by an inplace operation" in str(e) and "is at version 1; expected version 0" in str(e)


def test_a_saved_output_is_unpacked_with_its_history(ns, path):
    # d/dx exp(x) = exp(x): the backward reads the saved output.
    def body(x: Tensor) -> Tensor:
        return x.exp()

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        assert y.grad_fn is not None  # an output saved is given back with its history
        return g * y

    op, function = twins(ns, "exp", body, setup_context, backward)
    (a, (xa,)), (b, (xb,)) = both(op, function, lambda: (leaf(3),), lambda f, x: f(x))
    a.sum().backward()
    b.sum().backward()
    assert torch.allclose(xa.grad, xa.detach().exp()) and torch.equal(xa.grad, xb.grad)


def test_backward_twice_fails_without_retain_graph_as_for_a_function(ns, path):
    op, function = cube(ns)
    errors = []
    for f in (op, function):
        y = f(leaf(3))
        y.sum().backward()
        errors.append(raised(lambda: y.sum().backward()))
    assert [type(e) for e in errors] == [RuntimeError, RuntimeError]
    assert all("backward through the graph a second time" in str(e) for e in errors)


def test_backward_twice_with_retain_graph_accumulates_as_for_a_function(ns, path):
    op, function = cube(ns)
    grads = []
    for f in (op, function):
        x = leaf(3)
        y = f(x)
        y.sum().backward(retain_graph=True)
        y.sum().backward()
        grads.append(x.grad)
        assert torch.allclose(x.grad, 2 * 3 * x.detach() ** 2)
    assert torch.equal(grads[0], grads[1])


def test_saving_a_non_tensor_is_an_error_as_for_a_function(ns, path):
    def body(x: Tensor) -> Tensor:
        return x * 2

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], 3)

    op, function = twins(ns, "bad_save", body, setup_context, lambda ctx, g: g)
    errors = [raised(lambda f=f: f(leaf(2))) for f in (op, function)]
    assert [type(e) for e in errors] == [TypeError, TypeError]
    assert all("save_for_backward can only save" in str(e) and "argument 1" in str(e) for e in errors)


# --- needs_input_grad ----------------------------------------------------------------


@pytest.mark.parametrize("grads", [(True, False, True), (False, True, False), (True, True, True)])
def test_needs_input_grad_matches_a_function(ns, path, grads):
    seen = []

    def body(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
        return a * b * c

    def setup_context(ctx, inputs, output):
        seen.append(("setup", tuple(ctx.needs_input_grad)))
        ctx.save_for_backward(*inputs)

    def backward(ctx, g):
        seen.append(("backward", tuple(ctx.needs_input_grad)))
        a, b, c = ctx.saved_tensors
        needs = ctx.needs_input_grad
        return (g * b * c if needs[0] else None, g * a * c if needs[1] else None, g * a * b if needs[2] else None)

    op, function = twins(ns, "mul3", body, setup_context, backward)

    def make_inputs():
        return tuple(torch.randn(2, requires_grad=r) for r in grads)

    results = both(op, function, make_inputs, lambda f, *xs: f(*xs).sum().backward())
    assert seen[: len(seen) // 2] == seen[len(seen) // 2:] == [("setup", grads), ("backward", grads)]
    for (_, xs_a), (_, xs_b) in [results]:
        for xa, xb in zip(xs_a, xs_b):
            assert (xa.grad is None) == (xb.grad is None)


# --- mark_dirty, mark_non_differentiable, set_materialize_grads ----------------------


def test_mark_dirty_rebases_the_modified_input_as_for_a_function(ns):
    def body(x: Tensor) -> Tensor:
        return x.mul_(2)

    def setup_context(ctx, inputs, output):
        ctx.mark_dirty(inputs[0])

    def backward(ctx, g):
        return g * 2

    op, function = twins(ns, "double_", body, setup_context, backward, mutates_args=("x",))
    results = []
    for f in (op, function):
        a = leaf(3)
        x = a * 1
        y = f(x)
        version = x._version
        y.sum().backward()
        results.append((y.detach(), a.grad, version, y is x or y._base is x))
    (ya, ga, va, _), (yb, gb, vb, _) = results
    assert torch.equal(ya, yb) and torch.equal(ga, gb) and torch.equal(ga, torch.full((3,), 2.0))
    assert va >= 1 and vb >= 1


def test_marking_a_non_tensor_dirty_is_an_error_as_for_a_function(ns):
    def body(x: Tensor) -> Tensor:
        return x.mul_(2)

    def setup_context(ctx, inputs, output):
        ctx.mark_dirty(inputs[0], "x")

    op, function = twins(ns, "bad_dirty", body, setup_context, lambda ctx, g: g, mutates_args=("x",))
    errors = [raised(lambda f=f: f(leaf(2) * 1)) for f in (op, function)]
    assert [type(e) for e in errors] == [RuntimeError, RuntimeError]
    assert "mark_dirty only accepts tensors, but argument 1 is of type str" in str(errors[0])


def test_mark_non_differentiable_outputs_get_no_history_and_zero_gradients(ns, path):
    seen = []

    def body(x: Tensor) -> tuple[Tensor, Tensor]:
        values, order = x.sort()
        return values, order.to(x.dtype)

    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(output[1])

    def backward(ctx, g_values, g_order):
        seen.append(g_order.clone())
        (order,) = ctx.saved_tensors
        return torch.zeros_like(g_values).scatter(0, order.long(), g_values)

    op, function = twins(ns, "sort", body, setup_context, backward)
    results = both(op, function, lambda: (leaf(4),), lambda f, x: f(x))
    for (values, order), (x,) in results:
        assert values.requires_grad and not order.requires_grad
        (values * torch.arange(4.0)).sum().backward()
    (_, (xa,)), (_, (xb,)) = results
    assert torch.equal(xa.grad, xb.grad)
    assert all(torch.equal(g, torch.zeros(4)) for g in seen) and len(seen) == 2


@pytest.mark.parametrize("materialize", [True, False])
def test_set_materialize_grads_decides_between_zeros_and_none(ns, path, materialize):
    seen = []

    def body(x: Tensor) -> tuple[Tensor, Tensor]:
        return x * 2, x * 3

    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(materialize)

    def backward(ctx, g2, g3):
        seen.append(None if g3 is None else g3.clone())
        return g2 * 2 + (0 if g3 is None else g3 * 3)

    op, function = twins(ns, "two", body, setup_context, backward)
    results = both(op, function, lambda: (leaf(3),), lambda f, x: f(x)[0].sum().backward())
    (_, (xa,)), (_, (xb,)) = results
    assert torch.equal(xa.grad, xb.grad)
    expected = torch.zeros(3) if materialize else None
    for g in seen:
        assert (g is None) == (expected is None) and (g is None or torch.equal(g, expected))


# --- double backward, hooks ----------------------------------------------------------


def test_double_backward_through_the_backward_as_for_a_function(ns, path):
    op, function = cube(ns)
    seconds = []
    for f in (op, function):
        x = leaf(3)
        (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
        assert g.requires_grad
        (gg,) = torch.autograd.grad(g.sum(), x)
        assert torch.allclose(gg, 6 * x.detach())
        seconds.append(gg)
    assert torch.equal(seconds[0], seconds[1])


def test_tensor_and_node_hooks_run_as_for_a_function(ns, path):
    op, function = cube(ns)
    calls = []
    for tag, f in (("op", op), ("fn", function)):
        x = leaf(3)
        y = f(x)
        y.register_hook(lambda g, tag=tag: calls.append((tag, "tensor", g.clone())) or g * 2)
        y.grad_fn.register_prehook(lambda grads, tag=tag: calls.append((tag, "prehook", grads[0].clone())))
        y.grad_fn.register_hook(lambda gi, go, tag=tag: calls.append((tag, "hook", gi[0].clone(), go[0].clone())))
        y.sum().backward()
        calls.append((tag, "grad", x.grad.clone()))
    ours = [c[1:] for c in calls if c[0] == "op"]
    theirs = [c[1:] for c in calls if c[0] == "fn"]
    assert [c[0] for c in ours] == [c[0] for c in theirs] == ["tensor", "prehook", "hook", "grad"]
    for a, b in zip(ours, theirs):
        assert all(torch.equal(p, q) for p, q in zip(a[1:], b[1:]))


def test_saved_tensor_hooks_pack_and_unpack_as_for_a_function(ns, path):
    op, function = cube(ns)
    events = {"op": [], "fn": []}
    grads = []
    for tag, f in (("op", op), ("fn", function)):
        def pack(t, tag=tag):
            events[tag].append("pack")
            return ("packed", t.clone())

        def unpack(p, tag=tag):
            events[tag].append("unpack")
            return p[1]

        x = leaf(3)
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            y = f(x)
        y.sum().backward()
        grads.append(x.grad)
    assert events["op"] == events["fn"] == ["pack", "unpack"]
    assert torch.equal(grads[0], grads[1])


# --- anomaly mode, errors ------------------------------------------------------------


def test_anomaly_mode_reports_nan_from_backward_and_the_forward_traceback(ns, path):
    def body(x: Tensor) -> Tensor:
        return x * 2

    op, function = twins(ns, "nan", body, None, lambda ctx, g: g * float("nan"))
    errors, tracebacks = [], []
    for f in (op, function):
        with torch.autograd.detect_anomaly(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = f(leaf(2))
            errors.append(raised(lambda: y.sum().backward()))
        tracebacks.append("\n".join(str(w.message) for w in caught))
    assert [type(e) for e in errors] == [RuntimeError, RuntimeError]
    assert all(re.search(r"returned nan values in its 0th output", str(e)) for e in errors), errors
    # The stack of the forward call that made the node is shown.
    assert all("y = f(leaf(2))" in t for t in tracebacks), tracebacks


def test_an_error_raised_in_backward_reaches_the_caller_unchanged(ns, path):
    def backward(ctx, g):
        raise KeyError("from backward")

    def body(x: Tensor) -> Tensor:
        return x * 2

    op, function = twins(ns, "raises", body, None, backward)
    errors = [raised(lambda f=f: f(leaf(2)).sum().backward()) for f in (op, function)]
    assert [type(e) for e in errors] == [KeyError, KeyError]


@pytest.mark.parametrize("bad, words", [
    (lambda g: g[:1], "returned an invalid gradient at index 0"),
    (lambda g: "not a tensor", "str"),
    (lambda g: (g, g), "2 gradient"),
])
def test_a_bad_gradient_is_a_runtime_error_as_for_a_function(ns, path, bad, words):
    def body(x: Tensor) -> Tensor:
        return x * 2

    op, function = twins(ns, "bad", body, None, lambda ctx, g: bad(g))
    errors = [raised(lambda f=f: f(leaf(3)).sum().backward()) for f in (op, function)]
    assert all(isinstance(e, RuntimeError) for e in errors), errors
    # opforge's message names the op (and the parameter where there is one).
    assert f"{ns}::bad" in str(errors[0]) and words in str(errors[0])


# --- lifetime, grad mode -------------------------------------------------------------


def test_the_ctx_is_freed_with_the_output(ns, path):
    refs = []

    def body(x: Tensor) -> Tensor:
        return x * 2

    def setup_context(ctx, inputs, output):
        ctx.scale = 2.0
        refs.append(weakref.ref(ctx))

    op = opforge.op(f"{ns}::free", setup_context=setup_context, backward=lambda ctx, g: g * ctx.scale)(body)
    y = op(leaf(3))
    assert refs[0]() is not None
    del y
    gc.collect()
    assert refs[0]() is None


def test_no_node_is_recorded_without_grad_mode_or_inputs_that_require_grad(ns, path):
    op, _ = cube(ns)
    with torch.no_grad():
        assert op(leaf(2)).grad_fn is None
    assert op(torch.randn(2)).grad_fn is None
    assert op(leaf(2)).grad_fn.name() == f"{ns}::cubeBackward"


# --- the compiled path ---------------------------------------------------------------


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_compiled_call_traces_forward_and_backward_once(ns, backend):
    calls = []

    def body(x: Tensor) -> Tensor:
        return x**3

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def backward(ctx, g):
        calls.append("backward")
        (x,) = ctx.saved_tensors
        return 3 * x**2 * g

    op, function = twins(ns, "cube_c", body, setup_context, backward)
    op.register_fake(lambda x: torch.empty_like(x))
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: op(x).sin(), backend=backend, fullgraph=True)
    grads = []
    for f in (compiled, compiled, lambda x: function(x).sin()):
        x = leaf(4)
        f(x).sum().backward()
        grads.append(x.grad)
    # AOTAutograd traced the backward once; the second compiled call ran the
    # compiled backward, and the Function's eager call ran it once more.
    assert calls == ["backward", "backward"]
    assert torch.allclose(grads[0], grads[2]) and torch.allclose(grads[1], grads[2])


def test_compiled_autograd_is_a_clear_error_naming_the_op(ns):
    op, _ = cube(ns, "cube_ca")
    op.register_fake(lambda x: torch.empty_like(x))
    x = leaf(3)
    y = op(x * 2).sum()
    from torch._dynamo import compiled_autograd

    with compiled_autograd._enable(torch.compile(backend="eager")):
        error = raised(lambda: y.backward())
    assert isinstance(error, NotImplementedError)
    assert f"{ns}::cube_ca: compiled autograd does not run opforge's autograd node" in str(error)


# --- outputs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    double: Tensor
    triple: Tensor


def pair_op(name):
    def backward(ctx, g):
        return g.double * 2 + g.triple * 3

    @opforge.op(name, backward=backward)
    def pair(x: Tensor) -> Pair:
        return Pair(x * 2, x * 3)

    return pair


def test_a_dataclass_return_with_a_backward_stays_a_dataclass_when_grad_is_needed(ns, path):
    pair = pair_op(f"{ns}::pair")
    x = leaf(3)
    out = pair(x)
    assert type(out) is Pair and out.double.grad_fn is not None
    (out.double + out.triple).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 5.0))
    with torch.no_grad():
        assert type(pair(x)) is Pair


def test_a_dataclass_return_stays_a_dataclass_through_compat_magi(ns, path):
    from opforge.compat.magi import magi_register_custom_op

    def backward_fn(ctx, g):
        return g.double * 2 + g.triple * 3

    @magi_register_custom_op(name=f"{ns}::magi_pair", backward_fn=backward_fn)
    def magi_pair(x: torch.Tensor) -> Pair:
        return Pair(x * 2, x * 3)

    x = leaf(3)
    out = magi_pair(x)
    assert type(out) is Pair
    (out.double + out.triple).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 5.0))


def test_an_input_returned_as_is_is_refused_as_by_custom_op(ns, path):
    # An autograd.Function would hand back a view of x; an op's outputs are
    # new tensors, or eager and compiled disagree on what `a.add_(1)` changes.
    def body(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return x, y * 2

    op, _ = twins(ns, "passthrough", body, None, lambda ctx, gx, gy: (gx, gy * 2))
    x, y = leaf(2), leaf(2, seed=1)
    with pytest.raises(RuntimeError, match=rf"{ns}::passthrough: return value: a returned tensor is an input"):
        op(x, y)
    assert x.grad is None and x._version == 0


def test_a_tensor_list_return_gives_a_list_of_gradients(ns, path):
    seen = []

    def backward(ctx, grads):
        seen.append([g.clone() for g in grads])
        return grads[0] + grads[1] * 2

    @opforge.op(f"{ns}::split", backward=backward)
    def split(x: Tensor) -> list[Tensor]:
        return [x.clone(), x * 2]

    x = leaf(3)
    a, b = split(x)
    (a.sum() + 3 * b.sum()).backward()
    assert torch.equal(seen[0][0], torch.ones(3)) and torch.equal(seen[0][1], torch.full((3,), 3.0))
    assert torch.equal(x.grad, torch.full((3,), 7.0))


def test_an_optional_tensor_left_out_takes_no_gradient(ns, path):
    def backward(ctx, g):
        return g, (g if ctx.needs_input_grad[1] else None)

    @opforge.op(f"{ns}::maybe_add", backward=backward)
    def maybe_add(x: Tensor, y: Optional[Tensor] = None) -> Tensor:
        return x.clone() if y is None else x + y

    x = leaf(2)
    maybe_add(x).sum().backward()
    assert torch.equal(x.grad, torch.ones(2))


def test_a_gradient_for_an_input_that_was_none_is_an_error_naming_it(ns, path):
    @opforge.op(f"{ns}::maybe_add2", backward=lambda ctx, g: (g, g))
    def maybe_add2(x: Tensor, y: Optional[Tensor] = None) -> Tensor:
        return x.clone() if y is None else x + y

    error = raised(lambda: maybe_add2(leaf(2)).sum().backward())
    assert isinstance(error, RuntimeError) and "parameter 'y'" in str(error) and "None in the forward" in str(error)


def test_the_dispatcher_kernel_with_a_redispatched_device_kernel_records_the_same_node(ns):
    # A kernel registered per device type runs behind the dispatcher, as a C++ kernel does.
    op, function = cube(ns, "cube_d")
    op.register_kernel("cpu", lambda x: x**3)
    with fast_path(True):
        (a, (xa,)), (b, (xb,)) = both(op, function, lambda: (leaf(3),), lambda f, x: f(x))
    a.sum().backward()
    b.sum().backward()
    assert a.grad_fn.name() == f"{ns}::cube_dBackward"
    assert torch.equal(xa.grad, xb.grad)
