"""Breakable CUDA graphs: ops that cannot be captured, and the captures that
honor them (docs/cuda_graphs.md).

An op says once that it cannot be captured, with torch's tag:

    @opforge.op("mylib::paged_attn", mutates_args=("out",), tags=torch.Tag.cudagraph_unsafe)
    def paged_attn(q: Tensor, kv: Tensor, seq_lens: Tensor, out: Tensor) -> None: ...

    m.def("paged_attn(Tensor q, Tensor kv, Tensor seq_lens, Tensor! out) -> ()", &PagedAttn)
        .tag("cudagraph_unsafe");                                   // OPFORGE_LIBRARY, either ABI

Every capture then honors it:

    g = opforge.cuda_graphs.BreakableGraph()
    out = g.capture(model, x)      # graph segments, split where a tagged op runs eagerly
    x.copy_(next_x); g.replay()    # `out` holds the new step's result
    g.num_segments, g.num_breaks   # (33, 32) for 32 tagged layers

An engine's breakable capture (vLLM's BreakableCUDAGraphCapture, or any
class with its protocol) takes the breaks with no decorator at the call
site; a plain `torch.cuda.graph` capture refuses a tagged op with an error
naming it, before it launches anything.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import _C

#: torch's tag for an op that cannot be captured into a CUDA graph.
UNSAFE = torch.Tag.cudagraph_unsafe

_tls = threading.local()  # .active: the BreakableGraph capturing on this thread; .allow: allow_unsafe_capture depth


@dataclass(frozen=True)
class _Engine:
    """How opforge asks one engine's capture class whether it captures, and hands it a break."""

    name: str
    current: Callable[[], Any]  # the capture under way on this thread, or None
    capturing: Callable[[Any], bool]  # whether that capture has a graph segment open
    add_eager: Callable[[Any, Callable[[], Any]], Any]  # ends the segment, runs fn, records it, starts the next
    key: Any


_ENGINES: list[_Engine] = []
_ENGINES_LOCK = threading.Lock()
# vLLM's breakable capture, registered the first time a tagged op meets a
# capture while one of these modules is imported.
_KNOWN_ENGINES = (
    ("vllm.compilation.breakable_cudagraph", "BreakableCUDAGraphCapture"),
    ("vllm.backends.compiler.breakable_cudagraph", "BreakableCUDAGraphCapture"),
)


def register_capture(cls: type | None = None, *, current: Callable[[], Any] | None = None,
                     add_eager: Callable[[Any, Callable[[], Any]], Any] | None = None,
                     capturing: Callable[[Any], bool] | None = None, name: str | None = None) -> None:
    """Makes an engine's breakable capture known, so that a cudagraph_unsafe
    op called while it captures breaks there (no decorator at the call site).

        register_capture(BreakableCUDAGraphCapture)   # vLLM's protocol: cls.current(), obj.add_eager(fn)
        register_capture(current=my_engine.active_capture,
                         add_eager=lambda cap, fn: cap.run_eager(fn), name="my_engine")

    With a class: `cls.current()` gives the capture under way on this thread
    (or None), `capture.add_eager(fn)` ends its segment, runs `fn()` and
    records it for replay, and `capture._capturing` (where it exists) says
    whether a segment is open. Without a class, `current` and `add_eager`
    say the same as functions. vLLM's class is registered by itself once
    vLLM is imported. Registering a class twice does nothing."""
    if cls is not None:
        if current is None:
            current = getattr(cls, "current", None)
            if not callable(current):
                raise TypeError(f"opforge.cuda_graphs.register_capture: {cls.__qualname__} has no current() "
                                f"class method. Pass current= (a function giving the capture under way or None).")
        if add_eager is None:
            if not callable(getattr(cls, "add_eager", None)):
                raise TypeError(f"opforge.cuda_graphs.register_capture: {cls.__qualname__} has no add_eager(fn). "
                                f"Pass add_eager= (a function (capture, fn) that runs fn as an eager break).")
            add_eager = _call_add_eager
        name = name or f"{cls.__module__}.{cls.__qualname__}"
    elif current is None or add_eager is None:
        raise TypeError("opforge.cuda_graphs.register_capture takes the engine's capture class, or both current= "
                        "and add_eager= functions.")
    if not callable(current) or not callable(add_eager) or (capturing is not None and not callable(capturing)):
        raise TypeError("opforge.cuda_graphs.register_capture: current=, add_eager= and capturing= must be "
                        "functions.")
    key = cls if cls is not None else (current, add_eager)
    engine = _Engine(name or getattr(current, "__qualname__", "engine"), current, capturing or _segment_open,
                     add_eager, key)
    with _ENGINES_LOCK:
        if not any(e.key == key for e in _ENGINES):
            _ENGINES.append(engine)


