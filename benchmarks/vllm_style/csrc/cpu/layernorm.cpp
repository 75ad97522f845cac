// RMSNorm and the fused residual add + RMSNorm on the CPU: one token (row) at
// a time, accumulated in float, as vLLM's csrc/cpu/layernorm.cpp does (without
// its SIMD vectors and OpenMP loop, so every build computes the same bits).
#include <cmath>

#include "../dispatch_utils.h"

namespace vllm_style {
namespace {

template <typename scalar_t>
void rms_norm_impl(scalar_t* __restrict__ out, const scalar_t* __restrict__ input,
                   const scalar_t* __restrict__ weight, const float epsilon, const int64_t num_tokens,
                   const int64_t hidden_size) {
  for (int64_t i = 0; i < num_tokens; ++i) {
    const scalar_t* input_p = input + i * hidden_size;
    scalar_t* out_p = out + i * hidden_size;
    float variance = 0.0f;
    for (int64_t j = 0; j < hidden_size; ++j) {
      const float x = static_cast<float>(input_p[j]);
      variance += x * x;
    }
    const float s_variance = 1.0f / std::sqrt(variance / static_cast<float>(hidden_size) + epsilon);
    for (int64_t j = 0; j < hidden_size; ++j) {
      out_p[j] = static_cast<scalar_t>(static_cast<float>(input_p[j]) * s_variance * static_cast<float>(weight[j]));
    }
  }
}

template <typename scalar_t>
void fused_add_rms_norm_impl(scalar_t* __restrict__ input, scalar_t* __restrict__ residual,
                             const scalar_t* __restrict__ weight, const float epsilon, const int64_t num_tokens,
                             const int64_t hidden_size) {
  for (int64_t i = 0; i < num_tokens; ++i) {
    scalar_t* input_p = input + i * hidden_size;
    scalar_t* residual_p = residual + i * hidden_size;
    float variance = 0.0f;
    for (int64_t j = 0; j < hidden_size; ++j) {
      const scalar_t sum = static_cast<scalar_t>(static_cast<float>(input_p[j]) + static_cast<float>(residual_p[j]));
      residual_p[j] = sum;
      const float x = static_cast<float>(sum);
      variance += x * x;
    }
    const float s_variance = 1.0f / std::sqrt(variance / static_cast<float>(hidden_size) + epsilon);
    for (int64_t j = 0; j < hidden_size; ++j) {
      input_p[j] =
          static_cast<scalar_t>(static_cast<float>(residual_p[j]) * s_variance * static_cast<float>(weight[j]));
    }
  }
}

void check_norm(const char* op, const Tensor& out, const Tensor& input, const Tensor& weight) {
  VLLM_STYLE_CHECK(input.is_contiguous() && out.is_contiguous(), op, ": tensors must be contiguous");
  VLLM_STYLE_CHECK(out.numel() == input.numel(), op, ": the written tensor must have input's size");
  VLLM_STYLE_CHECK(weight.numel() == LastDim(input), op, ": weight must have input's last dimension");
  VLLM_STYLE_CHECK(out.scalar_type() == input.scalar_type() && weight.scalar_type() == input.scalar_type(), op,
                   ": tensors must have one dtype");
}

}  // namespace

void rms_norm(Tensor& out, Tensor& input, Tensor& weight, double epsilon) {
  check_norm("rms_norm", out, input, weight);
  const int64_t hidden_size = LastDim(input);
  const int64_t num_tokens = NumRows(input);
  DispatchFloatingTypes(input.scalar_type(), "rms_norm", [&](auto tag) {
    using scalar_t = decltype(tag);
    rms_norm_impl(out.mutable_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
                  weight.const_data_ptr<scalar_t>(), static_cast<float>(epsilon), num_tokens, hidden_size);
  });
}

void fused_add_rms_norm(Tensor& input, Tensor& residual, Tensor& weight, double epsilon) {
  check_norm("fused_add_rms_norm", residual, input, weight);
  const int64_t hidden_size = LastDim(input);
  const int64_t num_tokens = NumRows(input);
  DispatchFloatingTypes(input.scalar_type(), "fused_add_rms_norm", [&](auto tag) {
    using scalar_t = decltype(tag);
    fused_add_rms_norm_impl(input.mutable_data_ptr<scalar_t>(), residual.mutable_data_ptr<scalar_t>(),
                            weight.const_data_ptr<scalar_t>(), static_cast<float>(epsilon), num_tokens,
                            hidden_size);
  });
}

namespace with_cfg {

void rms_norm(Tensor& out, Tensor& input, Tensor& weight, const NormCfg& cfg) {
  vllm_style::rms_norm(out, input, weight, cfg.epsilon);
}

void fused_add_rms_norm(Tensor& input, Tensor& residual, Tensor& weight, const NormCfg& cfg) {
  vllm_style::fused_add_rms_norm(input, residual, weight, cfg.epsilon);
}

}  // namespace with_cfg

}  // namespace vllm_style
