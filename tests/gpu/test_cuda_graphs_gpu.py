"""Breakable CUDA graphs on a GPU (docs/cuda_graphs.md): a 32-layer model
whose every layer has captured ops (Python, C++, Triton) and one op tagged
cudagraph_unsafe that reads a host value per call, for each kernel kind of
the tagged op. opforge's BreakableGraph and a capture with vLLM's protocol
replay bitwise equal to eager over 5 replays with changed inputs and host
values; a plain torch.cuda.graph capture is refused; reduce-overhead keeps
the tagged op out of its CUDA graphs.

    python -m pytest tests/gpu/test_cuda_graphs_gpu.py -v
    OPFORGE_KERNELS=stable python -m pytest tests/gpu/test_cuda_graphs_gpu.py -v -k cpp   # the C++ op, stable ABI
"""

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

if torch.cuda.is_available():
    import opforge  # noqa: E402
    from opforge import cuda_graphs  # noqa: E402

    import cuda_graph_models as models  # noqa: E402

KINDS = ["python", "cpp", "triton",
         pytest.param("tvm_ffi", marks=pytest.mark.skipif(importlib.util.find_spec("tvm_ffi") is None,
                                                          reason="needs apache-tvm-ffi"))]
REPLAYS = 5


@pytest.fixture
def protocol():
    cuda_graphs.register_capture(models.ProtocolCapture)
    yield models.ProtocolCapture
    cuda_graphs.unregister_capture(models.ProtocolCapture)


def new_input(step, like=None):
    g = torch.Generator(device="cuda").manual_seed(100 + step)
    return torch.randn(8, 256, device="cuda", generator=g)


@pytest.mark.parametrize("kind", KINDS)
def test_breakable_graph_replays_bitwise_equal_to_eager_with_changed_inputs_and_host_values(kind):
    model = models.Model(kind)
    x = new_input(0)
    graph = cuda_graphs.BreakableGraph()
    out = graph.capture(model, x)
    # A segment before each break; the model ends with a break, so nothing after the last.
    assert (graph.num_breaks, graph.num_segments) == (models.LAYERS, models.LAYERS)
    for step in range(1, REPLAYS + 1):
        x.copy_(new_input(step))
        model.set_host(step)
        graph.replay()
        expected = model(x)
        torch.cuda.synchronize()
        assert torch.equal(out, expected), f"{kind}: replay {step} differs from eager"
    graph.release()
    with pytest.raises(RuntimeError, match="nothing is captured"):
        graph.replay()


@pytest.mark.parametrize("kind", KINDS)
def test_a_capture_with_vllms_protocol_breaks_at_the_tagged_op_with_no_decorator(kind, protocol):
    model = models.Model(kind)
    x = new_input(0)
    model(x)  # warm-up, as an engine does before capturing
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    capture = protocol(pool=torch.cuda.graph_pool_handle())
    with torch.cuda.stream(stream):
        with capture:
            out = model(x)
    torch.cuda.current_stream().wait_stream(stream)
    assert capture.num_eager_breaks == models.LAYERS
    for step in range(1, REPLAYS + 1):
        x.copy_(new_input(step))
        model.set_host(step)
        capture.replay()
        expected = model(x)
        torch.cuda.synchronize()
        assert torch.equal(out, expected), f"{kind}: replay {step} differs from eager"


@pytest.mark.parametrize("kind", KINDS)
def test_a_plain_cuda_graph_capture_of_the_model_is_refused_naming_the_op(kind):
    model = models.Model(kind)
    x = new_input(0)
    model(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"cudagraph_unsafe.*Nothing was launched"):
        with torch.cuda.graph(graph):
            model(x)
    assert not torch.cuda.is_current_stream_capturing()
    # The stream and the allocator are fine: a breakable capture works next.
    breakable = cuda_graphs.BreakableGraph()
    out = breakable.capture(model, x)
    model.set_host(3)
    breakable.replay()
    assert torch.equal(out, model(x))


def test_allow_unsafe_capture_captures_the_op_as_it_is():
    model = models.Model("python", layers=2)
    x = new_input(0)
    model(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), cuda_graphs.allow_unsafe_capture():
        out = model(x)
    graph.replay()
    assert torch.equal(out, model(x))  # same host values: the capture's are right


@pytest.mark.parametrize("kind", KINDS)
def test_reduce_overhead_compile_keeps_the_tagged_op_out_of_its_cuda_graphs(kind, fresh_compile, monkeypatch):
    from torch._inductor import config

    if hasattr(config, "graph_partition"):
        monkeypatch.setattr(config, "graph_partition", True)
    model = models.Model(kind, layers=4)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for step in range(REPLAYS + 2):
        x = new_input(step)
        model.set_host(step)
        got = compiled(x).clone()
        assert torch.equal(got, model(x)) or torch.allclose(got, model(x), rtol=1e-6, atol=1e-6), \
            f"{kind}: compiled step {step} differs from eager"
    # The model did run in CUDA graphs: a skip would make the values above prove nothing.
    skips = {k: v for k, v in torch._dynamo.utils.counters["inductor"].items() if "cudagraph_skip" in k}
    assert not any(skips.values()), skips


def test_a_functional_tagged_op_replays_into_its_static_output():
    model = models.Model("python")
    model.functional = True
    x = new_input(0)
    graph = cuda_graphs.BreakableGraph()
    out = graph.capture(model, x)
    ptr = out.data_ptr()
    assert graph.num_breaks == models.LAYERS
    for step in range(1, REPLAYS + 1):
        x.copy_(new_input(step))
        model.set_host(step)
        graph.replay()
        assert out.data_ptr() == ptr
        assert torch.equal(out, model(x))


def test_an_error_in_an_eager_break_leaves_no_capture_open():
    calls = {"n": 0}

    @opforge.op("cg_gpu::fails_second", mutates_args=("out",), tags=cuda_graphs.UNSAFE)
    def fails_second(out: torch.Tensor, x: torch.Tensor) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise ValueError("kernel refused")
        out.copy_(x)

    def fn(x):
        y = x * 2
        out = torch.empty_like(y)
        fails_second(out, y)
        return out + 1

    x = new_input(0)
    graph = cuda_graphs.BreakableGraph()
    with pytest.raises(ValueError, match="kernel refused"):
        graph.capture(fn, x)  # warm-up is call 1, the capture's break call 2
    assert not torch.cuda.is_current_stream_capturing()
    assert not cuda_graphs.capturing()
    out = graph.capture(fn, x)
    x.copy_(new_input(1))
    graph.replay()
    assert torch.equal(out, x * 2 + 1)
    # Nested captures are refused, naming both.
    with pytest.raises(RuntimeError, match="do not nest"):
        cuda_graphs.BreakableGraph().capture(lambda t: graph.capture(fn, t), x)


def test_a_tagged_op_on_cpu_tensors_or_outside_a_capture_is_an_ordinary_call():
    out, x = torch.empty(4), torch.arange(4.0)
    models.scale_py(out, x, torch.tensor([2.0]))
    assert torch.equal(out, x * 2)
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        y = torch.ones(4, device="cuda") * 3
        models.scale_py(out, x, torch.tensor([5.0]))  # CPU tensors: nothing of it is captured
    assert torch.equal(out, x * 5)
    graph.replay()
    assert torch.equal(y, torch.full((4,), 3.0, device="cuda"))
