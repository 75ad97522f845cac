// The C++ front end through the real dispatcher.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include "opforge/backward.h"
#include "opforge/opforge.h"

// The core's registries, which the tests inspect.
#include "core/error.h"
#include "core/handles.h"
#include "core/libraries.h"
#include "core/spec.h"
#include "core/structs.h"
#include "core/tags.h"

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

// Runs a library block now (OPFORGE_LIBRARY runs one when the library loads)
// and keeps it registered for the rest of the test binary.
opforge::LibraryBlock* Block(const char* ns, void (*init)(opforge::Library&)) {
  return new opforge::LibraryBlock(torch::Library::FRAGMENT, ns, std::nullopt, init, __FILE__, __LINE__);
}

class LibraryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    block_ = Block("opforge_lib_test", [](opforge::Library& m) {
      m.def("attn(Tensor q, Cfg cfg) -> Tensor", &Attn).symm_mem_args({"cfg"});
      m.def("split(Tensor x) -> Out", &Split);
      m.def("run(Tensor x, Handle(Runner) runner) -> Tensor", &RunKernel);
      m.def("mutate(Tensor x, Inner(a!) bufs) -> ()", &Mutate);
    });
    ASSERT_EQ(block_->error(), "");
  }
  static opforge::LibraryBlock* block_;
};
opforge::LibraryBlock* LibraryTest::block_ = nullptr;

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
  // The library's own Cfg: registered under its namespace.
  EXPECT_EQ(opforge::ToString(spec->original), "opforge_lib_test::attn(Tensor q, opforge_lib_test.Cfg cfg) -> Tensor");
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
  // A handle leaf arrives as a SymInt and is read as the kernel's Handle<Runner>.
  auto build = [](c10::SymInt arg) {
    using opforge::detail::HandleId;
    return opforge::detail::LeafTraits<opforge::Handle<Runner>>::FromWide(opforge::detail::FromUnboxed<HandleId>(arg));
  };
  auto runner = std::make_shared<Runner>(Runner{2.0});
  int64_t h = opforge::RegisterHandle(runner);
  opforge::Handle<Runner> concrete = build(c10::SymInt(h));
  EXPECT_FALSE(concrete.is_symbolic());
  EXPECT_EQ(&concrete.get(), runner.get());
  EXPECT_EQ(concrete.id(), h);

  opforge::Handle<Runner> symbolic = build(c10::SymInt(c10::SymNode(c10::make_intrusive<SymbolicNode>())));
  EXPECT_TRUE(symbolic.is_symbolic());
  try {
    (void)symbolic->k;
    FAIL() << "a symbolic handle has no runner";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("is symbolic: a fake kernel runs while torch.compile traces"),
              std::string::npos)
        << e.what();
  }
  opforge::HandleTable::Global().Release(h);
}

TEST_F(LibraryTest, AWeaklyRegisteredObjectThatIsGoneIsStale) {
  auto runner = std::make_shared<Runner>(Runner{2.0});
  int64_t h = opforge::RegisterHandle(runner, /*weak=*/true);
  EXPECT_DOUBLE_EQ(opforge::Handle<Runner>(h)->k, 2.0);
  runner.reset();
  try {
    opforge::Handle<Runner> gone(h);
    FAIL() << "the object is gone";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("was registered weakly and no longer exists"), std::string::npos)
        << e.what();
  }
  opforge::HandleTable::Global().Release(h);
}

TEST_F(LibraryTest, DefWithAKernelRegistersItForEveryBackendButNotAsAComposite) {
  // Fake tensors must never reach a kernel that reads data pointers when the
  // op has a fake kernel, and a gradient never traces through one
  // (docs/cpp_ops.md#what-mdef-with-a-kernel-means).
  for (const char* name : {"opforge_lib_test::run", "opforge_lib_test::split"}) {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
    EXPECT_TRUE(op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)) << name;
    EXPECT_FALSE(op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) << name;
  }
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
    // The kernel's adapter names the op and the parameter.
    EXPECT_EQ(std::string(e.what()).rfind("opforge_lib_test::run: the CompositeExplicitAutograd kernel, parameter ",
                                          0),
              0u)
        << e.what();
  }
  opforge::HandleTable::Global().Release(h);
}

