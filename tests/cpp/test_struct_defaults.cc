// C++ default member initializers become struct field defaults: in the
// registered struct, and as leaf defaults of the flat schema torch registers.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <sstream>

#include "opforge/opforge.h"

// The core's registries, which the tests inspect.
#include "core/error.h"
#include "core/handles.h"
#include "core/libraries.h"
#include "core/spec.h"
#include "core/structs.h"
#include "core/tags.h"

namespace defaults_test {

enum class Mode : int64_t { kAdd = 3, kMul = 5 };
OPFORGE_ENUM_NAMED(Mode, "defaults_test.Mode", kAdd, kMul);

struct Attn {
  double scale;  // no initializer: required
  bool causal = true;
  int64_t window = -1;
  int32_t heads{8};
  float eps = 0.25f;
  Mode mode = Mode::kMul;
  c10::ScalarType acc = c10::ScalarType::Float;
  std::string name = "a \"b\"";
  std::vector<int64_t> dims = {1, 2};
  std::optional<double> clip;
  std::optional<int64_t> seed = 7;
  std::optional<at::Tensor> bias;
};
OPFORGE_STRUCT_NAMED(Attn, "defaults_test.Attn", scale, causal, window, heads, eps, mode, acc, name, dims,
                     clip, seed, bias);

// Sums what the kernel received, so omitted leaves show their defaults.
at::Tensor Apply(const at::Tensor& x, const Attn& a) {
  double add = (a.causal ? 1 : 0) + a.window * 10 + a.heads * 100 + static_cast<double>(a.mode) * 1000 +
               static_cast<double>(a.name.size()) * 1e4 + static_cast<double>(a.dims.size()) * 1e5 +
               a.seed.value_or(0) * 1e6 + a.clip.value_or(0.0) + a.eps;
  return x * a.scale + add;
}

struct Inner {
  at::Tensor w;
  double gain = 2.0;
};
OPFORGE_STRUCT_NAMED(Inner, "defaults_test.Inner", w, gain);

struct Outer {
  Inner inner;  // a nested struct: its own fields' defaults apply
  int64_t k = 4;
};
OPFORGE_STRUCT_NAMED(Outer, "defaults_test.Outer", inner, k);

at::Tensor ApplyOuter(const at::Tensor& x, const Outer& o) { return x * o.inner.gain + o.k + o.inner.w; }

// Not default-constructible: its initializer cannot be read, so no defaults.
struct Pinned {
  explicit Pinned(double s) : scale(s) {}
  double scale;
  bool flag = true;
};
OPFORGE_STRUCT_NAMED(Pinned, "defaults_test.Pinned", scale, flag);

// A user-written default constructor counts like initializers: what it
// sets is a default, what it leaves alone is not.
struct Ctor {
  Ctor() : set(9) {}
  int64_t set;
  int64_t unset;
};
OPFORGE_STRUCT_NAMED(Ctor, "defaults_test.Ctor", set, unset);

// No initializer anywhere: a trivial struct, every field required.
struct Plain {
  double a;
  bool b;
  int64_t c;
};
OPFORGE_STRUCT_NAMED(Plain, "defaults_test.Plain", a, b, c);

std::string Describe(const char* name) {
  auto def = opforge::TypeRegistry::Global().FindStruct(name);
  return def ? opforge::Describe(*def) : "<not registered>";
}

std::string FlatSchema(const char* name) {
  std::ostringstream out;
  out << c10::Dispatcher::singleton().findSchemaOrThrow(name, "").schema();
  return out.str();
}

class StructDefaults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    block_ = new opforge::LibraryBlock(
        torch::Library::FRAGMENT, "opforge_defaults", std::nullopt,
        [](opforge::Library& m) {
          m.def("apply(Tensor x, defaults_test.Attn a) -> Tensor", &Apply);
          m.def("outer(Tensor x, defaults_test.Outer o) -> Tensor", &ApplyOuter);
          m.def("trailing(defaults_test.Attn a, Tensor x) -> Tensor");
          m.types<Pinned, Ctor, Plain>();
        },
        __FILE__, __LINE__);
    ASSERT_EQ(block_->error(), "");
  }
  static opforge::LibraryBlock* block_;
};
opforge::LibraryBlock* StructDefaults::block_ = nullptr;

