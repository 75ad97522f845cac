"""mutates_args (docs/python_ops.md): a parameter, a leaf or a field path; a struct name
expands to its Tensor leaves only; mutation inside a struct works eagerly and
compiled, and version counters move as torch.library's do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from op_testing import both_paths, fresh_dynamo, graph_breaks, ns, path  # noqa: F401

import opforge

Tensor = torch.Tensor


@dataclass(frozen=True)
class Buffers:
    out: Tensor
    count: Optional[Tensor] = None
    alpha: float = 1.0


def accumulate_op(name: str, mutates=("buf",)):
    @opforge.op(name, mutates_args=mutates)
    def accumulate(x: Tensor, buf: Buffers) -> None:
        buf.out.add_(x * buf.alpha)
        if buf.count is not None:
            buf.count.add_(1)

    return accumulate


def test_a_struct_in_mutates_args_marks_only_its_tensor_leaves(ns):
    acc = accumulate_op(f"{ns}::acc")
    assert acc.schema == (f"{ns}::acc(Tensor x, Tensor(a1!) buf__out, Tensor(a2!)? buf__count=None, "
                          f"float buf__alpha=1.) -> ()")


def test_a_leaf_name_or_a_field_path_marks_one_leaf(ns):
    by_leaf = accumulate_op(f"{ns}::by_leaf", mutates=("buf__out",))
    by_path = accumulate_op(f"{ns}::by_path", mutates=("buf.count",))
    assert "Tensor(a1!) buf__out, Tensor? buf__count" in by_leaf.schema
    assert "Tensor buf__out, Tensor(a2!)? buf__count" in by_path.schema


def test_tensors_inside_a_struct_are_mutated_in_place(ns, path):
    acc = accumulate_op(f"{ns}::acc")
    out, count = torch.zeros(3), torch.zeros(())
    acc(torch.ones(3), Buffers(out, count, alpha=2.0))
    acc(torch.ones(3), Buffers(out, count, alpha=2.0))
    assert torch.equal(out, torch.full((3,), 4.0))
    assert count.item() == 2


def test_mutated_tensors_get_their_version_counter_bumped(ns, path):
    @opforge.op(f"{ns}::fill", mutates_args=("buf",))
    def fill(buf: Buffers) -> None:
        with torch.no_grad():
            buf.out.copy_(torch.ones_like(buf.out))

    out = torch.zeros(2)
    before = out._version
    fill(Buffers(out))
    assert out._version > before
    assert torch.equal(out, torch.ones(2))


def test_both_eager_paths_bump_versions_alike(ns):
    acc = accumulate_op(f"{ns}::acc")
    versions = []
    for enabled in (True, False):
        previous = opforge.set_fast_path_enabled(enabled)
        out = torch.zeros(1)
        acc(torch.ones(1), Buffers(out))
        versions.append(out._version)
        opforge.set_fast_path_enabled(previous)
    assert versions[0] == versions[1]


def test_a_top_level_tensor_and_a_tensor_list_can_be_mutated(ns, path):
    @opforge.op(f"{ns}::zero", mutates_args=("x", "ys"))
    def zero(x: Tensor, ys: list[Tensor]) -> None:
        x.zero_()
        for y in ys:
            y.fill_(7)

    assert zero.schema == f"{ns}::zero(Tensor(a0!) x, Tensor(a1!)[] ys) -> ()"
    x, ys = torch.ones(2), [torch.zeros(1), torch.zeros(2)]
    zero(x, ys)
    assert torch.equal(x, torch.zeros(2)) and all(bool((y == 7).all()) for y in ys)


def test_an_absent_optional_mutated_tensor_is_fine(ns, path):
    acc = accumulate_op(f"{ns}::acc")
    out = torch.zeros(2)
    acc(torch.ones(2), Buffers(out))
    assert torch.equal(out, torch.ones(2))


def test_mutation_inside_a_struct_is_visible_after_a_compiled_call(ns):
    acc = accumulate_op(f"{ns}::acc")

    def f(x, out, count):
        acc(x, Buffers(out, count, alpha=3.0))
        return out + 1

    for backend in ("eager", "inductor"):
        with fresh_dynamo():
            out, count = torch.zeros(2), torch.zeros(())
            compiled = torch.compile(f, fullgraph=True, backend=backend)
            result = compiled(torch.ones(2), out, count)
            assert graph_breaks() == 0
        assert torch.equal(out, torch.full((2,), 3.0)), backend
        assert torch.equal(result, torch.full((2,), 4.0)), backend
        assert count.item() == 1, backend


def test_opcheck_passes_for_an_op_mutating_a_struct_field(ns):
    acc = accumulate_op(f"{ns}::acc")
    result = opforge.opcheck(acc, (torch.ones(3), Buffers(torch.zeros(3), torch.zeros(()), 2.0)))
    assert set(result.values()) == {"SUCCESS"}


# --- an op that mutates and has a backward --------------------------------------------------------


def rotate_op(ns: str):
    """x rotated in place by a kernel that writes it (no torch in-place op, so no
    version bump of its own), y accumulated into a buffer; x marked dirty."""

    def setup_context(ctx, inputs, output):
        ctx.mark_dirty(inputs[0])

    def backward(ctx, g):
        return g.roll(-1), None, None

    @opforge.op(f"{ns}::rotate_", mutates_args=("x", "buf"), setup_context=setup_context, backward=backward)
    def rotate_(x: Tensor, y: Tensor, buf: Tensor) -> Tensor:
        with torch.no_grad():
            x.detach().copy_(x.detach().roll(1))
            buf.detach().add_(y)
        return x

    return rotate_


def run_rotate(op):
    a = torch.arange(4.0, requires_grad=True)
    x, buf = a * 1, torch.zeros(4)
    before = (x._version, buf._version)
    out = op(x, torch.ones(4), buf)
    after = (x._version, buf._version)
    out.backward(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    return out.detach(), a.grad, buf, after[0] - before[0], after[1] - before[1], out is x


def test_an_op_with_a_backward_bumps_versions_alike_on_both_paths_when_a_gradient_is_needed(ns):
    rotate_ = rotate_op(ns)
    fast, dispatcher = both_paths(run_rotate, rotate_)
    for (out, grad, buf, dx, dbuf, same), what in ((fast, "fast"), (dispatcher, "dispatcher")):
        assert torch.equal(out, torch.tensor([3.0, 0.0, 1.0, 2.0])), what
        assert torch.equal(grad, torch.tensor([2.0, 3.0, 4.0, 1.0])), what
        assert torch.equal(buf, torch.ones(4)), what
        assert same, what
    assert fast[3:5] == dispatcher[3:5] and fast[3] >= 1 and fast[4] >= 1


def test_the_fast_path_records_a_mutating_op_with_a_backward_directly(ns):
    # The dispatcher path bumps versions in the op's ADInplaceOrView kernel (C++);
    # the fast path bumps them itself and records the node without the dispatcher.
    # The body writes through .data, which bumps nothing: every bump is opforge's.
    def backward(ctx, g):
        return g.roll(-1), None, None

    @opforge.op(f"{ns}::rotate_data_", mutates_args=("x", "buf"),
                setup_context=lambda ctx, inputs, output: ctx.mark_dirty(inputs[0]), backward=backward)
    def rotate_data_(x: Tensor, y: Tensor, buf: Tensor) -> Tensor:
        x.data.copy_(x.data.roll(1))
        buf.data.add_(y)
        return x

    fast, dispatcher = both_paths(run_rotate, rotate_data_)
    # buf once, by opforge; x once by opforge and once by mark_dirty, as autograd.Function's does.
    assert fast[3:5] == dispatcher[3:5] == (2, 1), "two mutated tensors, bumped once each"
    assert torch.equal(fast[1], dispatcher[1]) and torch.equal(fast[1], torch.tensor([2.0, 3.0, 4.0, 1.0]))


def test_an_inference_tensor_mutated_with_a_gradient_needed_behaves_alike_on_both_paths(ns):
    rotate_ = rotate_op(ns)

    def call():
        with torch.inference_mode():
            buf = torch.zeros(4)
        try:
            out = rotate_(torch.arange(4.0, requires_grad=True) * 1, torch.ones(4), buf)
        except RuntimeError as e:
            return str(e)
        return out.detach(), buf.clone(), out.requires_grad

    fast, dispatcher = both_paths(call)
    assert type(fast) is type(dispatcher)
    if isinstance(fast, str):
        assert fast == dispatcher
    else:
        assert all(torch.equal(a, b) for a, b in zip(fast[:2], dispatcher[:2])) and fast[2] == dispatcher[2]
        assert torch.equal(fast[1], torch.ones(4))


# --- outputs that alias inputs ---------------------------------------------------
# An op's outputs are new tensors, as for torch.library.custom_op: a body
# returning an input (or a view of it) is refused on every path, or
# `y = op(x); y.add_(1)` would change x eagerly and not in a compiled graph.


@dataclass(frozen=True)
class Split:
    head: Tensor
    tail: Tensor


ALIASING_BODIES = {
    "input": (lambda x: x, Tensor),
    "view": (lambda x: x.view(-1)[1:], Tensor),
    "twice": (lambda x: (x + 1,) * 2, tuple[Tensor, Tensor]),
    "in_list": (lambda x: [x * 2, x], list[Tensor]),
    "in_struct": (lambda x: Split(x * 2, x[1:]), Split),
}


def aliasing_op(ns, kind, fake=True):
    body, ret = ALIASING_BODIES[kind]

    def fake_fn(x):
        out = body(x)
        if isinstance(out, Split):
            return Split(torch.empty_like(out.head), torch.empty_like(out.tail))
        if isinstance(out, (tuple, list)):
            return type(out)(torch.empty_like(t) for t in out)
        return torch.empty_like(out)

    def alias(x: Tensor):
        return body(x)

    alias.__annotations__["return"] = ret
    return opforge.op(f"{ns}::alias_{kind}", fake=fake_fn if fake else None)(alias)


@pytest.mark.parametrize("kind", sorted(ALIASING_BODIES))
def test_a_returned_input_or_view_is_refused_eagerly_through_the_dispatcher_and_compiled(ns, kind):
    op = aliasing_op(ns, kind)
    message = rf"{ns}::alias_{kind}: return value: a returned tensor is an input of the op, a view of one"
    x = torch.arange(4.0)
    calls = {"fast path": lambda: op(x), "dispatcher": lambda: getattr(torch.ops, ns).__getattr__(f"alias_{kind}")(x),
             "compiled": lambda: torch.compile(op, fullgraph=True, backend="eager")(x)}
    for where, call in calls.items():
        torch._dynamo.reset()
        with pytest.raises(RuntimeError, match=message):
            call()
        assert torch.equal(x, torch.arange(4.0)), where


def test_a_fake_returning_its_input_is_refused_when_traced(ns):
    @opforge.op(f"{ns}::fake_alias", fake=lambda x: x)
    def fake_alias(x: Tensor) -> Tensor:
        return x.clone()

    with pytest.raises(Exception, match=rf"{ns}::fake_alias: return value: a returned tensor is an input"):
        torch.compile(fake_alias, fullgraph=True, backend="eager")(torch.ones(2))


def test_returning_the_tensor_the_op_writes_stays_allowed(ns, path):
    @opforge.op(f"{ns}::scale_", mutates_args=("x",))
    def scale_(x: Tensor) -> Tensor:
        return x.mul_(2)

    x = torch.ones(3)
    y = scale_(x)
    assert torch.equal(x, torch.full((3,), 2.0)) and y.data_ptr() == x.data_ptr()


def test_fresh_outputs_and_outputs_sharing_nothing_pass(ns, path):
    @opforge.op(f"{ns}::fresh")
    def fresh(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return x + 1, y.clone()

    a, b = fresh(torch.ones(2), torch.zeros(2))
    assert torch.equal(a, torch.full((2,), 2.0)) and torch.equal(b, torch.zeros(2))
