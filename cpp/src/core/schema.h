// A model of torch function schemas, with a parser and a printer for torch's
// schema grammar.
//
//   FunctionSchema s = ParseSchema("aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor");
//   s.arguments[2].kwarg_only  == true
//   ToString(s)                == the same text, exactly as torch prints it
//
// The parser also understands opforge's extensions when given a
// TypeRegistry: registered struct and enum names as types, Literal[...] and
// Handle(Name). Those only appear in op specs; lowering removes them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace opforge {

class TypeRegistry;

// A constant as it appears in a default: `=1`, `=[0, 1]`, `="mean"`, `=None`.
// Printing follows torch's IValue printing (`1e-05` becomes
// `1.0000000000000001e-05`, `3.0` becomes `3.`).
struct Value {
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,
    kDouble,
    kComplex,  // real in d, imaginary in imag
    kString,
    kDevice,  // device text in s, e.g. "cuda:1"
    kList,
    kStruct,  // opforge extension: field names in names, values in items
  };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double d = 0.0;
  double imag = 0.0;
  std::string s;
  std::vector<Value> items;
  std::vector<std::string> names;

  static Value None() { return Value(); }
  static Value Bool(bool v);
  static Value Int(int64_t v);
  static Value Double(double v);
  static Value Complex(double re, double im);
  static Value String(std::string v);
  static Value Device(std::string v);
  static Value List(std::vector<Value> v);
  static Value Struct(std::vector<std::string> names, std::vector<Value> v);

  bool operator==(const Value& o) const;
  bool operator!=(const Value& o) const { return !(*this == o); }
};

enum class TypeKind : uint8_t {
  kTensor,
  kInt,
  kSymInt,
  kFloat,
  kBool,
  kSymBool,
  kStr,
  kComplex,
  kScalar,
  kScalarType,
  kLayout,
  kMemoryFormat,
  kDevice,
  kGenerator,
  kStorage,
  kStream,
  kQScheme,
  kQuantizer,
  kCapsule,
  kAny,
  kAnyClass,
  kAnyEnum,
  kPyObject,
  kNone,
  kVar,    // a type variable: `t`, `tVal`
  kClass,  // `__torch__.torch.classes.ns.Name`
  kList,
  kOptional,
  kTuple,
  kDict,
  kFuture,
  kRRef,
  kAwait,
  kUnion,
  // opforge extensions; never part of a schema registered with torch.
  kStruct,   // a registered struct, by name
  kEnum,     // a registered enum, by name
  kLiteral,  // Literal["a", "b"] or Literal[1, 2]: values in `literals`
  kHandle,   // Handle(Runner): an object passed through the dispatcher as int
};

struct Type;
using TypePtr = std::shared_ptr<const Type>;

struct Type {
  TypeKind kind;
  std::string name;                // kVar, kClass, kStruct, kEnum, kHandle
  std::vector<TypePtr> elements;   // kList/kOptional: 1; kDict: 2; ...
  std::vector<Value> literals;     // kLiteral

  static TypePtr Get(TypeKind kind);  // shared instances of the leaf kinds
  static TypePtr Named(TypeKind kind, std::string name);
  static TypePtr List(TypePtr element);
  static TypePtr Optional(TypePtr element);
  static TypePtr Composite(TypeKind kind, std::vector<TypePtr> elements);
  static TypePtr Literal(std::vector<Value> values);

  const Type& element() const { return *elements.at(0); }
  bool is_optional() const { return kind == TypeKind::kOptional; }
  // Strips one level of Optional.
  const Type& unwrap_optional() const { return is_optional() ? element() : *this; }
};

bool operator==(const Type& a, const Type& b);
inline bool operator!=(const Type& a, const Type& b) { return !(a == b); }

// `int[]`, `Tensor?`, `Dict(str, t)`, as in a schema.
std::string TypeStr(const Type& type);
// `List[int]`, `Optional[Tensor]`: how torch's Python bindings print a type
// (`str(arg.real_type)`). Used to compare structure with torch.
std::string AnnotationStr(const Type& type);

// The leaf type a schema writes as `name` ("Tensor", "SymInt"), or nullptr.
TypePtr LeafType(std::string_view name);

// True for Tensor, Tensor?, Tensor[], Tensor?[] and optionals of those.
bool IsTensorLike(const Type& type);

// Alias annotation: `(a)`, `(a!)`, `(a -> *)`, `(a|b)`.
struct AliasInfo {
  std::vector<std::string> before_sets;  // in the order written; "*" = any
  std::vector<std::string> after_sets;
  bool is_write = false;
  std::vector<AliasInfo> contained;  // for lists: the element's annotation

  bool operator==(const AliasInfo& o) const;
};

struct Argument {
  std::string name;
  TypePtr type;               // a sized list `int[2]` is kList with N = 2
  std::optional<int32_t> N;   // the size of `int[2]`
  std::optional<Value> default_value;
  std::optional<AliasInfo> alias_info;
  bool kwarg_only = false;
};

struct FunctionSchema {
  std::string name;      // "aten::add" (namespace optional)
  std::string overload;  // "Tensor", or empty
  std::vector<Argument> arguments;
  std::vector<Argument> returns;
  bool is_vararg = false;
  bool is_varret = false;

  std::string qualified_name() const { return overload.empty() ? name : name + "." + overload; }
};

struct ParseOptions {
  // Enables opforge's extensions (struct/enum names, Literal, Handle, struct
  // defaults `{a=1}`) and resolves type names against this registry.
  const TypeRegistry* registry = nullptr;
  // torch rejects a positional argument without a default after one with a
  // default. Specs may relax this; lowering restores the rule.
  bool allow_default_before_required = false;
  // Resolves a type name `N` as `scope.N` first (a C++ library's own structs
  // and enums, registered under its op namespace), then as `N`.
  std::string scope;
  // Refuses a default that is not a value of its argument's type (`int
  // n=1.5`), which torch's parser takes and its first call trips over. C++
  // libraries' schemas; the Python front end checks its own defaults, by name.
  bool check_default_types = false;
};

// Throws ParseError (with the offset of the bad token) or Error.
FunctionSchema ParseSchema(std::string_view text, const ParseOptions& options = {});
// A single type, e.g. a struct field's type: "float", "Tensor?", "AttnCfg".
TypePtr ParseType(std::string_view text, const ParseOptions& options = {});
// A single constant for a type, e.g. "1e-5" for float, "[0, 1]" for int[].
Value ParseDefault(std::string_view text, const Type& type, std::optional<int32_t> N = std::nullopt,
                   const ParseOptions& options = {});

// Printing, exactly as torch's `str(schema)` prints.
std::string ToString(const FunctionSchema& schema);
// The same text in the form torch's parser accepts back, for registration:
// torch prints `Device d=cpu` and non-ASCII string bytes as octal escapes it
// cannot read; this prints `Device d="cpu"` and the bytes themselves.
std::string ToDefinableString(const FunctionSchema& schema);
std::string ToString(const Argument& argument);
std::string ToString(const AliasInfo& alias_info);
// How a default prints for an argument of this type.
std::string DefaultToString(const Value& value, const Type& type);
// torch's IValue printing, without the type-dependent rules.
std::string ValueToString(const Value& value);

}  // namespace opforge