TEST_F(StructDefaults, InitializersBecomeTheRegisteredFieldDefaults) {
  EXPECT_EQ(Describe("defaults_test.Attn"),
            "defaults_test.Attn(scale: float, causal: bool = True, window: int = -1, heads: int = 8, "
            "eps: float = 0.25, mode: defaults_test.Mode = 5, acc: ScalarType = 6, name: str = \"a \\\"b\\\"\", "
            "dims: int[] = [1, 2], clip: float? = None, seed: int? = 7, bias: Tensor? = None)");
}

TEST_F(StructDefaults, TheFlatSchemaCarriesThemAsLeafDefaults) {
  EXPECT_EQ(FlatSchema("opforge_defaults::apply"),
            "opforge_defaults::apply(Tensor x, float a__scale, bool a__causal=True, int a__window=-1, "
            "int a__heads=8, float a__eps=0.25, int a__mode=5, ScalarType a__acc=6, str a__name=\"a \\\"b\\\"\", "
            "int[] a__dims=[1, 2], float? a__clip=None, int? a__seed=7, Tensor? a__bias=None) -> Tensor");
  // The original signature still takes the struct without a default.
  auto spec = opforge::OpSpecRegistry::Global().Find("opforge_defaults::apply");
  ASSERT_TRUE(spec);
  EXPECT_EQ(opforge::ToString(spec->original), "opforge_defaults::apply(Tensor x, defaults_test.Attn a) -> Tensor");
}

TEST_F(StructDefaults, ACallOmittingTheDefaultedLeavesGetsTheInitializersValues) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("opforge_defaults::apply", "");
  // Only x and a__scale: the dispatcher fills the rest from the schema.
  std::vector<c10::IValue> stack{at::zeros({1}, at::kDouble), 2.0};
  for (const auto& arg : op.schema().arguments()) {
    if (stack.size() <= static_cast<size_t>(&arg - op.schema().arguments().data())) {
      ASSERT_TRUE(arg.default_value().has_value()) << arg.name();
      stack.push_back(*arg.default_value());
    }
  }
  op.callBoxed(&stack);
  // causal 1, window -10, heads 800, mode 5000, name 50000, dims 200000,
  // seed 7000000, clip 0, eps 0.25.
  EXPECT_DOUBLE_EQ(stack[0].toTensor().item<double>(), 1 - 10 + 800 + 5000 + 50000 + 200000 + 7000000 + 0.25);
}

TEST_F(StructDefaults, NestedStructFieldsKeepTheirOwnDefaults) {
  EXPECT_EQ(Describe("defaults_test.Outer"), "defaults_test.Outer(inner: defaults_test.Inner, k: int = 4)");
  EXPECT_EQ(FlatSchema("opforge_defaults::outer"),
            "opforge_defaults::outer(Tensor x, Tensor o__inner__w, float o__inner__gain=2., int o__k=4) -> Tensor");
}

TEST_F(StructDefaults, DefaultsTorchCannotKeepBeforeARequiredLeafAreDropped) {
  // a__scale is required and x follows the struct: torch rejects a default
  // before a positional argument without one, so these leaves have none.
  EXPECT_EQ(FlatSchema("opforge_defaults::trailing"),
            "opforge_defaults::trailing(float a__scale, bool a__causal, int a__window, int a__heads, "
            "float a__eps, int a__mode, ScalarType a__acc, str a__name, int[] a__dims, float? a__clip, "
            "int? a__seed, Tensor? a__bias, Tensor x) -> Tensor");
  EXPECT_TRUE(opforge::OpSpecRegistry::Global().Find("opforge_defaults::trailing")->warnings.empty());
}

TEST_F(StructDefaults, AStructThatIsNotDefaultConstructibleHasNoDefaults) {
  static_assert(!std::is_default_constructible_v<Pinned>);
  EXPECT_EQ(Describe("defaults_test.Pinned"), "defaults_test.Pinned(scale: float, flag: bool)");
}

TEST_F(StructDefaults, ADefaultConstructorsAssignmentsAreDefaultsAndTheRestIsRequired) {
  EXPECT_EQ(Describe("defaults_test.Ctor"), "defaults_test.Ctor(set: int = 9, unset: int)");
}

TEST_F(StructDefaults, AStructWithoutInitializersHasNoDefaults) {
  EXPECT_EQ(Describe("defaults_test.Plain"), "defaults_test.Plain(a: float, b: bool, c: int)");
}

}  // namespace defaults_test
