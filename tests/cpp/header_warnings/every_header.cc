// Every public opforge header, and what a kernel library instantiates of
// them, compiled with -Wall -Wextra -Werror and opforge's include directory as
// a plain -I: a user's build that includes opforge's headers without
// -isystem, with whatever warnings it turns on, stays warning-free. Built in
// both ABI modes (tests/cpp/CMakeLists.txt); compiled, never run.
#include <opforge/opforge.h>

#include <opforge/abi.h>
#include <opforge/handle.h>
#include <opforge/reflect.h>
#include <opforge/version.h>
#ifndef OPFORGE_STABLE_ABI
#include <opforge/backward.h>
#include <opforge/call.h>
#include <opforge/library.h>
#endif

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

// torch declares its stable types (Tensor, Device) hidden, so GCC warns of a
// struct holding one that is more visible: a stable-ABI library's own
// structs are hidden too (as they are under -fvisibility=hidden).
#if defined(OPFORGE_STABLE_ABI)
#define WARNINGS_HIDDEN __attribute__((visibility("hidden")))
#else
#define WARNINGS_HIDDEN
#endif

namespace warnings {

using opforge::Tensor;

enum class Mode : int64_t { kFast = 0, kExact = 1 };
OPFORGE_ENUM(Mode, kFast, kExact);

struct WARNINGS_HIDDEN Inner {
  Tensor t;
  double scale = 1.0;
};
OPFORGE_STRUCT(Inner, t, scale);

// One field of every leaf type a struct may hold.
struct WARNINGS_HIDDEN Cfg {
  int64_t i = 1;
  int32_t narrow = 2;
  double d = 0.5;
  float f = 0.25f;
  bool b = true;
  std::string s = "s";
  std::vector<int64_t> ints = {1, 2};
  std::vector<double> floats = {0.5};
  std::vector<bool> flags = {true, false};
  std::optional<double> maybe;
  std::optional<Tensor> bias;
  std::vector<Tensor> tensors;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Layout layout = c10::Layout::Strided;
  c10::MemoryFormat format = c10::MemoryFormat::Contiguous;
  opforge::Device device = opforge::Device(c10::DeviceType::CPU);
  Mode mode = Mode::kFast;
  Inner inner;
};
OPFORGE_STRUCT(Cfg, i, narrow, d, f, b, s, ints, floats, flags, maybe, bias, tensors, dtype, layout, format, device,
               mode, inner);

struct WARNINGS_HIDDEN Result {
  Tensor y;
  int64_t n = 0;
};
OPFORGE_STRUCT(Result, y, n);

struct Runner {
  double factor = 2.0;
};

void Inplace(Tensor& out, const Tensor& x, const Cfg& cfg) {
  (void)x;
  (void)cfg;
  (void)out;
}

Tensor Everything(const Tensor& x, const std::optional<Tensor>& maybe, const std::vector<Tensor>& xs, int64_t i,
                  std::optional<int64_t> oi, double d, bool b, const std::string& s, const std::vector<int64_t>& ints,
                  const std::vector<double>& floats, const std::vector<bool>& flags, c10::ScalarType dtype,
                  opforge::Device device, Mode mode, const std::optional<Cfg>& ocfg, opforge::Handle<Runner> runner) {
  (void)maybe, (void)xs, (void)i, (void)oi, (void)d, (void)b, (void)s, (void)ints, (void)floats, (void)flags;
  (void)dtype, (void)device, (void)mode, (void)ocfg, (void)runner;
  return x;
}

std::tuple<Tensor, Tensor> Pair(const Tensor& x, const Cfg& cfg) { return {x, cfg.inner.t}; }
std::vector<Tensor> List(const Tensor& x) { return {x, x}; }
Result Returns(const Tensor& x) { return {x, 1}; }

Tensor Scaled(const Tensor& x, const Inner& inner) {
  (void)inner;
  return opforge::Call<Tensor>("warnings::flat", x, int64_t{1});
}
Tensor ScaledMeta(const Tensor& x, const Inner&) { return x; }

struct ScaledGrad {
  static void setup_context(opforge::AutogradContext* ctx, const Tensor& x, const Inner& inner, const Tensor&) {
    ctx->save_for_backward({x, inner.t});
    ctx->saved_data["scale"] = inner.scale;
    ctx->saved_data["name"] = "scaled";
  }
  static opforge::GradsFor<decltype(Scaled)> backward(opforge::AutogradContext* ctx, const Tensor& grad) {
    auto saved = ctx->get_saved_variables();
    const double scale = ctx->saved_data["scale"].toDouble();
    (void)scale;
    opforge::Grad<Inner> inner;
    inner.set(&Inner::t, grad);
    return {ctx->needs_input_grad(0) ? grad : Tensor(), inner};
  }
};

Tensor Flat(const Tensor& x, int64_t) { return x; }

int64_t MakeRunner(double factor) {
  return opforge::RegisterHandle(std::make_shared<Runner>(Runner{factor}));
}

}  // namespace warnings

using namespace warnings;

OPFORGE_LIBRARY(warnings, m) {
  m.def("inplace(Tensor! out, Tensor x, Cfg cfg) -> ()");
  m.impl("inplace", c10::kCPU, &Inplace);
  m.def("everything(Tensor x, Tensor? maybe, Tensor[] xs, int i, int? oi, float d, bool b, str s, int[] ints, "
        "float[] floats, bool[] flags, ScalarType dtype, Device device, Mode mode, Cfg? ocfg, "
        "Handle(Runner) runner) -> Tensor",
        &Everything);
  m.def("pair(Tensor x, Cfg cfg) -> (Tensor, Tensor)", &Pair);
  m.def("list(Tensor x) -> Tensor[]", &List).symm_mem_args({"x"});
  m.def("returns(Tensor x) -> Result", &Returns);
  m.def("scaled(Tensor x, Inner inner) -> Tensor", &Scaled).autograd<ScaledGrad>();
  m.fake("scaled", &ScaledMeta);
  m.def("flat(Tensor x, int n) -> Tensor");
  m.types<Cfg>();
}

OPFORGE_LIBRARY_IMPL(warnings, CPU, m) { m.impl("flat", &Flat); }

#ifndef OPFORGE_STABLE_ABI
// The C++ API mode's own: an op looked up once, called typed.
Tensor CallTwice(const Tensor& x, const Cfg& cfg) {
  static const opforge::OpRef pair("warnings::pair");
  auto [a, b] = pair.call<std::tuple<Tensor, Tensor>>(x, cfg);
  (void)b;
  return opforge::Call<Result>("warnings::returns", a).y;
}
#endif
