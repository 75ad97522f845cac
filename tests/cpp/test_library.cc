// The C++ front end through the real dispatcher.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include "opforge/backward.h"
#include "opforge/opforge.h"

namespace lib_test {

struct Inner {
  double bias = 0.0;
  at::Tensor w;
};
OPFORGE_STRUCT(Inner, bias, w);

enum class Mode : int64_t { kFast = 1, kExact = 2 };
OPFORGE_ENUM(Mode, kFast, kExact);

struct Cfg {
  double scale;
  bool causal = true;
  int64_t k = 1;
  Mode mode = Mode::kFast;
  std::optional<double> eps;
  std::vector<int64_t> dims;
  Inner inner;
  std::optional<Inner> extra;
};
OPFORGE_STRUCT(Cfg, scale, causal, k, mode, eps, dims, inner, extra);

// Every field shows up in the result, so a wrong rebuild shows.
at::Tensor Attn(const at::Tensor& q, const Cfg& cfg) {
  double add = (cfg.causal ? 1 : 0) + cfg.k * 10 + static_cast<int64_t>(cfg.mode) * 100 +
               cfg.eps.value_or(0.5) + static_cast<double>(cfg.dims.size()) * 1000 + cfg.inner.bias +
               (cfg.extra ? cfg.extra->bias : -7.0);
  return q * cfg.scale + add + cfg.inner.w;
}

at::Tensor AttnCpu(const at::Tensor& q, const Cfg& cfg) { return Attn(q, cfg) + 0.25; }

struct Out {
  at::Tensor y;
  at::Tensor lse;
};
OPFORGE_STRUCT(Out, y, lse);

Out Split(const at::Tensor& x) { return Out{x * 2, x * 3}; }

struct Runner {
  double k;
};
at::Tensor RunKernel(const at::Tensor& x, opforge::Handle<Runner> runner) { return x * runner->k; }

void Mutate(const at::Tensor& x, const Inner& bufs) { bufs.w.add_(x); }

c10::IValue Call(const char* name, std::vector<c10::IValue> stack) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  op.callBoxed(&stack);
  return stack.empty() ? c10::IValue() : stack[0];
}

class LibraryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    lib_ = new torch::Library(torch::Library::FRAGMENT, "opforge_lib_test", std::nullopt, __FILE__, __LINE__);
    opforge::Library m(*lib_, "opforge_lib_test");
    m.def("attn(Tensor q, Cfg cfg) -> Tensor", &Attn).symm_mem_args({"cfg"});
    m.def("split(Tensor x) -> Out", &Split);
    m.def("run(Tensor x, Handle(Runner) runner) -> Tensor", &RunKernel);
    m.def("mutate(Tensor x, Inner(a!) bufs) -> ()", &Mutate);
  }
  static torch::Library* lib_;
};
torch::Library* LibraryTest::lib_ = nullptr;

TEST_F(LibraryTest, StructParametersRegisterTheFlatSchema) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_lib_test::attn", "");
  std::ostringstream printed;
  printed << op.schema();
  EXPECT_EQ(printed.str(),
            "opforge_lib_test::attn(Tensor q, float cfg__scale, bool cfg__causal, int cfg__k, int cfg__mode, "
            "float? cfg__eps, int[] cfg__dims, float cfg__inner__bias, Tensor cfg__inner__w, "
            "bool cfg__extra__is_set=False, float? cfg__extra__bias=None, Tensor? cfg__extra__w=None) -> Tensor");
  // The earlier fields' defaults (causal = true, ...) cannot be kept: the
  // required cfg__inner__w follows them (tests/cpp/test_struct_defaults.cc).
}

