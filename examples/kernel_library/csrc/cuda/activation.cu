// act(x[..., :d]) * x[..., d:] on CUDA, as vLLM's silu_and_mul / gelu_and_mul.
#include <cuda_runtime.h>

#include <algorithm>

#include "../portable.h"

namespace kernels {
namespace {

template <class T>
__global__ void ActAndMulKernel(T* out, const T* in, int64_t d, Act act, float limit) {
  const int64_t row = blockIdx.x;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float a = static_cast<float>(in[row * 2 * d + i]);
    if (limit > 0) a = fminf(fmaxf(a, -limit), limit);
    const float b = static_cast<float>(in[row * 2 * d + d + i]);
    const float y = act == Act::kSilu ? a / (1.f + __expf(-a)) : 0.5f * a * (1.f + erff(a * 0.70710678118654752f));
    out[row * d + i] = static_cast<T>(y * b);
  }
}

template <class T>
__global__ void ScaleKernel(T* out, const T* in, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<T>(static_cast<float>(in[i]) * scale);
  }
}

}  // namespace

void scale_by_host_cuda(Tensor& out, const Tensor& x, const Tensor& host_scale) {
  const float scale = HostScalar(host_scale, "scale_by_host");  // the host value of this call
  Check(x.is_contiguous() && out.is_contiguous() && out.numel() == x.numel(), "scale_by_host",
        "x and out must be contiguous, of one shape");
  auto stream = static_cast<cudaStream_t>(CurrentStream(x));
  DispatchFloating(x.scalar_type(), "scale_by_host", [&](auto tag) {
    using T = decltype(tag);
    const int64_t n = x.numel();
    if (n == 0) return;
    const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 1024));
    ScaleKernel<T><<<blocks, 256, 0, stream>>>(out.mutable_data_ptr<T>(), x.const_data_ptr<T>(), n, scale);
  });
  const cudaError_t err = cudaGetLastError();
  Check(err == cudaSuccess, "scale_by_host", std::string("CUDA launch failed: ") + cudaGetErrorString(err));
}

void act_and_mul_cuda(Tensor& out, const Tensor& input, const ActCfg& cfg) {
  int64_t rows, d2;
  RowsOf(input, rows, d2);
  Check(input.is_contiguous() && out.is_contiguous(), "act_and_mul", "input and out must be contiguous");
  Check(d2 % 2 == 0 && out.numel() == rows * (d2 / 2), "act_and_mul",
        "input's last dimension must be even and out must have half of it");
  auto stream = static_cast<cudaStream_t>(CurrentStream(input));
  DispatchFloating(input.scalar_type(), "act_and_mul", [&](auto tag) {
    using T = decltype(tag);
    if (rows == 0) return;
    ActAndMulKernel<T><<<rows, 256, 0, stream>>>(out.mutable_data_ptr<T>(), input.const_data_ptr<T>(), d2 / 2,
                                                 cfg.act, static_cast<float>(cfg.limit));
  });
  const cudaError_t err = cudaGetLastError();
  Check(err == cudaSuccess, "act_and_mul", std::string("CUDA launch failed: ") + cudaGetErrorString(err));
}

}  // namespace kernels
