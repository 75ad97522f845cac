#include <gtest/gtest.h>

#include "core/error.h"
#include "core/schema.h"

namespace opforge {
namespace {

std::string RoundTrip(const std::string& text) { return ToString(ParseSchema(text)); }

TEST(SchemaPrint, SimpleSchemaPrintsUnchanged) {
  const std::string s = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor";
  EXPECT_EQ(RoundTrip(s), s);
}

TEST(SchemaParse, ArgumentsCarryNameTypeDefaultAndKwargOnly) {
  FunctionSchema s = ParseSchema("aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor");
  EXPECT_EQ(s.name, "aten::add");
  EXPECT_EQ(s.overload, "Tensor");
  ASSERT_EQ(s.arguments.size(), 3u);
  EXPECT_EQ(s.arguments[0].name, "self");
  EXPECT_EQ(s.arguments[0].type->kind, TypeKind::kTensor);
  EXPECT_FALSE(s.arguments[1].kwarg_only);
  EXPECT_TRUE(s.arguments[2].kwarg_only);
  EXPECT_EQ(s.arguments[2].type->kind, TypeKind::kScalar);
  ASSERT_TRUE(s.arguments[2].default_value.has_value());
  EXPECT_EQ(*s.arguments[2].default_value, Value::Int(1));
  ASSERT_EQ(s.returns.size(), 1u);
  EXPECT_EQ(s.returns[0].type->kind, TypeKind::kTensor);
}

TEST(SchemaPrint, FloatDefaultsPrintLikeTorchIValues) {
  EXPECT_EQ(RoundTrip("a::b(float x=1e-5) -> Tensor"), "a::b(float x=1.0000000000000001e-05) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(float x=3) -> Tensor"), "a::b(float x=3.) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(float x=-0.0) -> Tensor"), "a::b(float x=0.) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(float x=1e20) -> Tensor"), "a::b(float x=1e+20) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(float x=1e10) -> Tensor"), "a::b(float x=10000000000.) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(float x=.5) -> Tensor"), "a::b(float x=0.5) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(float? x=2) -> Tensor"), "a::b(float? x=2) -> Tensor");
}

TEST(SchemaPrint, NamedConstantsBecomeTheirEnumValues) {
  EXPECT_EQ(RoundTrip("a::b(ScalarType d=float, ScalarType? e=long, Layout l=strided, "
                      "MemoryFormat m=contiguous_format, int r=Mean) -> Tensor"),
            "a::b(ScalarType d=6, ScalarType? e=4, Layout l=0, MemoryFormat m=0, int r=1) -> Tensor");
}

TEST(SchemaPrint, IntListDefaultsCollapseWhenAllEqual) {
  EXPECT_EQ(RoundTrip("a::b(int[2] y=1, int[2] z=[1,2], int[3] q=[1,1,1], int[] e=[]) -> Tensor"),
            "a::b(int[2] y=1, int[2] z=[1, 2], int[3] q=1, int[] e=[]) -> Tensor");
  // SymInt lists keep the full form, as in torch.
  EXPECT_EQ(RoundTrip("a::b(SymInt[2] u=1) -> Tensor"), "a::b(SymInt[2] u=[1, 1]) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(float[] x=[1,2.5], bool[2] b=[True,False]) -> Tensor"),
            "a::b(float[] x=[1., 2.5], bool[2] b=[True, False]) -> Tensor");
}

TEST(SchemaPrint, StringDefaultsAreQuotedAndEscaped) {
  EXPECT_EQ(RoundTrip(R"(a::b(str s="a\"b\n", str? t=None, str u='x') -> Tensor)"),
            R"(a::b(str s="a\"b\n", str? t=None, str u="x") -> Tensor)");
  EXPECT_EQ(RoundTrip(R"(a::b(str s="\101") -> Tensor)"), R"(a::b(str s="A") -> Tensor)");
  // A string default of a non-str type prints bare, as torch does.
  EXPECT_EQ(RoundTrip(R"(a::b(Scalar s="a") -> Tensor)"), "a::b(Scalar s=a) -> Tensor");
}