TEST_F(LibraryTest, KernelReceivesTheStructRebuiltFromLeaves) {
  at::Tensor q = at::ones({2}, at::kDouble);
  at::Tensor w = at::full({2}, 0.125);
  auto out = Call("opforge_lib_test::attn",
                  {q, 2.0, false, int64_t{3}, int64_t{2}, c10::IValue(), std::vector<int64_t>{4, 5}, 0.5, w,
                   true, 0.25, w})
                 .toTensor();
  // 2 + (0 + 30 + 200 + 0.5 + 2000 + 0.5 + 0.25) + 0.125
  EXPECT_DOUBLE_EQ(out[0].item<double>(), 2 + 2231.25 + 0.125);
  auto absent = Call("opforge_lib_test::attn",
                     {q, 1.0, true, int64_t{1}, int64_t{1}, 0.0, std::vector<int64_t>{}, 0.0, w, false,
                      c10::IValue(), c10::IValue()})
                    .toTensor();
  // 1 + (1 + 10 + 100 + 0 + 0 + 0 - 7) + 0.125
  EXPECT_DOUBLE_EQ(absent[0].item<double>(), 1 + 104 + 0.125);
}

TEST_F(LibraryTest, PresentOptionalStructWithAMissingFieldIsAnError) {
  at::Tensor w = at::zeros({2});
  try {
    Call("opforge_lib_test::attn", {at::ones({2}, at::kDouble), 1.0, true, int64_t{1}, int64_t{1}, 0.0, std::vector<int64_t>{},
                                    0.0, w, true, 0.25, c10::IValue()});
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("one of its required fields is None"), std::string::npos) << e.what();
  }
}

TEST_F(LibraryTest, StructReturnsBecomeTuples) {
  auto out = Call("opforge_lib_test::split", {at::ones({1})});
  // Boxed calls leave both returns on the stack; the first is y.
  EXPECT_DOUBLE_EQ(out.toTensor().item<double>(), 2.0);
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_lib_test::split", "");
  auto typed = op.typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&)>();
  auto [y, lse] = typed.call(at::ones({1}));
  EXPECT_DOUBLE_EQ(lse.item<double>(), 3.0);
}

TEST_F(LibraryTest, SymmMemArgsExpandAStructToItsTensorLeaves) {
  EXPECT_EQ(opforge::TagRegistry::Global().ArgsWithTag("opforge_lib_test::attn", "symm_mem"),
            (std::vector<std::string>{"cfg__inner__w", "cfg__extra__w"}));
  auto spec = opforge::OpSpecRegistry::Global().Find("opforge_lib_test::attn");
  ASSERT_TRUE(spec);
  EXPECT_EQ(opforge::ToString(spec->original), "opforge_lib_test::attn(Tensor q, Cfg cfg) -> Tensor");
}

TEST_F(LibraryTest, HandleParametersResolveToTheRegisteredObject) {
  auto runner = std::make_shared<Runner>(Runner{4.0});
  int64_t h = opforge::RegisterHandle(runner);
  auto out = Call("opforge_lib_test::run", {at::ones({1}), h}).toTensor();
  EXPECT_DOUBLE_EQ(out.item<double>(), 4.0);
  ASSERT_TRUE(opforge::HandleTable::Global().Release(h));
  try {
    Call("opforge_lib_test::run", {at::ones({1}), h});
    FAIL() << "a released handle must not resolve";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("is stale"), std::string::npos) << e.what();
  }
}

// A symbolic int, as a fake kernel sees a handle while torch.compile traces.
struct SymbolicNode : c10::SymNodeImpl {
  bool is_int() override { return true; }
  std::string str() override { return "s0"; }
};

TEST_F(LibraryTest, AConcreteSymIntHandleResolvesAndASymbolicOneHasNoObject) {
  auto runner = std::make_shared<Runner>(Runner{2.0});
  int64_t h = opforge::RegisterHandle(runner);
  opforge::Handle<Runner> concrete{c10::SymInt(h)};
  EXPECT_FALSE(concrete.is_symbolic());
  EXPECT_EQ(&concrete.get(), runner.get());
  EXPECT_EQ(concrete.id(), h);

  opforge::Handle<Runner> symbolic{c10::SymInt(c10::SymNode(c10::make_intrusive<SymbolicNode>()))};
  EXPECT_TRUE(symbolic.is_symbolic());
  try {
    (void)symbolic->k;
    FAIL() << "a symbolic handle has no runner";
  } catch (const opforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is symbolic: a fake kernel runs while torch.compile traces"),
              std::string::npos)
        << e.what();
  }
  opforge::HandleTable::Global().Release(h);
}

