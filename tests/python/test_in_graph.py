"""Struct ops Dynamo records as one node of its graph (opforge._in_graph,
docs/performance.md#one-node-in-dynamos-graph): what it traces, what it
guards, what AOTAutograd, Inductor, their caches and torch.export make of it,
and the boundary's errors under compile, against the same op called eagerly.

The ops are defined at the module's top level, as Dynamo must find them by
module and name; an op defined in a function keeps its traced `__call__`."""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from typing import Optional

import pytest
import torch

import opforge
from opforge import _in_graph
from opforge.bench import compile as _bench_compile

Tensor = torch.Tensor


@dataclass(frozen=True)
class Gain:
    scale: float
    n: int = 1


@dataclass(frozen=True)
class Outer:
    gain: Gain
    bias: float = 0.0


@opforge.op("ofig::scaled", fake=lambda x, cfg: torch.empty_like(x))
def scaled(x: Tensor, cfg: Gain) -> Tensor:
    return x * (cfg.scale * cfg.n)


@opforge.op("ofig::nested", fake=lambda x, w, cfg: torch.empty_like(x))
def nested(x: Tensor, w: Tensor, cfg: Outer) -> Tensor:
    return x * w * (cfg.gain.scale * cfg.gain.n) + cfg.bias


@opforge.op("ofig::leafy", fake=lambda x, k, cfg=None, ls=(1,), s="a": torch.empty_like(x))
def leafy(x: Tensor, k: int, cfg: Optional[Gain] = None, ls: list[int] = (1,), s: str = "a") -> Tensor:
    return x * k


@opforge.op("ofig::grad", fake=lambda x, cfg: torch.empty_like(x))
def grad(x: Tensor, cfg: Gain) -> Tensor:
    return x * cfg.scale


grad.register_autograd(lambda ctx, g: (g * ctx.scale, None),
                       setup_context=lambda ctx, inputs, output: setattr(ctx, "scale", inputs[1].scale))


@opforge.op("ofig::write", mutates_args=("out",))
def write(out: Tensor, cfg: Gain) -> None:
    out.mul_(cfg.scale)


@opforge.op("ofig::pair", fake=lambda x, cfg: Gain(cfg.scale * 2, cfg.n))
def pair(x: Tensor, cfg: Gain) -> Gain:
    return Gain(cfg.scale * 2, cfg.n)


def graphs_of(fn, *args, fullgraph=True):
    """The FX graphs Dynamo hands its backend for `fn(*args)`, and the result."""
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=fullgraph)(*args)
    return seen, out


def targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def outcome(fn, *args, **kwargs):
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the test compares whatever is raised
        return type(e), str(e)


def test_a_module_level_struct_op_is_one_node_of_dynamos_graph():
    cfg = Gain(2.0, 3)
    (gm,), out = graphs_of(lambda x: scaled(x, cfg) + 1, torch.ones(3))
    assert torch.equal(out, torch.full((3,), 7.0))
    assert _in_graph.admitted(scaled)
    calls = targets(gm)
    assert calls.count(scaled) == 1
    # No flatten was traced: the op's flat OpOverload is not in Dynamo's graph.
    assert torch.ops.ofig.scaled.default not in calls


def test_an_op_defined_in_a_function_keeps_its_traced_call():
    @opforge.op("ofig::local", fake=lambda x, cfg: torch.empty_like(x))
    def local(x: Tensor, cfg: Gain) -> Tensor:
        return x * cfg.scale

    (gm,), out = graphs_of(lambda x: local(x, Gain(3.0)), torch.ones(2))
    assert torch.equal(out, torch.full((2,), 3.0))
    assert not _in_graph.admitted(local)
    assert local not in targets(gm) and torch.ops.ofig.local.default in targets(gm)


@pytest.mark.parametrize("op", [write, pair], ids=["mutating", "struct_return"])
def test_ops_dynamo_cannot_hold_as_one_call_keep_their_traced_call(op):
    torch._dynamo.reset()
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))  # a compile start
    assert not _in_graph.admitted(op)


def test_mutating_and_struct_returning_ops_still_compile_to_the_eager_result():
    def fn(x):
        out = x.clone()
        write(out, Gain(3.0))
        return out, pair(x, Gain(1.5, 2))

    (_gm,), (out, g) = graphs_of(fn, torch.ones(2))
    assert torch.equal(out, torch.full((2,), 3.0)) and g == Gain(3.0, 2)


