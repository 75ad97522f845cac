// An op taking an optional struct with a required field and an enum field,
// for the differential test of C++ ops (tests/python/test_cpp_differential.py).
// The same source builds in both ABI modes, each in a namespace of its own.
#include <opforge/opforge.h>

#include <optional>
#include <stdexcept>

#ifdef OPFORGE_STABLE_ABI
#define DIFFERENTIAL_NS differential_stable
#else
#define DIFFERENTIAL_NS differential_unstable
#endif

namespace differential {

using opforge::Tensor;

enum class Mode : int64_t { kAdd = 0, kMul = 1 };
OPFORGE_ENUM(Mode, kAdd, kMul);

struct Window {
  int64_t size;  // no initializer: a required field (docs/cpp_ops.md#defaults)
  double scale = 1.0;
  Mode mode = Mode::kMul;
};
OPFORGE_STRUCT(Window, size, scale, mode);

// out = x without a window; with one, x * scale (or x + scale) + 100 * size.
void WindowCpu(Tensor& out, const Tensor& x, const std::optional<Window>& w) {
  if (x.scalar_type() != c10::ScalarType::Float || !x.is_contiguous() || !out.is_contiguous() ||
      out.numel() != x.numel()) {
    throw std::runtime_error("window: x and out must be contiguous float32 tensors of one size");
  }
  const float* in = x.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    double v = in[i];
    if (w) v = (w->mode == Mode::kMul ? v * w->scale : v + w->scale) + 100.0 * static_cast<double>(w->size);
    o[i] = static_cast<float>(v);
  }
}

}  // namespace differential

OPFORGE_LIBRARY(DIFFERENTIAL_NS, m) {
  m.def("window(Tensor! out, Tensor x, Window? w=None) -> ()");
  m.impl("window", c10::kCPU, &differential::WindowCpu);
}
