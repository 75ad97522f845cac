// SiLU-and-mul (SwiGLU's activation) on the CPU: out = silu(x[..., :d]) * x[..., d:],
// computed in float.
#include <cmath>

#include "../dispatch_utils.h"

namespace vllm_style {
namespace {

template <typename scalar_t>
void silu_and_mul_impl(scalar_t* __restrict__ out, const scalar_t* __restrict__ input, const int64_t num_tokens,
                       const int64_t d) {
  for (int64_t i = 0; i < num_tokens; ++i) {
    const scalar_t* gate = input + i * 2 * d;
    const scalar_t* up = gate + d;
    scalar_t* out_p = out + i * d;
    for (int64_t j = 0; j < d; ++j) {
      const float x = static_cast<float>(gate[j]);
      out_p[j] = static_cast<scalar_t>(x / (1.0f + std::exp(-x)) * static_cast<float>(up[j]));
    }
  }
}

}  // namespace

void silu_and_mul(Tensor& out, Tensor& input) {
  VLLM_STYLE_CHECK(input.is_contiguous() && out.is_contiguous(), "silu_and_mul: tensors must be contiguous");
  const int64_t d = LastDim(input) / 2;
  const int64_t num_tokens = NumRows(input);
  VLLM_STYLE_CHECK(out.numel() == num_tokens * d, "silu_and_mul: out must be input with half its last dimension");
  VLLM_STYLE_CHECK(out.scalar_type() == input.scalar_type(), "silu_and_mul: tensors must have one dtype");
  DispatchFloatingTypes(input.scalar_type(), "silu_and_mul", [&](auto tag) {
    using scalar_t = decltype(tag);
    silu_and_mul_impl(out.mutable_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(), num_tokens, d);
  });
}

}  // namespace vllm_style
