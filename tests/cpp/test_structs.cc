#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "core/structs.h"

namespace opforge {
namespace {

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Literals, ValuesMustBeAllStrOrAllInt) {
  CheckLiteralValues({Value::String("a"), Value::String("b")});
  CheckLiteralValues({Value::Int(1), Value::Int(2)});
  EXPECT_EQ(ErrorOf([] { CheckLiteralValues({Value::String("a"), Value::Int(1)}); }),
            "Literal['a', 1] mixes value types or uses values other than str and int. "
            "Use Literal of str values only or of int values only.");
  EXPECT_NE(ErrorOf([] { CheckLiteralValues({Value::Double(1.5)}); }), "(no error)");
  EXPECT_NE(ErrorOf([] { CheckLiteralValues({}); }), "(no error)");
}

TEST(TypeRegistry, SameLayoutTwiceIsANoOp) {
  TypeRegistry r;
  EXPECT_TRUE(r.AddStruct(MakeStruct("Cfg", {{"a", "int"}, {"b", "float", "1."}}, r)));
  EXPECT_FALSE(r.AddStruct(MakeStruct("Cfg", {{"a", "int"}, {"b", "float", "1."}}, r)));
  auto def = r.FindStruct("Cfg");
  ASSERT_TRUE(def);
  ASSERT_EQ(def->fields.size(), 2u);
  EXPECT_EQ(def->fields[1].default_value, Value::Double(1.0));
}

TEST(TypeRegistry, SameNameWithDifferentLayoutIsRejected) {
  TypeRegistry r;
  r.AddStruct(MakeStruct("Cfg", {{"a", "int"}}, r));
  EXPECT_EQ(ErrorOf([&] { r.AddStruct(MakeStruct("Cfg", {{"a", "float"}}, r)); }),
            "struct 'Cfg': is already registered with a different layout: Cfg(a: int) vs "
            "Cfg(a: float). Give one of them another name.");
}

TEST(TypeRegistry, FieldTypesMustBeLowerable) {
  TypeRegistry r;
  EXPECT_EQ(ErrorOf([&] { r.AddStruct(MakeStruct("Cfg", {{"d", "Dict(str, Tensor)"}}, r)); }),
            "field Cfg.d: type Dict(str, Tensor) cannot be expressed in a torch schema. Use a "
            "struct (a frozen dataclass) or separate parameters instead of a dict.");
  EXPECT_NE(ErrorOf([&] { r.AddStruct(MakeStruct("Cfg", {{"x", "Nope"}}, r)); }).find("unknown type 'Nope'"),
            std::string::npos);
  EXPECT_FALSE(r.Contains("Cfg"));
}

TEST(TypeRegistry, FieldNamesMustBeIdentifiersWithoutDoubleUnderscore) {
  TypeRegistry r;
  EXPECT_NE(ErrorOf([&] { r.AddStruct(MakeStruct("Cfg", {{"a__b", "int"}}, r)); }).find("contains '__'"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { r.AddStruct(MakeStruct("Cfg", {{"a", "int"}, {"a", "int"}}, r)); })
                .find("declared twice"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { r.AddStruct(MakeStruct("Tensor", {{"a", "int"}}, r)); }).find("shadows a builtin"),
            std::string::npos);
}

TEST(TypeRegistry, NestedStructsAndDottedNames) {
  TypeRegistry r;
  r.AddStruct(MakeStruct("pkg.Inner", {{"w", "Tensor?"}}, r));
  r.AddStruct(MakeStruct("pkg.Outer", {{"inner", "pkg.Inner"}, {"opt", "pkg.Inner?"}}, r));
  auto outer = r.FindStruct("pkg.Outer");
  ASSERT_TRUE(outer);
  EXPECT_EQ(outer->fields[0].type->kind, TypeKind::kStruct);
  EXPECT_EQ(outer->fields[1].type->element().name, "pkg.Inner");
  EXPECT_EQ(Describe(*outer), "pkg.Outer(inner: pkg.Inner, opt: pkg.Inner?)");
}

TEST(TypeRegistry, EnumsNeedOneValueType) {
  TypeRegistry r;
  EXPECT_TRUE(r.AddEnum(EnumDef{"Mode", {"A", "B"}, {Value::String("a"), Value::String("b")}}));
  EXPECT_EQ(r.FindEnum("Mode")->value_kind(), TypeKind::kStr);
  EXPECT_EQ(ErrorOf([&] { r.AddEnum(EnumDef{"Mixed", {"A", "B"}, {Value::String("a"), Value::Int(1)}}); }),
            "enum 'Mixed': mixes str and int values. Use one value type for all members.");
  EXPECT_NE(ErrorOf([&] { r.AddEnum(EnumDef{"F", {"A"}, {Value::Double(1.5)}}); }).find("neither str nor int"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { r.AddStruct(MakeStruct("Mode", {{"a", "int"}}, r)); }).find("already registered as an enum"),
            std::string::npos);
}

TEST(TypeRegistry, RemoveForgetsTheName) {
  TypeRegistry r;
  r.AddStruct(MakeStruct("Cfg", {{"a", "int"}}, r));
  EXPECT_TRUE(r.Remove("Cfg"));
  EXPECT_FALSE(r.Remove("Cfg"));
  EXPECT_EQ(r.FindStruct("Cfg"), nullptr);
}

TEST(TypeRegistry, ConcurrentRegistrationKeepsEveryStruct) {
  TypeRegistry r;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&r, t] {
      for (int i = 0; i < 200; ++i) {
        std::string name = "S" + std::to_string(i);  // shared names: same layout
        r.AddStruct(MakeStruct(name, {{"a", "int"}}, r));
        r.AddStruct(MakeStruct("T" + std::to_string(t) + "_" + std::to_string(i), {{"a", "int"}}, r));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(r.Names().size(), 200u + 8u * 200u);
}

}  // namespace
}  // namespace opforge
