"""C++ backwards declared next to the op (`m.def(...).autograd<G>()`), seen
from Python: gradients of struct fields, gradcheck, opcheck and
torch.compile(fullgraph=True) forward and backward."""

import math
import os
import re

import pytest
import torch

import opforge
from opforge.bench import cpp as _bench_cpp

from cpp_ext import ROOT, load


@pytest.fixture(scope="module")
def ext():
    return load()


@pytest.fixture(scope="module")
def Lin(ext):
    return opforge.structs.opforge_ext.Lin


def _inputs(requires_grad=True, bias=True):
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.double, requires_grad=requires_grad)
    w = torch.randn(4, 2, dtype=torch.double, requires_grad=requires_grad)
    b = torch.randn(2, dtype=torch.double, requires_grad=requires_grad) if bias else None
    return x, w, b


def test_struct_field_tensors_get_the_gradients_the_cpp_backward_gives(ext, Lin):
    x, w, b = _inputs()
    y = ext.linear(x, Lin(w=w, b=b, scale=0.5))
    assert y.grad_fn.name() == "torch::autograd::CppNode<opforge::detail::OpBackward>"
    g = torch.randn_like(y)
    y.backward(g)
    torch.testing.assert_close(x.grad, g @ w.detach().t() * 0.5)
    torch.testing.assert_close(w.grad, x.detach().t() @ g * 0.5)
    torch.testing.assert_close(b.grad, g.sum(0))


def test_gradcheck_passes_through_the_cpp_backward_with_a_struct_parameter(ext, Lin):
    x, w, b = _inputs()
    assert torch.autograd.gradcheck(lambda x, w, b: ext.linear(x, Lin(w=w, b=b, scale=1.5)), (x, w, b))
    x, w, _ = _inputs(bias=False)
    assert torch.autograd.gradcheck(lambda x, w: ext.linear(x, Lin(w=w, b=None, scale=-2.0)), (x, w))


def test_only_the_inputs_that_require_grad_get_gradients(ext, Lin):
    x, w, b = _inputs(requires_grad=False)
    w.requires_grad_()
    ext.linear(x, Lin(w=w, b=b)).sum().backward()
    assert x.grad is None and b.grad is None
    torch.testing.assert_close(w.grad, x.t() @ torch.ones(3, 2, dtype=torch.double))


def test_without_grad_the_output_has_no_graph_node(ext, Lin):
    x, w, b = _inputs()
    with torch.no_grad():
        y = ext.linear(x, Lin(w=w, b=b))
    assert y.grad_fn is None and not y.requires_grad
    torch.testing.assert_close(y, x.detach() @ w.detach() + b.detach())


def test_the_flat_op_and_the_struct_call_give_the_same_gradients(ext, Lin):
    x, w, b = _inputs()
    torch.ops.opforge_ext.linear(x, w, b, 2.0).sum().backward()
    grads = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    ext.linear(x, Lin(w=w, b=b, scale=2.0)).sum().backward()
    for t, expected in zip((x, w, b), grads):
        torch.testing.assert_close(t.grad, expected)


def test_a_struct_return_gets_its_gradients_as_a_struct(ext):
    x = torch.arange(4.0, dtype=torch.double, requires_grad=True)
    halves = ext.split(x, 3.0)
    assert type(halves).__name__ == "Halves"
    (halves.lo.sum() + 10 * halves.hi.sum()).backward()
    torch.testing.assert_close(x.grad, torch.tensor([3.0, 3.0, 60.0, 60.0], dtype=torch.double))
    assert torch.autograd.gradcheck(lambda x: tuple(vars(ext.split(x, 0.5)).values()),
                                    (torch.randn(4, dtype=torch.double, requires_grad=True),))


def test_opcheck_passes_for_the_op_with_a_cpp_backward(ext, Lin):
    x, w, b = _inputs()
    flat_args, flat_kwargs = ext.linear.flatten(x, Lin(w=w, b=b, scale=0.25))
    torch.library.opcheck(torch.ops.opforge_ext.linear.default, flat_args, flat_kwargs)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_op_compiles_with_fullgraph_forward_and_backward(ext, Lin, backend):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()

    def f(x, w, b):
        return ext.linear(x, Lin(w=w, b=b, scale=0.5)).relu().sum()

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    x, w, b = _inputs()
    loss = compiled(x, w, b)
    loss.backward()
    got = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    expected_loss = f(x, w, b)
    expected_loss.backward()
    torch.testing.assert_close(loss, expected_loss)
    for g, t in zip(got, (x, w, b)):
        torch.testing.assert_close(g, t.grad)
    assert not torch._dynamo.utils.counters["graph_break"]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def bench_rows(text: str) -> dict[str, tuple[list[float], str | None]]:
    """The rendered bench table's rows: label -> (its numbers, its budget verdict or None).
    '    C++ backward / autograd::Function, from C++        1.012x   budget <= 1.05x: met'
    -> {'C++ backward / autograd::Function, from C++': ([1.012], 'met')}"""
    rows = {}
    for line in text.splitlines():
        if not line.startswith("    "):
            continue  # a title or a section heading
        label, numbers, *budget = re.split(r"\s{2,}", line.strip())
        rows[label] = ([float(v.rstrip("x")) for v in numbers.split(" / ")],
                       budget[0].split(": ")[1] if budget else None)
    return rows


def test_the_bench_prints_the_cpp_backward_against_a_hand_written_function_with_every_number():
    library = _bench_cpp.build(os.path.join(ROOT, "build", "bench_cpp_ops"))
    results = _bench_cpp.measure(library, calls=20, repeats=1)
    assert set(results.cpp) == {"flat", "structured", "function_bwd", "opforge_bwd"}
    leaf_rows = {f"{kind}{n}" for n in _bench_cpp.LEAVES for kind in ("flat", "struct")}
    leaf_rows |= {f"struct{n}_built" for n in _bench_cpp.LEAVES}
    assert set(results.python) == {"flat", "structured", "structured_wrapper", "function_bwd", "opforge_bwd",
                                   "opforge_wrapper_bwd"} | leaf_rows
    text = _bench_cpp.render(results)
    rows = bench_rows(text)
    assert all(numbers and all(math.isfinite(n) for n in numbers) for numbers, _ in rows.values()), text
    assert [len(rows[label][0]) for label in ("flat op, torch.ops.ns.flatN(x, *leaves)",
                                               "struct op, opforge.ops.ns.structN(x, cfg)")] == [3, 3]
    # Each ratio is the measured values' and its verdict is the budget's.
    ratio, verdict = rows["C++ backward / autograd::Function, from C++"]
    assert ratio[0] == pytest.approx(results.cpp["opforge_bwd"] / results.cpp["function_bwd"], abs=5e-4)
    assert verdict == ("met" if ratio[0] <= 1.05 else "NOT met")
    ratio, verdict = rows["C++ struct op / flat op, from Python"]
    assert ratio[0] == pytest.approx(results.python["structured"] / results.python["flat"], abs=5e-4)
    assert verdict == ("met" if ratio[0] <= 1.05 else "NOT met")
    for row in ("fwd+bwd: hand-written torch::autograd::Function", "fwd+bwd: opforge C++ backward (struct form)",
                "C++ backward / autograd::Function, from C++", "C++ backward / autograd::Function, from Python",
                "C++ struct op / flat torch.ops op, 30 leaves", "same, struct built in the call, 5 leaves"):
        assert row in text, row
    assert text.count("budget <= 1.05x") == 4 + len(_bench_cpp.LEAVES)
    assert text.count("budget <= 1.15x") == len(_bench_cpp.LEAVES)