TEST(LibraryPlan, ParamNamesReadTheSchemasTopLevelNames) {
  opforge::detail::LibraryPlan plan("ns", nullptr, "f.cc", 1, nullptr, "unstable", 0);
  plan.AddOp("f(Tensor(a!) out, Tensor? w, int[2] dims=[1, 2], Handle(lib.Runner) r, *, str mode=\"a,(b\", "
             "float eps=1e-6) -> ()");
  plan.AddOp("g() -> Tensor");
  EXPECT_EQ(plan.ParamNames("f"), (std::vector<std::string>{"out", "w", "dims", "r", "mode", "eps"}));
  EXPECT_TRUE(plan.ParamNames("g").empty());
  EXPECT_TRUE(plan.ParamNames("not_defined_here").empty());
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

TEST(LibraryErrors, UnknownStructTypeInSchemaIsAnErrorAndNothingIsRegistered) {
  auto* block = Block("opforge_lib_err", [](opforge::Library& m) {
    m.def("ok(Tensor x) -> Tensor");
    m.def("f(Tensor x, NoSuchCfg cfg) -> Tensor");
  });
  EXPECT_NE(block->error().find("OPFORGE_LIBRARY(opforge_lib_err)"), std::string::npos) << block->error();
  EXPECT_NE(block->error().find("its schema names type 'NoSuchCfg', which this library block does not declare"), std::string::npos) << block->error();
  EXPECT_NE(block->error().find("Nothing of this block was registered."), std::string::npos) << block->error();
  EXPECT_FALSE(c10::Dispatcher::singleton().findSchema({"opforge_lib_err::ok", ""}).has_value());
  EXPECT_FALSE(opforge::OpSpecRegistry::Global().Find("opforge_lib_err::ok"));
  bool recorded = false;
  for (const auto& e : opforge::LibraryRegistry::Global().LoadErrors()) {
    recorded = recorded || e.message == block->error();
  }
  EXPECT_TRUE(recorded);
}

at::Tensor TwiceByValue(at::Tensor x) { return x * 2; }
at::Tensor TwiceByRef(const at::Tensor& x) { return x * 2; }

TEST(LibraryErrors, AKernelOfALaterBlockTakesTheSignatureItsOpRecordedOrNamesTheMismatch) {
  // The first block's kernel takes its tensor by value: the op records that signature (docs/cpp_ops.md#typed-calls).
  auto* first = Block("opforge_sig", [](opforge::Library& m) {
    m.def("twice(Tensor x) -> Tensor");
    m.impl("twice", c10::kCPU, &TwiceByValue);
  });
  ASSERT_EQ(first->error(), "");
  // A later block's kernel of the same signature registers (here for another key).
  auto* same = Block("opforge_sig", [](opforge::Library& m) { m.impl("twice", c10::kCUDA, &TwiceByValue); });
  EXPECT_EQ(same->error(), "");
  // One taking it by const reference has neither the recorded signature nor a flat one that fits: torch's
  // mismatch, naming the op and the kernel, and nothing of that block registered.
  auto* other = Block("opforge_sig", [](opforge::Library& m) {
    m.impl("twice", c10::DispatchKey::Meta, &TwiceByRef);
  });
  EXPECT_NE(other->error().find("opforge_sig::twice"), std::string::npos) << other->error();
  EXPECT_NE(other->error().find("Meta kernel"), std::string::npos) << other->error();
  EXPECT_NE(other->error().find("Mismatch in kernel C++ signatures"), std::string::npos) << other->error();
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_sig::twice", "");
  EXPECT_FALSE(op.hasKernelForDispatchKey(c10::DispatchKey::Meta));
  EXPECT_TRUE(op.hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  at::Tensor y = op.typed<decltype(TwiceByValue)>().call(at::ones({2}));
  EXPECT_DOUBLE_EQ(y[1].item<double>(), 2.0);
}

struct Cfg2 {
  double scale;
};
OPFORGE_STRUCT_NAMED(Cfg2, "Cfg", scale);  // the name lib_test::Cfg has, another layout
at::Tensor UseCfg2(const at::Tensor& x, const Cfg2& c) { return x * c.scale; }

TEST(LibraryErrors, TwoTypesOfOneLibraryWithOneNameAreAnError) {
  auto* block = Block("opforge_lib_err2", [](opforge::Library& m) {
    m.types<Cfg>();
    m.def("g(Tensor x, Cfg c) -> Tensor", &UseCfg2);
  });
  EXPECT_NE(block->error().find("struct lib_test::Cfg2: is registered as 'opforge_lib_err2.Cfg', a name this "
                                "library already gave a struct of another layout"),
            std::string::npos)
      << block->error();
  EXPECT_FALSE(opforge::TypeRegistry::Global().FindStruct("opforge_lib_err2.Cfg"));
}

TEST(LibraryScopes, TwoLibrariesMayEachHaveAStructNamedCfg) {
  auto* a = Block("opforge_scope_a", [](opforge::Library& m) { m.def("f(Tensor q, Cfg cfg) -> Tensor", &Attn); });
  auto* b = Block("opforge_scope_b", [](opforge::Library& m) { m.def("f(Tensor x, Cfg c) -> Tensor", &UseCfg2); });
  ASSERT_EQ(a->error(), "");
  ASSERT_EQ(b->error(), "");
  EXPECT_EQ(opforge::TypeRegistry::Global().FindStruct("opforge_scope_a.Cfg")->fields.size(), 8u);
  EXPECT_EQ(opforge::TypeRegistry::Global().FindStruct("opforge_scope_b.Cfg")->fields.size(), 1u);
  auto out = Call("opforge_scope_b::f", {at::ones({1}), 3.0}).toTensor();
  EXPECT_DOUBLE_EQ(out.item<double>(), 3.0);
}

TEST(LibraryErrors, KernelSignatureMustMatchTheSchema) {
  // The schema says int, the kernel takes the Cfg struct: opforge's check
  // (before torch's), naming the op, the parameter and the C++ type to write.
  auto* block = Block("opforge_lib_err3", [](opforge::Library& m) { m.def("h(Tensor q, int cfg) -> Tensor", &Attn); });
  EXPECT_NE(block->error().find("opforge_lib_err3::h: CompositeExplicitAutograd kernel, parameter 'cfg': is const "
                                "lib_test::Cfg& (opforge_lib_err3.Cfg) in C++ but int in the schema. Write it as "
                                "int64_t"),
            std::string::npos)
      << block->error();
  EXPECT_FALSE(c10::Dispatcher::singleton().findSchema({"opforge_lib_err3::h", ""}).has_value());
}

at::Tensor TakesTensor(const at::Tensor& x, const at::Tensor& w) { return x * w; }
at::Tensor TakesOne(const at::Tensor& x) { return x; }
std::tuple<at::Tensor, at::Tensor> TwoOut(const at::Tensor& x) { return {x, x}; }

TEST(LibraryErrors, AKernelTakingTensorForATensorOptionalIsRefusedAtLoad) {
  // What a stable kernel would read wrongly (and crash on None) is refused
  // in both modes by the core, before torch sees the op.
  auto* block = Block("opforge_lib_err4", [](opforge::Library& m) {
    m.def("f(Tensor x, Tensor? w) -> Tensor");
    m.impl("f", c10::kCPU, &TakesTensor);
  });
  EXPECT_NE(block->error().find("opforge_lib_err4::f: CPU kernel, parameter 'w': is const opforge::Tensor& (Tensor) "
                                "in C++ but Tensor? in the schema. Write it as const std::optional<opforge::Tensor>&"),
            std::string::npos)
      << block->error();
  EXPECT_FALSE(c10::Dispatcher::singleton().findSchema({"opforge_lib_err4::f", ""}).has_value());
}

TEST(LibraryErrors, AKernelWithAParameterTooFewOrAReturnTooManyIsRefusedAtLoad) {
  auto* few = Block("opforge_lib_err5", [](opforge::Library& m) {
    m.def("f(Tensor x, float eps) -> Tensor", &TakesOne);
  });
  EXPECT_NE(few->error().find("opforge_lib_err5::f: CompositeExplicitAutograd kernel: has 1 parameters but the "
                              "schema has 2 (Tensor x, float eps). Give the kernel one parameter per schema "
                              "parameter, in order: (const opforge::Tensor&, double)."),
            std::string::npos)
      << few->error();
  auto* many = Block("opforge_lib_err6", [](opforge::Library& m) { m.def("f(Tensor x) -> Tensor", &TwoOut); });
  EXPECT_NE(many->error().find("opforge_lib_err6::f: CompositeExplicitAutograd kernel: has 2 returns but the schema "
                               "has 1 (Tensor)."),
            std::string::npos)
      << many->error();
}

at::Tensor TakesInt(const at::Tensor& x, int64_t) { return x; }

TEST(LibraryErrors, ADefaultOfAnotherTypeIsALoadError) {
  // torch would register it and trip over it at the first call.
  auto* block =
      Block("opforge_lib_err8", [](opforge::Library& m) { m.def("f(Tensor x, int n=1.5) -> Tensor", &TakesInt); });
  EXPECT_NE(block->error().find("opforge_lib_err8::f: the default '1.5' is not a value of type int"), std::string::npos)
      << block->error();
  EXPECT_FALSE(c10::Dispatcher::singleton().findSchema({"opforge_lib_err8::f", ""}).has_value());
}

TEST(LibraryErrors, AnImplBlockKernelIsCheckedAgainstTheOpOfAnotherBlock) {
  auto* def = Block("opforge_lib_err7", [](opforge::Library& m) { m.def("f(Tensor x, int n) -> Tensor"); });
  ASSERT_EQ(def->error(), "");
  auto* impl = new opforge::LibraryBlock(
      torch::Library::IMPL, "opforge_lib_err7", c10::DispatchKey::CPU,
      [](opforge::Library& m) { m.impl("f", &TakesTensor); }, __FILE__, __LINE__);
  EXPECT_NE(impl->error().find("CPU kernel, parameter 'n': is const opforge::Tensor& (Tensor) in C++ but int in the "
                               "schema. Write it as int64_t"),
            std::string::npos)
      << impl->error();
}

struct CapturedWarnings : c10::WarningHandler {
  std::vector<std::string> messages;
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
};

TEST(LibraryErrors, SymmMemArgsWithoutGroupNameWarn) {
  CapturedWarnings captured;
  c10::WarningUtils::WarningHandlerGuard guard(&captured);
  auto* block = Block("opforge_lib_warn", [](opforge::Library& m) {
    m.def("attn(Tensor q, Cfg cfg) -> Tensor", &Attn).symm_mem_args({"q"});
  });
  ASSERT_EQ(block->error(), "");
  ASSERT_EQ(captured.messages.size(), 1u);
  EXPECT_NE(captured.messages[0].find("opforge_lib_warn::attn: symm_mem_args are declared but the op has no "
                                      "'group_name' argument"),
            std::string::npos)
      << captured.messages[0];
}

TEST(LibraryImpl, PerDeviceKernelsTakePrecedence) {
  auto* block = Block("opforge_lib_dev", [](opforge::Library& m) {
    m.def("attn(Tensor q, Cfg cfg) -> Tensor", &Attn);
    m.impl("attn", c10::DeviceType::CPU, &AttnCpu);
  });
  ASSERT_EQ(block->error(), "");
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

// times's gradient, for an op defined without its kernel (def, then impl).
struct TimesGrad {
  static void setup_context(opforge::AutogradContext* ctx, const at::Tensor&, int64_t n, const at::Tensor&) {
    ctx->saved_data["n"] = n;
  }
  static opforge::GradsFor<decltype(Times)> backward(opforge::AutogradContext* ctx, const at::Tensor& g) {
    return {g * static_cast<double>(ctx->saved_data["n"].toInt()), opforge::NoGrad{}};
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
    auto* block = lib_test::Block("opforge_grad_test", [](opforge::Library& m) {
      m.def("affine(Tensor x, grad_test.Cfg cfg) -> Tensor", &Affine).autograd<AffineGrad>();
      m.def("pair(Tensor x, int n, Tensor[] ys) -> (Tensor, Tensor)", &Pair).autograd<PairGrad>();
      m.def("times(Tensor x, int n) -> Tensor", &Times).autograd<BadTimesGrad>();
      // Defined first, its kernel given apart: the backward names the kernel's signature.
      m.def("scaled(Tensor x, int n) -> Tensor").autograd<TimesGrad, decltype(Times)>();
      m.impl("scaled", c10::kCPU, &Times);
    });
    ASSERT_EQ(block->error(), "");
  }
};

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
  // The op records its kernel's own signature (a Tensor[] as const std::vector<at::Tensor>&), as TORCH_LIBRARY would.
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_grad_test::pair", "").typed<decltype(Pair)>();
  at::Tensor x = at::tensor({2.0}).requires_grad_();
  at::Tensor y1 = at::tensor({1.0}).requires_grad_();
  at::Tensor y2 = at::tensor({1.0}).requires_grad_();
  auto [sum, sq] = op.call(x, 3, {y1, y2});
  auto grads = torch::autograd::grad({(sum + sq).sum()}, {x, y1, y2});
  EXPECT_DOUBLE_EQ(grads[0].item<double>(), 3.0 + 2 * 2.0);
  EXPECT_DOUBLE_EQ(grads[1].item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(grads[2].item<double>(), 1.0);
}

TEST_F(BackwardTest, AnOpDefinedBeforeItsKernelTakesABackwardNamingTheKernelsSignature) {
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("opforge_grad_test::scaled", "")
                .typed<at::Tensor(const at::Tensor&, int64_t)>();
  at::Tensor x = at::tensor({2.0, 3.0}).requires_grad_();
  at::Tensor y = op.call(x, 3);
  EXPECT_TRUE(at::allclose(y, at::tensor({6.0, 9.0})));
  EXPECT_TRUE(at::allclose(torch::autograd::grad({y.sum()}, {x})[0], at::tensor({3.0, 3.0})));
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
  auto* block = lib_test::Block("opforge_grad_err", [](opforge::Library& m) {
    m.def("update(Tensor x, grad_test.Inner(a!) bufs) -> Tensor", &Update).autograd<UpdateGrad>();
  });
  EXPECT_NE(block->error().find("the op mutates 'bufs.t'"), std::string::npos) << block->error();
  EXPECT_FALSE(c10::Dispatcher::singleton().findSchema({"opforge_grad_err::update", ""}).has_value());
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
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("opforge::Grad<grad_test.Partial>::set: the field is not one of those "
                                         "listed in OPFORGE_STRUCT."),
              std::string::npos)
        << e.what();
  }
}

}  // namespace grad_test

