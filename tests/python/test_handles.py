"""Runner handles (docs/handles.md): the caller passes the object, the dispatcher
sees an int, the body gets the object back; a stale, released or foreign
handle is a clear error, never another object."""

from __future__ import annotations

import copy
import gc
import threading
from typing import Optional

import pytest
import torch
from op_testing import fast_path, fresh_dynamo, graph_breaks, needs_torch, ns, path  # noqa: F401
from torch._subclasses.fake_tensor import FakeTensorMode

import opforge
from opforge import handles

Tensor = torch.Tensor


class Runner:
    def __init__(self, k: float):
        self.k = k
        self.calls = 0

    def run(self, x: Tensor) -> Tensor:
        self.calls += 1
        return x * self.k


class Slotted:
    __slots__ = ("k",)

    def __init__(self, k):
        self.k = k


def gemm_op(name):
    seen = {}

    @opforge.op(name)
    def gemm(x: Tensor, runner: opforge.Handle[Runner], other: Optional[opforge.Handle[Runner]] = None) -> Tensor:
        seen["runner"] = runner
        return runner.run(x) if other is None else other.run(runner.run(x))

    @gemm.register_fake
    def _(x, runner, other=None):
        seen["fake_runner"] = runner
        return torch.empty_like(x)

    return gemm, seen


def test_a_handle_parameter_is_a_symint_in_the_schema(ns):
    # SymInt, not int: under torch.compile the handle is a graph input, and an
    # `int` argument would specialize the graph on its value.
    gemm, _ = gemm_op(f"{ns}::gemm")
    assert gemm.schema == f"{ns}::gemm(Tensor x, SymInt runner, SymInt? other=None) -> Tensor"


def test_the_body_receives_the_object_itself(ns, path):
    gemm, seen = gemm_op(f"{ns}::gemm")
    r = Runner(3.0)
    assert torch.equal(gemm(torch.ones(2), r), torch.full((2,), 3.0))
    assert seen["runner"] is r
    assert torch.equal(gemm(torch.ones(2), r, Runner(2.0)), torch.full((2,), 6.0))


def test_the_dispatcher_sees_an_int_and_the_flat_op_accepts_it(ns):
    gemm, seen = gemm_op(f"{ns}::gemm")
    r = Runner(5.0)
    args, _ = gemm.flatten(torch.ones(1), r)
    assert type(args[1]) is int
    assert args[1] == handles.register(r)
    out = getattr(torch.ops, ns).gemm(torch.ones(1), args[1])
    assert out.item() == 5.0 and seen["runner"] is r


def test_fake_kernels_get_the_int_not_the_object(ns):
    gemm, seen = gemm_op(f"{ns}::gemm")
    r = Runner(1.0)
    with FakeTensorMode():
        gemm(torch.empty(3), r)
    assert seen["fake_runner"] == handles.register(r)
    assert r.calls == 0


def test_the_table_holds_objects_weakly(ns):
    gemm, _ = gemm_op(f"{ns}::gemm")
    r = Runner(1.0)
    h = handles.register(r)
    gc.collect()  # objects other tests left in reference cycles
    count = handles.count()
    del r
    gc.collect()
    assert handles.count() == count - 1
    with pytest.raises(LookupError, match=rf"^{ns}::gemm: parameter 'runner': handle {h}"):
        getattr(torch.ops, ns).gemm(torch.ones(1), h)


def owner_of(obj):
    """The object a registered object's attribute points back at."""
    return getattr(obj, handles.ATTRIBUTE)[1]()


def test_objects_of_a_handle_class_register_themselves_when_made_or_copied(ns):
    class Made:
        def __init__(self, k):
            self.k = k

    earlier = Made(1.0)  # exists before any op names the class

    @opforge.op(f"{ns}::made")
    def made(x: Tensor, m: opforge.Handle[Made]) -> Tensor:
        return x * m.k

    assert owner_of(earlier) is earlier
    gc.collect()
    count = handles.count()
    m = Made(2.0)
    assert handles.count() == count + 1 and owner_of(m) is m
    for twin in (copy.copy(m), copy.deepcopy(m)):
        assert owner_of(twin) is twin and twin.k == 2.0
        assert handles.register(twin) not in (handles.register(m), handles.register(earlier))
    assert made(torch.ones(1), m).item() == 2.0