TEST(SchemaPrint, DeviceDefaultsPrintBareAndParseBack) {
  EXPECT_EQ(RoundTrip(R"(a::b(Device d="cpu") -> Tensor)"), "a::b(Device d=cpu) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(Device d=cpu) -> Tensor"), "a::b(Device d=cpu) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(Device? d=cuda:1) -> Tensor"), "a::b(Device? d=cuda:1) -> Tensor");
}

TEST(SchemaPrint, TheDefinableFormQuotesDevicesAndKeepsNonAsciiBytes) {
  // torch prints these in a form its own parser rejects; registration uses
  // the definable form.
  const FunctionSchema s = ParseSchema("a::b(Device d=\"cuda:1\", str s=\"\u00e9t\u00e9\") -> Tensor");
  // torch escapes bytes >= 0x80 through a signed char ("\\0)+"), which its
  // own parser then rejects as an ill-formed octal escape; ToString matches
  // torch's text so schemas compare equal.
  EXPECT_NE(ToString(s).find("str s=\"\\0)+"), std::string::npos);
  EXPECT_EQ(ToDefinableString(s), "a::b(Device d=\"cuda:1\", str s=\"\u00e9t\u00e9\") -> Tensor");
  EXPECT_EQ(ToString(ParseSchema(ToDefinableString(s))), ToString(s));
}

TEST(SchemaPrint, ComplexDefaultsPrintRealAndImaginaryParts) {
  EXPECT_EQ(RoundTrip("a::b(complex c=1.5) -> Tensor"), "a::b(complex c=0.+1.j) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(float x=2j) -> Tensor"), "a::b(float x=0.+2.j) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(complex c=0.+1.j, complex d=1.5-2.j) -> Tensor"),
            "a::b(complex c=0.+1.j, complex d=1.5-2.j) -> Tensor");
}

TEST(SchemaPrint, AliasSetsPrintInTorchsOrder) {
  EXPECT_EQ(RoundTrip("a::b(Tensor(a) x) -> Tensor(b|a)"), "a::b(Tensor(a) x) -> Tensor(a|b)");
  EXPECT_EQ(RoundTrip("a::b(Tensor(a! -> a|b) self) -> Tensor"), "a::b(Tensor(a! -> b|a) self) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(Tensor(a -> *) z) -> Tensor"), "a::b(Tensor(a -> *) z) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(Tensor(a|*) x) -> Tensor"), "a::b(Tensor(*|a) x) -> Tensor");
}

TEST(SchemaParse, ListAliasAnnotationsNestInAContainer) {
  FunctionSchema s = ParseSchema("a::b(Tensor(a!)[] y, Tensor[](b) z, Tensor(a)?[] w) -> Tensor");
  const auto& y = s.arguments[0];
  ASSERT_TRUE(y.alias_info.has_value());
  EXPECT_TRUE(y.alias_info->before_sets.empty());
  EXPECT_TRUE(y.alias_info->is_write);
  ASSERT_EQ(y.alias_info->contained.size(), 1u);
  EXPECT_EQ(y.alias_info->contained[0].before_sets, std::vector<std::string>{"a"});
  EXPECT_EQ(s.arguments[1].alias_info->before_sets, std::vector<std::string>{"b"});
  EXPECT_EQ(ToString(s), "a::b(Tensor(a!)[] y, Tensor[](b) z, Tensor?(a)[] w) -> Tensor");
  // torch's printed form Tensor?(a)[] reads back to the same structure.
  EXPECT_EQ(RoundTrip(ToString(s)), ToString(s));
}

TEST(SchemaParse, FreshWriteAliasGetsAGeneratedSet) {
  EXPECT_EQ(RoundTrip("a::b(Tensor! x) -> Tensor"), "a::b(Tensor($0! -> ) x) -> Tensor");
  // ... and that printed form (torch's too, for a TORCH_LIBRARY op's `Tensor!`) reads back.
  EXPECT_EQ(RoundTrip("a::b(Tensor($0! -> ) x, Tensor($1!) y) -> Tensor"),
            "a::b(Tensor($0! -> ) x, Tensor($1!) y) -> Tensor");
  FunctionSchema parsed = ParseSchema("a::b(Tensor($0! -> ) x) -> ()");
  EXPECT_TRUE(parsed.arguments[0].alias_info->is_write);
  EXPECT_EQ(parsed.arguments[0].alias_info->before_sets, std::vector<std::string>{"$0"});
  EXPECT_TRUE(parsed.arguments[0].alias_info->after_sets.empty());
}

