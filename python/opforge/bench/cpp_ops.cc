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
#include <string>
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

// --- 1, 5 and 30 scalar leaves: a struct op from Python vs the flat op ----------
// (generated once by hand; each reads every leaf)

struct Cfg1 {
  double a0 = 0;
};
OPFORGE_STRUCT_NAMED(Cfg1, "opforge_bench.Cfg1", a0);
at::Tensor Flat1(const at::Tensor& x, double a0) {
  sink = a0;
  return x;
}
at::Tensor Struct1(const at::Tensor& x, const Cfg1& c) {
  sink = c.a0;
  return x;
}

struct Cfg5 {
  double a0 = 0; double a1 = 1; double a2 = 2; double a3 = 3; double a4 = 4;
};
OPFORGE_STRUCT_NAMED(Cfg5, "opforge_bench.Cfg5", a0, a1, a2, a3, a4);
at::Tensor Flat5(const at::Tensor& x, double a0, double a1, double a2, double a3, double a4) {
  sink = a0 + a1 + a2 + a3 + a4;
  return x;
}
at::Tensor Struct5(const at::Tensor& x, const Cfg5& c) {
  sink = c.a0 + c.a1 + c.a2 + c.a3 + c.a4;
  return x;
}

struct Cfg30 {
  double a0 = 0; double a1 = 1; double a2 = 2; double a3 = 3; double a4 = 4; double a5 = 5; double a6 = 6; double a7 = 7; double a8 = 8; double a9 = 9; double a10 = 10; double a11 = 11; double a12 = 12; double a13 = 13; double a14 = 14; double a15 = 15; double a16 = 16; double a17 = 17; double a18 = 18; double a19 = 19; double a20 = 20; double a21 = 21; double a22 = 22; double a23 = 23; double a24 = 24; double a25 = 25; double a26 = 26; double a27 = 27; double a28 = 28; double a29 = 29;
};
OPFORGE_STRUCT_NAMED(Cfg30, "opforge_bench.Cfg30", a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29);
at::Tensor Flat30(const at::Tensor& x, double a0, double a1, double a2, double a3, double a4, double a5, double a6, double a7, double a8, double a9, double a10, double a11, double a12, double a13, double a14, double a15, double a16, double a17, double a18, double a19, double a20, double a21, double a22, double a23, double a24, double a25, double a26, double a27, double a28, double a29) {
  sink = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15 + a16 + a17 + a18 + a19 + a20 + a21 + a22 + a23 + a24 + a25 + a26 + a27 + a28 + a29;
  return x;
}
at::Tensor Struct30(const at::Tensor& x, const Cfg30& c) {
  sink = c.a0 + c.a1 + c.a2 + c.a3 + c.a4 + c.a5 + c.a6 + c.a7 + c.a8 + c.a9 + c.a10 + c.a11 + c.a12 + c.a13 + c.a14 + c.a15 + c.a16 + c.a17 + c.a18 + c.a19 + c.a20 + c.a21 + c.a22 + c.a23 + c.a24 + c.a25 + c.a26 + c.a27 + c.a28 + c.a29;
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

// Median ns per call of each op, called boxed through the dispatcher with a
// tensor and then zeros for its other (float) arguments: the way to compare
// a stable-ABI op, whose kernel torch can only call boxed, with a flat op.
std::vector<double> TimeBoxed(std::vector<std::string> names, int64_t calls, int64_t repeats) {
  std::vector<c10::OperatorHandle> ops;
  std::vector<std::vector<c10::IValue>> stacks;
  for (const auto& name : names) {
    ops.push_back(c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), ""));
    std::vector<c10::IValue> stack{at::ones({4})};
    for (size_t i = 1; i < ops.back().schema().arguments().size(); ++i) stack.emplace_back(static_cast<double>(i));
    stacks.push_back(std::move(stack));
  }
  std::vector<std::vector<double>> samples(ops.size());
  auto run = [&](size_t c, int64_t n) {
    return NsPerCall(
        [&] {
          std::vector<c10::IValue> stack = stacks[c];
          ops[c].callBoxed(&stack);
        },
        n);
  };
  for (size_t c = 0; c < ops.size(); ++c) run(c, calls / 10 + 1);
  for (int64_t r = 0; r < repeats; ++r) {
    for (size_t c = 0; c < ops.size(); ++c) samples[c].push_back(run(c, calls));
  }
  std::vector<double> out;
  for (auto& s : samples) out.push_back(Median(s));
  return out;
}

}  // namespace opforge_bench

// The flat ops as a kernel library writes them with TORCH_LIBRARY: a schema,
// then a CPU kernel (so torch's autograd fallback runs, as opforge's
// no-backward kernel does for the struct ops).
TORCH_LIBRARY_FRAGMENT(opforge_bench, m) {
  m.def("flat(Tensor x, Tensor y, float scale, bool causal, int k) -> Tensor");
  m.def("flat1(Tensor x, float a0) -> Tensor");
  m.def("flat5(Tensor x, float a0, float a1, float a2, float a3, float a4) -> Tensor");
  m.def("flat30(Tensor x, float a0, float a1, float a2, float a3, float a4, float a5, float a6, float a7, float a8, float a9, float a10, float a11, float a12, float a13, float a14, float a15, float a16, float a17, float a18, float a19, float a20, float a21, float a22, float a23, float a24, float a25, float a26, float a27, float a28, float a29) -> Tensor");
  m.def("time_cpp(int calls, int repeats) -> float[]", &opforge_bench::TimeCpp);
  m.def("time_boxed(str[] names, int calls, int repeats) -> float[]", &opforge_bench::TimeBoxed);
}

TORCH_LIBRARY_IMPL(opforge_bench, CPU, m) {
  m.impl("flat", &opforge_bench::Flat);
  m.impl("flat1", &opforge_bench::Flat1);
  m.impl("flat5", &opforge_bench::Flat5);
  m.impl("flat30", &opforge_bench::Flat30);
}

TORCH_LIBRARY_FRAGMENT(opforge_bench, m) {
  m.def("affine_flat(Tensor x, Tensor w, Tensor b, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(opforge_bench, CompositeExplicitAutograd, m) {
  m.impl("affine_flat", &opforge_bench::AffineFlat);
}

TORCH_LIBRARY_IMPL(opforge_bench, Autograd, m) {
  m.impl("affine_flat", &opforge_bench::AffineFlatAutograd);
}

OPFORGE_LIBRARY(opforge_bench, m) {
  m.def("structured(Tensor x, Tensor y, opforge_bench.Cfg cfg) -> Tensor");
  m.impl("structured", c10::kCPU, &opforge_bench::Structured);
  m.def("struct1(Tensor x, opforge_bench.Cfg1 cfg) -> Tensor");
  m.impl("struct1", c10::kCPU, &opforge_bench::Struct1);
  m.def("struct5(Tensor x, opforge_bench.Cfg5 cfg) -> Tensor");
  m.impl("struct5", c10::kCPU, &opforge_bench::Struct5);
  m.def("struct30(Tensor x, opforge_bench.Cfg30 cfg) -> Tensor");
  m.impl("struct30", c10::kCPU, &opforge_bench::Struct30);

  m.def("affine(Tensor x, opforge_bench.Lin lin) -> Tensor", &opforge_bench::Affine)
      .autograd<opforge_bench::AffineGrad>();
}
