// The four ops on CUDA, on the current stream: one block per token, sums in
// float. Built with the CPU kernels when torch and the build have CUDA.
#include <cuda_runtime.h>

#include <optional>
#include <utility>

#include "../dispatch_utils.h"

#ifdef VLLM_STYLE_STABLE
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#else
#include <c10/cuda/CUDAStream.h>
#endif

namespace vllm_style {
namespace {

constexpr int kThreads = 256;

cudaStream_t current_stream(const Tensor& t) {
#ifdef VLLM_STYLE_STABLE
  void* stream = nullptr;
  VLLM_STYLE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream) == AOTI_TORCH_SUCCESS,
                   "could not get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
#else
  return c10::cuda::getCurrentCUDAStream(t.get_device()).stream();
#endif
}

__device__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  __shared__ float total;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.0f;
  if (warp == 0) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  if (threadIdx.x == 0) total = v;
  __syncthreads();
  return total;
}

template <typename scalar_t>
__global__ void rms_norm_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ input,
                                const scalar_t* __restrict__ weight, const float epsilon, const int64_t hidden_size) {
  const scalar_t* input_p = input + blockIdx.x * hidden_size;
  float variance = 0.0f;
  for (int64_t j = threadIdx.x; j < hidden_size; j += blockDim.x) {
    const float x = static_cast<float>(input_p[j]);
    variance += x * x;
  }
  const float s_variance = 1.0f / sqrtf(block_sum(variance) / static_cast<float>(hidden_size) + epsilon);
  for (int64_t j = threadIdx.x; j < hidden_size; j += blockDim.x) {
    out[blockIdx.x * hidden_size + j] =
        static_cast<scalar_t>(static_cast<float>(input_p[j]) * s_variance * static_cast<float>(weight[j]));
  }
}

template <typename scalar_t>
__global__ void fused_add_rms_norm_kernel(scalar_t* __restrict__ input, scalar_t* __restrict__ residual,
                                          const scalar_t* __restrict__ weight, const float epsilon,
                                          const int64_t hidden_size) {
  scalar_t* input_p = input + blockIdx.x * hidden_size;
  scalar_t* residual_p = residual + blockIdx.x * hidden_size;
  float variance = 0.0f;
  for (int64_t j = threadIdx.x; j < hidden_size; j += blockDim.x) {
    const scalar_t sum = static_cast<scalar_t>(static_cast<float>(input_p[j]) + static_cast<float>(residual_p[j]));
    residual_p[j] = sum;
    const float x = static_cast<float>(sum);
    variance += x * x;
  }
  const float s_variance = 1.0f / sqrtf(block_sum(variance) / static_cast<float>(hidden_size) + epsilon);
  for (int64_t j = threadIdx.x; j < hidden_size; j += blockDim.x) {
    input_p[j] = static_cast<scalar_t>(static_cast<float>(residual_p[j]) * s_variance * static_cast<float>(weight[j]));
  }
}

template <typename scalar_t>
__global__ void silu_and_mul_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ input, const int64_t d) {
  const scalar_t* gate = input + blockIdx.x * 2 * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float x = static_cast<float>(gate[j]);
    out[blockIdx.x * d + j] = static_cast<scalar_t>(x / (1.0f + expf(-x)) * static_cast<float>(gate[d + j]));
  }
}

template <typename scalar_t>
__global__ void rotary_kernel(scalar_t* __restrict__ data, const int64_t token_stride, const int num_heads,
                              const int head_size, const int64_t* __restrict__ positions,
                              const scalar_t* __restrict__ cos_sin_cache, const int rot_dim, const bool is_neox) {
  const int embed_dim = rot_dim / 2;
  const scalar_t* cos_ptr = cos_sin_cache + positions[blockIdx.x] * rot_dim;
  const scalar_t* sin_ptr = cos_ptr + embed_dim;
  for (int i = threadIdx.x; i < num_heads * embed_dim; i += blockDim.x) {
    const int head = i / embed_dim;
    const int j = i % embed_dim;
    scalar_t* head_p = data + blockIdx.x * token_stride + static_cast<int64_t>(head) * head_size;
    const int x_index = is_neox ? j : 2 * j;
    const int y_index = is_neox ? embed_dim + j : 2 * j + 1;
    const float cos = static_cast<float>(cos_ptr[j]);
    const float sin = static_cast<float>(sin_ptr[j]);
    const float x = static_cast<float>(head_p[x_index]);
    const float y = static_cast<float>(head_p[y_index]);
    head_p[x_index] = static_cast<scalar_t>(x * cos - y * sin);
    head_p[y_index] = static_cast<scalar_t>(y * cos + x * sin);
  }
}

template <typename scalar_t>
void rotate(Tensor& t, const int head_size, const Tensor& positions, const Tensor& cos_sin_cache, bool is_neox) {
  const int64_t num_tokens = NumRows(t);
  if (num_tokens == 0) return;
  const int num_heads = static_cast<int>(LastDim(t) / head_size);
  const int64_t token_stride = t.dim() > 1 ? t.stride(t.dim() - 2) : LastDim(t);
  rotary_kernel<<<num_tokens, kThreads, 0, current_stream(t)>>>(
      t.mutable_data_ptr<scalar_t>(), token_stride, num_heads, head_size, positions.const_data_ptr<int64_t>(),
      cos_sin_cache.const_data_ptr<scalar_t>(), static_cast<int>(LastDim(cos_sin_cache)), is_neox);
}

