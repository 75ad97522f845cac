"""Ops tagged torch.Tag.cudagraph_unsafe honor CUDA graph captures
(opforge.cuda_graphs), on CPU: the tag reaches the schema from every front
end; a tagged op called while a capture is under way is refused naming the
op before its kernel runs, or becomes an eager break of a breakable capture
(an engine's, with vLLM's protocol), whose replay recomputes it.

`_C._set_capture_probe(1)` makes every device report a capture under way,
so the whole break machinery runs on CPU tensors; `probe` restores it."""

import sys
import threading
import types
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

import opforge
import opforge.cuda_graphs as cg
from opforge import _C

import kernel_library

UNSAFE = torch.Tag.cudagraph_unsafe
COUNTS = {"scale": 0, "doubled": 0}


@opforge.op("cgtest::scale", mutates_args=("out",), tags=UNSAFE)
def scale(out: Tensor, x: Tensor, factor: float) -> None:
    """out = x * factor, counting its runs."""
    COUNTS["scale"] += 1
    out.copy_(x * factor)


@opforge.op("cgtest::doubled", tags=UNSAFE)
def doubled(x: Tensor) -> Tensor:
    """A new tensor x * 2, counting its runs."""
    COUNTS["doubled"] += 1
    return x * 2


@opforge.op("cgtest::per_device", mutates_args=("out",), tags=(UNSAFE,))
def per_device(out: Tensor, x: Tensor) -> None:
    out.copy_(x)


@per_device.register_kernel("cpu")
def _(out, x):
    out.copy_(x + 10)


@opforge.op("cgtest::untagged", mutates_args=("out",))
def untagged(out: Tensor, x: Tensor) -> None:
    out.copy_(x + 1)


@opforge.op("cgtest::first_n", tags=UNSAFE)
def first_n(x: Tensor, n: Tensor) -> Tensor:
    """x[:n] * 1, n read on the host: a shape a CUDA graph cannot keep."""
    return x[: int(n.item())] * 1


@opforge.op("cgtest::copies", tags=UNSAFE)
def copies(x: Tensor, n: Tensor) -> list[Tensor]:
    """n copies of x, n read on the host."""
    return [x * 1 for _ in range(int(n.item()))]


@dataclass(frozen=True)
class Affine:
    scale: float
    shift: float = 0.0


@dataclass(frozen=True)
class Parts:
    scaled: Tensor
    shifted: Tensor


@opforge.op("cgtest::affine_parts", tags=UNSAFE)
def affine_parts(x: Tensor, cfg: Affine) -> Parts:
    return Parts(x * cfg.scale, x + cfg.shift)


@opforge.op("cgtest::numel", tags=UNSAFE)
def numel(x: Tensor) -> int:
    return x.numel()


@opforge.op("cgtest::fails", tags=UNSAFE)
def fails(x: Tensor, bad: bool) -> Tensor:
    if bad:
        raise ValueError("cgtest::fails was told to fail")
    return x + 1


class StepCapture:
    """A breakable capture with vLLM's protocol (BreakableCUDAGraphCapture):
    `current()` is the capture under way on this thread, `_capturing` says a
    segment is open, `add_eager(fn)` ends the segment, runs fn() once,
    records it and opens the next. Its "graph segments" are empty (CPU);
    replay() runs the recorded breaks in order."""

    _tls = threading.local()

    def __init__(self):
        self._capturing = False
        self.breaks = []
        self.num_segments = 0

    @classmethod
    def current(cls):
        return getattr(cls._tls, "capture", None)

    def __enter__(self):
        type(self)._tls.capture = self
        self._begin()
        return self

    def __exit__(self, *exc):
        self._capturing = False
        type(self)._tls.capture = None

    def _begin(self):
        self._capturing = True
        self.num_segments += 1

    def add_eager(self, fn):
        self._capturing = False
        try:
            result = fn()
            self.breaks.append(fn)
            return result
        finally:
            self._begin()

    def replay(self):
        for fn in self.breaks:
            fn()


class LazyCapture(StepCapture):
    """Takes the break and never runs it."""

    _tls = threading.local()

    def add_eager(self, fn):
        return None


@pytest.fixture
def probe():
    """Every device reports a capture under way, for the test."""
    previous = _C._set_capture_probe(1)
    try:
        yield
    finally:
        _C._set_capture_probe(previous)