TEST_F(LibraryTest, AnOpWithAHandleGetsAKernelTorchCompileDoesNotTraceInto) {
  auto run = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_lib_test::run", "");
  EXPECT_TRUE(run.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd));
  EXPECT_FALSE(run.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd));
  auto split = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_lib_test::split", "");
  EXPECT_TRUE(split.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd));
}

TEST_F(LibraryTest, HandleOfAnotherTypeIsRejected) {
  auto inner = std::make_shared<Inner>();
  int64_t h = opforge::RegisterHandle(inner);
  try {
    Call("opforge_lib_test::run", {at::ones({1}), h});
    FAIL() << "a handle of another type must not resolve";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("refers to a lib_test.Inner, not a lib_test.Runner"),
              std::string::npos)
        << e.what();
  }
  opforge::HandleTable::Global().Release(h);
}

TEST_F(LibraryTest, MutatingAStructMutatesItsTensorField) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_lib_test::mutate", "");
  std::ostringstream printed;
  printed << op.schema();
  EXPECT_EQ(printed.str(),
            "opforge_lib_test::mutate(Tensor x, float bufs__bias, Tensor(a2!) bufs__w) -> ()");
  at::Tensor w = at::zeros({2});
  Call("opforge_lib_test::mutate", {at::ones({2}, at::kDouble), 0.0, w});
  EXPECT_DOUBLE_EQ(w[1].item<double>(), 1.0);
}

TEST(LibraryErrors, UnknownStructTypeInSchemaIsAnError) {
  torch::Library lib(torch::Library::FRAGMENT, "opforge_lib_err", std::nullopt, __FILE__, __LINE__);
  opforge::Library m(lib, "opforge_lib_err");
  try {
    m.def("f(Tensor x, NoSuchCfg cfg) -> Tensor");
    FAIL() << "expected an error";
  } catch (const opforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown type 'NoSuchCfg'"), std::string::npos) << e.what();
  }
}

struct Cfg2 {
  double scale;
};
OPFORGE_STRUCT_NAMED(Cfg2, "Cfg", scale);  // same name as lib_test::Cfg, other layout
at::Tensor UseCfg2(const at::Tensor& x, const Cfg2& c) { return x * c.scale; }

TEST(LibraryErrors, DuplicateStructNameWithADifferentLayoutIsAnError) {
  torch::Library lib(torch::Library::FRAGMENT, "opforge_lib_err2", std::nullopt, __FILE__, __LINE__);
  opforge::Library m(lib, "opforge_lib_err2");
  opforge::RegisterTypes<Cfg>();
  try {
    m.def("g(Tensor x, Cfg c) -> Tensor", &UseCfg2);
    FAIL() << "expected an error";
  } catch (const opforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("already registered with a different layout"), std::string::npos)
        << e.what();
  }
}

TEST(LibraryErrors, KernelSignatureMustMatchTheSchema) {
  torch::Library lib(torch::Library::FRAGMENT, "opforge_lib_err3", std::nullopt, __FILE__, __LINE__);
  opforge::Library m(lib, "opforge_lib_err3");
  // The schema says int, the kernel takes the Cfg struct: torch's own check.
  EXPECT_ANY_THROW(m.def("h(Tensor q, int cfg) -> Tensor", &Attn));
}

struct CapturedWarnings : c10::WarningHandler {
  std::vector<std::string> messages;
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
};

TEST(LibraryErrors, SymmMemArgsWithoutGroupNameWarn) {
  CapturedWarnings captured;
  c10::WarningUtils::WarningHandlerGuard guard(&captured);
  torch::Library lib(torch::Library::FRAGMENT, "opforge_lib_warn", std::nullopt, __FILE__, __LINE__);
  opforge::Library m(lib, "opforge_lib_warn");
  m.def("attn(Tensor q, Cfg cfg) -> Tensor", &Attn).symm_mem_args({"q"});
  ASSERT_EQ(captured.messages.size(), 1u);
  EXPECT_NE(captured.messages[0].find("opforge_lib_warn::attn: symm_mem_args are declared but the op has no "
                                      "'group_name' argument"),
            std::string::npos)
      << captured.messages[0];
}

