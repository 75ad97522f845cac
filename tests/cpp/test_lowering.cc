#include <gtest/gtest.h>

#include "core/error.h"
#include "core/spec.h"

namespace opforge {
namespace {

// Each test works in its own registry so tests stay independent.
class LoweringTest : public ::testing::Test {
 protected:
  void AddStruct(const std::string& name, const std::vector<FieldText>& fields) {
    registry_.AddStruct(MakeStruct(name, fields, registry_));
  }
  void AddEnum(const std::string& name, std::vector<std::string> members, std::vector<Value> values) {
    registry_.AddEnum(EnumDef{name, std::move(members), std::move(values)});
  }
  LoweredOp Lower(const std::string& spec, std::vector<std::string> mutates = {}) {
    LowerOptions options;
    options.mutates_args = std::move(mutates);
    return LowerText(spec, options, registry_);
  }
  std::string Flat(const std::string& spec, std::vector<std::string> mutates = {}) {
    return ToString(Lower(spec, std::move(mutates)).flat);
  }
  // The message of the Error lowering `spec` raises.
  std::string ErrorOf(const std::string& spec, std::vector<std::string> mutates = {}) {
    try {
      Lower(spec, std::move(mutates));
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }

  TypeRegistry registry_;
};

TEST_F(LoweringTest, AnOpPastTorchsArgumentLimitIsRefusedNamingTheCountAndTheParameterThatBringsIt) {
  std::vector<FieldText> fields;
  for (int i = 0; i < 64; ++i) fields.push_back({"f" + std::to_string(i), "float", std::nullopt});
  AddStruct("Wide", fields);
  // 64 leaves: torch's limit, still accepted; one tensor more is not.
  EXPECT_EQ(Lower("ns::ok(Wide cfg) -> ()").flat.arguments.size(), 64u);
  EXPECT_EQ(ErrorOf("ns::wide(Tensor x, Wide cfg) -> Tensor"),
            "ns::wide: lowers to 65 flat arguments (each struct field is one: parameter 'cfg' brings 64); torch's "
            "dispatcher takes at most 64. "
            "Take fewer leaves: keep rarely-set fields out of the op's structs (a Handle carries any object as one "
            "argument), or split the op.");
}

TEST_F(LoweringTest, AnOpNameWithANulByteIsRefusedShowingTheByte) {
  std::string message;
  try {
    CheckOpName(std::string("ns::f\0g", 7));
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_EQ(message,
            "ns::f\\x00g: the op name holds the control byte \\x00 at position 5 (a NUL byte, which ends the name for "
            "torch). Use letters, digits and underscores: 'namespace::name'.");
}

TEST_F(LoweringTest, FlatSignatureLowersToItself) {
  const std::string s =
      "mylib::f(Tensor x, SymInt n, float eps=1.0000000000000001e-05, int[] dims=[0], "
      "str? mode=None, *, ScalarType? dtype=None) -> (Tensor, Tensor)";
  LoweredOp op = Lower(s);
  EXPECT_EQ(ToString(op.flat), s);
  EXPECT_TRUE(op.is_identity());
  ASSERT_EQ(op.params.size(), 6u);
  for (size_t i = 0; i < op.params.size(); ++i) {
    EXPECT_EQ(op.params[i].kind, MappingNode::Kind::kLeaf);
    EXPECT_EQ(op.params[i].leaf_index, static_cast<int>(i));
  }
}

TEST_F(LoweringTest, StructFieldsBecomeDoubleUnderscoreLeaves) {
  AddStruct("AttnCfg", {{"scale", "float"}, {"causal", "bool", "True"}});
  LoweredOp op = Lower("mylib::attn(Tensor q, AttnCfg cfg, Literal[\"a\", \"b\"] mode=\"a\") -> Tensor");
  EXPECT_EQ(ToString(op.flat),
            "mylib::attn(Tensor q, float cfg__scale, bool cfg__causal=True, str mode=\"a\") -> Tensor");
  EXPECT_FALSE(op.is_identity());
  ASSERT_EQ(op.params.size(), 3u);
  const MappingNode& cfg = op.params[1];
  EXPECT_EQ(cfg.kind, MappingNode::Kind::kStruct);
  EXPECT_EQ(cfg.struct_name, "AttnCfg");
  ASSERT_EQ(cfg.children.size(), 2u);
  EXPECT_EQ(cfg.children[0].name, "scale");
  EXPECT_EQ(cfg.children[0].leaf_index, 1);
  EXPECT_EQ(cfg.children[1].leaf_index, 2);
  EXPECT_EQ(op.leaves[2].path, "cfg.causal");
}

TEST_F(LoweringTest, NestingThreeDeepJoinsEveryLevel) {
  AddStruct("Inner", {{"bias", "float", "0."}, {"w", "Tensor"}});
  AddStruct("Middle", {{"inner", "Inner"}, {"k", "int"}});
  AddStruct("Outer", {{"mid", "Middle"}, {"flag", "bool"}});
  LoweredOp op = Lower("mylib::f(Tensor x, Outer cfg) -> Tensor");
  EXPECT_EQ(ToString(op.flat),
            "mylib::f(Tensor x, float cfg__mid__inner__bias, Tensor cfg__mid__inner__w, "
            "int cfg__mid__k, bool cfg__flag) -> Tensor");
  const MappingNode& inner = op.params[1].children[0].children[0];
  EXPECT_EQ(inner.struct_name, "Inner");
  EXPECT_EQ(inner.children[1].leaf_index, 2);
  EXPECT_EQ(op.leaves[2].path, "cfg.mid.inner.w");
}

TEST_F(LoweringTest, StructDefaultIsCarriedByLeafDefaults) {
  AddStruct("Cfg", {{"scale", "float", "1."}, {"n", "int", "2"}, {"name", "str", "\"x\""}});
  EXPECT_EQ(Flat("mylib::f(Tensor x, Cfg cfg={scale=0.5}) -> Tensor"),
            "mylib::f(Tensor x, float cfg__scale=0.5, int cfg__n=2, str cfg__name=\"x\") -> Tensor");
  // Without a struct default, the field defaults become leaf defaults, so
  // torch.ops callers may omit them as a struct's constructor would.
  EXPECT_EQ(Flat("mylib::f(Tensor x, Cfg cfg) -> Tensor"),
            "mylib::f(Tensor x, float cfg__scale=1., int cfg__n=2, str cfg__name=\"x\") -> Tensor");
  LoweredOp op = Lower("mylib::f(Tensor x, Cfg cfg) -> Tensor");
  EXPECT_TRUE(op.leaves[1].default_from_field);
  EXPECT_TRUE(op.warnings.empty());
}

TEST_F(LoweringTest, OnlyTensorsListsOfTensorsAndNumbersMayBeReturned) {
  AddStruct("Out", {{"y", "Tensor"}, {"n", "int"}});
  EXPECT_EQ(Flat("mylib::f(Tensor x) -> (Tensor, Tensor[], SymInt, float, bool, Scalar)"),
            "mylib::f(Tensor x) -> (Tensor, Tensor[], SymInt, float, bool, Scalar)");
  EXPECT_EQ(Flat("mylib::f(Tensor x) -> Out"), "mylib::f(Tensor x) -> (Tensor, int)");
  EXPECT_EQ(ErrorOf("mylib::f(Tensor x) -> Tensor?"),
            "mylib::f: return value: type Tensor? cannot be returned from an op. Return Tensor, "
            "tuple[Tensor, ...], list[Tensor], a frozen dataclass of tensors, int, float, bool or None.");
  EXPECT_NE(ErrorOf("mylib::f(Tensor x) -> str"), "(no error)");
  EXPECT_NE(ErrorOf("mylib::f(Tensor x) -> int[]"), "(no error)");
}

TEST_F(LoweringTest, FieldDefaultsBeforeARequiredArgumentAreDroppedSilently) {
  AddStruct("Cfg", {{"scale", "float", "1."}, {"n", "int", "2"}});
  // A schema cannot have a defaulted positional argument before a required
  // one; a field default is a convenience, so it goes without a warning.
  LoweredOp op = Lower("mylib::f(Tensor x, Cfg cfg, Tensor y) -> Tensor");
  EXPECT_EQ(ToString(op.flat), "mylib::f(Tensor x, float cfg__scale, int cfg__n, Tensor y) -> Tensor");
  EXPECT_FALSE(op.leaves[1].default_from_field);
  EXPECT_TRUE(op.warnings.empty());
}

TEST_F(LoweringTest, OptionalStructAddsPresenceLeafAndOptionalFields) {
  AddStruct("Cfg", {{"scale", "float"}, {"w", "Tensor"}, {"dims", "int[]"}, {"bias", "Tensor?"}});
  LoweredOp op = Lower("mylib::f(Tensor x, Cfg? cfg=None) -> Tensor");
  EXPECT_EQ(ToString(op.flat),
            "mylib::f(Tensor x, bool cfg__is_set=False, float? cfg__scale=None, Tensor? cfg__w=None, "
            "int[]? cfg__dims=None, Tensor? cfg__bias=None) -> Tensor");
  // Fields optional only because the struct is: a caller passing a Cfg must
  // still give them; `bias` was Optional to begin with.
  EXPECT_TRUE(op.leaves[2].forced_optional);
  EXPECT_TRUE(op.leaves[3].forced_optional);
  EXPECT_FALSE(op.leaves[5].forced_optional);
  EXPECT_FALSE(op.leaves[1].forced_optional);
  const MappingNode& cfg = op.params[1];
  EXPECT_TRUE(cfg.optional);
  EXPECT_EQ(cfg.presence_index, 1);
  EXPECT_TRUE(op.leaves[1].is_presence);
  EXPECT_EQ(cfg.children[0].leaf_index, 2);
  // Without a default, the presence leaf has none either.
  EXPECT_EQ(Flat("mylib::g(Cfg? cfg) -> Tensor"),
            "mylib::g(bool cfg__is_set, float? cfg__scale, Tensor? cfg__w, int[]? cfg__dims, "
            "Tensor? cfg__bias) -> Tensor");
}

TEST_F(LoweringTest, OptionalStructWithInstanceDefaultIsSetByDefault) {
  AddStruct("Cfg", {{"scale", "float", "1."}});
  EXPECT_EQ(Flat("mylib::f(Tensor x, Cfg? cfg={scale=2.}) -> Tensor"),
            "mylib::f(Tensor x, bool cfg__is_set=True, float? cfg__scale=2.) -> Tensor");
}

TEST_F(LoweringTest, NestedOptionalStructInsideOptionalStruct) {
  AddStruct("In", {{"a", "int"}});
  AddStruct("Out", {{"inner", "In?"}, {"b", "float"}});
  EXPECT_EQ(Flat("mylib::f(Out? o=None) -> Tensor"),
            "mylib::f(bool o__is_set=False, bool o__inner__is_set=False, int? o__inner__a=None, "
            "float? o__b=None) -> Tensor");
}

TEST_F(LoweringTest, LiteralsLowerToStrOrIntAndKeepAllowedValues) {
  LoweredOp op = Lower("mylib::f(Tensor x, Literal[\"fast\", \"exact\"] mode, Literal[1, 2, 4] k=2) -> Tensor");
  EXPECT_EQ(ToString(op.flat), "mylib::f(Tensor x, str mode, int k=2) -> Tensor");
  ASSERT_EQ(op.leaves[1].allowed.size(), 2u);
  EXPECT_EQ(op.leaves[1].allowed[1], Value::String("exact"));
  ASSERT_EQ(op.leaves[2].allowed.size(), 3u);
  EXPECT_EQ(op.leaves[2].allowed[2], Value::Int(4));
  EXPECT_NE(ErrorOf("mylib::f(Literal[1, 2] k=3) -> Tensor").find("default 3 is not one of the allowed values"),
            std::string::npos);
}

TEST_F(LoweringTest, EnumsLowerByTheirValueType) {
  AddEnum("Mode", {"FAST", "EXACT"}, {Value::String("fast"), Value::String("exact")});
  AddEnum("Level", {"LOW", "HIGH"}, {Value::Int(1), Value::Int(10)});
  LoweredOp op = Lower("mylib::f(Tensor x, Mode mode=EXACT, Level? level=None, Level[] levels=[1]) -> Tensor");
  EXPECT_EQ(ToString(op.flat),
            "mylib::f(Tensor x, str mode=\"exact\", int? level=None, int[] levels=[1]) -> Tensor");
  EXPECT_EQ(op.leaves[1].enum_name, "Mode");
  EXPECT_EQ(op.leaves[2].enum_name, "Level");
  EXPECT_EQ(op.leaves[2].allowed[1], Value::Int(10));
  EXPECT_EQ(op.leaves[3].enum_name, "Level");
}

TEST_F(LoweringTest, EnumFieldInsideStruct) {
  AddEnum("Mode", {"FAST", "EXACT"}, {Value::String("fast"), Value::String("exact")});
  AddStruct("Cfg", {{"mode", "Mode", "\"fast\""}, {"k", "Literal[1, 2]", "1"}});
  LoweredOp op = Lower("mylib::f(Cfg cfg={}) -> Tensor");
  EXPECT_EQ(ToString(op.flat), "mylib::f(str cfg__mode=\"fast\", int cfg__k=1) -> Tensor");
  EXPECT_EQ(op.leaves[0].enum_name, "Mode");
  EXPECT_EQ(op.leaves[1].allowed.size(), 2u);
}

TEST_F(LoweringTest, HandleLowersToSymIntSoThatCompiledCodeTakesItAsAnInput) {
  LoweredOp op = Lower("mylib::run(Tensor x, Handle(Runner) runner) -> Tensor");
  EXPECT_EQ(ToString(op.flat), "mylib::run(Tensor x, SymInt runner) -> Tensor");
  EXPECT_EQ(op.leaves[1].handle_type, "Runner");
}

TEST_F(LoweringTest, MutatingAStructMarksOnlyItsTensorLeaves) {
  AddStruct("Bufs", {{"k", "Tensor"}, {"scale", "float"}, {"v", "Tensor?"}, {"many", "Tensor[]"}});
  LoweredOp op = Lower("mylib::f(Tensor x, Bufs bufs) -> ()", {"bufs"});
  EXPECT_EQ(ToString(op.flat),
            "mylib::f(Tensor x, Tensor(a1!) bufs__k, float bufs__scale, Tensor(a3!)? bufs__v, "
            "Tensor(a4!)[] bufs__many) -> ()");
  EXPECT_TRUE(op.leaves[1].mutated);
  EXPECT_FALSE(op.leaves[2].mutated);
}

TEST_F(LoweringTest, AWriteAnnotationOnAStructMutatesItsTensorLeaves) {
  AddStruct("Bufs", {{"k", "Tensor"}, {"scale", "float"}});
  EXPECT_EQ(Flat("mylib::f(Tensor x, Bufs(a!) bufs) -> ()"),
            "mylib::f(Tensor x, Tensor(a1!) bufs__k, float bufs__scale) -> ()");
  EXPECT_NE(ErrorOf("mylib::f(Tensor x, Bufs(a) bufs) -> ()").find("can only carry a write annotation"),
            std::string::npos);
}

TEST_F(LoweringTest, MutatesArgsAcceptsLeafNamesAndFieldPaths) {
  AddStruct("Inner", {{"w", "Tensor"}, {"u", "Tensor"}});
  AddStruct("Bufs", {{"inner", "Inner"}, {"k", "Tensor"}});
  EXPECT_EQ(Flat("mylib::f(Bufs b) -> ()", {"b__k"}),
            "mylib::f(Tensor b__inner__w, Tensor b__inner__u, Tensor(a2!) b__k) -> ()");
  EXPECT_EQ(Flat("mylib::f(Bufs b) -> ()", {"b.inner.u"}),
            "mylib::f(Tensor b__inner__w, Tensor(a1!) b__inner__u, Tensor b__k) -> ()");
  EXPECT_EQ(Flat("mylib::f(Bufs b) -> ()", {"b.inner"}),
            "mylib::f(Tensor(a0!) b__inner__w, Tensor(a1!) b__inner__u, Tensor b__k) -> ()");
}

TEST_F(LoweringTest, MutatesArgsOnAFlatSignatureMatchesInferSchema) {
  EXPECT_EQ(Flat("mylib::f(Tensor x, Tensor y, Tensor? z, Tensor[] w) -> ()", {"y", "z", "w"}),
            "mylib::f(Tensor x, Tensor(a1!) y, Tensor(a2!)? z, Tensor(a3!)[] w) -> ()");
}

TEST_F(LoweringTest, MutatesArgsRejectsUnknownAndNonTensorNames) {
  AddStruct("Cfg", {{"scale", "float"}});
  EXPECT_NE(ErrorOf("mylib::f(Tensor x, float s) -> ()", {"nope"})
                .find("mylib::f: mutates_args: 'nope' is not a parameter or a struct field of the op."),
            std::string::npos);
  EXPECT_NE(ErrorOf("mylib::f(Tensor x, float s) -> ()", {"s"})
                .find("'s' has type float; only Tensor arguments can be mutated."),
            std::string::npos);
  EXPECT_NE(ErrorOf("mylib::f(Tensor x, Cfg c) -> ()", {"c"})
                .find("'c' is a struct with no Tensor fields"),
            std::string::npos);
  EXPECT_NE(ErrorOf("mylib::f(Tensor x, Cfg c) -> ()", {"c__scale"})
                .find("only Tensor arguments can be mutated"),
            std::string::npos);
}

TEST_F(LoweringTest, ListDefaultsAreKept) {
  EXPECT_EQ(Flat("mylib::f(Tensor x, int[] dims=[0], float[] w=[1., 2.5], int[2] k=1) -> Tensor"),
            "mylib::f(Tensor x, int[] dims=[0], float[] w=[1., 2.5], int[2] k=1) -> Tensor");
}

TEST_F(LoweringTest, StructReturnsFlattenToATuple) {
  AddStruct("Out", {{"y", "Tensor"}, {"lse", "Tensor"}});
  LoweredOp op = Lower("mylib::f(Tensor x) -> Out");
  EXPECT_EQ(ToString(op.flat), "mylib::f(Tensor x) -> (Tensor, Tensor)");
  ASSERT_EQ(op.returns.size(), 1u);
  EXPECT_EQ(op.returns[0].struct_name, "Out");
  EXPECT_EQ(op.returns[0].children[1].leaf_index, 1);
}

TEST_F(LoweringTest, LostDefaultDropsEarlierPositionalDefaults) {
  AddStruct("Cfg", {{"w", "Tensor"}, {"s", "float", "1."}});
  // cfg's default cannot carry a Tensor, so cfg__w has no default and the
  // default before it has to go.
  LoweredOp op = Lower("mylib::f(int n=3, Cfg cfg={s=2.}) -> Tensor");
  EXPECT_EQ(ToString(op.flat), "mylib::f(int n, Tensor cfg__w, float cfg__s=2.) -> Tensor");
  ASSERT_EQ(op.warnings.size(), 1u);
  EXPECT_NE(op.warnings[0].find("'n'"), std::string::npos);
}

TEST_F(LoweringTest, KeywordOnlyStructLeavesStayKeywordOnly) {
  AddStruct("Cfg", {{"a", "int"}, {"b", "int"}});
  EXPECT_EQ(Flat("mylib::f(Tensor x, *, Cfg cfg) -> Tensor"),
            "mylib::f(Tensor x, *, int cfg__a, int cfg__b) -> Tensor");
}

TEST_F(LoweringTest, ErrorsNameTheOpTheParameterAndAFix) {
  AddStruct("Cfg", {{"a", "int"}});
  EXPECT_EQ(ErrorOf("mylib::f(Tensor x, (int, int) pair) -> Tensor"),
            "mylib::f: parameter 'pair': type (int, int) cannot be expressed in a torch schema. "
            "Use a list (e.g. int[] / list[int]) instead of a tuple.");
  EXPECT_NE(ErrorOf("mylib::f(Dict(str, Tensor) d) -> Tensor").find("instead of a dict"), std::string::npos);
  EXPECT_NE(ErrorOf("f(Tensor x) -> Tensor").find("'namespace::name'"), std::string::npos);
  EXPECT_NE(ErrorOf("mylib::f(Tensor x, Unknown u) -> Tensor").find("unknown type 'Unknown'"),
            std::string::npos);
  EXPECT_EQ(ErrorOf("mylib::f(Cfg cfg, int cfg__a) -> Tensor"),
            "mylib::f: parameter 'cfg__a': its flat argument name 'cfg__a' collides with the one "
            "from 'cfg.a'. Rename the parameter or the field.");
  EXPECT_NE(ErrorOf("mylib::f(Cfg cfg=None) -> Tensor").find("Annotate it as Optional[Cfg]"),
            std::string::npos);
  EXPECT_NE(ErrorOf("mylib::f(Cfg[] cfgs) -> Tensor").find("Lists of structs are not supported"),
            std::string::npos);
}

TEST_F(LoweringTest, NestedFieldErrorsNameTheField) {
  AddStruct("Cfg", {{"a", "int"}});
  EXPECT_EQ(ErrorOf("mylib::f(Cfg cfg={a=None}) -> Tensor"),
            "mylib::f: parameter 'cfg', field Cfg.a: has default None but type int is not optional. "
            "Make the type optional or give a non-None default.");
}

}  // namespace
}  // namespace opforge