// ---------------------------------------------------------------------------
// Kernel libraries written the way vLLM's csrc/ and sgl-kernel write theirs:
// `Tensor!` schemas, `at::Tensor&` parameters, def then impl per device.

namespace vllm_style {

struct NormCfg {
  double eps = 1e-6;
  bool offset = false;
};
OPFORGE_STRUCT(NormCfg, eps, offset);

struct ActCfg {
  double limit = 0.0;  // no Tensor field: its gradient is NoGrad
};
OPFORGE_STRUCT(ActCfg, limit);

// out = x / (mean(x^2) + eps) * (w + offset), written into `out`.
void RmsNorm(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const NormCfg& cfg) {
  at::Tensor scale = (x * x).mean(-1, /*keepdim=*/true) + cfg.eps;
  out.copy_(x / scale * (cfg.offset ? w + 1.0 : w));
}

at::Tensor Scaled(const at::Tensor& x, const ActCfg& cfg) { return x * (cfg.limit + 1.0); }

struct ScaledGrad {
  static void setup_context(opforge::AutogradContext* ctx, const at::Tensor&, const ActCfg& cfg,
                            const at::Tensor&) {
    ctx->saved_data["k"] = cfg.limit + 1.0;
  }
  static opforge::GradsFor<decltype(Scaled)> backward(opforge::AutogradContext* ctx, const at::Tensor& g) {
    return {g * ctx->saved_data["k"].toDouble(), opforge::NoGrad{}};
  }
};

TEST(VllmStyle, TensorBangSchemasAndTensorRefKernelsRegisterAndRun) {
  auto* block = lib_test::Block("opforge_vllm_style", [](opforge::Library& m) {
    // def first, kernels after: the struct named in the schema is known from
    // the kernel that takes it, whatever the order.
    m.def("rms_norm(Tensor! out, Tensor x, Tensor w, NormCfg cfg) -> ()");
    m.impl("rms_norm", c10::kCPU, &RmsNorm);
    m.def("scaled(Tensor x, ActCfg cfg) -> Tensor", &Scaled).autograd<ScaledGrad>();
  });
  ASSERT_EQ(block->error(), "");
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_vllm_style::rms_norm", "");
  std::ostringstream printed;
  printed << op.schema();
  EXPECT_EQ(printed.str(),
            "opforge_vllm_style::rms_norm(Tensor(_0!) out, Tensor x, Tensor w, float cfg__eps=9.9999999999999995e-07, "
            "bool cfg__offset=False) -> ()");
  EXPECT_TRUE(opforge::OpSpecRegistry::Global().Find("opforge_vllm_style::rms_norm")->leaves[0].mutated);
  at::Tensor x = at::rand({2, 4}, at::kDouble);
  at::Tensor w = at::rand({4}, at::kDouble);
  at::Tensor out = at::empty_like(x);
  lib_test::Call("opforge_vllm_style::rms_norm", {out, x, w, 0.5, true});
  EXPECT_TRUE(at::allclose(out, x / ((x * x).mean(-1, true) + 0.5) * (w + 1.0)));
}

TEST(VllmStyle, AnOpWithoutABackwardRaisesWhenAGradientIsRequested) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_vllm_style::rms_norm", "");
  at::Tensor x = at::rand({1, 4}, at::kDouble).requires_grad_();
  at::Tensor out = at::zeros({1, 4}, at::kDouble);
  std::vector<c10::IValue> stack{out, x, at::ones({4}, at::kDouble), 1e-6, false};
  op.callBoxed(&stack);
  ASSERT_TRUE(out.requires_grad());
  try {
    out.sum().backward();
    FAIL() << "a gradient through an op without a backward must be an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("opforge_vllm_style::rms_norm: a gradient was requested through this op, "
                                         "but it has no backward."),
              std::string::npos)
        << e.what();
  }
}

