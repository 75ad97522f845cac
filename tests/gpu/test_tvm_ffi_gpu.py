"""A CUDA kernel exported through TVM-FFI as an op's kernel (docs/tvm_ffi.md):
eager, torch.ops, compiled with Inductor, captured in a CUDA graph, and on
a side stream, where it must run on torch's current stream."""

import dataclasses

import pytest
import torch
from torch import Tensor

tvm_ffi = pytest.importorskip("tvm_ffi")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import tvm_ffi.cpp  # noqa: E402

import opforge  # noqa: E402

CUDA_SOURCE = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

namespace ffi = tvm::ffi;

__global__ void RmsNormKernel(float* out, const float* x, const float* w, int64_t d, float eps, float plus) {
  const int64_t row = blockIdx.x;
  __shared__ float total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  float s = 0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += x[row * d + j] * x[row * d + j];
  atomicAdd(&total, s);
  __syncthreads();
  const float r = rsqrtf(total / d + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) out[row * d + j] = x[row * d + j] * r * (w[j] + plus);
}

// Spins for about `cycles` clock cycles, then writes `value`: a kernel that is
// still running when the next one on its stream is launched.
__global__ void SlowFill(float* out, int64_t n, float value, int64_t cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {}
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = value;
}

__global__ void AddOne(float* out, const float* x, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = x[i] + 1;
}

cudaStream_t Stream(ffi::TensorView t) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(t.device().device_type, t.device().device_id));
}

void rms_norm(ffi::TensorView out, ffi::TensorView x, ffi::TensorView w, double eps, bool add_one) {
  TVM_FFI_ICHECK(x.ndim() == 2 && x.IsContiguous()) << "x must be a contiguous 2-D tensor";
  TVM_FFI_ICHECK(x.device().device_type == kDLCUDA) << "x must be a CUDA tensor";
  RmsNormKernel<<<x.size(0), 128, 0, Stream(x)>>>(static_cast<float*>(out.data_ptr()),
      static_cast<const float*>(x.data_ptr()), static_cast<const float*>(w.data_ptr()), x.size(1), float(eps),
      add_one ? 1.f : 0.f);
}

void slow_fill(ffi::TensorView out, double value, int64_t cycles) {
  SlowFill<<<1, 128, 0, Stream(out)>>>(static_cast<float*>(out.data_ptr()), out.numel(), float(value), cycles);
}

void add_one(ffi::TensorView out, ffi::TensorView x) {
  AddOne<<<1, 128, 0, Stream(x)>>>(static_cast<float*>(out.data_ptr()), static_cast<const float*>(x.data_ptr()),
                                    x.numel());
}
"""


@dataclasses.dataclass(frozen=True)
class NormCfg:
    eps: float = 1e-6
    add_one: bool = False


@pytest.fixture(scope="module")
def mod():
    return tvm_ffi.cpp.load_inline("opforge_gpu_test_kernels", cuda_sources=CUDA_SOURCE,
                                   functions=["rms_norm", "slow_fill", "add_one"])


@pytest.fixture(scope="module")
def ops(mod):
    @opforge.op("ffi_gpu::rms_norm", mutates_args=("out",), kernel={"cuda": mod.rms_norm})
    def rms_norm(out: Tensor, x: Tensor, w: Tensor, cfg: NormCfg) -> None: ...

    @opforge.op("ffi_gpu::slow_fill", mutates_args=("out",), kernel={"cuda": mod.slow_fill})
    def slow_fill(out: Tensor, value: float, cycles: int) -> None: ...

    @opforge.op("ffi_gpu::add_one", mutates_args=("out",), kernel={"cuda": mod.add_one})
    def add_one(out: Tensor, x: Tensor) -> None: ...

    return rms_norm, slow_fill, add_one


def ref(x, w, eps, add_one):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (w + (1.0 if add_one else 0.0))


def test_the_cuda_kernel_runs_eagerly_and_through_torch_ops(ops):
    rms_norm = ops[0]
    x, w = torch.randn(8, 256, device="cuda"), torch.randn(256, device="cuda")
    out = torch.full_like(x, float("nan"))
    rms_norm(out, x, w, NormCfg(1e-5, True))
    torch.testing.assert_close(out, ref(x, w, 1e-5, True))
    out2 = torch.empty_like(x)
    torch.ops.ffi_gpu.rms_norm(out2, x, w, 1e-5, True)
    torch.testing.assert_close(out2, out)


def test_the_op_compiles_with_inductor_and_gives_eager_values(ops, fresh_compile):
    rms_norm = ops[0]
    x, w = torch.randn(8, 256, device="cuda"), torch.randn(256, device="cuda")

    def step(x, w):
        out = torch.empty_like(x)
        rms_norm(out, x * 2, w, NormCfg(1e-5, False))
        return out + 1

    compiled = torch.compile(step, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), step(x, w))


def test_a_cuda_graph_replays_the_op_with_new_inputs(ops):
    rms_norm = ops[0]
    x, w = torch.randn(8, 256, device="cuda"), torch.randn(256, device="cuda")
    out = torch.empty_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        rms_norm(out, x, w, NormCfg())  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rms_norm(out, x, w, NormCfg())
    x.copy_(torch.randn_like(x))
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, ref(x, w, 1e-6, False))


def test_on_a_side_stream_the_kernel_runs_after_the_work_before_it_on_that_stream(ops):
    # slow_fill still runs when add_one is launched: add_one reads 3s only if
    # it was launched on the same (side) stream, as torch's current stream.
    _, slow_fill, add_one = ops
    a, b = torch.zeros(1024, device="cuda"), torch.zeros(1024, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        slow_fill(a, 3.0, 200_000_000)
        add_one(b, a)
    torch.cuda.synchronize()
    assert b.eq(4.0).all().item()
