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

void scale_by_host_cpu(Tensor& out, const Tensor& x, const Tensor& host_scale) {
  const float scale = HostScalar(host_scale, "scale_by_host");
  Check(x.is_contiguous() && out.is_contiguous() && out.numel() == x.numel(), "scale_by_host",
        "x and out must be contiguous, of one shape");
  DispatchFloating(x.scalar_type(), "scale_by_host", [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    for (int64_t i = 0; i < x.numel(); ++i) o[i] = static_cast<scalar_t>(static_cast<float>(in[i]) * scale);
  });
}

int64_t make_scale_table(const std::vector<double>& scales) {
  return opforge::RegisterHandle(std::make_shared<ScaleTable>(ScaleTable{scales}));
}

void scale_rows_cpu(Tensor& out, const Tensor& x, opforge::Handle<ScaleTable> table, const std::vector<int64_t>& rows,
                    std::optional<double> clamp) {
  int64_t n, d;
  RowsOf(x, n, d);
  Check(x.is_contiguous() && out.is_contiguous() && out.numel() == x.numel(), "scale_rows",
        "x and out must be contiguous, of one shape");
  Check(static_cast<int64_t>(rows.size()) == n, "scale_rows", "give one table row per row of x");
  const auto& scales = table->scales;
  DispatchFloating(x.scalar_type(), "scale_rows", [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* in = x.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    for (int64_t r = 0; r < n; ++r) {
      Check(rows[r] >= 0 && rows[r] < static_cast<int64_t>(scales.size()), "scale_rows", "a row is outside the table");
      for (int64_t i = 0; i < d; ++i) {
        double v = static_cast<double>(in[r * d + i]) * scales[static_cast<size_t>(rows[r])];
        if (clamp) v = std::clamp(v, -*clamp, *clamp);
        o[r * d + i] = static_cast<scalar_t>(v);
      }
    }
  });
}

}  // namespace kernels