TEST(LibraryImpl, PerDeviceKernelsTakePrecedence) {
  torch::Library lib(torch::Library::FRAGMENT, "opforge_lib_dev", std::nullopt, __FILE__, __LINE__);
  opforge::Library m(lib, "opforge_lib_dev");
  m.def("attn(Tensor q, Cfg cfg) -> Tensor", &Attn);
  m.impl("attn", c10::DeviceType::CPU, &AttnCpu);
  at::Tensor w = at::zeros({1});
  auto out = Call("opforge_lib_dev::attn", {at::zeros({1}), 1.0, true, int64_t{0}, int64_t{1}, 0.0,
                                            std::vector<int64_t>{}, 0.0, w, false, c10::IValue(),
                                            c10::IValue()})
                 .toTensor();
  // Attn gives 0 + (1 + 0 + 100 + 0 + 0 + 0 - 7); AttnCpu adds 0.25.
  EXPECT_DOUBLE_EQ(out.item<double>(), 94.25);
}

}  // namespace lib_test

// ---------------------------------------------------------------------------
// A C++ backward written against the struct signature.

namespace grad_test {

struct Inner {
  at::Tensor t;
  double k = 1.0;
};
OPFORGE_STRUCT_NAMED(Inner, "grad_test.Inner", t, k);

struct Cfg {
  double scale = 1.0;
  at::Tensor w;
  std::optional<at::Tensor> b;
  Inner inner;
};
OPFORGE_STRUCT_NAMED(Cfg, "grad_test.Cfg", scale, w, b, inner);

// y = x * w * scale + b + inner.t * inner.k
at::Tensor Affine(const at::Tensor& x, const Cfg& cfg) {
  at::Tensor y = x * cfg.w * cfg.scale + cfg.inner.t * cfg.inner.k;
  return cfg.b ? y + *cfg.b : y;
}

int setup_calls = 0;
std::pair<bool, bool> last_needs;  // needs_input_grad(0), needs_input_grad(1) in setup_context

struct AffineGrad {
  static void setup_context(opforge::AutogradContext* ctx, const at::Tensor& x, const Cfg& cfg,
                            const at::Tensor& /*out*/) {
    ++setup_calls;
    ctx->save_for_backward({x, cfg.w});
    ctx->saved_data["scale"] = cfg.scale;
    ctx->saved_data["k"] = cfg.inner.k;
    last_needs = {ctx->needs_input_grad(0), ctx->needs_input_grad(1)};
  }
  static opforge::GradsFor<decltype(Affine)> backward(opforge::AutogradContext* ctx, const at::Tensor& grad) {
    auto saved = ctx->get_saved_variables();
    const double scale = ctx->saved_data["scale"].toDouble();
    opforge::Grad<Cfg> cfg;
    cfg.set(&Cfg::w, grad * saved[0] * scale)
        .set(&Cfg::b, grad)
        .set(&Cfg::inner, opforge::Grad<Inner>().set(&Inner::t, grad * ctx->saved_data["k"].toDouble()));
    return {grad * saved[1] * scale, cfg};
  }
};

// Two outputs, a scalar parameter (no gradient) and a Tensor[] parameter.
std::tuple<at::Tensor, at::Tensor> Pair(const at::Tensor& x, int64_t n, const std::vector<at::Tensor>& ys) {
  at::Tensor sum = x * static_cast<double>(n);
  for (const auto& y : ys) sum = sum + y;
  return {sum, x * x};
}

struct PairGrad {
  static void setup_context(opforge::AutogradContext* ctx, const at::Tensor& x, int64_t n,
                            const std::vector<at::Tensor>& ys, const std::tuple<at::Tensor, at::Tensor>&) {
    ctx->save_for_backward({x});
    ctx->saved_data["n"] = n;
    ctx->saved_data["count"] = static_cast<int64_t>(ys.size());
  }
  static opforge::GradsFor<decltype(Pair)> backward(opforge::AutogradContext* ctx, const at::Tensor& g_sum,
                                                    const at::Tensor& g_sq) {
    at::Tensor x = ctx->get_saved_variables()[0];
    std::vector<at::Tensor> gys(static_cast<size_t>(ctx->saved_data["count"].toInt()), g_sum);
    return {g_sum * static_cast<double>(ctx->saved_data["n"].toInt()) + g_sq * 2 * x, opforge::NoGrad{}, gys};
  }
};

// A backward that wrongly returns a gradient for an int parameter.
at::Tensor Times(const at::Tensor& x, int64_t n) { return x * static_cast<double>(n); }
struct BadTimesGrad {
  static std::tuple<at::Tensor, at::Tensor> backward(opforge::AutogradContext*, const at::Tensor& g) {
    return {g, g};
  }
};

at::Tensor Update(const at::Tensor& x, const Inner& bufs) {
  bufs.t.add_(x);
  return x * 2;
}
struct UpdateGrad {
  static opforge::GradsFor<decltype(Update)> backward(opforge::AutogradContext*, const at::Tensor&) {
    return {};
  }
};

class BackwardTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    lib_ = new torch::Library(torch::Library::FRAGMENT, "opforge_grad_test", std::nullopt, __FILE__, __LINE__);
    opforge::Library m(*lib_, "opforge_grad_test");
    m.def("affine(Tensor x, grad_test.Cfg cfg) -> Tensor", &Affine).autograd<AffineGrad>();
    m.def("pair(Tensor x, int n, Tensor[] ys) -> (Tensor, Tensor)", &Pair).autograd<PairGrad>();
    m.def("times(Tensor x, int n) -> Tensor", &Times).autograd<BadTimesGrad>();
  }
  static torch::Library* lib_;
};
torch::Library* BackwardTest::lib_ = nullptr;