@pytest.fixture
def engine():
    """StepCapture registered as an engine's capture, for the test."""
    cg.register_capture(StepCapture)
    try:
        yield StepCapture
    finally:
        cg.unregister_capture(StepCapture)


def has_guard(qualname: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "BackendSelect")


@pytest.fixture(scope="module")
def ffi_scale():
    pytest.importorskip("tvm_ffi")
    from tvm_ffi_kernels import kernels

    @opforge.op("cgtest::ffi_scale", mutates_args=("out",), kernel=kernels().scale_out, tags=UNSAFE)
    def ffi_scale(out: Tensor, x: Tensor, s: float) -> None:
        """The signature: the TVM-FFI function is the kernel."""

    return ffi_scale


def triton_add_body(x: Tensor, y: Tensor) -> Tensor:
    """Launches triton_helpers' add_kernel: a body opforge's Triton scan detects."""
    import triton
    from triton_helpers.kernels import add_kernel

    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 32),)](x, y, out, x.numel(), BLOCK=32)
    return out


@pytest.fixture(scope="module")
def triton_add():
    pytest.importorskip("triton")
    try:
        return opforge.op("cgtest::triton_add", tags=UNSAFE)(triton_add_body)
    except Exception as e:  # pragma: no cover - depends on the installed triton
        pytest.skip(f"opforge's Triton scan does not run on this machine: {type(e).__name__}: {e}")


@pytest.fixture(scope="module")
def kernels():
    return kernel_library.load()


# --- the tag on the schema ---------------------------------------------------


@pytest.mark.parametrize("op", [scale, per_device], ids=["python_body", "per_device_kernel"])
def test_the_tag_of_a_python_op_is_on_its_schema_and_installs_the_guard(op):
    assert UNSAFE in op.overload.tags
    assert UNSAFE in getattr(torch.ops.cgtest, op.name.split("::")[1]).default.tags
    assert has_guard(op.name)


def test_the_tag_of_a_tvm_ffi_kernel_op_is_on_its_schema_and_installs_the_guard(ffi_scale):
    assert UNSAFE in torch.ops.cgtest.ffi_scale.default.tags
    assert has_guard("cgtest::ffi_scale")
    out = torch.zeros(3)
    ffi_scale(out, torch.arange(3.0), 3.0)
    assert out.tolist() == [0.0, 3.0, 6.0]


def test_the_tag_of_a_triton_op_is_on_its_schema_and_refuses_a_capture_before_the_launch(triton_add, probe):
    assert UNSAFE in torch.ops.cgtest.triton_add.default.tags
    assert has_guard("cgtest::triton_add")
    # One opaque node for Inductor to cut the graph around: its launches are not traced.
    assert triton_add.triton_kernels == ()
    # On CPU the launch itself would fail; the guard refuses the call first.
    with pytest.raises(RuntimeError, match=r"^cgtest::triton_add: .*Nothing was launched"):
        triton_add(torch.ones(4), torch.ones(4))


def test_a_tagged_op_cannot_ask_for_its_triton_kernels_to_be_traced():
    pytest.importorskip("triton")
    with pytest.raises(ValueError, match=r"^cgtest::triton_forced: an op tagged torch.Tag.cudagraph_unsafe stays "
                                         r"opaque to Inductor.*triton='force'"):
        opforge.op("cgtest::triton_forced", tags=UNSAFE, triton="force")(triton_add_body)
    assert not hasattr(torch.ops.cgtest, "triton_forced")


def test_the_cpp_tag_of_the_example_librarys_op_is_on_its_schema_and_installs_the_guard(kernels):
    assert UNSAFE in torch.ops.kernels.scale_by_host.default.tags
    assert has_guard("kernels::scale_by_host")
    assert UNSAFE not in torch.ops.kernels.rms_norm.default.tags
    assert not has_guard("kernels::rms_norm")


def test_an_untagged_op_has_no_guard_and_runs_while_a_capture_is_under_way(probe):
    assert UNSAFE not in untagged.overload.tags
    assert not has_guard("cgtest::untagged")
    out = torch.zeros(2)
    untagged(out, torch.ones(2))
    assert out.tolist() == [2.0, 2.0]
    torch.ops.cgtest.untagged(out, torch.full((2,), 2.0))
    assert out.tolist() == [3.0, 3.0]


