// Named struct and enum types that op specs may use as parameter types.
//
//   TypeRegistry& r = TypeRegistry::Global();
//   r.AddStruct(MakeStruct("AttnCfg", {{"scale", "float"}, {"causal", "bool", "True"}}));
//   ParseSchema("my::attn(Tensor q, AttnCfg cfg) -> Tensor", {&r});
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/schema.h"

namespace opforge {

struct StructField {
  std::string name;
  TypePtr type;
  std::optional<Value> default_value;
};

struct StructDef {
  std::string name;
  std::vector<StructField> fields;

  const StructField* Find(std::string_view field) const;
};

struct EnumDef {
  std::string name;
  std::vector<std::string> members;  // member names, in order
  std::vector<Value> values;         // all kString or all kInt

  // kStr or kInt: the schema type the enum lowers to.
  TypeKind value_kind() const;
};

// A field written as text, for MakeStruct.
struct FieldText {
  std::string name;
  std::string type;
  std::optional<std::string> default_value;  // schema default syntax
};

class TypeRegistry {
 public:
  // The process-wide registry used by both front ends.
  static TypeRegistry& Global();

  // Adds a struct. The same name with the same layout again is a no-op and
  // returns false; the same name with a different layout throws. Every field
  // type must be lowerable (see Lower); nested structs must already exist.
  bool AddStruct(StructDef def);
  bool AddEnum(EnumDef def);

  std::shared_ptr<const StructDef> FindStruct(std::string_view name) const;
  std::shared_ptr<const EnumDef> FindEnum(std::string_view name) const;
  bool Contains(std::string_view name) const;

  // Removes a struct or enum; used to roll back a failed registration.
  bool Remove(std::string_view name);
  std::vector<std::string> Names() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const StructDef>, std::less<>> structs_;
  std::map<std::string, std::shared_ptr<const EnumDef>, std::less<>> enums_;
};

// Literal values: at least one, all strings or all integers. Throws a
// TypeError-kind Error otherwise (the enum rule of TypeRegistry::AddEnum, for
// Literal[...]).
void CheckLiteralValues(const std::vector<Value>& values);

// True for a C identifier: a letter or '_', then letters, digits and '_'.
bool IsIdentifier(std::string_view name);

// Builds a StructDef from field texts, resolving nested names in `registry`:
// in `scope` first (a C++ library's namespace), by default in the struct's
// own dotted prefix (`mod.Outer` finds `mod.Inner` as `Inner`).
StructDef MakeStruct(std::string name, const std::vector<FieldText>& fields,
                     const TypeRegistry& registry = TypeRegistry::Global(),
                     const std::optional<std::string>& scope = std::nullopt);

// Two layouts are the same when field names, types and defaults match.
bool SameLayout(const StructDef& a, const StructDef& b);

// `Inner(bias: float = 0.)`-style description used in error messages.
std::string Describe(const StructDef& def);

}  // namespace opforge
