// The C++ rows of `opforge bench` and benchmarks/bench_cpp_ops.py: each
// opforge op next to the same op written by hand, and a timing loop that calls
// them through the dispatcher from C++ (exposed as opforge_bench::time_cpp).
//
//   torch.ops.opforge_bench.time_cpp(2000, 9)
//   -> [flat ns, struct ns, hand-written Function fwd+bwd ns, opforge backward fwd+bwd ns]
//
// Bodies do no work: what is measured is the call and the autograd machinery.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <opforge/backward.h>
#include <opforge/opforge.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace opforge_bench {

// --- a struct of scalars vs the same scalars flat ---------------------------

struct Cfg {
  double scale;
  bool causal;
  int64_t k;
};
OPFORGE_STRUCT_NAMED(Cfg, "opforge_bench.Cfg", scale, causal, k);

// Both read their scalars, so neither call can be optimized away.
volatile double sink;

at::Tensor Flat(const at::Tensor& x, const at::Tensor& /*y*/, double scale, bool causal, int64_t k) {
  sink = scale + static_cast<double>(k) + (causal ? 1 : 0);
  return x;
}

at::Tensor Structured(const at::Tensor& x, const at::Tensor& /*y*/, const Cfg& cfg) {
  sink = cfg.scale + static_cast<double>(cfg.k) + (cfg.causal ? 1 : 0);
  return x;
}

// --- a backward: opforge's struct form vs a hand-written Function ------------

struct Lin {
  at::Tensor w;
  at::Tensor b;
  double scale;
};
OPFORGE_STRUCT_NAMED(Lin, "opforge_bench.Lin", w, b, scale);

at::Tensor Affine(const at::Tensor& x, const Lin& /*lin*/) { return at::empty_like(x); }

struct AffineGrad {
  static void setup_context(opforge::AutogradContext* ctx, const at::Tensor& x, const Lin& lin,
                            const at::Tensor& /*out*/) {
    ctx->save_for_backward({x, lin.w});
  }
  static opforge::GradsFor<decltype(Affine)> backward(opforge::AutogradContext* /*ctx*/,
                                                      const at::Tensor& grad) {
    opforge::Grad<Lin> lin;
    lin.set(&Lin::w, grad).set(&Lin::b, grad);
    return {grad, lin};
  }
};

using AffineSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double);

at::Tensor AffineFlat(const at::Tensor& x, const at::Tensor& /*w*/, const at::Tensor& /*b*/,
                      double /*scale*/) {
  return at::empty_like(x);
}

// The usual hand-written autograd kernel of a TORCH_LIBRARY op.
class AffineFunction : public torch::autograd::Function<AffineFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& b, double scale) {
    ctx->save_for_backward({x, w});
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("opforge_bench::affine_flat", "")
                               .typed<AffineSignature>();
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(x, w, b, scale);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], grads[0], grads[0], at::Tensor()};
  }
};

at::Tensor AffineFlatAutograd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double scale) {
  return AffineFunction::apply(x, w, b, scale);
}

// --- the timing loop ---------------------------------------------------------

template <class F>
double NsPerCall(F&& f, int64_t calls) {
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) f();
  std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / static_cast<double>(calls);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median ns per call of each case; repeats alternate between the cases so
// drift affects them alike.
std::vector<double> TimeCpp(int64_t calls, int64_t repeats) {
  auto& dispatcher = c10::Dispatcher::singleton();
  using CallSignature = at::Tensor(const at::Tensor&, const at::Tensor&, double, bool, int64_t);
  auto flat = dispatcher.findSchemaOrThrow("opforge_bench::flat", "").typed<CallSignature>();
  auto structured = dispatcher.findSchemaOrThrow("opforge_bench::structured", "").typed<CallSignature>();
  auto function = dispatcher.findSchemaOrThrow("opforge_bench::affine_flat", "").typed<AffineSignature>();
  auto opforge = dispatcher.findSchemaOrThrow("opforge_bench::affine", "").typed<AffineSignature>();
  at::Tensor x = at::ones({4});
  at::Tensor xg = at::ones({4}).requires_grad_();
  at::Tensor w = at::ones({4}).requires_grad_();
  at::Tensor b = at::ones({4}).requires_grad_();
  std::vector<std::function<void()>> cases = {
      [&] { flat.call(x, x, 2.0, true, 3); },
      [&] { structured.call(x, x, 2.0, true, 3); },
      [&] { function.call(xg, w, b, 2.0).sum().backward(); },
      [&] { opforge.call(xg, w, b, 2.0).sum().backward(); },
  };
  // The autograd cases cost ~100x a bare call: fewer iterations.
  const std::vector<int64_t> iterations = {calls * 20, calls * 20, calls, calls};
  std::vector<std::vector<double>> samples(cases.size());
  for (size_t c = 0; c < cases.size(); ++c) NsPerCall(cases[c], iterations[c] / 10 + 1);  // warm up
  for (int64_t r = 0; r < repeats; ++r) {
    for (size_t c = 0; c < cases.size(); ++c) samples[c].push_back(NsPerCall(cases[c], iterations[c]));
  }
  std::vector<double> out;
  for (auto& s : samples) out.push_back(Median(s));
  return out;
}

}  // namespace opforge_bench

TORCH_LIBRARY_FRAGMENT(opforge_bench, m) {
  m.def("flat(Tensor x, Tensor y, float scale, bool causal, int k) -> Tensor", &opforge_bench::Flat);
  m.def("affine_flat(Tensor x, Tensor w, Tensor b, float scale) -> Tensor");
  m.def("time_cpp(int calls, int repeats) -> float[]", &opforge_bench::TimeCpp);
}

TORCH_LIBRARY_IMPL(opforge_bench, CompositeExplicitAutograd, m) {
  m.impl("affine_flat", &opforge_bench::AffineFlat);
}

TORCH_LIBRARY_IMPL(opforge_bench, Autograd, m) {
  m.impl("affine_flat", &opforge_bench::AffineFlatAutograd);
}

OPFORGE_LIBRARY(opforge_bench, m) {
  m.def("structured(Tensor x, Tensor y, opforge_bench.Cfg cfg) -> Tensor", &opforge_bench::Structured);
  m.def("affine(Tensor x, opforge_bench.Lin lin) -> Tensor", &opforge_bench::Affine)
      .autograd<opforge_bench::AffineGrad>();
}
