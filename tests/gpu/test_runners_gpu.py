"""Runner handles in CUDA graphs: 64 layers, a runner each, every layer
compiled with mode="reduce-overhead" (Inductor + CUDA graph trees).

    python -m pytest tests/gpu/test_runners_gpu.py -v

One Dynamo graph serves all 64 layers; CUDA graph trees record one CUDA graph
per distinct handle value (a handle is an int input of the graph, like a
size), so each layer replays the kernels of its own runner. A replay runs no
Python: the runners' `calls` counters show that replays happened.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

from op_testing import fresh_dynamo, graph_breaks, load_test_extension, ns  # noqa: E402,F401
from runner_models import (CppRunnerLayer, PythonRunnerLayer, compile_layers, compiled_graphs,  # noqa: E402
                           define_gemm, run, run_uncompiled)
from torch.testing import assert_close  # noqa: E402

from opforge import handles  # noqa: E402

LAYERS = 64
DIM = 64
STEPS = 5


@pytest.fixture(autouse=True)
def quiet_cudagraph_trees(monkeypatch):
    """64 handles are 64 int keys: CUDA graph trees warn past 8 by default."""
    from torch._inductor import config

    monkeypatch.setattr(config.triton, "cudagraph_dynamic_shape_warn_limit", None)


def batches():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, DIM, generator=g).cuda() for _ in range(STEPS)]


def compiled_steps(layers, xs):
    """Runs the compiled layers once per input; cudagraph outputs are
    overwritten by the next replay, so each is cloned."""
    out = []
    for x in xs:
        torch.compiler.cudagraph_mark_step_begin()
        out.append(run(layers, x).clone())
    torch.cuda.synchronize()
    return out


def test_64_layers_of_a_python_op_with_runners_replay_in_cuda_graphs(ns):
    from torch._dynamo.utils import counters

    gemm = define_gemm(ns)
    layers = [PythonRunnerLayer(gemm, DIM, seed=i, device="cuda", register=True) for i in range(LAYERS)]
    xs = batches()
    print(f"torch {torch.__version__}, handle compile mode {handles.compile_mode()!r}")
    with torch.no_grad(), fresh_dynamo():
        eager = [run(layers, x) for x in xs]
        for layer in layers:
            layer.runner.calls = 0
        compile_layers(layers, mode="reduce-overhead")
        compiled = compiled_steps(layers, xs)
        assert compiled_graphs() <= 2
        assert graph_breaks() == 0
        assert counters["inductor"]["cudagraph_skips"] == 0
    for got, want in zip(compiled, eager):
        assert_close(got, want, rtol=1e-3, atol=1e-3)
    calls = [layer.runner.calls for layer in layers]
    assert min(calls) >= 1, "every layer ran its own runner at least once (warm-up or recording)"
    assert max(calls) < STEPS, f"later steps replayed CUDA graphs without running Python: {calls}"


def test_a_model_whose_first_call_is_compiled_replays_in_cuda_graphs(ns):
    # No eager call and no registration by hand: each runner registered
    # itself when its layer made it, on any torch (2.11 cannot register one
    # while tracing).
    gemm = define_gemm(ns)
    layers = [PythonRunnerLayer(gemm, DIM, seed=i, device="cuda") for i in range(LAYERS)]
    xs = batches()
    with torch.no_grad(), fresh_dynamo():
        compile_layers(layers, mode="reduce-overhead")
        compiled = compiled_steps(layers, xs)
        assert compiled_graphs() == 1
        assert graph_breaks() == 0
        eager = [run_uncompiled(layers, x) for x in xs]
    for got, want in zip(compiled, eager):
        assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_a_released_runner_records_again_and_replays_its_own_kernels(ns):
    gemm = define_gemm(ns)
    layers = [PythonRunnerLayer(gemm, DIM, seed=i, device="cuda", register=True) for i in range(8)]
    xs = batches()
    with torch.no_grad(), fresh_dynamo():
        eager = [run(layers, x) for x in xs]
        compile_layers(layers, mode="reduce-overhead")
        compiled_steps(layers, xs)
        handles.release(layers[5].runner)
        again = compiled_steps(layers, xs)
        assert compiled_graphs() <= 2
    for got, want in zip(again, eager):
        assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_64_layers_of_a_cpp_op_with_a_handle_replay_in_cuda_graphs():
    ext = load_test_extension()
    torch.manual_seed(0)
    layers = [CppRunnerLayer(ext, DIM, factor=0.5 + i / LAYERS, device="cuda") for i in range(LAYERS)]
    xs = batches()
    with torch.no_grad(), fresh_dynamo():
        eager = [run(layers, x) for x in xs]
        compile_layers(layers, mode="reduce-overhead")
        compiled = compiled_steps(layers, xs)
        assert compiled_graphs() <= 2
        assert graph_breaks() == 0
    for got, want in zip(compiled, eager):
        assert_close(got, want, rtol=1e-3, atol=1e-3)
    for layer in layers:
        handles.release(layer.runner)