using AffineSig = at::Tensor(const at::Tensor&, double, const at::Tensor&, const std::optional<at::Tensor>&,
                             const at::Tensor&, double);

TEST_F(BackwardTest, StructFieldTensorsGetTheGradientsBackwardGaveThem) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_grad_test::affine", "").typed<AffineSig>();
  at::Tensor x = at::tensor({1.0, 2.0}).requires_grad_();
  at::Tensor w = at::tensor({3.0, 4.0}).requires_grad_();
  at::Tensor b = at::tensor({0.5, 0.5}).requires_grad_();
  at::Tensor t = at::tensor({1.0, 1.0}).requires_grad_();
  setup_calls = 0;
  at::Tensor y = op.call(x, 2.0, w, b, t, 3.0);
  EXPECT_EQ(setup_calls, 1);
  EXPECT_TRUE(at::allclose(y, at::tensor({1.0 * 3 * 2 + 0.5 + 3, 2.0 * 4 * 2 + 0.5 + 3})));
  EXPECT_NE(std::string(y.grad_fn()->name()).find("OpBackward"), std::string::npos) << y.grad_fn()->name();
  auto grads = torch::autograd::grad({y.sum()}, {x, w, b, t});
  EXPECT_TRUE(at::allclose(grads[0], w * 2.0));
  EXPECT_TRUE(at::allclose(grads[1], x * 2.0));
  EXPECT_TRUE(at::allclose(grads[2], at::ones({2}, at::kDouble)));
  EXPECT_TRUE(at::allclose(grads[3], at::full({2}, 3.0, at::kDouble)));
}

TEST_F(BackwardTest, AnAbsentOptionalTensorFieldTakesNoGradient) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_grad_test::affine", "").typed<AffineSig>();
  at::Tensor x = at::tensor({1.0, 2.0});
  at::Tensor w = at::tensor({3.0, 4.0}).requires_grad_();
  at::Tensor t = at::tensor({1.0, 1.0});
  at::Tensor y = op.call(x, 1.0, w, std::nullopt, t, 1.0);
  auto grads = torch::autograd::grad({y.sum()}, {w});
  EXPECT_TRUE(at::allclose(grads[0], x));
}

