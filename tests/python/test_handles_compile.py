"""Runner handles at model scale under torch.compile: every layer holds its
own runner, each layer instance is compiled (regional compilation,
fullgraph=True), and the runners do not multiply the graphs."""

from __future__ import annotations

import copy
import gc

import pytest
import torch
from op_testing import fresh_dynamo, graph_breaks, load_test_extension, needs_torch, ns  # noqa: F401
from runner_models import (CppRunnerLayer, GemmRunner, PythonRunnerLayer, compile_layers, compiled_graphs,
                           define_gemm, run, run_uncompiled)
from torch.testing import assert_close

from opforge import handles

DIM = 8

# Before torch 2.12 Dynamo cannot call a function on an object while tracing,
# so a runner made without its __init__ (GemmRunner.__new__, as fresh_runner
# does) must be registered before torch.compile meets it (docs/handles.md,
# "Which torch does what").
registers_at_trace_time = needs_torch("2.12", "registering a runner made without its __init__ while Dynamo "
                                      "traces (runners made by __init__ or copied are tested everywhere)",
                                      handles._dynamo_registers_at_trace_time())


def layers_of(gemm, n, register=False):
    return [PythonRunnerLayer(gemm, DIM, seed=i, register=register) for i in range(n)]


def inputs(seed=0):
    return torch.randn(3, DIM, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def compile_mode(monkeypatch):
    """Runs a test under one of the ways compiled code can receive handles
    (docs/handles.md), as a torch that offers only that one would."""

    saved = torch.compiler.config.dynamic_sources

    def use(mode: str):
        if mode == "dynamic_int" and handles._detect_mode() != "dynamic_int":
            pytest.skip(f"needs torch 2.10 (this is {torch.__version__}): torch.fx's DynamicInt")
        monkeypatch.setattr(handles, "_MODE", mode)
        torch.compiler.config.dynamic_sources = ""  # as a torch that offers no other way would have it
        if mode == "dynamic_sources":
            handles._install_dynamic_source_pattern()

    yield use
    torch.compiler.config.dynamic_sources = saved


def fresh_runner(runner: GemmRunner) -> GemmRunner:
    """The same plan in a runner that was never registered (made without
    __init__, which would register it)."""
    fresh = GemmRunner.__new__(GemmRunner)
    fresh.plan, fresh.calls = runner.plan, 0
    return fresh


@pytest.mark.parametrize("registered", [True, pytest.param(False, marks=registers_at_trace_time)],
                         ids=["registered", "first-seen-under-compile"])
def test_24_layers_each_with_its_own_runner_compile_to_at_most_two_graphs(ns, registered):
    gemm = define_gemm(ns)
    layers = layers_of(gemm, 24)
    x, y = inputs(0), inputs(1)
    with torch.no_grad(), fresh_dynamo():
        eager_x, eager_y = run(layers, x), run(layers, y)  # eager calls register the runners
        for layer in layers:
            layer.runner = layer.runner if registered else fresh_runner(layer.runner)
            layer.runner.calls = 0
        compile_layers(layers, backend="eager")
        compiled_x, compiled_y = run(layers, x), run(layers, y)
        assert compiled_graphs() <= (1 if registered else 2)
        assert graph_breaks() == 0
    assert_close(compiled_x, eager_x)
    assert_close(compiled_y, eager_y)
    assert [layer.runner.calls for layer in layers] == [2] * 24  # each layer ran its own runner


@pytest.mark.parametrize("trace_time", [True, False], ids=["this-torch", "no-trace-time-registration"])
def test_a_model_whose_first_call_is_compiled_compiles_one_graph_on_every_torch(ns, monkeypatch, trace_time):
    # The runners are made with the layers and never passed eagerly nor
    # registered by hand; without trace-time registration is how torch
    # before 2.12 runs.
    if not trace_time:
        monkeypatch.setattr(handles, "_TRACE_TIME_REGISTRATION", False)
    gemm = define_gemm(ns)
    layers = layers_of(gemm, 24)
    x = inputs()
    with torch.no_grad(), fresh_dynamo():
        compile_layers(layers, backend="eager")
        compiled = run(layers, x)
        assert compiled_graphs() == 1
        assert graph_breaks() == 0
        assert [layer.runner.calls for layer in layers] == [1] * 24
        eager = run_uncompiled(layers, x)
    assert_close(compiled, eager)


def test_24_layers_with_inductor_compile_once_and_match_eager(ns):
    gemm = define_gemm(ns)
    layers = layers_of(gemm, 24)
    x = inputs()
    with torch.no_grad(), fresh_dynamo():
        eager = run(layers, x)
        compile_layers(layers, backend="inductor")
        compiled = run(layers, x)
        assert compiled_graphs() == 1
    assert_close(compiled, eager)


@needs_torch("2.10", "DynamicInt, which makes a C++ handle held by a module a graph input",
             handles.compile_mode() == "dynamic_int")
def test_24_layers_of_a_cpp_op_with_a_handle_compile_to_at_most_two_graphs():
    ext = load_test_extension()
    layers = [CppRunnerLayer(ext, DIM, factor=0.5 + i / 24) for i in range(24)]
    x = inputs()
    with torch.no_grad(), fresh_dynamo():
        eager = run(layers, x)
        compile_layers(layers, backend="eager")
        compiled = run(layers, x)
        assert compiled_graphs() <= 2
        assert graph_breaks() == 0
    assert_close(compiled, eager)
    for layer in layers:
        handles.release(layer.runner)


def test_the_fake_kernel_gets_a_symbolic_int_never_the_runner(ns):
    seen = {}
    gemm = define_gemm(ns, seen)
    layers = layers_of(gemm, 3, register=True)
    with torch.no_grad(), fresh_dynamo():
        compile_layers(layers, backend="eager")
        run(layers, inputs())
    expected = int if handles.compile_mode() == "constant" else torch.SymInt
    assert seen["fake"] and all(isinstance(h, expected) for h in seen["fake"])
    assert [layer.runner.calls for layer in layers] == [1, 1, 1]  # only the real kernel ran them


def test_a_released_runner_passed_again_to_a_compiled_function_works_as_in_eager(ns):
    gemm = define_gemm(ns)
    runner = GemmRunner(torch.eye(DIM) * 2)
    x = inputs()
    old = handles.register(runner)
    with fresh_dynamo():
        f = torch.compile(lambda x, r: gemm(x, r) + 1, fullgraph=True, backend="eager")
        assert_close(f(x, runner), x * 2 + 1)
        assert handles.release(runner) is True
        with pytest.raises(LookupError, match=f"handle {old}: is stale"):
            getattr(torch.ops, ns).runner_gemm(x, old)  # the handle stays dead
        assert_close(f(x, runner), x * 2 + 1)  # the runner itself is registered again
        new = handles.register(runner)
        assert new != old and handles.resolve(new) is runner
        handles.release(runner)
        assert_close(f(x, runner), x * 2 + 1)  # and again
        assert compiled_graphs() == 1


def test_a_released_runner_in_a_compiled_model_gets_a_new_handle_without_recompiling(ns):
    gemm = define_gemm(ns)
    layers = layers_of(gemm, 6, register=True)
    x = inputs()
    with torch.no_grad(), fresh_dynamo():
        compile_layers(layers, backend="eager")
        before = run(layers, x)
        old = handles.register(layers[3].runner)
        gc.collect()  # objects other tests left in reference cycles
        count = handles.count()
        handles.release(layers[3].runner)
        assert handles.count() == count - 1
        after = run(layers, x)
        assert compiled_graphs() == 1
    assert_close(after, before)
    assert handles.count() == count
    assert handles.register(layers[3].runner) != old


def test_a_new_runner_assigned_to_a_compiled_layer_is_the_one_called(ns):
    gemm = define_gemm(ns)
    layers = layers_of(gemm, 4, register=True)
    x = inputs()
    with torch.no_grad(), fresh_dynamo():
        compile_layers(layers, backend="eager")
        run(layers, x)
        old = layers[1].runner
        layers[1].runner = GemmRunner(torch.eye(DIM))  # never registered
        compiled = run(layers, x)
        assert compiled_graphs() == 1
    assert layers[1].runner.calls == 1 and old.calls == 1
    assert_close(compiled, run(layers, x))


def test_copies_of_registered_runners_get_their_own_handles_under_compile(ns):
    # deepcopy of a model copies each runner with its original's attribute:
    # the copies must never run the originals, nor compile one graph each.
    gemm = define_gemm(ns)
    layers = layers_of(gemm, 12, register=True)
    copies = copy.deepcopy(layers, {id(gemm): gemm})
    for layer in copies:
        layer.runner.plan = layer.runner.plan * -1
    x = inputs()
    with torch.no_grad(), fresh_dynamo():
        compile_layers(copies, backend="eager")
        compiled = run(copies, x)
        assert compiled_graphs() == 1
    assert [layer.runner.calls for layer in layers] == [0] * 12
    assert [layer.runner.calls for layer in copies] == [1] * 12
    assert_close(compiled, run(copies, x))
    assert len({handles.register(layer.runner) for layer in layers + copies}) == 24


def test_copies_of_runners_that_are_gone_compile_too(ns):
    gemm = define_gemm(ns)
    template = PythonRunnerLayer(gemm, DIM, seed=0, register=True)
    layers = [copy.deepcopy(template, {id(gemm): gemm}) for _ in range(8)]
    del template
    gc.collect()
    x = inputs()
    with torch.no_grad(), fresh_dynamo():
        compile_layers(layers, backend="eager")
        compiled = run(layers, x)
        assert compiled_graphs() == 1
    assert [layer.runner.calls for layer in layers] == [1] * 8
    assert_close(compiled, run(layers, x))


@pytest.mark.parametrize("mode", ["dynamic_int", "dynamic_sources"])
def test_each_way_of_passing_handles_compiles_24_runners_to_at_most_two_graphs(ns, compile_mode, mode):
    compile_mode(mode)
    gemm = define_gemm(ns)
    layers = layers_of(gemm, 24, register=True)
    assert type(getattr(layers[0].runner, handles.ATTRIBUTE)[0]) is (
        handles.HandleId if mode == "dynamic_int" else int)
    x = inputs()
    with torch.no_grad(), fresh_dynamo():
        eager = run(layers, x)
        compile_layers(layers, backend="eager")
        compiled = run(layers, x)
        handles.release(layers[5].runner)
        released = run(layers, x)
        assert compiled_graphs() <= 2
    assert_close(compiled, eager)
    assert_close(released, eager)


def test_without_dynamic_ints_or_sources_each_runner_compiles_its_own_graph(ns, compile_mode):
    # The last fallback: correct results, one graph per runner (so models
    # with more runners than Dynamo's recompile limit need torch >= 2.10).
    compile_mode("constant")
    gemm = define_gemm(ns)
    layers = layers_of(gemm, 4, register=True)
    assert handles.dynamic(12345) == 12345 and type(handles.dynamic(12345)) is int
    x = inputs()
    with torch.no_grad(), fresh_dynamo():
        eager = run(layers, x)
        compile_layers(layers, backend="eager")
        compiled = run(layers, x)
        assert compiled_graphs() == 4
        handles.release(layers[2].runner)
        assert_close(run(layers, x), eager)  # a released runner works, after one more graph
    assert_close(compiled, eager)


def test_without_trace_time_registration_registered_runners_still_compile_once(ns, monkeypatch):
    # Where Dynamo cannot call a function on the object while tracing,
    # runners must be registered first (tests/python/test_handles.py has the
    # error); registered ones share the graph as everywhere else.
    monkeypatch.setattr(handles, "_TRACE_TIME_REGISTRATION", False)
    gemm = define_gemm(ns)
    layers = layers_of(gemm, 12, register=True)
    x = inputs()
    with torch.no_grad(), fresh_dynamo():
        eager = run(layers, x)
        compile_layers(layers, backend="eager")
        compiled = run(layers, x)
        assert compiled_graphs() <= (1 if handles.compile_mode() != "constant" else 12)
    assert_close(compiled, eager)


@pytest.mark.parametrize("mode", ["dynamic_sources", "constant"])
def test_dynamic_warns_when_made_where_an_int_handle_is_a_constant_to_compiled_code(compile_mode, mode):
    compile_mode(mode)
    handles._warn_constant_handles.cache_clear()
    with pytest.warns(UserWarning, match=r"opforge.handles.dynamic: torch \S+ has no DynamicInt \(torch 2.10 has\), "
                                         r"so an int handle is a constant under torch.compile"):
        assert handles.dynamic(12345) == 12345
    handles._warn_constant_handles.cache_clear()


def test_dynamic_handles_print_and_compare_as_plain_ints():
    h = handles.dynamic(4611686018427387905)
    assert h == 4611686018427387905 and hash(h) == hash(4611686018427387905)
    assert str(h) == repr(h) == "4611686018427387905" and f"{h}" == "4611686018427387905"
    assert handles.dynamic(h) is h or handles.compile_mode() != "dynamic_int"
    for bad in ("1", 1.0, True, None):
        with pytest.raises(TypeError, match="opforge.handles.dynamic: expected an int handle, got"):
            handles.dynamic(bad)


@registers_at_trace_time
def test_a_wrong_object_under_compile_is_the_same_error_as_in_eager(ns):
    gemm = define_gemm(ns)
    with fresh_dynamo():
        f = torch.compile(lambda x, r: gemm(x, r), fullgraph=True, backend="eager")
        with pytest.raises(Exception, match=rf"{ns}::runner_gemm: parameter 'runner': expected a GemmRunner for "
                                            r"a Handle\[GemmRunner\] parameter, got NotARunner"):
            f(inputs(), type("NotARunner", (), {})())
