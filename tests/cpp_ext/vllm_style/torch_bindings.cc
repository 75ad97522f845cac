// vLLM's csrc/torch_bindings.cpp, as it ports to opforge: its registration
// macros, which expand the library name (TORCH_EXTENSION_NAME, defined by the
// build), now stand for opforge's, and the def/impl lines are unchanged.
// The same file builds in both ABI modes (tests/python/test_cpp_vllm_style.py).
#include <opforge/opforge.h>

#include <cmath>
#include <cstdint>

#ifndef OPFORGE_STABLE_ABI
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <opforge/backward.h>
#include <torch/library.h>

#include <string>
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

// out = x + bias, the optional taken by value as vLLM's rotary_embedding
// takes its `std::optional<torch::Tensor> key`: the kernel's own signature
// differs from the flat one opforge would otherwise record.
void add_bias(Tensor& out, Tensor x, std::optional<Tensor> bias) {
  const auto* px = static_cast<const float*>(x.data_ptr());
  const auto* pb = bias ? static_cast<const float*>(bias->data_ptr()) : nullptr;
  auto* po = static_cast<float*>(out.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = px[i] + (pb ? pb[i] : 0.0f);
}

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  ops.def("rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()");
  ops.impl("rms_norm", c10::kCPU, &rms_norm);
  ops.def("scale_(Tensor(a!) x, float factor) -> ()");
  ops.def("numel_times(Tensor x, SymInt n) -> int", &numel_times);
  ops.def("add_bias(Tensor! out, Tensor x, Tensor? bias) -> ()");
  ops.impl("add_bias", c10::kCPU, &add_bias);
}

TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CPU, ops) { ops.impl("scale_", &scale_); }

#ifndef OPFORGE_STABLE_ABI
// The same kernel registered with torch's own macro, for what a written
// tensor's version counter does there.
TORCH_LIBRARY(vllm_style_torch, ops) {
  ops.def("rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()");
  ops.impl("rms_norm", c10::kCPU, &rms_norm);
  ops.def("add_bias(Tensor! out, Tensor x, Tensor? bias) -> ()");
  ops.impl("add_bias", c10::kCPU, &add_bias);
}

// vLLM's C++ code calls its ops through the dispatcher with the kernel's own
// signature, c10::Dispatcher::singleton().findSchemaOrThrow(...).typed<Sig>();
// these ops make such calls on the ops of namespace `ns`.
namespace typed {

template <class Sig>
c10::TypedOperatorHandle<Sig> Op(const std::string& ns, const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow((ns + "::" + name).c_str(), "").typed<Sig>();
}

void rms_norm(std::string ns, at::Tensor& out, const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor input = x, weight = w;
  Op<decltype(::rms_norm)>(ns, "rms_norm").call(out, input, weight, eps);
}
void add_bias(std::string ns, at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  Op<decltype(::add_bias)>(ns, "add_bias").call(out, x, bias);
}
int64_t numel_times(std::string ns, const at::Tensor& x, int64_t n) {
  return Op<decltype(::numel_times)>(ns, "numel_times").call(x, n);
}
// The call C++ callers made before: the signature opforge recorded for an op
// whose kernels do not agree on one (and for every op, before kernels'
// own signatures were recorded).
void add_bias_flat(std::string ns, at::Tensor& out, const at::Tensor& x, const std::optional<at::Tensor>& bias) {
  Op<void(at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&)>(ns, "add_bias").call(out, x, bias);
}

}  // namespace typed

TORCH_LIBRARY(vllm_style_typed, ops) {
  ops.def("rms_norm(str ns, Tensor! out, Tensor x, Tensor w, float eps) -> ()", &typed::rms_norm);
  ops.def("add_bias(str ns, Tensor! out, Tensor x, Tensor? bias) -> ()", &typed::add_bias);
  ops.def("add_bias_flat(str ns, Tensor! out, Tensor x, Tensor? bias) -> ()", &typed::add_bias_flat);
  ops.def("numel_times(str ns, Tensor x, int n) -> int", &typed::numel_times);
}

// Kernels of one op that differ in how they take a tensor (by value here,
// by const reference there) register opforge's flat signature; a C++
// backward follows whichever signature the op's kernels recorded.
at::Tensor twice_cpu(at::Tensor x) { return at::mul(x, 2); }
at::Tensor twice_meta(const at::Tensor& x) { return at::empty_like(x); }
at::Tensor square(at::Tensor x) { return at::mul(x, x); }

struct SquareGrad {
  static void setup_context(opforge::AutogradContext* ctx, at::Tensor x, const at::Tensor&) {
    ctx->save_for_backward({x});
  }
  static opforge::GradsFor<decltype(square)> backward(opforge::AutogradContext* ctx, const at::Tensor& grad) {
    return {at::mul(at::mul(grad, ctx->get_saved_variables()[0]), 2)};
  }
};

OPFORGE_LIBRARY(vllm_style_signatures, m) {
  m.def("twice(Tensor x) -> Tensor");
  m.impl("twice", c10::kCPU, &twice_cpu);
  m.impl("twice", c10::DispatchKey::Meta, &twice_meta);
  m.def("square(Tensor x) -> Tensor", &square).autograd<SquareGrad>();
}

namespace typed {
at::Tensor twice_own(const at::Tensor& x) {
  return Op<decltype(twice_cpu)>("vllm_style_signatures", "twice").call(x);
}
at::Tensor twice_flat(const at::Tensor& x) {
  return Op<decltype(twice_meta)>("vllm_style_signatures", "twice").call(x);
}
at::Tensor square_own(const at::Tensor& x) {
  return Op<decltype(square)>("vllm_style_signatures", "square").call(x);
}
}  // namespace typed

TORCH_LIBRARY_FRAGMENT(vllm_style_typed, ops) {
  ops.def("twice_own(Tensor x) -> Tensor", &typed::twice_own);
  ops.def("twice_flat(Tensor x) -> Tensor", &typed::twice_flat);
  ops.def("square_own(Tensor x) -> Tensor", &typed::square_own);
}
#endif