void check_norm(const char* op, const Tensor& out, const Tensor& input, const Tensor& weight) {
  VLLM_STYLE_CHECK(input.is_contiguous() && out.is_contiguous(), op, ": tensors must be contiguous");
  VLLM_STYLE_CHECK(out.numel() == input.numel(), op, ": the written tensor must have input's size");
  VLLM_STYLE_CHECK(weight.numel() == LastDim(input), op, ": weight must have input's last dimension");
  VLLM_STYLE_CHECK(out.scalar_type() == input.scalar_type() && weight.scalar_type() == input.scalar_type(), op,
                   ": tensors must have one dtype");
}

}  // namespace

void rms_norm_cuda(Tensor& out, Tensor& input, Tensor& weight, double epsilon) {
  check_norm("rms_norm", out, input, weight);
  const int64_t num_tokens = NumRows(input);
  if (num_tokens == 0) return;
  DispatchFloatingTypes(input.scalar_type(), "rms_norm", [&](auto tag) {
    using scalar_t = decltype(tag);
    rms_norm_kernel<<<num_tokens, kThreads, 0, current_stream(input)>>>(
        out.mutable_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
        static_cast<float>(epsilon), LastDim(input));
  });
}

void fused_add_rms_norm_cuda(Tensor& input, Tensor& residual, Tensor& weight, double epsilon) {
  check_norm("fused_add_rms_norm", residual, input, weight);
  const int64_t num_tokens = NumRows(input);
  if (num_tokens == 0) return;
  DispatchFloatingTypes(input.scalar_type(), "fused_add_rms_norm", [&](auto tag) {
    using scalar_t = decltype(tag);
    fused_add_rms_norm_kernel<<<num_tokens, kThreads, 0, current_stream(input)>>>(
        input.mutable_data_ptr<scalar_t>(), residual.mutable_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
        static_cast<float>(epsilon), LastDim(input));
  });
}

void silu_and_mul_cuda(Tensor& out, Tensor& input) {
  VLLM_STYLE_CHECK(input.is_contiguous() && out.is_contiguous(), "silu_and_mul: tensors must be contiguous");
  const int64_t d = LastDim(input) / 2;
  const int64_t num_tokens = NumRows(input);
  VLLM_STYLE_CHECK(out.numel() == num_tokens * d, "silu_and_mul: out must be input with half its last dimension");
  VLLM_STYLE_CHECK(out.scalar_type() == input.scalar_type(), "silu_and_mul: tensors must have one dtype");
  if (num_tokens == 0) return;
  DispatchFloatingTypes(input.scalar_type(), "silu_and_mul", [&](auto tag) {
    using scalar_t = decltype(tag);
    silu_and_mul_kernel<<<num_tokens, kThreads, 0, current_stream(input)>>>(
        out.mutable_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(), d);
  });
}

void rotary_embedding_cuda(Tensor& positions, Tensor& query, std::optional<Tensor> key, int64_t head_size,
                           Tensor& cos_sin_cache, bool is_neox) {
  VLLM_STYLE_CHECK(head_size > 0 && LastDim(query) % head_size == 0,
                   "rotary_embedding: query's last dimension must be a multiple of head_size");
  VLLM_STYLE_CHECK(LastDim(cos_sin_cache) <= head_size, "rotary_embedding: rot_dim must be at most head_size");
  VLLM_STYLE_CHECK(positions.numel() == NumRows(query), "rotary_embedding: one position per token");
  VLLM_STYLE_CHECK(query.stride(query.dim() - 1) == 1, "rotary_embedding: query's last dimension must be dense");
  VLLM_STYLE_CHECK(cos_sin_cache.is_contiguous() && cos_sin_cache.scalar_type() == query.scalar_type(),
                   "rotary_embedding: cos_sin_cache must be contiguous, of query's dtype");
  DispatchFloatingTypes(query.scalar_type(), "rotary_embedding", [&](auto tag) {
    using scalar_t = decltype(tag);
    rotate<scalar_t>(query, static_cast<int>(head_size), positions, cos_sin_cache, is_neox);
    if (key.has_value()) {
      VLLM_STYLE_CHECK(key->stride(key->dim() - 1) == 1 && NumRows(*key) == NumRows(query),
                       "rotary_embedding: key must have query's tokens and a dense last dimension");
      rotate<scalar_t>(*key, static_cast<int>(head_size), positions, cos_sin_cache, is_neox);
    }
  });
}

namespace with_cfg {

void rms_norm_cuda(Tensor& out, Tensor& input, Tensor& weight, const NormCfg& cfg) {
  vllm_style::rms_norm_cuda(out, input, weight, cfg.epsilon);
}

void fused_add_rms_norm_cuda(Tensor& input, Tensor& residual, Tensor& weight, const NormCfg& cfg) {
  vllm_style::fused_add_rms_norm_cuda(input, residual, weight, cfg.epsilon);
}

void rotary_embedding_cuda(Tensor& positions, Tensor& query, std::optional<Tensor> key, Tensor& cos_sin_cache,
                           const RopeCfg& cfg) {
  vllm_style::rotary_embedding_cuda(positions, query, std::move(key), cfg.head_size, cos_sin_cache, cfg.is_neox);
}

}  // namespace with_cfg

}  // namespace vllm_style