# --- a capture that cannot break --------------------------------------------


CALLS = {
    "eager": lambda out, x: scale(out, x, 2.0),
    "torch_ops": lambda out, x: torch.ops.cgtest.scale(out, x, 2.0),
    "flat_call": lambda out, x: _C.FlatCall(scale.overload)(out, x, 2.0),
}


@pytest.mark.parametrize("fast", [True, False], ids=["fast_path", "dispatcher"])
@pytest.mark.parametrize("call", list(CALLS))
def test_a_tagged_op_during_a_plain_capture_is_refused_naming_the_op_before_its_kernel_runs(probe, call, fast):
    out, x = torch.zeros(3), torch.ones(3)
    before = COUNTS["scale"]
    previous = opforge.set_fast_path_enabled(fast)
    try:
        with pytest.raises(RuntimeError) as info:
            CALLS[call](out, x)
    finally:
        opforge.set_fast_path_enabled(previous)
    assert str(info.value).startswith("cgtest::scale: this op is tagged torch.Tag.cudagraph_unsafe")
    assert "Nothing was launched" in str(info.value)
    assert _C.plain_capture_message("cgtest::scale") in str(info.value)
    assert COUNTS["scale"] == before
    assert out.tolist() == [0.0, 0.0, 0.0]


def test_the_cpp_op_during_a_plain_capture_is_refused_and_writes_nothing(kernels, probe):
    out, x = torch.zeros(3), torch.ones(3)
    for call in (kernels.scale_by_host, torch.ops.kernels.scale_by_host):
        with pytest.raises(RuntimeError, match=r"^kernels::scale_by_host: this op is tagged .*Nothing was launched"):
            call(out, x, torch.tensor([4.0]))
    assert out.tolist() == [0.0, 0.0, 0.0]


def test_inside_allow_unsafe_capture_a_tagged_op_runs_as_an_ordinary_call(probe):
    out, x = torch.zeros(3), torch.arange(3.0)
    before = COUNTS["scale"]
    with cg.allow_unsafe_capture():
        with cg.allow_unsafe_capture():
            scale(out, x, 2.0)
        torch.ops.cgtest.scale(out, x, 3.0)
        assert doubled(x).tolist() == [0.0, 2.0, 4.0]
    assert out.tolist() == [0.0, 3.0, 6.0]
    assert COUNTS["scale"] == before + 2
    with pytest.raises(RuntimeError, match="^cgtest::scale: "):  # the opt-out ended with the block
        scale(out, x, 5.0)
    assert out.tolist() == [0.0, 3.0, 6.0]


@pytest.mark.parametrize("setting", [0, -1], ids=["no_capture", "ask_the_device"])
def test_without_a_capture_a_tagged_op_on_cpu_is_an_ordinary_call(setting):
    previous = _C._set_capture_probe(setting)
    try:
        assert _C.capture_underway("cpu") is False
        out, x = torch.zeros(2), torch.ones(2)
        scale(out, x, 4.0)
        assert out.tolist() == [4.0, 4.0]
        torch.ops.cgtest.scale(out, x, 5.0)
        assert out.tolist() == [5.0, 5.0]
        _C.FlatCall(scale.overload)(out, x, 6.0)
        assert out.tolist() == [6.0, 6.0]
        assert doubled(x).tolist() == [2.0, 2.0]
    finally:
        assert _C._set_capture_probe(previous) == setting


# --- an engine's breakable capture -------------------------------------------


@pytest.mark.parametrize("call", list(CALLS))
def test_a_tagged_op_during_an_engines_capture_is_one_eager_break_and_replay_recomputes(probe, engine, call):
    out, x = torch.zeros(3), torch.arange(3.0)
    before = COUNTS["scale"]
    with StepCapture() as capture:
        assert CALLS[call](out, x) is None
    assert len(capture.breaks) == 1
    assert capture.num_segments == 2
    assert COUNTS["scale"] == before + 1
    assert out.tolist() == [0.0, 2.0, 4.0]
    x.copy_(torch.tensor([5.0, 6.0, 7.0]))
    capture.replay()
    assert COUNTS["scale"] == before + 2
    assert out.tolist() == [10.0, 12.0, 14.0]