TEST_F(BackwardTest, NeedsInputGradCountsOriginalParameters) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_grad_test::affine", "").typed<AffineSig>();
  auto ones = at::ones({1}, at::kDouble);
  at::Tensor x = ones.clone().requires_grad_();
  op.call(x, 1.0, ones, std::nullopt, ones, 1.0);
  EXPECT_EQ(last_needs, std::make_pair(true, false));
  // A nested field's tensor makes its struct parameter need a gradient.
  op.call(ones, 1.0, ones, std::nullopt, ones.clone().requires_grad_(), 1.0);
  EXPECT_EQ(last_needs, std::make_pair(false, true));
}

TEST_F(BackwardTest, WithoutGradModeTheKernelRunsWithoutANode) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_grad_test::affine", "").typed<AffineSig>();
  at::Tensor x = at::tensor({1.0}).requires_grad_();
  setup_calls = 0;
  c10::AutoGradMode no_grad(false);
  at::Tensor y = op.call(x, 1.0, x, std::nullopt, x, 1.0);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(setup_calls, 0);
}

TEST_F(BackwardTest, TupleOutputsAndTensorListParametersGetGradients) {
  using Sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t, at::TensorList);
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_grad_test::pair", "").typed<Sig>();
  at::Tensor x = at::tensor({2.0}).requires_grad_();
  at::Tensor y1 = at::tensor({1.0}).requires_grad_();
  at::Tensor y2 = at::tensor({1.0}).requires_grad_();
  auto [sum, sq] = op.call(x, 3, {y1, y2});
  auto grads = torch::autograd::grad({(sum + sq).sum()}, {x, y1, y2});
  EXPECT_DOUBLE_EQ(grads[0].item<double>(), 3.0 + 2 * 2.0);
  EXPECT_DOUBLE_EQ(grads[1].item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(grads[2].item<double>(), 1.0);
}

TEST_F(BackwardTest, AGradientForANonTensorParameterIsAnError) {
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("opforge_grad_test::times", "")
                .typed<at::Tensor(const at::Tensor&, int64_t)>();
  at::Tensor x = at::tensor({2.0}).requires_grad_();
  at::Tensor y = op.call(x, 3);
  try {
    torch::autograd::grad({y.sum()}, {x});
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("opforge_grad_test::times: parameter 'n': backward returned a defined "
                                         "gradient, but the parameter is not a Tensor."),
              std::string::npos)
        << e.what();
  }
}

TEST(BackwardErrors, AnOpThatMutatesCannotHaveABackward) {
  torch::Library lib(torch::Library::FRAGMENT, "opforge_grad_err", std::nullopt, __FILE__, __LINE__);
  opforge::Library m(lib, "opforge_grad_err");
  try {
    m.def("update(Tensor x, grad_test.Inner(a!) bufs) -> Tensor", &Update).autograd<UpdateGrad>();
    FAIL() << "expected an error";
  } catch (const opforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the op mutates 'bufs.t'"), std::string::npos) << e.what();
  }
}

struct Partial {
  at::Tensor a;
  at::Tensor hidden;  // not listed below
};
OPFORGE_STRUCT_NAMED(Partial, "grad_test.Partial", a);

TEST(BackwardErrors, GradOfAFieldNotListedInTheStructIsAnError) {
  opforge::Grad<Partial> g;
  g.set(&Partial::a, at::ones({1}));
  EXPECT_TRUE(at::allclose(g.get(&Partial::a), at::ones({1})));
  try {
    g.set(&Partial::hidden, at::ones({1}));
    FAIL() << "expected an error";
  } catch (const opforge::Error& e) {
    EXPECT_NE(std::string(e.what()).find("opforge::Grad<grad_test.Partial>::set: the field is not one of those "
                                         "listed in OPFORGE_STRUCT."),
              std::string::npos)
        << e.what();
  }
}

}  // namespace grad_test