def test_nested_structs_lists_defaults_and_none_give_the_eager_result_on_every_path():
    x, w = torch.randn(4, generator=torch.Generator().manual_seed(0)), torch.rand(4) + 0.5
    cases = [
        lambda x, w: nested(x, w, Outer(Gain(0.5, 3), bias=1.5)),
        lambda x, w: nested(x, w, cfg=Outer(Gain(2.0))),
        lambda x, w: leafy(x, 3),
        lambda x, w: leafy(x, 2, Gain(1.0), [1, 2], "b"),
        lambda x, w: leafy(x, k=2, cfg=None, ls=(3,)),
    ]
    for case in cases:
        eager = case(x, w)
        for backend in ("eager", "aot_eager", "inductor"):
            torch._dynamo.reset()
            got = torch.compile(case, backend=backend, fullgraph=True)(x, w)
            torch.testing.assert_close(got, eager, msg=f"{backend}")


def test_a_struct_built_inside_the_compiled_function_is_recorded_with_its_fields():
    (gm,), out = graphs_of(lambda x, s: scaled(x, Gain(s, 2)), torch.ones(2), 1.25)
    assert torch.equal(out, torch.full((2,), 2.5))
    assert targets(gm).count(scaled) == 1


class Model(torch.nn.Module):
    def __init__(self, cfg: Gain):
        super().__init__()
        self.cfg = cfg

    def forward(self, x):
        return scaled(x, self.cfg)


def test_a_changed_struct_field_recompiles_and_gives_the_new_result():
    model = Model(Gain(2.0, 1))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    frames = _bench_compile._frames()
    assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 2.0))
    model.cfg = dataclasses.replace(model.cfg, n=5)
    assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 10.0))
    model.cfg = Gain(2.0, 1)  # the first graph again: its guards hold
    assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 2.0))
    assert _bench_compile._frames() - frames == 2


def test_inductor_calls_the_flat_op_through_its_flat_call():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    fn = torch.compile(lambda x: scaled(x, Gain(2.0, 2)) * 2, fullgraph=True)
    out, (code, *_rest) = run_and_get_code(fn, torch.ones(3))
    assert torch.equal(out, torch.full((3,), 8.0))
    assert "torch.ops.ofig.scaled.default" in code and "extern_kernels, 'opforge_" in code


def test_a_gradient_through_a_compiled_struct_op_matches_eager():
    x = torch.randn(3, requires_grad=True, generator=torch.Generator().manual_seed(1))
    eager = torch.autograd.grad(grad(x, Gain(3.0)).sum(), x)[0]
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        out = torch.compile(lambda t: grad(t, Gain(3.0)).sum(), backend=backend, fullgraph=True)(x)
        got = torch.autograd.grad(out, x)[0]
        assert torch.equal(got, eager) and torch.equal(eager, torch.full((3,), 3.0)), backend


def test_the_warm_compile_of_a_graph_holding_the_op_hits_aotautograds_cache():
    from torch._dynamo.utils import counters

    model = Model(Gain(1.5, 2))
    x = torch.ones(4)
    with tempfile.TemporaryDirectory() as cache, _bench_compile._warm_caches(cache):
        _seconds, _fn, cold = _bench_compile._first_call(model, x, "inductor")
        counters.clear()
        _seconds, _fn, warm = _bench_compile._first_call(model, x, "inductor")
        hits = dict(counters["aot_autograd"])
    assert torch.equal(cold, torch.full((4,), 3.0)) and torch.equal(warm, cold)
    assert hits.get("autograd_cache_hit") == 1 and "autograd_cache_bypass" not in hits, hits


def test_an_exported_program_holds_the_flat_op_and_runs_as_eager():
    model = Model(Gain(2.0, 2))
    exported = torch.export.export(model, (torch.ones(3),), strict=True)
    calls = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert torch.ops.ofig.scaled.default in calls and scaled not in calls
    assert torch.equal(exported.module()(torch.full((3,), 2.0)), torch.full((3,), 8.0))


