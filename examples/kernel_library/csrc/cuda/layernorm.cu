// RMSNorm on CUDA: one block per row, a block-wide sum of squares in float.
#include <cuda_runtime.h>

#include <type_traits>

#include "../portable.h"

namespace kernels {
namespace {

constexpr int kThreads = 256;

// Sums in float, or in double for double tensors.
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
__device__ __forceinline__ Acc<T> F(T v) {
  return static_cast<Acc<T>>(v);
}

template <class A>
__device__ A BlockSum(A v) {
  __shared__ A partial[kThreads / 32];
  __shared__ A total;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : A(0);
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  if (threadIdx.x == 0) total = v;
  __syncthreads();
  const A out = total;
  __syncthreads();  // before the next call reuses `partial` and `total`
  return out;
}

template <class T>
__global__ void RmsNormKernel(T* out, const T* in, T* residual, const T* w, int64_t d, double eps, bool gemma) {
  using A = Acc<T>;
  const int64_t row = blockIdx.x;
  const T* x = in + row * d;
  T* res = residual ? residual + row * d : nullptr;
  A ss = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    A v = F(x[i]);
    if (res) {
      v += F(res[i]);
      res[i] = static_cast<T>(v);
    }
    ss += v * v;
  }
  const A inv = A(1) / sqrt(BlockSum(ss) / static_cast<A>(d) + static_cast<A>(eps));
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const A v = res ? F(res[i]) : F(x[i]);
    const A s = gemma ? A(1) + F(w[i]) : F(w[i]);
    out[row * d + i] = static_cast<T>(v * inv * s);
  }
}

template <class T>
__global__ void RmsNormBackwardKernel(T* gx, Acc<T>* gw, const T* g, const T* in, const T* w, int64_t d, double eps,
                                      bool gemma) {
  using A = Acc<T>;
  const int64_t row = blockIdx.x;
  const T* x = in + row * d;
  const T* gr = g + row * d;
  A ss = 0, dot = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const A s = gemma ? A(1) + F(w[i]) : F(w[i]);
    ss += F(x[i]) * F(x[i]);
    dot += F(gr[i]) * s * F(x[i]);
  }
  const A inv = A(1) / sqrt(BlockSum(ss) / static_cast<A>(d) + static_cast<A>(eps));
  dot = BlockSum(dot);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const A s = gemma ? A(1) + F(w[i]) : F(w[i]);
    gx[row * d + i] = static_cast<T>(inv * s * F(gr[i]) - F(x[i]) * inv * inv * inv * dot / static_cast<A>(d));
    atomicAdd(&gw[i], F(gr[i]) * F(x[i]) * inv);
  }
}

template <class T>
__global__ void CastKernel(T* out, const Acc<T>* in, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = static_cast<T>(in[i]);
}

void CheckLaunch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  Check(err == cudaSuccess, op, std::string("CUDA launch failed: ") + cudaGetErrorString(err));
}

}  // namespace

void rms_norm_cuda(Tensor& out, const Tensor& input, const Tensor& weight, const NormCfg& cfg) {
  Check(input.is_contiguous() && out.is_contiguous(), "rms_norm", "input and out must be contiguous");
  int64_t rows, d;
  RowsOf(input, rows, d);
  auto stream = static_cast<cudaStream_t>(CurrentStream(input));
  DispatchFloating(input.scalar_type(), "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    if (rows == 0) return;
    RmsNormKernel<T><<<rows, kThreads, 0, stream>>>(out.mutable_data_ptr<T>(), input.const_data_ptr<T>(), nullptr,
                                                    weight.const_data_ptr<T>(), d, cfg.eps, cfg.gemma);
  });
  CheckLaunch("rms_norm");
}

void fused_add_rms_norm_cuda(Tensor& input, Tensor& residual, const Tensor& weight, const NormCfg& cfg) {
  Check(input.is_contiguous() && residual.is_contiguous(), "fused_add_rms_norm",
        "input and residual must be contiguous");
  int64_t rows, d;
  RowsOf(input, rows, d);
  auto stream = static_cast<cudaStream_t>(CurrentStream(input));
  DispatchFloating(input.scalar_type(), "fused_add_rms_norm", [&](auto tag) {
    using T = decltype(tag);
    if (rows == 0) return;
    // Each block reads its row of input before it writes it.
    RmsNormKernel<T><<<rows, kThreads, 0, stream>>>(input.mutable_data_ptr<T>(), input.const_data_ptr<T>(),
                                                    residual.mutable_data_ptr<T>(), weight.const_data_ptr<T>(), d,
                                                    cfg.eps, cfg.gemma);
  });
  CheckLaunch("fused_add_rms_norm");
}

std::tuple<Tensor, Tensor> rms_norm_backward_cuda(const Tensor& grad, const Tensor& input, const Tensor& weight,
                                                  const NormCfg& cfg) {
  Check(grad.is_contiguous() && input.is_contiguous(), "rms_norm_backward", "grad and input must be contiguous");
  int64_t rows, d;
  RowsOf(input, rows, d);
  Tensor grad_input = EmptyLike(input);
  Tensor grad_weight = EmptyLike(weight);
  auto stream = static_cast<cudaStream_t>(CurrentStream(input));
  DispatchFloating(input.scalar_type(), "rms_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    A* acc = nullptr;
    Check(cudaMallocAsync(reinterpret_cast<void**>(&acc), sizeof(A) * d, stream) == cudaSuccess,
          "rms_norm_backward", "cannot allocate the weight-gradient accumulator");
    cudaMemsetAsync(acc, 0, sizeof(A) * d, stream);
    if (rows > 0) {
      RmsNormBackwardKernel<T><<<rows, kThreads, 0, stream>>>(grad_input.mutable_data_ptr<T>(), acc,
                                                              grad.const_data_ptr<T>(), input.const_data_ptr<T>(),
                                                              weight.const_data_ptr<T>(), d, cfg.eps, cfg.gemma);
    }
    CastKernel<T><<<(d + kThreads - 1) / kThreads, kThreads, 0, stream>>>(grad_weight.mutable_data_ptr<T>(), acc, d);
    cudaFreeAsync(acc, stream);
  });
  CheckLaunch("rms_norm_backward");
  return {grad_input, grad_weight};
}

}  // namespace kernels