def test_registering_on_creation_keeps_the_class_own_init_and_setstate(ns):
    class Base:
        def __init__(self, k):
            self.k = k

        def __setstate__(self, state):
            self.__dict__.update(state, restored=True)

    class Derived(Base):
        pass

    @opforge.op(f"{ns}::base")
    def base(x: Tensor, b: opforge.Handle[Base]) -> Tensor:
        return x * b.k

    d = Derived(3.0)
    assert owner_of(d) is d and d.k == 3.0
    twin = copy.deepcopy(d)
    assert twin.restored is True and owner_of(twin) is twin
    assert Base.__init__.__name__ == "__init__" and Base.__init__.__wrapped__(d, 4.0) is None and d.k == 4.0


def test_classes_whose_methods_cannot_be_replaced_are_left_as_they_are():
    init = torch.Generator.__init__
    handles.register_on_creation(torch.Generator)
    assert torch.Generator.__init__ is init
    assert not hasattr(torch.Generator(), handles.ATTRIBUTE)


def test_pin_keeps_an_object_alive_until_unpin(ns):
    r = Runner(2.0)
    h = handles.pin(r)
    del r
    gc.collect()
    assert handles.resolve(h).k == 2.0
    handles.unpin(handles.resolve(h))
    gc.collect()
    with pytest.raises(LookupError, match=f"handle {h}"):
        handles.resolve(h)


def test_objects_without_weak_references_must_be_pinned():
    s = Slotted(1.0)
    with pytest.raises(TypeError, match="objects of type Slotted cannot be held weakly. Pin them with "
                                        r"opforge.handles.pin\(obj\)"):
        handles.register(s)
    h = handles.pin(s)
    assert handles.resolve(h) is s
    handles.unpin(s)
    with pytest.raises(LookupError):
        handles.resolve(h)


def test_a_released_handle_is_an_error_not_another_object(ns):
    gemm, _ = gemm_op(f"{ns}::gemm")
    r = Runner(1.0)
    h = handles.register(r)
    assert handles.release(r) is True
    with pytest.raises(LookupError, match=rf"^{ns}::gemm: parameter 'runner': handle {h}"):
        getattr(torch.ops, ns).gemm(torch.ones(1), h)
    h2 = handles.register(r)  # registering again gives a new handle
    assert h2 != h and handles.resolve(h2) is r


def test_an_unknown_handle_is_an_error(ns):
    gemm, _ = gemm_op(f"{ns}::gemm")
    with pytest.raises(LookupError, match=rf"^{ns}::gemm: parameter 'runner': handle 12345"):
        getattr(torch.ops, ns).gemm(torch.ones(1), 12345)


def test_a_handle_to_another_type_is_an_error(ns):
    gemm, _ = gemm_op(f"{ns}::gemm")

    class Other:
        pass

    o = Other()
    h = handles.register(o)
    with pytest.raises(TypeError, match=rf"^{ns}::gemm: parameter 'runner': handle {h} refers to a Other, "
                                        r"not a Runner."):
        getattr(torch.ops, ns).gemm(torch.ones(1), h)


def test_passing_the_wrong_object_is_an_error_naming_the_parameter(ns, path):
    gemm, _ = gemm_op(f"{ns}::gemm")
    with pytest.raises(TypeError, match=rf"^{ns}::gemm: parameter 'runner': expected a Runner for a "
                                        r"Handle\[Runner\] parameter, got str."):
        gemm(torch.ones(1), "runner")