def unregister_capture(cls_or_current) -> bool:
    """Forgets a capture registered with register_capture; True if it was registered."""
    with _ENGINES_LOCK:
        for i, e in enumerate(_ENGINES):
            if e.key is cls_or_current or (isinstance(e.key, tuple) and e.key[0] is cls_or_current):
                del _ENGINES[i]
                return True
    return False


def registered_captures() -> list[str]:
    """The names of the engines' captures opforge honors."""
    _register_known_engines()
    return [e.name for e in _ENGINES]


def _call_add_eager(capture, fn):
    return capture.add_eager(fn)


def _segment_open(capture) -> bool:
    return bool(getattr(capture, "_capturing", True))


def _register_known_engines() -> None:
    for module_name, cls_name in _KNOWN_ENGINES:
        module = sys.modules.get(module_name)
        cls = getattr(module, cls_name, None) if module is not None else None
        if cls is not None and not any(e.key is cls for e in _ENGINES):
            register_capture(cls)


def _engine_capture():
    """(engine, capture) for the engine capture with a segment open on this thread, or None."""
    _register_known_engines()
    for engine in tuple(_ENGINES):
        capture = engine.current()
        if capture is not None and engine.capturing(capture):
            return engine, capture
    return None


@contextlib.contextmanager
def allow_unsafe_capture():
    """Inside it, a cudagraph_unsafe op called during a plain capture is
    captured as it is (no error). For authors who know the op is safe for the
    capture at hand; a breakable capture still breaks there.

        with torch.cuda.graph(g), opforge.cuda_graphs.allow_unsafe_capture():
            model(x)
    """
    _tls.allow = getattr(_tls, "allow", 0) + 1
    try:
        yield
    finally:
        _tls.allow -= 1


def _on_break(name: str, call) -> bool | None:
    """A cudagraph_unsafe op `name` called while its stream captures (the
    torch layer's guard, before any launch): a breakable capture runs `call`
    as an eager break, else the call is refused."""
    active = getattr(_tls, "active", None)
    if active is not None and active._open:
        active._break(call)
        return True
    found = _engine_capture()
    if found is not None:
        engine, capture = found
        engine.add_eager(capture, call)
        return True
    if getattr(_tls, "allow", 0):
        return None
    raise RuntimeError(_C.plain_capture_message(name))


_C.set_capture_break(_on_break)


