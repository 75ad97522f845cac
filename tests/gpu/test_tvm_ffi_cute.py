"""A CuTe DSL kernel compiled with --enable-tvm-ffi as an op's kernel
(docs/tvm_ffi.md#cute-dsl): eager, compiled, in a CUDA graph, on the
environment stream TVM-FFI takes from torch's current stream."""

import dataclasses

import pytest
import torch
from torch import Tensor

pytest.importorskip("tvm_ffi")
cute = pytest.importorskip("cutlass.cute")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import opforge  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Shift:
    value: float = 1.0


@cute.kernel
def _add_kernel(a: cute.Tensor, b: cute.Tensor, c: cute.Float32):
    cta, _, _ = cute.arch.block_idx()
    tid, _, _ = cute.arch.thread_idx()
    i = cta * 128 + tid
    if i < a.shape[0]:
        b[i] = a[i] + c


@cute.jit
def _add(a: cute.Tensor, b: cute.Tensor, c: cute.Float32, stream):
    n = a.shape[0]
    _add_kernel(a, b, c).launch(grid=((n + 127) // 128, 1, 1), block=(128, 1, 1), stream=stream)


@pytest.fixture(scope="module")
def compiled():
    n = cute.sym_int()
    a = cute.runtime.make_fake_compact_tensor(cute.Float32, (n,))
    b = cute.runtime.make_fake_compact_tensor(cute.Float32, (n,))
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(_add, a, b, cute.Float32(0.0), stream, options="--enable-tvm-ffi")


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