TEST(SchemaParse, TorchScriptTypesParse) {
  const std::string s =
      "a::b(Any x, t y, Dict(str, t) z, Future(t) f, (int, str) tup, Storage s, Stream st, "
      "AnyEnumType e, RRef(t) r, Await(t) aw, Union(int, str) un, "
      "NoneType n, QScheme q, Capsule c, AnyClassType act, Quantizer qz, "
      "__torch__.torch.classes.quantized.Conv2dPackedParamsBase p, str d, Tensor?[]? o, "
      "int[][] ll, SymBool sb, Generator? g=None) -> ((str, t)[])";
  EXPECT_EQ(RoundTrip(s), s);
  FunctionSchema parsed = ParseSchema(s);
  EXPECT_EQ(AnnotationStr(*parsed.arguments[2].type), "Dict[str, t]");
  EXPECT_EQ(AnnotationStr(*parsed.arguments[4].type), "Tuple[int, str]");
  EXPECT_EQ(AnnotationStr(*parsed.arguments[18].type), "Optional[List[Optional[Tensor]]]");
  EXPECT_EQ(AnnotationStr(*parsed.returns[0].type), "List[Tuple[str, t]]");
}

TEST(SchemaParse, DimnameReadsAsStrAsInTorch) {
  EXPECT_EQ(RoundTrip("aten::align_to(Tensor(a) self, Dimname[] names) -> Tensor(a)"),
            "aten::align_to(Tensor(a) self, str[] names) -> Tensor(a)");
}

TEST(SchemaPrint, ReturnsNeedParenthesesUnlessSingle) {
  EXPECT_EQ(RoundTrip("a::b() -> ()"), "a::b() -> ()");
  EXPECT_EQ(RoundTrip("a::b(...) -> ..."), "a::b(...) -> ...");
  EXPECT_EQ(RoundTrip("a::b(int x, ...) -> (int, ...)"), "a::b(int x, ...) -> (int, ...)");
  EXPECT_EQ(RoundTrip("a::b(Tensor x) -> (int)"), "a::b(Tensor x) -> int");
  EXPECT_EQ(RoundTrip("a::b(Tensor self) -> (Tensor a, Tensor b)"), "a::b(Tensor self) -> (Tensor a, Tensor b)");
  EXPECT_EQ(RoundTrip("a::b(Tensor self) -> Tensor a"), "a::b(Tensor self) -> Tensor a");
}

TEST(SchemaParse, WhitespaceCommentsAndRepeatedStarAreAccepted) {
  EXPECT_EQ(RoundTrip("  a :: b ( Tensor  x ) -> Tensor # c"), "a::b(Tensor x) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(Tensor x, *, Tensor y, *, Tensor z) -> Tensor"),
            "a::b(Tensor x, *, Tensor y, Tensor z) -> Tensor");
  EXPECT_EQ(RoundTrip("a::b(Tensor x) -> Tensor\n"), "a::b(Tensor x) -> Tensor");
  EXPECT_EQ(RoundTrip("ab(Tensor self) -> Tensor"), "ab(Tensor self) -> Tensor");
}

TEST(SchemaParse, RejectsWhatTorchRejects) {
  const char* bad[] = {
      "a::b(Tensor x, Tensor y",           // unterminated
      "a::b.default(Tensor x) -> Tensor",  // reserved overload name
      "a::b.__x(Tensor x) -> Tensor",
      "a::b(int x=1, int y) -> Tensor",    // required after default
      "a::b(Tensor in) -> Tensor",         // keyword as a name
      "a::b(Tensor self,) -> Tensor",
      "a::b(Foo x) -> Tensor",             // unknown type
      "a::b(float x=inf) -> Tensor",
      "a::b(int x=99999999999999999999) -> Tensor",
      "a::b(str[] s=[\"a\"]) -> Tensor",
      "a::b(int[] x=None) -> Tensor",
      R"(a::b(str x="\x41") -> Tensor)",
      "a::b(Tensor x=1) -> Tensor",
      "a::b(int x, ...) -> Tensor, Tensor",
      "a::b(int x=1, ...) -> Tensor",
      "a::b(Tensor(*|a) x) -> Tensor",
      "a::b",
      "a::b(Tensor $x) -> Tensor",
  };
  for (const char* text : bad) {
    EXPECT_THROW(ParseSchema(text), Error) << text;
  }
}

