#include "core/structs.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "core/error.h"
#include "core/spec.h"

namespace opforge {

const StructField* StructDef::Find(std::string_view field) const {
  auto it = std::find_if(fields.begin(), fields.end(), [&](const StructField& f) { return f.name == field; });
  return it == fields.end() ? nullptr : &*it;
}

TypeKind EnumDef::value_kind() const {
  return !values.empty() && values[0].kind == Value::Kind::kInt ? TypeKind::kInt : TypeKind::kStr;
}

bool IsIdentifier(std::string_view name) {
  const auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  return !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
         std::all_of(name.begin(), name.end(), word_char);
}

TypeRegistry& TypeRegistry::Global() {
  static auto* registry = new TypeRegistry();
  return *registry;
}

namespace {

bool IsTypeName(const std::string& name) {
  // Dotted names (`mymod.Cfg`) are allowed; each part is an identifier.
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    if (!IsIdentifier(name.substr(start, dot - start))) return false;
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

const char* kReserved[] = {"Tensor", "int", "float", "bool", "str", "Scalar",
                           "SymInt", "Literal", "Handle", "Dict", "Future",
                           "Union", "Any", "Device", "None", "NoneType"};

void CheckTypeName(const std::string& name, const char* what) {
  const std::string where = std::string(what) + " '" + name + "'";
  if (!IsTypeName(name)) {
    throw Error(ErrorKind::kValueError, "", where, "is not a valid type name.",
                "Use an identifier, optionally dotted (mylib.AttnCfg).");
  }
  if (std::find(std::begin(kReserved), std::end(kReserved), name) != std::end(kReserved)) {
    throw Error(ErrorKind::kValueError, "", where, "shadows a builtin schema type.", "Choose another name.");
  }
}

}  // namespace

bool SameLayout(const StructDef& a, const StructDef& b) {
  return std::equal(a.fields.begin(), a.fields.end(), b.fields.begin(), b.fields.end(),
                    [](const StructField& x, const StructField& y) {
                      return x.name == y.name && *x.type == *y.type && x.default_value == y.default_value;
                    });
}

std::string Describe(const StructDef& def) {
  std::string out = def.name + "(";
  for (size_t i = 0; i < def.fields.size(); ++i) {
    if (i) out += ", ";
    out += def.fields[i].name + ": " + TypeStr(*def.fields[i].type);
    if (def.fields[i].default_value) {
      out += " = " + DefaultToString(*def.fields[i].default_value, *def.fields[i].type);
    }
  }
  return out + ")";
}

bool TypeRegistry::AddStruct(StructDef def) {
  CheckTypeName(def.name, "struct");
  std::set<std::string> seen;
  for (const auto& field : def.fields) {
    const std::string where = "field " + def.name + "." + field.name;
    if (!IsIdentifier(field.name)) {
      throw Error(ErrorKind::kValueError, "", where, "is not a valid field name.", "Use an identifier.");
    }
    if (field.name.find("__") != std::string::npos) {
      throw Error(ErrorKind::kValueError, "", where, "contains '__', which opforge uses to join leaf names.",
                  "Rename the field.");
    }
    if (!seen.insert(field.name).second) {
      throw Error(ErrorKind::kValueError, "", where, "is declared twice.", "Remove one.");
    }
    if (field.type->unwrap_optional().kind == TypeKind::kStruct && field.type->unwrap_optional().name == def.name) {
      throw Error(ErrorKind::kTypeError, "", where, "refers to its own struct.", "Structs cannot be recursive.");
    }
    CheckLowerable(*field.type, *this, "", where);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (enums_.count(def.name)) {
    throw Error(ErrorKind::kValueError, "", "struct '" + def.name + "'",
                "is already registered as an enum.", "Choose another name.");
  }
  auto it = structs_.find(def.name);
  if (it != structs_.end()) {
    if (SameLayout(*it->second, def)) return false;
    throw Error(ErrorKind::kValueError, "", "struct '" + def.name + "'",
                "is already registered with a different layout: " + Describe(*it->second) +
                    " vs " + Describe(def) + ".",
                "Give one of them another name.");
  }
  std::string name = def.name;
  structs_.emplace(std::move(name), std::make_shared<const StructDef>(std::move(def)));
  return true;
}

void CheckLiteralValues(const std::vector<Value>& values) {
  const bool ok = !values.empty() && std::all_of(values.begin(), values.end(), [&](const Value& v) {
    return (v.kind == Value::Kind::kString || v.kind == Value::Kind::kInt) && v.kind == values[0].kind;
  });
  if (!ok) {
    std::string shown;
    for (const auto& v : values) {
      // Shown as Python writes it, so the user recognizes the annotation.
      const std::string text = v.kind == Value::Kind::kString ? "'" + v.s + "'" : ValueToString(v);
      shown += (shown.empty() ? "" : ", ") + text;
    }
    throw Error(ErrorKind::kTypeError, "", "",
                "Literal[" + shown + "] mixes value types or uses values other than str and int.",
                "Use Literal of str values only or of int values only.");
  }
}

bool TypeRegistry::AddEnum(EnumDef def) {
  CheckTypeName(def.name, "enum");
  const std::string where = "enum '" + def.name + "'";
  if (def.values.empty() || def.values.size() != def.members.size()) {
    throw Error(ErrorKind::kValueError, "", where, "needs at least one member, each with a value.");
  }
  std::set<std::string> members;
  for (size_t i = 0; i < def.values.size(); ++i) {
    const auto& v = def.values[i];
    if (v.kind != Value::Kind::kString && v.kind != Value::Kind::kInt) {
      throw Error(ErrorKind::kTypeError, "", where,
                  "member " + def.members[i] + " has a value that is neither str nor int (" + ValueToString(v) + ").",
                  "Use str or int values.");
    }
    if (v.kind != def.values[0].kind) {
      throw Error(ErrorKind::kTypeError, "", where, "mixes str and int values.", "Use one value type for all members.");
    }
    if (!members.insert(def.members[i]).second) {
      throw Error(ErrorKind::kValueError, "", where, "declares member " + def.members[i] + " twice.");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (structs_.count(def.name)) {
    throw Error(ErrorKind::kValueError, "", where, "is already registered as a struct.", "Choose another name.");
  }
  auto it = enums_.find(def.name);
  if (it != enums_.end()) {
    if (it->second->members == def.members && it->second->values == def.values) return false;
    throw Error(ErrorKind::kValueError, "", where, "is already registered with different members.",
                "Give one of them another name.");
  }
  std::string name = def.name;
  enums_.emplace(std::move(name), std::make_shared<const EnumDef>(std::move(def)));
  return true;
}

std::shared_ptr<const StructDef> TypeRegistry::FindStruct(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = structs_.find(name);
  return it == structs_.end() ? nullptr : it->second;
}

std::shared_ptr<const EnumDef> TypeRegistry::FindEnum(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = enums_.find(name);
  return it == enums_.end() ? nullptr : it->second;
}

bool TypeRegistry::Contains(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return structs_.find(name) != structs_.end() || enums_.find(name) != enums_.end();
}

bool TypeRegistry::Remove(std::string_view name) {
  const std::string key(name);
  std::lock_guard<std::mutex> lock(mu_);
  return structs_.erase(key) > 0 || enums_.erase(key) > 0;
}

std::vector<std::string> TypeRegistry::Names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, _] : structs_) out.push_back(name);
  for (const auto& [name, _] : enums_) out.push_back(name);
  return out;
}

StructDef MakeStruct(std::string name, const std::vector<FieldText>& fields,
                     const TypeRegistry& registry, const std::optional<std::string>& scope) {
  StructDef def;
  def.name = std::move(name);
  ParseOptions options;
  options.registry = &registry;
  // Nested types as written in C++: `Inner` in library liba is `liba.Inner`.
  const size_t dot = def.name.rfind('.');
  options.scope = scope.value_or(dot == std::string::npos ? "" : def.name.substr(0, dot));
  for (const auto& text : fields) {
    StructField field;
    field.name = text.name;
    try {
      field.type = ParseType(text.type, options);
      if (text.default_value) {
        field.default_value = ParseDefault(*text.default_value, *field.type, std::nullopt, options);
      }
    } catch (const Error& e) {
      throw Error(ErrorKind::kTypeError, "", "field " + def.name + "." + text.name,
                  "cannot be read: " + std::string(e.what()));
    }
    def.fields.push_back(std::move(field));
  }
  return def;
}

}  // namespace opforge
