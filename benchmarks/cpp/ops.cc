// Two ops that differ only in how their scalars arrive: three flat
// arguments, or one struct rebuilt by opforge.
#include <opforge/opforge.h>

namespace bench {

struct Cfg {
  double scale;
  bool causal;
  int64_t k;
};
OPFORGE_STRUCT(Cfg, scale, causal, k);

// No-op bodies: what is measured is the call, not the work.
at::Tensor Flat(const at::Tensor& x, const at::Tensor& /*y*/, double /*scale*/, bool /*causal*/, int64_t /*k*/) {
  return x;
}
at::Tensor Structured(const at::Tensor& x, const at::Tensor& /*y*/, const Cfg& cfg) {
  // Read the fields so the rebuild cannot be optimized away.
  static volatile double sink;
  sink = cfg.scale + static_cast<double>(cfg.k) + (cfg.causal ? 1 : 0);
  return x;
}

}  // namespace bench

TORCH_LIBRARY_FRAGMENT(opforge_bench, m) {
  m.def("flat(Tensor x, Tensor y, float scale, bool causal, int k) -> Tensor", &bench::Flat);
}

OPFORGE_LIBRARY(opforge_bench, m) {
  m.def("structured(Tensor x, Tensor y, Cfg cfg) -> Tensor", &bench::Structured);
}
