// A bool[] leaf, end to end in both ABI modes: a kernel parameter, an
// optional one, a struct field with a default, a C++ call through the
// dispatcher and a backward that reads the struct (tests/python/test_cpp_leaf_types.py).
#include <opforge/opforge.h>

#include <optional>
#include <string>
#include <vector>

#ifdef OPFORGE_STABLE_ABI
#include <torch/csrc/stable/ops.h>
#define FLAGS_OP(name) "leaf_flags_stable::" name
#else
#include <ATen/ops/empty_like.h>
#define FLAGS_OP(name) "leaf_flags_unstable::" name
#endif

namespace flags {

using opforge::Tensor;

struct Mask {
  std::vector<bool> keep = {true, false, true};
  double scale = 2.0;
};
OPFORGE_STRUCT(Mask, keep, scale);

// out[i] = x[i] * scale where keep[i % keep.size()], else 0 (float32 on the CPU).
Tensor Masked(const Tensor& input, const Mask& m) {
#ifdef OPFORGE_STABLE_ABI
  Tensor x = torch::stable::contiguous(input);
  Tensor out = torch::stable::empty_like(x);
#else
  Tensor x = input.contiguous();
  Tensor out = at::empty_like(x);
#endif
  const auto* in = static_cast<const float*>(x.data_ptr());
  auto* o = static_cast<float*>(out.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) {
    o[i] = m.keep.at(static_cast<size_t>(i) % m.keep.size()) ? in[i] * static_cast<float>(m.scale) : 0.0f;
  }
  return out;
}

// Twice through the dispatcher: the struct and its bool[] pushed by opforge::Call.
Tensor MaskedTwice(const Tensor& x, const Mask& m) {
  return opforge::Call<Tensor>(FLAGS_OP("masked"), opforge::Call<Tensor>(FLAGS_OP("masked"), x, m), m);
}

// How many flags are set, -1 for None.
int64_t CountSet(const Tensor&, const std::optional<std::vector<bool>>& flags) {
  if (!flags) return -1;
  int64_t n = 0;
  for (bool f : *flags) n += f;
  return n;
}

// d masked / d x is masked itself: the flags travel to backward as a string.
struct MaskedGrad {
  static void setup_context(opforge::AutogradContext* ctx, const Tensor&, const Mask& m, const Tensor&) {
    std::string keep;
    for (bool f : m.keep) keep += f ? '1' : '0';
    ctx->saved_data["keep"] = keep;
    ctx->saved_data["scale"] = m.scale;
  }
  static opforge::GradsFor<decltype(Masked)> backward(opforge::AutogradContext* ctx, const Tensor& grad) {
    Mask m{{}, ctx->saved_data["scale"].toDouble()};
    for (char c : ctx->saved_data["keep"].toStringRef()) m.keep.push_back(c == '1');
    return {Masked(grad, m), opforge::NoGrad{}};
  }
};

void Register(opforge::Library& m) {
  m.def("masked(Tensor x, Mask m) -> Tensor", &Masked).autograd<MaskedGrad>();
  m.def("masked_twice(Tensor x, Mask m) -> Tensor", &MaskedTwice);
  m.def("count_set(Tensor x, bool[]? flags) -> int", &CountSet);
}

}  // namespace flags

#ifdef OPFORGE_STABLE_ABI
OPFORGE_LIBRARY(leaf_flags_stable, m) { flags::Register(m); }
#else
OPFORGE_LIBRARY(leaf_flags_unstable, m) { flags::Register(m); }
#endif
