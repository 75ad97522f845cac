// Ops with struct, enum, optional-struct and handle parameters, defined in C++.
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty_like.h>

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

}  // namespace ext

OPFORGE_LIBRARY(opforge_ext, m) {
  m.def("scale(Tensor x, ext.Cfg cfg) -> Tensor", &ext::Scale);
  m.fake("scale", &ext::ScaleFake);
  m.def("reduce(Tensor x) -> Stats", &ext::Reduce);
  m.def("run(Tensor x, Handle(Runner) runner) -> Tensor", &ext::Run);
  m.fake("run", &ext::RunFake);
  m.def("make_runner(float factor) -> int", &ext::MakeRunner);
}
