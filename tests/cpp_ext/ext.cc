// Ops with struct, enum, optional-struct and handle parameters, defined in C++.
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>

#include <cmath>

#include <opforge/backward.h>
#include <opforge/opforge.h>

namespace ext {

enum class Mode : int64_t { kAdd = 0, kMul = 1 };
OPFORGE_ENUM(Mode, kAdd, kMul);

struct Bias {
  double value;
  at::Tensor t;
};
OPFORGE_STRUCT(Bias, value, t);

struct Cfg {
  double scale;
  Mode mode;
  std::optional<Bias> bias;
};
OPFORGE_STRUCT_NAMED(Cfg, "ext.Cfg", scale, mode, bias);

at::Tensor Scale(const at::Tensor& x, const Cfg& cfg) {
  at::Tensor out = cfg.mode == Mode::kMul ? x * cfg.scale : x + cfg.scale;
  if (cfg.bias) out = out + cfg.bias->value + cfg.bias->t;
  return out;
}

at::Tensor ScaleFake(const at::Tensor& x, const Cfg&) { return at::empty_like(x); }

struct Stats {
  at::Tensor sum;
  at::Tensor max;
};
OPFORGE_STRUCT(Stats, sum, max);

Stats Reduce(const at::Tensor& x) { return Stats{x.sum(), x.max()}; }

struct Runner {
  double factor;
};
at::Tensor Run(const at::Tensor& x, opforge::Handle<Runner> runner) { return x * runner->factor; }

// The shape function never uses the runner (under torch.compile it gets a
// symbolic handle).
at::Tensor RunFake(const at::Tensor& x, opforge::Handle<Runner>) { return at::empty_like(x); }

// Registers a Runner for Python tests; returns its handle.
int64_t MakeRunner(double factor) { return opforge::RegisterHandle(std::make_shared<Runner>(Runner{factor})); }

// A struct with C++ default member initializers: from Python, every field
// but `scale` may be omitted (docs/cpp_ops.md#defaults).
struct AttnCfg {
  double scale;
  bool causal = true;
  int64_t window = -1;
  Mode mode = Mode::kMul;
  std::optional<double> softcap;
  std::string tag = "attn";
};
OPFORGE_STRUCT_NAMED(AttnCfg, "ext.AttnCfg", scale, causal, window, mode, softcap, tag);

// Every field shows in the result, so a default that went wrong shows too.
at::Tensor Attn(const at::Tensor& x, const AttnCfg& c) {
  return x * c.scale + (c.causal ? 1 : 0) + static_cast<double>(c.window) * 10 +
         static_cast<double>(c.mode) * 100 + c.softcap.value_or(0.0) * 1000 +
         static_cast<double>(c.tag.size()) * 10000;
}

// An op with a C++ backward: y = (x @ w) * scale + b, with w and b fields of
// a struct parameter.
struct Lin {
  at::Tensor w;
  std::optional<at::Tensor> b;
  double scale = 1.0;
};
OPFORGE_STRUCT_NAMED(Lin, "ext.Lin", w, b, scale);

at::Tensor Linear(const at::Tensor& x, const Lin& lin) {
  at::Tensor y = x.matmul(lin.w) * lin.scale;
  return lin.b ? y + *lin.b : y;
}

at::Tensor LinearFake(const at::Tensor& x, const Lin& lin) {
  return at::empty({x.size(0), lin.w.size(1)}, x.options());
}

struct LinearGrad {
  static void setup_context(opforge::AutogradContext* ctx, const at::Tensor& x, const Lin& lin,
                            const at::Tensor& /*out*/) {
    ctx->save_for_backward({x, lin.w});
    ctx->saved_data["scale"] = lin.scale;
  }
  static opforge::GradsFor<decltype(Linear)> backward(opforge::AutogradContext* ctx, const at::Tensor& grad) {
    auto saved = ctx->get_saved_variables();
    const double scale = ctx->saved_data["scale"].toDouble();
    opforge::Grad<Lin> lin;
    if (ctx->needs_input_grad(1)) {
      lin.set(&Lin::w, saved[0].t().matmul(grad) * scale).set(&Lin::b, grad.sum(0));
    }
    at::Tensor gx = ctx->needs_input_grad(0) ? grad.matmul(saved[1].t()) * scale : at::Tensor();
    return {gx, lin};
  }
};

// A struct return with a backward: both halves of x, scaled.
struct Halves {
  at::Tensor lo;
  at::Tensor hi;
};
OPFORGE_STRUCT_NAMED(Halves, "ext.Halves", lo, hi);

Halves Split(const at::Tensor& x, double k) {
  const int64_t n = x.size(0) / 2;
  return Halves{x.slice(0, 0, n) * k, x.slice(0, n) * (2 * k)};
}

Halves SplitFake(const at::Tensor& x, double) {
  const int64_t n = x.size(0) / 2;
  return Halves{at::empty({n}, x.options()), at::empty({x.size(0) - n}, x.options())};
}

struct SplitGrad {
  static void setup_context(opforge::AutogradContext* ctx, const at::Tensor&, double k, const Halves&) {
    ctx->saved_data["k"] = k;
  }
  static opforge::GradsFor<decltype(Split)> backward(opforge::AutogradContext* ctx, const Halves& grads) {
    const double k = ctx->saved_data["k"].toDouble();
    return {at::cat({grads.lo * k, grads.hi * (2 * k)}), opforge::NoGrad{}};
  }
};

// A real kernel: it reads data pointers, which fake tensors do not have.
at::Tensor SumRows(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() == 2, "sum_rows: float32 2-d");
  at::Tensor out = at::empty({x.size(0)}, x.options());
  const float* in = x.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  for (int64_t r = 0; r < x.size(0); ++r) {
    o[r] = 0;
    for (int64_t c = 0; c < x.size(1); ++c) o[r] += in[r * x.size(1) + c];
  }
  return out;
}
at::Tensor SumRowsFake(const at::Tensor& x) { return at::empty({x.size(0)}, x.options()); }