def test_a_functional_op_breaks_returning_the_static_output_which_replay_rewrites(probe, engine):
    x = torch.arange(3.0)
    with StepCapture() as capture:
        y = doubled(x)
    (call,) = capture.breaks
    assert isinstance(call, _C.CapturedCall)
    assert call.name == "cgtest::doubled" and call.ran
    assert call.outputs is y
    assert y.tolist() == [0.0, 2.0, 4.0]
    ptr = y.data_ptr()
    x.copy_(torch.tensor([1.0, -1.0, 3.0]))
    capture.replay()
    assert y.data_ptr() == ptr
    assert y.tolist() == [2.0, -2.0, 6.0]


def test_the_breaks_of_ops_of_every_python_front_end_replay_on_their_own_kernels(probe, engine, ffi_scale):
    x = torch.arange(3.0)
    out_dev, out_ffi = torch.zeros(3), torch.zeros(3)
    with StepCapture() as capture:
        per_device(out_dev, x)
        ffi_scale(out_ffi, x, 3.0)
    assert [c.name for c in capture.breaks] == ["cgtest::per_device", "cgtest::ffi_scale"]
    assert capture.num_segments == 3
    assert out_dev.tolist() == [10.0, 11.0, 12.0]
    assert out_ffi.tolist() == [0.0, 3.0, 6.0]
    x.fill_(1.0)
    capture.replay()
    assert out_dev.tolist() == [11.0, 11.0, 11.0]
    assert out_ffi.tolist() == [3.0, 3.0, 3.0]


def test_the_cpp_op_breaks_and_its_replay_reads_the_host_value_of_each_step(kernels, probe, engine):
    out, x, host = torch.zeros(3), torch.arange(3.0), torch.tensor([2.0])
    with StepCapture() as capture:
        kernels.scale_by_host(out, x, host)
    assert [c.name for c in capture.breaks] == ["kernels::scale_by_host"]
    assert out.tolist() == [0.0, 2.0, 4.0]
    host.fill_(-1.0)
    capture.replay()
    assert out.tolist() == [0.0, -1.0, -2.0]


def test_replay_of_a_break_whose_return_changes_shape_raises_naming_the_op(probe, engine):
    x, n = torch.arange(4.0), torch.tensor(2)
    with StepCapture() as capture:
        y = first_n(x, n)
    assert y.tolist() == [0.0, 1.0]
    x.add_(1)
    capture.replay()
    assert y.tolist() == [1.0, 2.0]
    n.fill_(3)
    with pytest.raises(RuntimeError, match=r"^cgtest::first_n: return 0 changed at replay \(Float \[3\] on cpu, "
                                           r"captured as Float \[2\] on cpu\)"):
        capture.replay()
    assert y.tolist() == [1.0, 2.0]


def test_replay_of_a_break_whose_returned_list_changes_length_raises_naming_the_op(probe, engine):
    x, n = torch.ones(2), torch.tensor(2)
    with StepCapture() as capture:
        ys = copies(x, n)
    assert [y.tolist() for y in ys] == [[1.0, 1.0], [1.0, 1.0]]
    x.fill_(3.0)
    capture.replay()
    assert [y.tolist() for y in ys] == [[3.0, 3.0], [3.0, 3.0]]
    n.fill_(1)
    with pytest.raises(RuntimeError, match=r"^cgtest::copies: return 0 changed length at replay"):
        capture.replay()


def test_a_recorded_break_takes_no_arguments(probe, engine):
    x = torch.arange(3.0)
    with StepCapture() as capture:
        doubled(x)
    (call,) = capture.breaks
    for args, kwargs in (((x,), {}), ((), {"x": x})):
        with pytest.raises(TypeError, match="^a CapturedCall takes no arguments$"):
            call(*args, **kwargs)


def test_a_struct_parameter_and_a_struct_return_break_and_replay_into_the_structs_tensors(probe, engine):
    x = torch.arange(2.0)
    with StepCapture() as capture:
        parts = affine_parts(x, Affine(3.0, shift=1.0))
    (call,) = capture.breaks
    assert isinstance(parts, Parts)
    assert call.outputs[0] is parts.scaled and call.outputs[1] is parts.shifted
    assert (parts.scaled.tolist(), parts.shifted.tolist()) == ([0.0, 3.0], [1.0, 2.0])
    x.copy_(torch.tensor([2.0, -2.0]))
    capture.replay()  # the struct's fields were recorded as flat leaves: the same scale and shift
    assert (parts.scaled.tolist(), parts.shifted.tolist()) == ([6.0, -6.0], [3.0, -1.0])


