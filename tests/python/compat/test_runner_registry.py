"""opforge.compat.runner_registry used the way the integer-ID runner pattern
is used: runners registered by id, looked up inside an opaque custom op that
torch.compile never traces into."""

import gc
import threading
import weakref

import pytest
import torch
from torch.testing import assert_close

from opforge.compat.runner_registry import RunnerNotFoundError, get_runner, register_runner, release_runner


class FakeRunner:
    """Stands in for a compiled CuTeDSL/CUTLASS runner: state the op cannot take as an argument."""

    def __init__(self, scale: float):
        self.scale = scale
        self.calls = 0

    def _run_impl(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * self.scale


@torch.library.custom_op("runner_registry_test::linear_gemm", mutates_args=())
def linear_gemm(x: torch.Tensor, runner_id: int, out_features: int) -> torch.Tensor:
    return get_runner(runner_id)._run_impl(x)


@linear_gemm.register_fake
def _(x, runner_id, out_features):
    return torch.empty(x.shape[0], out_features, dtype=x.dtype, device=x.device)


def test_register_returns_an_int_and_get_returns_the_same_object():
    runner = FakeRunner(2.0)
    rid = register_runner(runner)
    assert isinstance(rid, int) and not isinstance(rid, bool)
    assert str(rid) == str(int(rid)) and repr(rid) == repr(int(rid))
    assert get_runner(rid) is runner and get_runner(int(rid)) is runner
    release_runner(rid)


def test_runner_is_reached_from_a_compiled_opaque_op():
    runner = FakeRunner(3.0)
    rid = register_runner(runner)
    fn = torch.compile(lambda x: linear_gemm(x, rid, 4) + 1, backend="eager", fullgraph=True)
    x = torch.randn(2, 4)
    assert_close(fn(x), x * 3.0 + 1)
    assert runner.calls == 1
    release_runner(rid)


def test_registry_keeps_the_runner_alive_until_it_is_released():
    rid = register_runner(FakeRunner(1.0))
    gc.collect()
    runner = get_runner(rid)
    assert runner.scale == 1.0
    ref = weakref.ref(runner)
    del runner
    assert release_runner(rid) is True
    gc.collect()
    assert ref() is None


def test_a_released_id_raises_a_key_error_naming_the_id():
    rid = register_runner(FakeRunner(1.0))
    release_runner(rid)
    with pytest.raises(KeyError, match=rf"get_runner\({rid}\): no runner is registered under this id"):
        get_runner(rid)
    with pytest.raises(RunnerNotFoundError):
        get_runner(rid)


def test_a_new_runner_after_a_release_gets_a_new_id():
    runner = FakeRunner(1.0)
    first = register_runner(runner)
    release_runner(first)
    second = register_runner(FakeRunner(2.0))
    again = register_runner(runner)
    assert len({first, second, again}) == 3
    assert get_runner(second).scale == 2.0 and get_runner(again) is runner
    with pytest.raises(LookupError):
        get_runner(first)
    release_runner(second)
    release_runner(again)


def test_ids_are_never_reused_over_many_register_release_cycles():
    seen = set()
    for i in range(200):
        rid = register_runner(FakeRunner(float(i)))
        assert rid not in seen
        seen.add(rid)
        release_runner(rid)
    for rid in seen:
        with pytest.raises(RunnerNotFoundError):
            get_runner(rid)


def test_registering_the_same_runner_twice_returns_the_same_id():
    runner = FakeRunner(1.0)
    rid = register_runner(runner)
    assert register_runner(runner) == rid
    assert release_runner(runner) is True
    with pytest.raises(RunnerNotFoundError):
        get_runner(rid)


def test_runners_that_cannot_be_weakly_referenced_are_held_too():
    class SlotRunner:
        __slots__ = ("scale",)

        def __init__(self, scale):
            self.scale = scale

    rid = register_runner(SlotRunner(5.0))
    gc.collect()
    assert get_runner(rid).scale == 5.0
    release_runner(rid)


def test_ids_that_were_never_issued_raise():
    for rid in (0, -1, 12345, 2**70):
        with pytest.raises(RunnerNotFoundError, match="register_runner never returned it"):
            get_runner(rid)
    with pytest.raises(TypeError, match="runner ids are ints, got str"):
        get_runner("0")
    assert release_runner(12345) is False


def test_concurrent_registrations_get_distinct_ids():
    ids, runners = [], [FakeRunner(float(i)) for i in range(64)]
    lock = threading.Lock()

    def work(chunk):
        for runner in chunk:
            rid = register_runner(runner)
            with lock:
                ids.append(rid)

    threads = [threading.Thread(target=work, args=(runners[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 64
    assert sorted(get_runner(rid).scale for rid in ids) == [float(i) for i in range(64)]
    for rid in ids:
        release_runner(rid)


class Layer(torch.nn.Module):
    """A layer that keeps its runner's id as an int attribute, as the pattern does."""

    def __init__(self, scale: float):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.runner_id = register_runner(FakeRunner(scale))

    def forward(self, x):
        return linear_gemm(self.proj(x), self.runner_id, 4).relu()


def test_24_layers_each_with_its_own_runner_id_compile_to_at_most_two_graphs():
    # A module's plain int attribute is a constant to Dynamo (one graph per
    # id); the ids register_runner returns are graph inputs instead.
    from torch._dynamo.utils import counters

    from opforge import handles

    if handles.compile_mode() != "dynamic_int":
        pytest.skip(f"needs torch 2.10 (this is {torch.__version__}): DynamicInt, without which ids are "
                    f"constants to compiled code (compile mode {handles.compile_mode()!r}, docs/handles.md)")
    torch.manual_seed(0)
    layers = [Layer(0.5 + i / 24) for i in range(24)]
    x = torch.randn(3, 4)
    with torch.no_grad():
        eager = x
        for layer in layers:
            eager = layer(eager)
        torch._dynamo.reset()
        counters.clear()
        for layer in layers:
            layer.compile(fullgraph=True, backend="eager")
        compiled = x
        for layer in layers:
            compiled = layer(compiled)
        assert counters["stats"]["unique_graphs"] <= 2
        assert_close(compiled, eager)
        calls = [get_runner(layer.runner_id).calls for layer in layers]
        assert calls == [2] * 24  # once eager, once compiled: the compiled graph called each layer's own runner
    torch._dynamo.reset()
    for layer in layers:
        release_runner(layer.runner_id)
