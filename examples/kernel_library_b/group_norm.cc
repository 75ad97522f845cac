// Group RMSNorm: each of `groups` slices of the last dimension normalized on
// its own. Its NormCfg is not the one of examples/kernel_library.
#include <ATen/ops/empty_like.h>

#include <cmath>
#include <stdexcept>

#include <opforge/opforge.h>

namespace sgl {

struct NormCfg {
  int64_t groups = 1;
  double eps = 1e-5;
  double scale = 1.0;
};
OPFORGE_STRUCT(NormCfg, groups, eps, scale);

void group_rms_norm(at::Tensor& out, const at::Tensor& x, const NormCfg& cfg) {
  const int64_t d = x.size(-1);
  if (cfg.groups <= 0 || d % cfg.groups != 0) throw std::invalid_argument("group_rms_norm: groups must divide d");
  if (x.scalar_type() != at::kFloat || !x.is_contiguous() || !out.is_contiguous()) {
    throw std::invalid_argument("group_rms_norm: float32 contiguous tensors only");
  }
  const int64_t g = d / cfg.groups;
  const int64_t n = x.numel() / g;
  const float* in = x.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    float ss = 0.f;
    for (int64_t i = 0; i < g; ++i) ss += in[r * g + i] * in[r * g + i];
    const float inv = static_cast<float>(cfg.scale) / std::sqrt(ss / static_cast<float>(g) + static_cast<float>(cfg.eps));
    for (int64_t i = 0; i < g; ++i) o[r * g + i] = in[r * g + i] * inv;
  }
}

}  // namespace sgl

OPFORGE_LIBRARY(sgl_kernels, m) {
  m.def("group_rms_norm(Tensor! out, Tensor x, NormCfg cfg) -> ()");
  m.impl("group_rms_norm", c10::kCPU, &sgl::group_rms_norm);
}