TEST(VllmStyle, WritingATensorBumpsItsVersion) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_vllm_style::rms_norm", "");
  at::Tensor out = at::zeros({1, 4}, at::kDouble);
  const auto before = out._version();
  std::vector<c10::IValue> stack{out, at::ones({1, 4}, at::kDouble), at::ones({4}, at::kDouble), 1e-6, false};
  op.callBoxed(&stack);
  // Once for the call, and once more for the kernel's own out.copy_, an ATen in-place op (as under TORCH_LIBRARY).
  EXPECT_EQ(out._version(), before + 2);
}

TEST(VllmStyle, NoGradStandsForAStructWithoutTensorFields) {
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("opforge_vllm_style::scaled", "")
                .typed<at::Tensor(const at::Tensor&, double)>();
  at::Tensor x = at::ones({2}, at::kDouble).requires_grad_();
  auto grads = torch::autograd::grad({op.call(x, 2.0).sum()}, {x});
  EXPECT_TRUE(at::allclose(grads[0], at::full({2}, 3.0, at::kDouble)));
}

}  // namespace vllm_style

namespace call_test {

struct Inner {
  at::Tensor t;
  int32_t k = 2;
};
OPFORGE_STRUCT(Inner, t, k);

struct Cfg {
  double scale = 1.0;
  std::optional<Inner> inner;
  std::vector<int64_t> dims;
};
OPFORGE_STRUCT(Cfg, scale, inner, dims);

struct Pair {
  at::Tensor a;
  at::Tensor b;
};
OPFORGE_STRUCT(Pair, a, b);

at::Tensor Apply(const at::Tensor& x, const Cfg& cfg) {
  at::Tensor y = x * cfg.scale + static_cast<double>(cfg.dims.size());
  return cfg.inner ? y + cfg.inner->t * cfg.inner->k : y;
}
Pair Both(const at::Tensor& x) { return Pair{x + 1, x + 2}; }
void Fill(at::Tensor& out, double v) { out.fill_(v); }

TEST(OpforgeCall, StructOpsAreCalledWithTheirStructsAndStructReturnsComeBack) {
  auto* block = lib_test::Block("opforge_call_test", [](opforge::Library& m) {
    m.def("apply(Tensor x, Cfg cfg) -> Tensor", &Apply);
    m.def("both(Tensor x) -> Pair", &Both);
    m.def("fill(Tensor! out, float v) -> ()", &Fill);
  });
  ASSERT_EQ(block->error(), "");
  at::Tensor x = at::ones({2}, at::kDouble);
  Cfg cfg{3.0, Inner{at::full({2}, 0.5, at::kDouble), 4}, {7, 8}};
  at::Tensor y = opforge::Call<at::Tensor>("opforge_call_test::apply", x, cfg);
  EXPECT_TRUE(at::allclose(y, at::full({2}, 3.0 + 2 + 2.0, at::kDouble)));
  cfg.inner.reset();
  static const opforge::OpRef apply("opforge_call_test::apply");
  EXPECT_TRUE(at::allclose(apply.call<at::Tensor>(x, cfg), at::full({2}, 5.0, at::kDouble)));
  Pair p = opforge::Call<Pair>("opforge_call_test::both", x);
  EXPECT_DOUBLE_EQ(p.b[0].item<double>(), 3.0);
  at::Tensor out = at::zeros({2});
  opforge::Call("opforge_call_test::fill", out, 6.0);
  EXPECT_DOUBLE_EQ(out[1].item<double>(), 6.0);
}

TEST(OpforgeCall, AReturnTypeWithMoreReturnsThanTheOpIsRefusedBeforeTheCall) {
  // Reading two returns of a one-return op read past the stack (a tag that
  // changed from run to run); now nothing is called or read.
  at::Tensor x = at::ones({2}, at::kDouble);
  at::Tensor out = at::zeros({2});
  try {
    opforge::Call<std::tuple<at::Tensor, at::Tensor>>("opforge_call_test::fill", out, 6.0);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("opforge_call_test::fill: opforge::Call<R> reads 2 returns but the op has "
                                         "0; name the op's own return type as R"),
              std::string::npos)
        << e.what();
  }
  EXPECT_DOUBLE_EQ(out[1].item<double>(), 0.0);  // not called
  // R = void discards what the op returns.
  opforge::Call("opforge_call_test::apply", x, Cfg{});
}

struct NeverDeclared {
  double v = 1.0;
};
OPFORGE_STRUCT(NeverDeclared, v);

TEST(OpforgeCompat, RegisterTypesStillCompilesAndRegistersNothing) {
  const auto before = opforge::TypeRegistry::Global().Names();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  opforge::RegisterTypes<NeverDeclared>();
#pragma GCC diagnostic pop
  EXPECT_EQ(opforge::TypeRegistry::Global().Names(), before);
}

}  // namespace call_test