def test_inside_an_engines_capture_allow_unsafe_capture_still_breaks(probe, engine):
    out, x = torch.zeros(2), torch.ones(2)
    with StepCapture() as capture, cg.allow_unsafe_capture():
        scale(out, x, 2.0)
    assert [c.name for c in capture.breaks] == ["cgtest::scale"]
    x.fill_(2.0)
    capture.replay()
    assert out.tolist() == [4.0, 4.0]


def test_a_tagged_op_returning_an_int_is_refused_at_capture_naming_the_op(probe, engine):
    with StepCapture() as capture:
        with pytest.raises(RuntimeError, match=r"^cgtest::numel: return 0 is a Int, which a breakable CUDA graph "
                                               r"cannot replay"):
            numel(torch.ones(3))
    assert capture.breaks == []


def test_an_exception_in_the_kernel_during_a_break_propagates_and_the_capture_breaks_again(probe, engine):
    x = torch.zeros(2)
    with StepCapture() as capture:
        with pytest.raises(ValueError, match="cgtest::fails was told to fail"):
            fails(x, True)
        assert capture._capturing and cg.capturing()
        y = fails(x, False)
    assert y.tolist() == [1.0, 1.0]
    assert [c.name for c in capture.breaks] == ["cgtest::fails"]
    x.fill_(4.0)
    capture.replay()
    assert y.tolist() == [5.0, 5.0]


def test_an_add_eager_that_never_calls_the_break_is_an_error_saying_so(probe):
    cg.register_capture(LazyCapture)
    try:
        out = torch.zeros(2)
        with LazyCapture():
            with pytest.raises(RuntimeError, match=r"^cgtest::scale: the breakable capture took the op's eager "
                                                   r"break but did not run it; its add_eager\(fn\) must call fn\(\)"):
                scale(out, torch.ones(2), 2.0)
        assert out.tolist() == [0.0, 0.0]
    finally:
        assert cg.unregister_capture(LazyCapture)


def test_a_capture_on_one_thread_does_not_take_another_threads_calls(probe, engine):
    out, errors = torch.zeros(2), []

    def other():
        try:
            scale(out, torch.ones(2), 2.0)
        except RuntimeError as e:
            errors.append(str(e))

    with StepCapture() as capture:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert capture.breaks == []
    assert len(errors) == 1 and errors[0].startswith("cgtest::scale: this op is tagged")
    assert out.tolist() == [0.0, 0.0]


def test_capturing_is_true_inside_an_engines_open_segment_only(probe, engine):
    seen = []

    @opforge.op("cgtest::sees_capturing", tags=UNSAFE)
    def sees_capturing(x: Tensor) -> Tensor:
        seen.append(cg.capturing())
        return x + 0

    assert cg.capturing() is False
    with StepCapture():
        assert cg.capturing() is True
        sees_capturing(torch.ones(1))
        assert cg.capturing() is True
    assert cg.capturing() is False
    assert seen == [False]  # add_eager closed the segment while the op ran


# --- registering captures ----------------------------------------------------


def test_register_capture_refuses_a_class_without_current_or_add_eager_and_calls_without_both():
    class NoCurrent:
        def add_eager(self, fn):
            return fn()

    class NoAddEager:
        @classmethod
        def current(cls):
            return None

    with pytest.raises(TypeError, match=r"NoCurrent has no current\(\) class method. Pass current="):
        cg.register_capture(NoCurrent)
    with pytest.raises(TypeError, match=r"NoAddEager has no add_eager\(fn\). Pass add_eager="):
        cg.register_capture(NoAddEager)
    with pytest.raises(TypeError, match=r"takes the engine's capture class, or both current= and add_eager="):
        cg.register_capture()
    with pytest.raises(TypeError, match=r"takes the engine's capture class, or both current= and add_eager="):
        cg.register_capture(current=lambda: None)
    with pytest.raises(TypeError, match=r"current=, add_eager= and capturing= must be functions"):
        cg.register_capture(current=lambda: None, add_eager=3)
    names = cg.registered_captures()
    assert not any("NoCurrent" in n or "NoAddEager" in n for n in names)