def test_registration_is_idempotent_and_thread_safe():
    r = Runner(1.0)
    out = []
    threads = [threading.Thread(target=lambda: out.append(handles.register(r))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 1 and out[0] == handles.register(r)


registers_at_trace_time = needs_torch("2.12", "registering a runner made without its __init__ while Dynamo "
                                      "traces (the attribute fallback is tested below)",
                                      handles._dynamo_registers_at_trace_time())


@registers_at_trace_time
def test_handles_compile_with_fullgraph_without_earlier_registration(ns):
    gemm, seen = gemm_op(f"{ns}::gemm")
    r1, r2 = Runner(2.0), Runner(3.0)
    with fresh_dynamo():
        compiled = torch.compile(lambda x, r: gemm(x, r) + 1, fullgraph=True, backend="eager")
        assert torch.equal(compiled(torch.ones(2), r1), torch.full((2,), 3.0))
        assert torch.equal(compiled(torch.ones(2), r2), torch.full((2,), 4.0))
        assert torch.equal(compiled(torch.ones(2), r1), torch.full((2,), 3.0))
        assert graph_breaks() == 0
    assert seen["runner"] is r1


@registers_at_trace_time
def test_a_copied_object_is_not_mistaken_for_its_original_under_compile(ns):
    gemm, seen = gemm_op(f"{ns}::gemm")
    r = Runner(2.0)
    gemm(torch.ones(1), r)
    twin = copy.copy(r)
    twin.k = 7.0
    with fresh_dynamo():
        compiled = torch.compile(lambda x, r: gemm(x, r), fullgraph=True, backend="eager")
        assert compiled(torch.ones(1), r).item() == 2.0
        assert compiled(torch.ones(1), twin).item() == 7.0
    assert seen["runner"] is twin


def test_handles_compile_with_inductor(ns):
    gemm, _ = gemm_op(f"{ns}::gemm")
    r = Runner(4.0)
    handles.register(r)  # needed where Dynamo cannot register it while tracing
    with fresh_dynamo():
        compiled = torch.compile(lambda x: gemm(x, r) * 2, fullgraph=True, backend="inductor")
        assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 8.0))
        assert graph_breaks() == 0


def test_without_trace_time_registration_runners_made_or_copied_outside_compile_are_read_from_their_attribute(
        ns, monkeypatch):
    # Where Dynamo cannot call a function on the object at trace time, the
    # handle is read from the attribute that registration set: when the
    # runner was made (its __init__) or copied (its __setstate__).
    gemm, seen = gemm_op(f"{ns}::gemm")
    monkeypatch.setattr(handles, "_TRACE_TIME_REGISTRATION", False)
    r = Runner(2.0)
    twin = copy.copy(r)
    twin.k = 7.0
    bare = Runner.__new__(Runner)  # made without __init__: nothing registered it
    bare.k, bare.calls = 5.0, 0
    with fresh_dynamo():
        compiled = torch.compile(lambda x, r: gemm(x, r), fullgraph=True, backend="eager")
        assert compiled(torch.ones(1), r).item() == 2.0
        assert compiled(torch.ones(1), twin).item() == 7.0
        with pytest.raises(Exception, match=r"the Runner passed as a handle inside torch.compile was never "
                                            r"registered: it was not made by Runner.__init__ or copied \(those "
                                            r"register themselves\), and torch 2\.\d+\S* cannot register it "
                                            r"while tracing \(torch 2.12 can\)"):
            compiled(torch.ones(1), bare)
        handles.register(bare)
        assert compiled(torch.ones(1), bare).item() == 5.0
    assert seen["runner"] is bare


def test_a_handle_made_by_another_process_is_an_error_here_naming_the_op_and_the_parameter(ns):
    import subprocess
    import sys
    import textwrap

    # The other process registers a runner first, then so does this one: the
    # same number must not name this process's runner (docs/handles.md#handles-are-process-state).
    made = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import opforge
        class Runner:
            pass
        print(opforge.handles.register(Runner()))
    """)], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    foreign = int(made.stdout.split()[-1])
    gemm, seen = gemm_op(f"{ns}::gemm")
    mine = Runner(2.0)
    assert handles.register(mine) != foreign
    for call in (getattr(torch.ops, ns).gemm, lambda x, h: gemm.overload(x, h)):
        with pytest.raises(LookupError, match=rf"^{ns}::gemm: parameter 'runner': handle {foreign}: is stale: .*"
                                              r"another process made it"):
            call(torch.ones(1), foreign)
    assert "runner" not in seen
    assert gemm(torch.ones(1), mine).item() == 2.0


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
def test_exporting_a_model_that_passes_a_runner_says_the_handle_would_be_a_constant(ns, strict):
    gemm, _ = gemm_op(f"{ns}::gemm")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.runner = Runner(3.0)

        def forward(self, x):
            return gemm(x, self.runner)

    model = Model()
    with pytest.raises(Exception, match=rf"{ns}::gemm: parameter 'runner': torch.export would record the handle "
                                        r"of this Runner as a constant.*Keep the runner out of the exported program"):
        torch.export.export(model, (torch.ones(2),), strict=strict)
    # torch.compile keeps the handle a graph input, as before.
    assert torch.equal(torch.compile(model, fullgraph=True)(torch.ones(2)), torch.full((2,), 3.0))
