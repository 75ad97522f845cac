"""torch.compile(fullgraph=True) over every op form (docs/python_ops.md): no graph
breaks with the eager and inductor backends, dynamic batch sizes, and no more
recompiles for a struct's float field than for a plain float argument."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Literal, Optional

import pytest
import torch
from op_testing import compiled_frames, fresh_dynamo, graph_breaks

import opforge

Tensor = torch.Tensor
NS = "compile_forms"


class Mode(enum.Enum):
    ADD = "add"
    MUL = "mul"


@dataclass(frozen=True)
class Cfg:
    scale: float
    causal: bool = False


@dataclass(frozen=True)
class Bias:
    b: Tensor
    gain: float = 1.0


@dataclass(frozen=True)
class Outer:
    cfg: Cfg
    bias: Optional[Bias] = None


@dataclass(frozen=True)
class Acc:
    out: Tensor
    alpha: float


@dataclass(frozen=True)
class Pair:
    lo: Tensor
    hi: Tensor


class Runner:
    def __init__(self, k: float):
        self.k = k


def _like(x, *rest, **kw):
    return torch.empty_like(x)


@opforge.op(f"{NS}::plain", fake=lambda x, s: torch.empty_like(x))
def plain(x: Tensor, s: float) -> Tensor:
    return x * s


@opforge.op(f"{NS}::struct", fake=lambda x, cfg: torch.empty_like(x))
def struct(x: Tensor, cfg: Cfg) -> Tensor:
    return x * cfg.scale + (1 if cfg.causal else 0)


@opforge.op(f"{NS}::nested", fake=lambda x, o: torch.empty_like(x))
def nested(x: Tensor, o: Outer) -> Tensor:
    out = x * o.cfg.scale
    return out if o.bias is None else out + o.bias.b * o.bias.gain


def _choice_fake(x, mode=None, how="one", dims=(0,), dtype=torch.float32):
    # The output has the requested dtype; Inductor checks it from torch 2.14 on.
    return torch.empty_like(x, dtype=dtype)


@opforge.op(f"{NS}::choice", fake=_choice_fake)
def choice(x: Tensor, mode: Mode = Mode.ADD, how: Literal["one", "two"] = "one",
           dims: list[int] = [0], dtype: torch.dtype = torch.float32) -> Tensor:
    k = 1.0 if how == "one" else 2.0
    return (x + k if mode is Mode.ADD else x * k).to(dtype)


@opforge.op(f"{NS}::accumulate", mutates_args=("acc",))
def accumulate(x: Tensor, acc: Acc) -> None:
    acc.out.add_(x * acc.alpha)


def _square_backward(ctx, g):
    (x,) = ctx.saved_tensors
    return 2 * x * g * ctx.cfg.scale, None


def _square_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.cfg = inputs[1]


@opforge.op(f"{NS}::square", fake=lambda x, cfg: torch.empty_like(x), setup_context=_square_setup,
            backward=_square_backward)
def square(x: Tensor, cfg: Cfg) -> Tensor:
    return x * x * cfg.scale


@opforge.op(f"{NS}::run", fake=lambda x, r: torch.empty_like(x))
def run(x: Tensor, r: opforge.Handle[Runner]) -> Tensor:
    return x * r.k


@opforge.op(f"{NS}::split")
def split(x: Tensor) -> Pair:
    return Pair(x * 2, x * 3)


@split.register_fake
def _(x):
    return Pair(torch.empty_like(x), torch.empty_like(x))


@dataclass(frozen=True)
class Head:
    n: int
    scale: float = 1.0


def _head_setup(ctx, inputs, output):
    ctx.n, ctx.scale = inputs[1].n, inputs[1].scale
    ctx.size = inputs[0].shape[0]


def _head_backward(ctx, g):
    grad = g.new_zeros(ctx.size)
    grad[: ctx.n] = g * ctx.scale
    return grad, None


@opforge.op(f"{NS}::head", fake=lambda x, h: x.new_empty(h.n), setup_context=_head_setup, backward=_head_backward)
def head(x: Tensor, h: Head) -> Tensor:
    return x[: h.n] * h.scale


RUNNER = Runner(4.0)
CFG = Cfg(2.0, causal=True)

FORMS = {
    "plain": lambda x: plain(x, 3.0),
    "struct": lambda x: struct(x, CFG),
    "struct_built_inside": lambda x: struct(x, Cfg(scale=1.5)),
    "nested_optional_none": lambda x: nested(x, Outer(Cfg(2.0))),
    "nested_optional_set": lambda x: nested(x, Outer(Cfg(2.0), Bias(x + 1, gain=0.5))),
    "enum_literal_list_dtype": lambda x: choice(x, Mode.MUL, "two", dims=[0], dtype=torch.float64),
    "enum_as_value": lambda x: choice(x, "mul"),
    "backward": lambda x: square(x, CFG),
    "handle": lambda x: run(x, RUNNER),
    "struct_return": lambda x: split(x).hi - split(x).lo,
}


def mutation_form(x):
    out = torch.zeros_like(x)
    accumulate(x, Acc(out, 2.0))
    return out


FORMS["mutation_in_struct"] = mutation_form


def all_forms(x):
    return [form(x) for form in FORMS.values()]


@pytest.mark.parametrize("form", list(FORMS), ids=list(FORMS))
def test_each_form_compiles_without_graph_breaks_on_the_eager_backend(form):
    x = torch.arange(4.0)
    expected = FORMS[form](x)
    with fresh_dynamo():
        compiled = torch.compile(FORMS[form], fullgraph=True, backend="eager")
        result = compiled(x)
        assert graph_breaks() == 0
    assert torch.allclose(result, expected)
    assert result.dtype == expected.dtype


def test_every_form_compiles_with_inductor_without_graph_breaks_and_agrees_with_eager():
    x = torch.arange(4.0)
    expected = all_forms(x)
    with fresh_dynamo():
        explanation = torch._dynamo.explain(all_forms)(x)
        assert explanation.graph_break_count == 0
        assert explanation.graph_count == 1
        torch._dynamo.reset()
        compiled = torch.compile(all_forms, fullgraph=True, backend="inductor")
        results = compiled(x)
        assert graph_breaks() == 0
    for name, a, b in zip(FORMS, results, expected):
        assert torch.allclose(a, b), name


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_dynamic_batch_sizes_reuse_one_graph(backend):
    def f(x, w):
        out = nested(x, Outer(Cfg(2.0), Bias(w)))
        return square(out, CFG) + struct(x, CFG)

    with fresh_dynamo():
        compiled = torch.compile(f, fullgraph=True, backend=backend)
        for n in (2, 3, 5, 8):
            x, w = torch.randn(n, 3), torch.randn(n, 3)
            assert torch.allclose(compiled(x, w), f(x, w), atol=1e-6)
        assert graph_breaks() == 0
        assert compiled_frames() <= 2  # a static first graph, then one dynamic graph


def test_marked_dynamic_inputs_compile_once():
    with fresh_dynamo():
        compiled = torch.compile(lambda x: struct(x, CFG) + nested(x, Outer(CFG)), fullgraph=True, backend="eager")
        for n in (2, 3, 4):
            x = torch.randn(n)
            torch._dynamo.mark_dynamic(x, 0)
            compiled(x)
        assert compiled_frames() == 1


def count_frames(fn, args_per_call) -> int:
    with fresh_dynamo():
        compiled = torch.compile(fn, fullgraph=True, backend="eager")
        for args in args_per_call:
            compiled(*args)
        return compiled_frames()


def test_changing_a_struct_float_field_recompiles_no_more_than_a_plain_float():
    x = torch.ones(3)
    values = [0.5, 1.5, 2.5, 3.5, 4.5]
    plain_frames = count_frames(lambda x, s: plain(x, s), [(x, v) for v in values])
    struct_frames = count_frames(lambda x, cfg: struct(x, cfg), [(x, Cfg(v)) for v in values])
    inside_frames = count_frames(lambda x, s: struct(x, Cfg(s)), [(x, v) for v in values])
    assert struct_frames <= plain_frames
    assert inside_frames <= plain_frames


def test_changing_a_struct_field_reuses_the_graph_when_floats_are_dynamic():
    x = torch.ones(3)
    values = [0.5, 1.5, 2.5, 3.5]
    with torch._dynamo.config.patch(specialize_float=False):
        plain_frames = count_frames(lambda x, s: plain(x, s), [(x, v) for v in values])
        inside_frames = count_frames(lambda x, s: struct(x, Cfg(s)), [(x, v) for v in values])
    assert inside_frames <= plain_frames


def test_an_int_struct_field_that_changes_goes_dynamic_without_a_graph_break():
    # The traced test of a scalar leaf folds where the value is a constant; once Dynamo makes the int
    # symbolic (the second value) it traces the test's expressions instead, which accept a SymInt.
    x = torch.arange(6.0)
    with fresh_dynamo():
        compiled = torch.compile(lambda x, n: head(x, Head(n, 2.0)), fullgraph=True, backend="eager")
        for n in (1, 2, 3, 5):
            assert torch.equal(compiled(x, n), x[:n] * 2.0)
        assert graph_breaks() == 0
        assert compiled_frames() <= 2  # a static first graph, then one with n symbolic


def test_backward_through_inductor_matches_eager():
    x = torch.randn(4, requires_grad=True)
    square(x, CFG).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    with fresh_dynamo():
        compiled = torch.compile(lambda x: square(x, CFG).sum(), fullgraph=True, backend="inductor")
        compiled(x).backward()
        assert graph_breaks() == 0
    assert torch.allclose(x.grad, expected)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_struct_field_holding_a_symbolic_size_compiles(backend):
    def f(x):
        return head(x, Head(x.shape[0] - 1, 2.0)).sum()

    with fresh_dynamo():
        compiled = torch.compile(f, fullgraph=True, backend=backend, dynamic=True)
        for n in (4, 6, 9):
            x = torch.arange(float(n), requires_grad=True)
            out = compiled(x)
            out.backward()
            assert out.item() == 2.0 * sum(range(n - 1))
            assert torch.equal(x.grad, torch.tensor([2.0] * (n - 1) + [0.0]))
        assert graph_breaks() == 0
        assert compiled_frames() == 1


def test_a_compiled_struct_op_guards_nothing_of_the_ops_own_tables():
    # Dynamo evaluates every guard on every call: what the traced leaf checks
    # read must be literals of the generated code, not globals it guards
    # (its table of leaf kinds cost ~20 guards, 2-3 µs a call, for 4 leaves).
    # An op defined in a function: its traced __call__ (a module-level one is one node, guarded below).
    @opforge.op(f"{NS}::struct_traced", fake=lambda x, cfg: torch.empty_like(x))
    def traced(x: Tensor, cfg: Cfg) -> Tensor:
        return x * cfg.scale

    cfg = Cfg(scale=2.0)

    def f(x):
        return traced(x, cfg)

    def one_node(x):
        return struct(x, cfg)

    # One node: nothing of the generated code is read, so nothing of it is guarded.
    one = [g.name for g in torch._dynamo.explain(one_node)(torch.randn(3)).out_guards]
    assert not [n for n in one if "unnamed_scope" in n or "opforge" in n], one
    names = [g.name for g in torch._dynamo.explain(f)(torch.randn(3)).out_guards]
    own = [n for n in names if "unnamed_scope" in n or "opforge" in n]
    # The generated code's scope, its struct class, torch.Tensor (for the test of x), the one test of its
    # scalar leaves and the flat op; nothing of its tables or helpers, and not its test of "compiling?",
    # which comes after the leaf tests and is traced only where a value is bad.
    assert sorted(re.sub(r"\['_(Tensor|S|ok)\d+'\]", r"['_\1']", re.sub(
        r"\['___unnamed_scope_\d+_c\d+'\]", "[scope]", n)) for n in own) == [
        "G[scope]", "G[scope]['_S']", "G[scope]['_Tensor']", "G[scope]['_ok']", "G[scope]['_op']"], own


def test_a_compiled_call_refuses_any_non_tensor_for_a_tensor_with_the_eager_error():
    # The traced test of a Tensor leaf is "not a Tensor", not a list of Python types: a complex there is
    # the boundary's TypeError under torch.compile too, not torch's error from the fake call.
    with pytest.raises(TypeError, match=r"compile_forms::plain: parameter 'x': expected a Tensor, got complex 2j"):
        plain(2j, 1.0)
    with pytest.raises(TypeError, match=r"compile_forms::plain: parameter 'x': expected a Tensor, got complex 2j"):
        torch.compile(lambda v: plain(v, 1.0))(2j)