def test_registered_captures_lists_a_class_once_and_unregister_capture_says_whether_it_was_there():
    cg.register_capture(StepCapture)
    cg.register_capture(StepCapture)
    try:
        name = f"{__name__}.StepCapture"
        assert cg.registered_captures().count(name) == 1
    finally:
        assert cg.unregister_capture(StepCapture) is True
    assert cg.unregister_capture(StepCapture) is False
    assert f"{__name__}.StepCapture" not in cg.registered_captures()


def test_an_engine_registered_as_functions_takes_the_break(probe):
    active, taken = [], []

    def run_eager(capture, fn):
        taken.append(capture)
        return fn()

    def current():
        return active[0] if active else None

    cg.register_capture(current=current, add_eager=run_eager, name="fn_engine")
    try:
        assert "fn_engine" in cg.registered_captures()
        out = torch.zeros(2)
        active.append("capture-1")
        scale(out, torch.ones(2), 7.0)
        assert taken == ["capture-1"]
        assert out.tolist() == [7.0, 7.0]
        active.clear()
        with pytest.raises(RuntimeError, match="^cgtest::scale: "):  # nothing captures: refused
            scale(out, torch.ones(2), 8.0)
        assert out.tolist() == [7.0, 7.0]
    finally:
        assert cg.unregister_capture(current) is True
    assert "fn_engine" not in cg.registered_captures()


def test_a_function_engine_whose_capturing_says_no_segment_is_open_does_not_take_the_break(probe):
    def current():
        return "capture"

    cg.register_capture(current=current, add_eager=lambda capture, fn: fn(), capturing=lambda capture: False)
    try:
        with pytest.raises(RuntimeError, match="^cgtest::scale: "):
            scale(torch.zeros(2), torch.ones(2), 2.0)
    finally:
        assert cg.unregister_capture(current) is True


def test_vllms_capture_class_is_honored_once_its_module_is_imported(probe, monkeypatch):
    class BreakableCUDAGraphCapture(StepCapture):
        _tls = threading.local()

    module = types.ModuleType("vllm.compilation.breakable_cudagraph")
    module.BreakableCUDAGraphCapture = BreakableCUDAGraphCapture
    monkeypatch.setitem(sys.modules, "vllm.compilation.breakable_cudagraph", module)
    try:
        out, x = torch.zeros(2), torch.ones(2)
        with BreakableCUDAGraphCapture() as capture:
            scale(out, x, 3.0)
        assert [c.name for c in capture.breaks] == ["cgtest::scale"]
        assert out.tolist() == [3.0, 3.0]
        assert f"{__name__}.{BreakableCUDAGraphCapture.__qualname__}" in cg.registered_captures()
    finally:
        assert cg.unregister_capture(BreakableCUDAGraphCapture) is True


# --- BreakableGraph on a machine without CUDA --------------------------------


needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")


@needs_no_cuda
def test_breakable_graph_capture_says_it_needs_cuda():
    g = cg.BreakableGraph()
    with pytest.raises(RuntimeError, match=r"BreakableGraph.capture needs a CUDA device; "
                                           r"torch.cuda.is_available\(\) is False"):
        g.capture(lambda x: x + 1, torch.ones(2))
    assert repr(g) == "<opforge.cuda_graphs.BreakableGraph empty: 0 segments, 0 breaks>"
    with pytest.raises(TypeError, match="takes the callable to capture, not int"):
        g.capture(3)
    with pytest.raises(ValueError, match="warmup must be a non-negative int, not -1"):
        g.capture(lambda: None, warmup=-1)


def test_breakable_graph_replay_before_a_capture_says_nothing_is_captured():
    with pytest.raises(RuntimeError, match=r"BreakableGraph.replay: nothing is captured"):
        cg.BreakableGraph().replay()


def test_breakable_graph_inside_an_engines_capture_is_refused_naming_both(engine):
    with StepCapture() as capture:
        with pytest.raises(RuntimeError) as info:
            cg.BreakableGraph().capture(lambda x: x, torch.ones(1))
    message = str(info.value)
    assert message.startswith(f"BreakableGraph.capture: {__name__}.StepCapture is capturing on this thread "
                              f"({capture!r})")
    assert "<opforge.cuda_graphs.BreakableGraph empty: 0 segments, 0 breaks> cannot capture inside it" in message
    assert "Captures do not nest" in message

