// RMSNorm on the CPU: one row at a time, accumulated in float (double for double).
#include <cmath>
#include <type_traits>
#include <vector>

#include "../portable.h"

namespace kernels {
namespace {

// Sums in float, or in double for double tensors.
template <class T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
Acc<T> F(T v) {
  return static_cast<Acc<T>>(v);
}

template <class scalar_t>
void RmsNormRows(scalar_t* out, const scalar_t* in, const scalar_t* w, int64_t rows, int64_t d, const NormCfg& cfg) {
  for (int64_t r = 0; r < rows; ++r) {
    using acc_t = Acc<scalar_t>;
    const scalar_t* x = in + r * d;
    acc_t ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += F(x[i]) * F(x[i]);
    const acc_t inv = 1 / std::sqrt(ss / static_cast<acc_t>(d) + static_cast<acc_t>(cfg.eps));
    for (int64_t i = 0; i < d; ++i) {
      const acc_t scale = cfg.gemma ? 1 + F(w[i]) : F(w[i]);
      out[r * d + i] = static_cast<scalar_t>(F(x[i]) * inv * scale);
    }
  }
}

void CheckNorm(const char* op, const Tensor& out, const Tensor& input, const Tensor& weight) {
  Check(input.is_contiguous() && out.is_contiguous(), op, "input and out must be contiguous");
  Check(out.numel() == input.numel(), op, "out must have input's shape");
  Check(weight.dim() == 1 && weight.size(0) == input.size(input.dim() - 1), op,
        "weight must have the size of input's last dimension");
  Check(out.scalar_type() == input.scalar_type() && weight.scalar_type() == input.scalar_type(), op,
        "out, input and weight must have one dtype");
}

}  // namespace

void rms_norm_cpu(Tensor& out, const Tensor& input, const Tensor& weight, const NormCfg& cfg) {
  CheckNorm("rms_norm", out, input, weight);
  int64_t rows, d;
  RowsOf(input, rows, d);
  DispatchFloating(input.scalar_type(), "rms_norm", [&](auto tag) {
    using scalar_t = decltype(tag);
    RmsNormRows(out.mutable_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
                weight.const_data_ptr<scalar_t>(), rows, d, cfg);
  });
}

void fused_add_rms_norm_cpu(Tensor& input, Tensor& residual, const Tensor& weight, const NormCfg& cfg) {
  CheckNorm("fused_add_rms_norm", residual, input, weight);
  int64_t rows, d;
  RowsOf(input, rows, d);
  DispatchFloating(input.scalar_type(), "fused_add_rms_norm", [&](auto tag) {
    using scalar_t = decltype(tag);
    scalar_t* x = input.mutable_data_ptr<scalar_t>();
    scalar_t* res = residual.mutable_data_ptr<scalar_t>();
    for (int64_t i = 0; i < rows * d; ++i) res[i] = static_cast<scalar_t>(F(res[i]) + F(x[i]));
    RmsNormRows(x, res, weight.const_data_ptr<scalar_t>(), rows, d, cfg);
  });
}

std::tuple<Tensor, Tensor> rms_norm_backward_cpu(const Tensor& grad, const Tensor& input, const Tensor& weight,
                                                 const NormCfg& cfg) {
  Check(grad.is_contiguous() && input.is_contiguous(), "rms_norm_backward", "grad and input must be contiguous");
  int64_t rows, d;
  RowsOf(input, rows, d);
  Tensor grad_input = EmptyLike(input);
  Tensor grad_weight = EmptyLike(weight);
  DispatchFloating(input.scalar_type(), "rms_norm_backward", [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    const scalar_t* g = grad.const_data_ptr<scalar_t>();
    const scalar_t* w = weight.const_data_ptr<scalar_t>();
    scalar_t* gx = grad_input.mutable_data_ptr<scalar_t>();
    using acc_t = Acc<scalar_t>;
    std::vector<acc_t> gw(static_cast<size_t>(d), 0);
    for (int64_t r = 0; r < rows; ++r) {
      const scalar_t* xr = x + r * d;
      const scalar_t* gr = g + r * d;
      acc_t ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += F(xr[i]) * F(xr[i]);
      const acc_t inv = 1 / std::sqrt(ss / static_cast<acc_t>(d) + static_cast<acc_t>(cfg.eps));
      // y_i = x_i * inv * s_i;  dy/dx: inv * s_i * g_i - x_i * inv^3 / d * sum_j g_j s_j x_j
      acc_t dot = 0;
      for (int64_t i = 0; i < d; ++i) {
        const acc_t s = cfg.gemma ? 1 + F(w[i]) : F(w[i]);
        dot += F(gr[i]) * s * F(xr[i]);
        gw[static_cast<size_t>(i)] += F(gr[i]) * F(xr[i]) * inv;
      }
      for (int64_t i = 0; i < d; ++i) {
        const acc_t s = cfg.gemma ? 1 + F(w[i]) : F(w[i]);
        gx[r * d + i] = static_cast<scalar_t>(inv * s * F(gr[i]) - F(xr[i]) * inv * inv * inv * dot / static_cast<acc_t>(d));
      }
    }
    scalar_t* gwo = grad_weight.mutable_data_ptr<scalar_t>();
    for (int64_t i = 0; i < d; ++i) gwo[i] = static_cast<scalar_t>(gw[static_cast<size_t>(i)]);
  });
  return {grad_input, grad_weight};
}

}  // namespace kernels
