"""The eager fast path runs the body directly only when nothing could
intercept the dispatcher call; in every other situation the call goes through
the dispatcher, and the result is the same as with the fast path off."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest
import torch
from op_testing import both_paths, fast_path, ns  # noqa: F401
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import opforge

Tensor = torch.Tensor


@dataclass(frozen=True)
class Cfg:
    scale: float
    extra: Optional[Tensor] = None


def scale_op(name, backward=None):
    calls = []

    def body(x: Tensor, cfg: Cfg, *, shift: float = 0.0) -> Tensor:
        calls.append(torch._C._dispatch_tls_local_exclude_set())
        out = x * cfg.scale + shift
        return out if cfg.extra is None else out + cfg.extra

    op = opforge.op(name, backward=backward)(body)

    @op.register_fake
    def _(x, cfg, *, shift=0.0):
        return torch.empty_like(x)

    return op, calls


class RecordingFunctionMode(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


class RecordingDispatchMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_fast_path_and_dispatcher_give_identical_results(ns):
    op, _ = scale_op(f"{ns}::scale")
    x, extra = torch.randn(4), torch.randn(4)
    for args, kwargs in [((x, Cfg(2.0)), {}), ((x, Cfg(0.5, extra)), {"shift": 1.0}), ((x.double(), Cfg(3.0)), {})]:
        fast, slow = both_paths(op, *args, **kwargs)
        assert torch.equal(fast, slow)
        assert fast.dtype == slow.dtype


def test_the_body_runs_below_autograd_on_both_paths(ns):
    op, calls = scale_op(f"{ns}::scale")
    both_paths(op, torch.ones(2), Cfg(1.0))
    fast_excluded, slow_excluded = calls
    assert fast_excluded.has(torch._C.DispatchKey.AutogradOther)
    assert fast_excluded == slow_excluded


def test_the_fast_path_is_taken_for_plain_tensors(ns):
    op, _ = scale_op(f"{ns}::scale")
    fp_check = op._fast_check
    assert fp_check((torch.ones(1),)) == 0
    assert fp_check((torch.ones(1), None)) == 0
    assert fp_check((torch.ones(1, requires_grad=True),)) == 1
    with torch.no_grad():
        assert fp_check((torch.ones(1, requires_grad=True),)) == 0


def test_a_torch_function_mode_sees_the_op(ns):
    op, _ = scale_op(f"{ns}::scale")
    results = []
    x = torch.ones(2)
    for enabled in (True, False):
        with fast_path(enabled), RecordingFunctionMode() as mode:
            results.append(op(x, Cfg(2.0)))
        assert mode.seen == [f"{ns}.scale.default"], enabled
    assert torch.equal(*results)


def test_a_torch_dispatch_mode_sees_the_op(ns):
    op, _ = scale_op(f"{ns}::scale")
    x = torch.ones(2)
    for enabled in (True, False):
        with fast_path(enabled), RecordingDispatchMode() as mode:
            op(x, Cfg(2.0))
        assert mode.seen == [f"{ns}.scale.default"], enabled


def test_fake_tensors_use_the_fake_kernel_not_the_body(ns):
    op, calls = scale_op(f"{ns}::scale")
    for enabled in (True, False):
        with fast_path(enabled), FakeTensorMode():
            out = op(torch.empty(5), Cfg(2.0))
        assert out.shape == (5,) and type(out).__name__ == "FakeTensor"
    assert calls == []


def test_meta_tensors_use_the_fake_kernel(ns):
    op, calls = scale_op(f"{ns}::scale")
    fast, slow = both_paths(op, torch.empty(3, device="meta"), Cfg(2.0))
    assert fast.device.type == slow.device.type == "meta"
    assert calls == []


def test_autocast_goes_through_the_dispatcher(ns):
    op, _ = scale_op(f"{ns}::scale")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert op._fast_check((torch.ones(1),)) == -1
        fast, slow = both_paths(op, torch.ones(2), Cfg(2.0))
    assert torch.equal(fast, slow) and fast.dtype == slow.dtype


def test_vmap_goes_through_the_dispatcher_and_agrees(ns):
    op, _ = scale_op(f"{ns}::scale")
    x = torch.randn(3, 2)
    fast, slow = both_paths(torch.vmap(lambda t: op(t, Cfg(2.0))), x)
    assert torch.equal(fast, slow) and torch.equal(fast, x * 2)


def test_the_profiler_records_the_op(ns):
    op, _ = scale_op(f"{ns}::scale")
    for enabled in (True, False):
        with fast_path(enabled), torch.profiler.profile() as prof:
            op(torch.ones(2), Cfg(2.0))
        assert f"{ns}::scale" in [e.name for e in prof.events()], enabled


def test_record_function_observers_see_the_op(ns):
    op, _ = scale_op(f"{ns}::scale")
    with torch.autograd.profiler.profile() as prof:
        assert op._fast_check((torch.ones(1),)) == -1
        op(torch.ones(2), Cfg(2.0))
    assert any(e.name == f"{ns}::scale" for e in prof.function_events)


def test_inference_mode_gives_inference_tensors_on_both_paths(ns):
    op, _ = scale_op(f"{ns}::scale")
    with torch.inference_mode():
        fast, slow = both_paths(op, torch.ones(2), Cfg(2.0))
    assert fast.is_inference() and slow.is_inference()
    fast, slow = both_paths(op, torch.ones(2), Cfg(2.0))
    assert not fast.is_inference() and not slow.is_inference()


def test_requires_grad_without_backward_routes_to_the_dispatcher_error(ns):
    op, _ = scale_op(f"{ns}::scale")
    x = torch.ones(2, requires_grad=True)
    fast, slow = both_paths(op, x, Cfg(2.0))
    assert fast.requires_grad and slow.requires_grad
    assert type(fast.grad_fn).__name__ == type(slow.grad_fn).__name__
    with pytest.raises(RuntimeError, match="has no backward"):
        fast.sum().backward()


def test_requires_grad_with_backward_builds_the_same_graph_on_both_paths(ns):
    op, _ = scale_op(f"{ns}::scale", backward=lambda ctx, g: (2 * g, None, None))
    grads = []
    for enabled in (True, False):
        x = torch.ones(2, requires_grad=True)
        with fast_path(enabled):
            y = op(x, Cfg(2.0))
        assert y.grad_fn is not None
        y.sum().backward()
        grads.append(x.grad)
    assert torch.equal(*grads)


def test_no_grad_runs_the_body_directly(ns):
    op, _ = scale_op(f"{ns}::scale", backward=lambda ctx, g: (g, None, None))
    with torch.no_grad():
        y = op(torch.ones(2, requires_grad=True), Cfg(2.0))
    assert y.grad_fn is None and not y.requires_grad


def test_tensor_subclasses_go_through_the_dispatcher(ns):
    op, _ = scale_op(f"{ns}::scale")

    class Tagged(torch.Tensor):
        pass

    x = torch.ones(2).as_subclass(Tagged)
    assert op._fast_check((x,)) == -1
    fast, slow = both_paths(op, x, Cfg(2.0))
    assert type(fast) is type(slow) is Tagged
    assert torch.equal(fast.as_subclass(Tensor), slow.as_subclass(Tensor))


@pytest.mark.parametrize("make", [
    lambda: torch.ones(2, dtype=torch.complex64).conj(),
    lambda: torch.ones(2).to_sparse(),
    lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
    lambda: torch.ones(2, device="meta"),
], ids=["conjugate", "sparse", "nested", "meta"])
def test_tensors_some_dispatch_key_acts_on_are_not_taken_by_the_fast_path(ns, make):
    op, _ = scale_op(f"{ns}::scale")
    assert op._fast_check((make(),)) == -1


def test_tensors_on_different_devices_are_not_taken_by_the_fast_path(ns):
    op, _ = scale_op(f"{ns}::scale")
    assert op._fast_check((torch.ones(1), torch.ones(1, device="meta"))) == -1


def test_a_tensor_inside_a_struct_is_checked_too(ns):
    op, calls = scale_op(f"{ns}::scale")
    with FakeTensorMode() as mode:
        extra = mode.from_tensor(torch.ones(2))
    # The op's tensors tuple holds struct fields too: a fake tensor hidden
    # in one sends the call to the dispatcher.
    assert op._fast_check((torch.ones(2), extra)) == -1
    with mode:
        out = op(torch.empty(2), Cfg(2.0, extra))
    assert out.shape == (2,) and calls == []


def test_disabling_the_fast_path_is_global_and_returns_the_previous_setting(ns):
    op, _ = scale_op(f"{ns}::scale")
    previous = opforge.set_fast_path_enabled(False)
    try:
        assert previous is True
        assert op._fast_check((torch.ones(1),)) == -1
        assert opforge.set_fast_path_enabled(False) is False
    finally:
        opforge.set_fast_path_enabled(True)
    assert op._fast_check((torch.ones(1),)) == 0


def test_errors_from_the_body_propagate_alike(ns):
    @opforge.op(f"{ns}::fails")
    def fails(x: Tensor, cfg: Cfg) -> Tensor:
        raise ValueError(f"bad scale {cfg.scale}")

    for enabled in (True, False):
        with fast_path(enabled), pytest.raises(ValueError, match="bad scale 2.0"):
            fails(torch.ones(1), Cfg(2.0))


def test_functionalization_goes_through_the_dispatcher(ns):
    op, _ = scale_op(f"{ns}::scale")

    def f(x):
        return op(x, Cfg(3.0))

    x = torch.ones(2)
    out = torch.func.functionalize(f)(x)
    assert torch.equal(out, torch.full((2,), 3.0))