TEST(SchemaParse, ErrorsPointAtTheOffendingToken) {
  try {
    ParseSchema("a::b(Tensor x, Foo y) -> Tensor");
    FAIL() << "expected a parse error";
  } catch (const ParseError& e) {
    EXPECT_EQ(e.offset(), 15u);
    EXPECT_NE(std::string(e.what()).find("unknown type 'Foo'"), std::string::npos) << e.what();
  }
}

TEST(SchemaParse, ADefaultOfAnotherTypeIsAnErrorAtItsToken) {
  // torch's parser takes these and fails at the op's first call.
  const std::pair<const char*, const char*> bad[] = {
      {"a::b(Tensor x, int n=1.5) -> Tensor", "the default '1.5' is not a value of type int"},
      {"a::b(Tensor x, int n=\"a\") -> Tensor", "the default '\"a\"' is not a value of type int"},
      {"a::b(Tensor x, str s=3) -> Tensor", "the default '3' is not a value of type str"},
      {"a::b(Tensor x, bool f=2.5) -> Tensor", "the default '2.5' is not a value of type bool"},
      {"a::b(Tensor x, float f=True) -> Tensor", "the default 'True' is not a value of type float"},
  };
  ParseOptions strict;
  strict.check_default_types = true;
  for (const auto& [text, message] : bad) {
    EXPECT_NO_THROW(ParseSchema(text)) << text;  // as torch's parser, unless asked
    try {
      ParseSchema(text, strict);
      ADD_FAILURE() << "expected a parse error: " << text;
    } catch (const ParseError& e) {
      EXPECT_EQ(e.offset(), std::string(text).find('=') + 1) << text;
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  // What torch reads as the type's value still parses.
  EXPECT_EQ(ParseSchema("a::b(float x=2, int n=-1, float? y=None, str s='a') -> Tensor", strict).arguments.size(), 4u);
}

TEST(SchemaParse, AnErrorMessageIsValidUtf8WhateverBytesTheSchemaHolds) {
  // A byte that is not UTF-8 is written as \xNN (Python reads messages as
  // str); a valid multi-byte character stays as it is.
  try {
    ParseSchema("a::b(Tensor x\xff) -> Tensor");
    FAIL() << "expected a parse error";
  } catch (const ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("unexpected character '\\xff' at offset 13:\n  a::b(Tensor x\\xff)"),
              std::string::npos)
        << e.what();
  }
  try {
    ParseSchema("a::b(Tensor \xce\xbb) -> Tensor");
    FAIL() << "expected a parse error";
  } catch (const ParseError& e) {
    EXPECT_NE(std::string(e.what()).find("a::b(Tensor \xce\xbb)"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("\xce'"), std::string::npos) << e.what();  // no lone lead byte
  }
}

TEST(SchemaParse, ParseTypeAndDefaultStandAlone) {
  EXPECT_EQ(TypeStr(*ParseType("Tensor?[]")), "Tensor?[]");
  EXPECT_EQ(TypeStr(*ParseType("int[2]")), "int[]");
  auto t = ParseType("float");
  EXPECT_EQ(ParseDefault("2", *t), Value::Double(2.0));
  auto l = ParseType("int[]");
  EXPECT_EQ(ParseDefault("[0, 1]", *l), Value::List({Value::Int(0), Value::Int(1)}));
  EXPECT_THROW(ParseDefault("[0, 1] x", *l), Error);
}

TEST(SchemaPrint, NonAsciiStringBytesPrintAsTorchDoes) {
  // torch escapes bytes >= 0x80 with signed-char octal arithmetic.
  EXPECT_EQ(RoundTrip("a::b(str s=\"caf\xc3\xa9\") -> Tensor"),
            "a::b(str s=\"caf\\0)+\\/.)\") -> Tensor");
}

}  // namespace
}  // namespace opforge