class BreakableGraph:
    """One stream capture of a callable, cut into CUDA graph segments where a
    cudagraph_unsafe op runs eagerly; replay runs the segments and the eager
    breaks in order, on the capture's static tensors.

        g = BreakableGraph()
        out = g.capture(model, x)       # warm-up call(s), then the capture
        x.copy_(x2); g.replay()         # out now holds model(x2)
        g.release()                     # frees the graphs and the static tensors

    The graphs share one memory pool (`pool=`, else a new one per capture).
    The capture keeps its inputs, outputs and every break's arguments alive
    until it is released or captured again."""

    def __init__(self, *, pool=None):
        self._pool_arg = pool
        self._reset()

    def _reset(self) -> None:
        self._graphs: list = []
        self._replays: tuple = ()
        self._segments: list = []
        self._kept: tuple = ()
        self._graph = None
        self._open = False
        self._captured = False
        self.outputs = None
        self.num_segments = 0
        self.num_breaks = 0

    def __repr__(self) -> str:
        state = "captured" if self._captured else "empty"
        return f"<opforge.cuda_graphs.BreakableGraph {state}: {self.num_segments} segments, {self.num_breaks} breaks>"

    def capture(self, fn: Callable, *args, warmup: int = 1, **kwargs):
        """Runs `fn(*args, **kwargs)` `warmup` times eagerly, then captures
        one call of it; returns that call's outputs (the static outputs,
        which each replay rewrites). Capturing again releases the previous
        capture first."""
        if not callable(fn):
            raise TypeError(f"BreakableGraph.capture takes the callable to capture, not {type(fn).__name__}.")
        if not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"BreakableGraph.capture: warmup must be a non-negative int, not {warmup!r}.")
        _refuse_nesting(self)
        if not torch.cuda.is_available():
            raise RuntimeError("BreakableGraph.capture needs a CUDA device; torch.cuda.is_available() is False.")
        self.release()
        pool = self._pool_arg if self._pool_arg is not None else torch.cuda.graph_pool_handle()
        caller = torch.cuda.current_stream()
        stream = torch.cuda.Stream()
        stream.wait_stream(caller)
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn(*args, **kwargs)
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        self._pool = pool
        with torch.cuda.stream(stream):  # a capture ends on the stream it began on, also after an error
            _tls.active = self
            try:
                self._begin()
                out = fn(*args, **kwargs)
                self._end()
            except BaseException:
                self._abort()
                raise
            finally:
                _tls.active = None
        caller.wait_stream(stream)
        self._replays = tuple(self._segments)
        self._kept = (args, kwargs)
        self.outputs = out
        self._captured = True
        return out

    def replay(self) -> None:
        """Runs the captured segments and eager breaks in order, on the current stream."""
        if not self._captured:
            raise RuntimeError("BreakableGraph.replay: nothing is captured (never captured, released, or the "
                               "capture failed). Call capture(fn, *static_inputs) first.")
        for step in self._replays:
            step()

    def release(self) -> None:
        """Frees the graphs and lets the static tensors go; replay then raises until the next capture."""
        for g in self._graphs:
            g.reset()
        self._reset()

    def _begin(self) -> None:
        g = torch.cuda.CUDAGraph()
        g.capture_begin(pool=self._pool)
        self._graph = g
        self._open = True

    def _end(self) -> "torch.cuda.CUDAGraph | None":
        g, self._graph, self._open = self._graph, None, False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            g.capture_end()
        if any("empty" in str(w.message) for w in caught):
            return None  # two breaks in a row: nothing to replay between them
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self._graphs.append(g)
        self._segments.append(g.replay)
        self.num_segments += 1
        return g

    def _break(self, call) -> None:
        """A tagged op's eager break: the segment ends, `call` runs and is
        recorded, a new segment begins. The segment just captured runs once
        first, so the break sees at capture the values it sees at replay: an
        op that is a break because it reads its inputs on the host (a
        nonzero's count, an `.item()`) decides the shapes the next segments
        are captured with from real values, not from memory no kernel wrote."""
        g = self._end()
        if g is not None:
            g.replay()
        call()
        self._segments.append(call)
        self.num_breaks += 1
        self._begin()

    def _abort(self) -> None:
        """After an error during capture: the open segment's capture is ended
        (its graph dropped) and nothing of this capture is kept."""
        if self._open:
            self._open = False
            try:
                self._graph.capture_end()
            except Exception:  # an invalidated capture: ending it is all that matters
                pass
        self.release()


def _refuse_nesting(graph: BreakableGraph) -> None:
    active = getattr(_tls, "active", None)
    if active is not None:
        raise RuntimeError(f"BreakableGraph.capture: {active!r} is capturing on this thread, and {graph!r} cannot "
                           f"capture inside it. Captures do not nest: capture one after the other.")
    found = _engine_capture()
    if found is not None:
        raise RuntimeError(f"BreakableGraph.capture: {found[0].name} is capturing on this thread ({found[1]!r}), "
                           f"and {graph!r} cannot capture inside it. Captures do not nest: capture one after the "
                           f"other.")
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"BreakableGraph.capture: the current CUDA stream is already being captured (a "
                           f"torch.cuda.graph or other capture), and {graph!r} cannot capture inside it. Captures "
                           f"do not nest: capture one after the other.")


def capturing() -> bool:
    """Whether a breakable capture (opforge's or a registered engine's) has a segment open on this thread."""
    active = getattr(_tls, "active", None)
    return (active is not None and active._open) or _engine_capture() is not None


__all__ = ["UNSAFE", "BreakableGraph", "allow_unsafe_capture", "capturing", "register_capture",
           "registered_captures", "unregister_capture"]
