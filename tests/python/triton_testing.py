"""Graph capture for Triton op tests on CPU: the forward and backward graphs
AOTAutograd hands to Inductor, captured without running them (kernels
cannot run on CPU)."""

import contextlib
import functools
import logging
import os

import pytest
import torch
import triton
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import default_partition
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table


class _Captured(Exception):
    pass


@contextlib.contextmanager
def _quiet():
    # Without a GPU driver torch cannot analyse which arguments a kernel
    # writes and says so at warning level; it then assumes all of them.
    log = logging.getLogger("torch._dynamo")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def graphs(fn, *args, dynamic=None) -> dict:
    """{'forward': gm, 'backward': gm} for fn(*args) (backward only when an
    output requires grad), as Inductor would receive them."""
    out = {}

    def partition(joint, inputs, **kwargs):
        fw, bw = default_partition(joint, inputs, **kwargs)
        out["forward"], out["backward"] = fw, bw
        raise _Captured

    def fw_compiler(gm, example_inputs):
        out.setdefault("forward", gm)
        raise _Captured

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=fw_compiler, partition_fn=partition),
                             fullgraph=True, dynamic=dynamic)
    with _quiet():
        try:
            compiled(*args)
        except Exception:
            if not out:
                raise
    return out


def compile_error(fn, *args) -> BaseException:
    """The exception torch.compile(fn, fullgraph=True)(*args) raises while tracing."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=lambda gm, _: gm), fullgraph=True)
    with _quiet():
        try:
            compiled(*args)
        except Exception as e:  # noqa: BLE001 - the caller inspects it
            return e
    raise AssertionError("torch.compile succeeded")


def chain_text(e: BaseException) -> str:
    """The messages of an exception and of those it was raised from or during."""
    parts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        parts.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return "\n".join(parts)


def kernel_nodes(gm) -> list:
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and "triton_kernel_wrapper" in getattr(n.target, "__name__", str(n.target))]


def jit_function(kernel):
    """The user's @triton.jit function under a kernel's layers (a launcher's,
    autotune's, heuristics'), also behind the copy opforge hands Inductor
    when the kernel calls helpers through a module."""
    from opforge.triton import _flatten

    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn
    return _flatten.original(kernel)


def graph_kernels(gm) -> list:
    """The user's @triton.jit functions the graph launches, in order."""
    return [jit_function(kernel_side_table.get_kernel(n.kwargs["kernel_idx"])) for n in kernel_nodes(gm)]


def launch_arguments(node) -> dict:
    """Every argument of a kernel node: graph values and side-table constants."""
    return {**node.kwargs["kwargs"], **kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"])}


def calls(gm, op) -> bool:
    return any(n.target is op.overload for n in gm.graph.nodes)


class TargetOnlyDriver:
    """A Triton driver that only names a GPU target: enough to build a
    kernel's IR, which torch's kernel mutation analysis reads, on a machine
    without a GPU."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


@contextlib.contextmanager
def mutation_analysis_on_cpu():
    """opforge's check for undeclared kernel writes, run with a GPU target
    named for the analysis alone (nothing else sees the stand-in driver)."""
    from opforge.triton import _writes

    analyse, ready = _writes._analyse, _writes._driver_ready

    def with_target(jit, args):
        config = triton.runtime.driver
        previous = config._active
        config.set_active(TargetOnlyDriver())
        try:
            return analyse(jit, args)
        finally:
            config._active = previous

    _writes._analyse, _writes._driver_ready = with_target, lambda: True
    try:
        yield
    finally:
        _writes._analyse, _writes._driver_ready = analyse, ready


class RecordingInductor:
    """torch.compile's Inductor backend, recording the graphs AOTAutograd
    hands it (forward first, backward at the first backward call)."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        def inner_compile(graph_module, inputs, *args, **kwargs):
            self.graphs.append(graph_module)
            return compile_fx_inner(graph_module, inputs, *args, **kwargs)

        return compile_fx(gm, example_inputs, inner_compile=inner_compile)

    def kernel_nodes(self, index=0):
        return kernel_nodes(self.graphs[index])

    def kernels(self, index=0):
        """The user's @triton.jit functions graph `index` launches (0: forward)."""
        return graph_kernels(self.graphs[index])

    def calls(self, op, index=0):
        return calls(self.graphs[index], op)


def interpreted_helpers(check):
    """(the triton_helpers package built for Triton's interpreter, None), or
    (None, why the interpreter cannot run here). `check(package)` runs a
    kernel of it and says whether the result is right."""
    import triton_helpers

    try:
        package = triton_helpers.load_interpreted()
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            right = check(package)
        finally:
            os.environ.pop("TRITON_INTERPRET", None)
        if not right:
            return None, "Triton's interpreter computed a wrong result on this torch/triton"
        return package, None
    except Exception as e:  # pragma: no cover - depends on the installed versions
        return None, f"Triton's interpreter does not run with this torch/triton: {type(e).__name__}: {e}"


def interpreter_fixture(check):
    """A pytest fixture giving the interpreted triton_helpers package, with
    TRITON_INTERPRET=1 set for the test, or skipping it with the reason."""
    loaded = functools.lru_cache(maxsize=None)(lambda: interpreted_helpers(check))

    @pytest.fixture
    def interp(monkeypatch):
        package, reason = loaded()
        if package is None:
            pytest.skip(reason)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        return package

    return interp
