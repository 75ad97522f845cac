// act(x[..., :d]) * x[..., d:] on the CPU, as vLLM's silu_and_mul / gelu_and_mul.
#include <algorithm>
#include <cmath>

#include "../portable.h"

namespace kernels {

void act_and_mul_cpu(Tensor& out, const Tensor& input, const ActCfg& cfg) {
  int64_t rows, d2;
  RowsOf(input, rows, d2);
  const int64_t d = d2 / 2;
  Check(input.is_contiguous() && out.is_contiguous(), "act_and_mul", "input and out must be contiguous");
  Check(d2 % 2 == 0 && out.numel() == rows * d, "act_and_mul",
        "input's last dimension must be even and out must have half of it");
  Check(out.scalar_type() == input.scalar_type(), "act_and_mul", "out and input must have one dtype");
  DispatchFloating(input.scalar_type(), "act_and_mul", [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* in = input.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < d; ++i) {
        float a = static_cast<float>(in[r * d2 + i]);
        if (cfg.limit > 0) a = std::clamp(a, static_cast<float>(-cfg.limit), static_cast<float>(cfg.limit));
        const float b = static_cast<float>(in[r * d2 + d + i]);
        const float act = cfg.act == Act::kSilu ? a / (1.f + std::exp(-a))
                                                : 0.5f * a * (1.f + std::erf(a * 0.70710678118654752f));
        o[r * d + i] = static_cast<scalar_t>(act * b);
      }
    }
  });
}

}  // namespace kernels
