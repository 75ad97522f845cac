"""A CuTe DSL kernel compiled with --enable-tvm-ffi as an op's kernel
(docs/tvm_ffi.md#cute-dsl): eager, compiled, in a CUDA graph, on the
environment stream TVM-FFI takes from torch's current stream."""

import os
import sys

import pytest
import torch
from torch import Tensor

pytest.importorskip("tvm_ffi")
cute = pytest.importorskip("cutlass.cute")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import opforge  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "benchmarks"))
import bench_tvm_ffi_cute as bench  # noqa: E402
from bench_tvm_ffi_cute import Shift  # noqa: E402


@pytest.fixture(scope="module")
def compiled():
    return bench.build()  # out = a + c over a 1-D float32 tensor, on TVM-FFI's environment stream


@pytest.fixture(scope="module")
def add(compiled):
    @opforge.op("cute_ffi::add", mutates_args=("out",), kernel={"cuda": compiled})
    def add(x: Tensor, out: Tensor, shift: Shift) -> None:
        """out = x + shift.value, by a CuTe DSL kernel."""

    return add


def test_the_cute_kernel_runs_as_an_op_eagerly_and_through_torch_ops(compiled, add):
    x = torch.randn(1000, device="cuda")
    out = torch.full_like(x, float("nan"))
    add(x, out, Shift(2.5))
    torch.testing.assert_close(out, x + 2.5)
    torch.ops.cute_ffi.add(x, out, -1.0)
    torch.testing.assert_close(out, x - 1.0)
    direct = torch.empty_like(x)
    compiled(x, direct, 2.5)
    torch.testing.assert_close(direct, x + 2.5)


def test_the_cute_op_compiles_with_inductor(add, fresh_compile):
    x = torch.randn(512, device="cuda")

    def step(x):
        out = torch.empty_like(x)
        add(x * 2, out, Shift(0.5))
        return out.relu()

    torch.testing.assert_close(torch.compile(step, fullgraph=True)(x), step(x))


def test_a_cuda_graph_replays_the_cute_op(add):
    x = torch.randn(4096, device="cuda")
    out = torch.empty_like(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        add(x, out, Shift(3.0))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add(x, out, Shift(3.0))
    x.copy_(torch.randn_like(x))
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + 3.0)