// Every kind of field, for the differential test of C++ ops' eager path
// (tests/python/test_cpp_libraries.py): the kernel returns what it received.
struct Probe {
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::string s;
  std::optional<double> of;
  std::vector<int64_t> il;
  std::vector<double> fl;
  c10::ScalarType dt = at::kFloat;
  Mode m = Mode::kAdd;
  std::optional<at::Tensor> t;
  std::vector<at::Tensor> ts;
};
OPFORGE_STRUCT_NAMED(Probe, "ext.Probe", i, f, b, s, of, il, fl, dt, m, t, ts);

at::Tensor Encode(const Probe& p) {
  double s_code = static_cast<double>(p.s.size());
  for (unsigned char c : p.s) s_code = s_code * 31 + c;
  double il = static_cast<double>(p.il.size()), fl = static_cast<double>(p.fl.size()), ts = 0;
  for (int64_t v : p.il) il = il * 7 + static_cast<double>(v);
  for (double v : p.fl) fl = fl * 7 + v;
  for (const auto& t : p.ts) ts = ts * 7 + t.sum().item<double>() + 1;
  const double nan = std::nan("");
  return at::tensor({static_cast<double>(p.i), p.f, p.b ? 1.0 : 0.0, s_code, p.of.value_or(nan), il, fl,
                     static_cast<double>(p.dt), static_cast<double>(p.m), p.t ? p.t->sum().item<double>() : nan, ts},
                    at::kDouble);
}
at::Tensor ProbeKernel(const at::Tensor& x, const Probe& p) { return Encode(p) + x.sum().item<double>(); }
at::Tensor ProbeOptional(const at::Tensor& x, const std::optional<Probe>& p) {
  return p ? Encode(*p) : at::full({11}, -1.0, at::kDouble);
}

// A collective-shaped op whose input must be symmetric (docs/symm_mem.md).
at::Tensor AllReduce(const at::Tensor& x, const std::string& /*reduce_op*/, const std::string& /*group_name*/) {
  return x * 2;
}
at::Tensor AllReduceFake(const at::Tensor& x, const std::string&, const std::string&) { return at::empty_like(x); }

}  // namespace ext

OPFORGE_LIBRARY(opforge_ext, m) {
  m.def("probe(Tensor x, ext.Probe p) -> Tensor", &ext::ProbeKernel);
  m.def("probe_optional(Tensor x, ext.Probe? p) -> Tensor", &ext::ProbeOptional);
  m.def("sum_rows(Tensor x) -> Tensor", &ext::SumRows);
  m.fake("sum_rows", &ext::SumRowsFake);
  m.def("all_reduce(Tensor x, str reduce_op, str group_name) -> Tensor", &ext::AllReduce).symm_mem_args({"x"});
  m.fake("all_reduce", &ext::AllReduceFake);
  m.def("scale(Tensor x, ext.Cfg cfg) -> Tensor", &ext::Scale);
  m.fake("scale", &ext::ScaleFake);
  m.def("reduce(Tensor x) -> Stats", &ext::Reduce);
  m.def("run(Tensor x, Handle(Runner) runner) -> Tensor", &ext::Run);
  m.fake("run", &ext::RunFake);
  m.def("make_runner(float factor) -> int", &ext::MakeRunner);
  m.def("attn(Tensor x, ext.AttnCfg cfg) -> Tensor", &ext::Attn);
  m.def("attn_default(Tensor x, ext.AttnCfg cfg={scale=2.0, window=3}) -> Tensor", &ext::Attn);
  m.def("linear(Tensor x, ext.Lin lin) -> Tensor", &ext::Linear).autograd<ext::LinearGrad>();
  m.fake("linear", &ext::LinearFake);
  m.def("split(Tensor x, float k) -> ext.Halves", &ext::Split).autograd<ext::SplitGrad>();
  m.fake("split", &ext::SplitFake);
  // Ops whose fake, backward or kernel come from Python
  // (tests/python/test_cpp_decorators.py): C++ gives the schema and, but for
  // `py_kernel`, a CPU kernel.
  m.def("mix(Tensor x, ext.Lin lin) -> Tensor");
  m.impl("mix", c10::DeviceType::CPU, &ext::Linear);
  m.def("halves(Tensor x, float k) -> ext.Halves");
  m.impl("halves", c10::DeviceType::CPU, &ext::Split);
  m.def("py_kernel(Tensor x, ext.AttnCfg cfg) -> Tensor");
  // A kernel made of ATen calls that autograd and fake tensors trace through.
  m.def("composite(Tensor x, ext.Lin lin) -> Tensor");
  m.impl("composite", c10::DispatchKey::CompositeImplicitAutograd, &ext::Linear);
  m.def("mix_with_fake(Tensor x, ext.Lin lin) -> Tensor");
  m.impl("mix_with_fake", c10::DeviceType::CPU, &ext::Linear);
  m.fake("mix_with_fake", &ext::LinearFake);
}
