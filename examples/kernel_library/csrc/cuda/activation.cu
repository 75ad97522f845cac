// act(x[..., :d]) * x[..., d:] on CUDA, as vLLM's silu_and_mul / gelu_and_mul.
#include <cuda_runtime.h>

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

}  // namespace

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