@pytest.mark.parametrize(("args", "error"), [
    (("a", 1), (TypeError, "parameter 'x': expected a Tensor, got str 'a'. Pass a Tensor.")),
    ((None, 1), (TypeError, "parameter 'x': expected a Tensor, got None. Pass a Tensor.")),
    (("T", 1.5), (TypeError, "parameter 'k': expected an int, got float 1.5. Pass an int.")),
    (("T", 2**64), (OverflowError, "parameter 'k': int 18446744073709551616 is outside the range of torch's int")),
    (("T", 1, Gain("a")), (TypeError, "parameter 'cfg', field Gain.scale: expected a float, got str 'a'.")),
    (("T", 1, Gain(None)), (TypeError, "parameter 'cfg', field Gain.scale: expected a float, got None.")),
    (("T", 1, Outer(Gain(1.0))), (TypeError, "parameter 'cfg': expected a Gain instance, got Outer")),
    (("T", 1, None, [1, 1.5]), (TypeError, "parameter 'ls': expected a list of int, got list [1, 1.5].")),
    (("T", 1, None, [1], 3), (TypeError, "parameter 's': expected a str, got int 3. Pass a str.")),
], ids=["str_tensor", "none_tensor", "float_int", "int_past_64_bits", "field", "none_field", "other_struct",
        "list_item", "int_str"])
def test_a_refused_argument_is_the_boundarys_error_compiled_as_eager(args, error):
    args = tuple(torch.ones(2) if a == "T" else a for a in args)
    kind, text = error
    eager = outcome(leafy, *args)
    assert eager[0] is kind and eager[1].startswith(f"ofig::leafy: {text}"), eager
    torch._dynamo.reset()
    # Graph breaks allowed: the call runs eagerly and raises the boundary's own error.
    assert outcome(torch.compile(lambda *a: leafy(*a), backend="eager"), *args) == eager
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported) as info:  # Dynamo's graph break, with the message
        torch.compile(lambda *a: leafy(*a), backend="eager", fullgraph=True)(*args)
    assert f"ofig::leafy: {text}" in str(info.value)
    # The op still compiles and runs with good arguments.
    torch._dynamo.reset()
    good = torch.compile(lambda *a: leafy(*a), backend="eager", fullgraph=True)(torch.ones(2), 3, Gain(2.0))
    assert torch.equal(good, torch.full((2,), 3.0))


def test_an_argument_dynamo_cannot_hold_still_gets_the_boundarys_error_where_graph_breaks_are_allowed():
    class NotAStruct:
        scale = 1.0
        n = 1

    eager = outcome(scaled, torch.ones(1), NotAStruct())
    assert eager[0] is TypeError and eager[1].startswith("ofig::scaled: parameter 'cfg': expected a Gain"), eager
    torch._dynamo.reset()
    assert outcome(torch.compile(lambda x: scaled(x, NotAStruct()), backend="eager"), torch.ones(1)) == eager


def test_a_refused_call_outside_compile_raises_the_boundarys_error_unchanged():
    # The hook that turns the error into Dynamo's graph break acts only inside Dynamo's fake run.
    kind, message = outcome(scaled, torch.ones(1), Gain("a"))
    assert kind is TypeError and message.startswith("ofig::scaled: parameter 'cfg', field Gain.scale")
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.ones(1))
        assert outcome(scaled, fake, Gain("a")) == (kind, message)


def test_a_module_name_defined_again_as_another_op_is_cached_under_the_new_ops_key():
    # A cache key that stayed the first op's would let a cached graph of it stand for the second.
    import sys

    import torch._inductor.config as inductor_config

    module = sys.modules[__name__]
    ops = []
    for name in ("ofig::again_a", "ofig::again_b"):
        @opforge.op(name, fake=lambda x, cfg: torch.empty_like(x))
        def again(x: Tensor, cfg: Gain) -> Tensor:
            return x * cfg.scale

        again.__qualname__ = "again"
        module.again = again
        ops.append(again)
        torch._dynamo.reset()
        out = torch.compile(lambda x: module.again(x, Gain(2.0)), backend="eager", fullgraph=True)(torch.ones(1))
        assert torch.equal(out, torch.full((1,), 2.0)) and _in_graph.admitted(again)
        key = inductor_config.unsafe_marked_cacheable_functions[f"{__name__}.again"]
        assert key.startswith(f"opforge op {name} "), key
    del module.again
