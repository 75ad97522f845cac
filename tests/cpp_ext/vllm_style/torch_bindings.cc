// vLLM's csrc/torch_bindings.cpp, as it ports to opforge: its registration
// macros, which expand the library name (TORCH_EXTENSION_NAME, defined by the
// build), now stand for opforge's, and the def/impl lines are unchanged.
// The same file builds in both ABI modes (tests/python/test_cpp_vllm_style.py).
#include <opforge/opforge.h>

#include <cmath>
#include <cstdint>

#ifndef OPFORGE_STABLE_ABI
#include <torch/library.h>
#endif

// vLLM's csrc/core/registration.h, pointed at opforge.
#define TORCH_LIBRARY_EXPAND(NAME, MODULE) OPFORGE_LIBRARY(NAME, MODULE)
#define TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) OPFORGE_LIBRARY_IMPL(NAME, DEVICE, MODULE)

using opforge::Tensor;

// out = input / sqrt(mean(input^2) + epsilon) * weight, over the last
// dimension (contiguous float32 on the CPU), declared as vLLM declares its
// kernel: every tensor a `Tensor&`, the ones it only reads included.
void rms_norm(Tensor& out, Tensor& input, Tensor& weight, double epsilon) {
  const int64_t d = input.size(input.dim() - 1);
  const int64_t rows = d == 0 ? 0 : input.numel() / d;
  const auto* x = static_cast<const float*>(input.data_ptr());
  const auto* w = static_cast<const float*>(weight.data_ptr());
  auto* o = static_cast<float*>(out.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < d; ++i) sum += double(x[r * d + i]) * x[r * d + i];
    const double scale = 1.0 / std::sqrt(sum / double(d) + epsilon);
    for (int64_t i = 0; i < d; ++i) o[r * d + i] = float(x[r * d + i] * scale * w[i]);
  }
}

// x *= factor, registered in an IMPL block as vLLM registers device kernels.
void scale_(Tensor& x, double factor) {
  auto* p = static_cast<float*>(x.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = float(p[i] * factor);
}

// A SymInt argument, which the kernel takes as int64_t (vLLM's awq_gemm does).
int64_t numel_times(const Tensor& x, int64_t n) { return x.numel() * n; }

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()");
  ops.impl("rms_norm", c10::kCPU, &rms_norm);
  ops.def("scale_(Tensor(a!) x, float factor) -> ()");
  ops.def("numel_times(Tensor x, SymInt n) -> int", &numel_times);
}

TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CPU, ops) { ops.impl("scale_", &scale_); }

#ifndef OPFORGE_STABLE_ABI
// The same kernel registered with torch's own macro, for what a written
// tensor's version counter does there.
TORCH_LIBRARY(vllm_style_torch, ops) {
  ops.def("rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()");
  ops.impl("rms_norm", c10::kCPU, &rms_norm);
}
#endif
