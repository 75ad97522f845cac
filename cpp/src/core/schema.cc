// The schema model and its printer. Printing mirrors torch's
// `operator<<(std::ostream&, const FunctionSchema&)` and IValue printing, so
// `ToString(ParseSchema(s)) == str(torch._C.parse_schema(s))`.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "core/schema.h"

namespace opforge {
namespace {

// A Value of `kind` with `member` set to `v` and the other members at their defaults.
template <typename T>
Value Make(Value::Kind kind, T Value::*member, T v) {
  Value out;
  out.kind = kind;
  out.*member = std::move(v);
  return out;
}

using K = TypeKind;
using KindNames = std::pair<TypeKind, const char*>;

// The leaf kinds as a schema writes them.
constexpr KindNames kLeafNames[] = {
    {K::kTensor, "Tensor"}, {K::kInt, "int"}, {K::kSymInt, "SymInt"}, {K::kFloat, "float"}, {K::kBool, "bool"},
    {K::kSymBool, "SymBool"}, {K::kStr, "str"}, {K::kComplex, "complex"}, {K::kScalar, "Scalar"},
    {K::kScalarType, "ScalarType"}, {K::kLayout, "Layout"}, {K::kMemoryFormat, "MemoryFormat"},
    {K::kDevice, "Device"}, {K::kGenerator, "Generator"}, {K::kStorage, "Storage"}, {K::kStream, "Stream"},
    {K::kQScheme, "QScheme"}, {K::kQuantizer, "Quantizer"}, {K::kCapsule, "Capsule"}, {K::kAny, "Any"},
    {K::kAnyClass, "AnyClassType"}, {K::kAnyEnum, "AnyEnumType"}, {K::kPyObject, "PyObject"}, {K::kNone, "NoneType"},
};

// The composite kinds as `Name(...)` in a schema and `Name[...]` in an
// annotation; a schema writes a tuple as a bare `(...)`.
constexpr KindNames kCompositeNames[] = {
    {K::kList, "List"}, {K::kOptional, "Optional"}, {K::kTuple, "Tuple"}, {K::kDict, "Dict"},
    {K::kFuture, "Future"}, {K::kRRef, "RRef"}, {K::kAwait, "Await"}, {K::kUnion, "Union"},
};

// The name `kind` has in `names`, or nullptr.
template <size_t N>
const char* NameIn(const KindNames (&names)[N], TypeKind kind) {
  auto it = std::find_if(std::begin(names), std::end(names), [&](const KindNames& n) { return n.first == kind; });
  return it == std::end(names) ? nullptr : it->second;
}

std::string JoinTypes(const std::vector<TypePtr>& types, bool annotation) {
  std::string out;
  for (size_t i = 0; i < types.size(); ++i) {
    if (i) out += ", ";
    out += annotation ? AnnotationStr(*types[i]) : TypeStr(*types[i]);
  }
  return out;
}

// c10::printQuotedString, including its handling of bytes >= 0x80. torch
// cannot parse its own printing of those bytes back, so the definable form
// writes them as they are (torch's parser reads UTF-8 inside quotes).
void AppendQuoted(std::string& out, const std::string& text, bool definable = false) {
  out += '"';
  for (char c : text) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\'': out += "\\'"; break;
      case '"': out += "\\\""; break;
      case '\a': out += "\\a"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\v': out += "\\v"; break;
      default:
        if ((c > 0x1f && c < 0x7f) || (definable && static_cast<unsigned char>(c) >= 0x80)) {
          out += c;
        } else {
          // Same arithmetic as torch on a signed char, so non-ASCII bytes
          // print the way torch prints them.
          char buf[4] = "000";
          signed char s = static_cast<signed char>(c);
          for (int k = 2; k >= 0; --k, s = static_cast<signed char>(s / 8)) {
            buf[k] = static_cast<char>(buf[k] + (k ? s % 8 : s));
          }
          out += '\\';
          out += buf;
        }
    }
  }
  out += '"';
}

void AppendDouble(std::string& out, double d) {
  // torch's operator<<(ostream, IValue): integral doubles print as "3.".
  // The range check stands in for the x86 conversion torch relies on, which
  // maps out-of-range values to INT64_MIN.
  int c = std::fpclassify(d);
  if ((c == FP_NORMAL || c == FP_ZERO) && d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
    auto i = static_cast<int64_t>(d);
    if (static_cast<double>(i) == d) {
      out += std::to_string(i);
      out += '.';
      return;
    }
  }
  // What an ostream with precision max_digits10 and the default float
  // format prints (%g); written without iostreams to keep the core lean.
  if (std::isnan(d)) {
    out += std::signbit(d) ? "-nan" : "nan";
    return;
  }
  if (std::isinf(d)) {
    out += d < 0 ? "-inf" : "inf";
    return;
  }
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.*g", std::numeric_limits<double>::max_digits10, d);
  out += buf;
}

void AppendValue(std::string& out, const Value& v, bool quote_strings) {
  switch (v.kind) {
    case Value::Kind::kNone: out += "None"; break;
    case Value::Kind::kBool: out += v.b ? "True" : "False"; break;
    case Value::Kind::kInt: out += std::to_string(v.i); break;
    case Value::Kind::kDouble: AppendDouble(out, v.d); break;
    case Value::Kind::kComplex:
      AppendDouble(out, v.d);
      out += v.imag >= 0 ? "+" : "-";
      AppendDouble(out, std::abs(v.imag));
      out += "j";
      break;
    case Value::Kind::kString:
      if (quote_strings) {
        AppendQuoted(out, v.s);
      } else {
        out += v.s;
      }
      break;
    case Value::Kind::kDevice: out += v.s; break;
    case Value::Kind::kList:
    case Value::Kind::kStruct: {
      // A struct default prints as `{name=value, ...}`, its strings quoted.
      const bool is_struct = v.kind == Value::Kind::kStruct;
      out += is_struct ? "{" : "[";
      for (size_t i = 0; i < v.items.size(); ++i) {
        if (i) out += ", ";
        if (is_struct) out += v.names[i] + "=";
        AppendValue(out, v.items[i], quote_strings || is_struct);
      }
      out += is_struct ? "}" : "]";
      break;
    }
  }
}

std::set<std::string> Sorted(const std::vector<std::string>& sets) { return {sets.begin(), sets.end()}; }

bool SameSets(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  return a == b || Sorted(a) == Sorted(b);
}

// torch keeps alias sets in an unordered_set, which iterates the sets it holds
// in the reverse of the order they were added.
void AppendSets(std::string& out, const std::vector<std::string>& sets) {
  for (size_t i = sets.size(); i-- > 0;) {
    out += sets[i];
    if (i) out += "|";
  }
}

void AppendType(std::string& out, const Type& type) {
  if (const char* leaf = NameIn(kLeafNames, type.kind)) {
    out += leaf;
    return;
  }
  switch (type.kind) {
    case TypeKind::kVar:
    case TypeKind::kClass:
    case TypeKind::kStruct:
    case TypeKind::kEnum:
      out += type.name;
      return;
    case TypeKind::kHandle:
      out += "Handle(" + type.name + ")";
      return;
    case TypeKind::kLiteral:
      out += "Literal";
      AppendValue(out, Value::List(type.literals), /*quote_strings=*/true);
      return;
    case TypeKind::kList:
      AppendType(out, type.element());
      out += "[]";
      return;
    case TypeKind::kOptional:
      AppendType(out, type.element());
      out += "?";
      return;
    default:
      if (type.kind != TypeKind::kTuple) out += NameIn(kCompositeNames, type.kind);
      out += "(" + JoinTypes(type.elements, /*annotation=*/false) + ")";
  }
}

void AppendAlias(std::string& out, const AliasInfo& alias_info) {
  out += "(";
  AppendSets(out, alias_info.before_sets);
  if (alias_info.is_write) out += "!";
  if (!SameSets(alias_info.before_sets, alias_info.after_sets)) {
    out += " -> ";
    AppendSets(out, alias_info.after_sets);
  }
  out += ")";
}

void AppendDefault(std::string& out, const Value& value, const Type& type, bool definable = false) {
  const Type& unopt = type.unwrap_optional();
  if (value.kind == Value::Kind::kString &&
      (unopt.kind == TypeKind::kStr || unopt.kind == TypeKind::kLiteral || unopt.kind == TypeKind::kEnum)) {
    AppendQuoted(out, value.s, definable);
  } else if (definable && value.kind == Value::Kind::kDevice) {
    // torch prints `Device d=cpu` but parses only `Device d="cpu"`.
    AppendQuoted(out, value.s, definable);
  } else if (type.kind == TypeKind::kList && type.element().kind == TypeKind::kInt &&
             value.kind == Value::Kind::kList && value.items.size() > 1) {
    // torch writes `int[2] stride=1` rather than `int[2] stride=[1, 1]`.
    const bool same = std::all_of(value.items.begin(), value.items.end(),
                                  [&](const Value& item) { return item == value.items[0]; });
    AppendValue(out, same ? value.items[0] : value, false);
  } else {
    AppendValue(out, value, false);
  }
}

void AppendArgument(std::string& out, const Argument& arg, bool definable = false) {
  const Type& type = *arg.type;
  bool is_opt = type.is_optional();
  const Type& unopt = type.unwrap_optional();
  if (unopt.kind == TypeKind::kList) {
    AppendType(out, unopt.element());
    if (arg.alias_info && !arg.alias_info->contained.empty()) {
      AppendAlias(out, arg.alias_info->contained[0]);
    }
    out += "[";
    if (arg.N) out += std::to_string(*arg.N);
    out += "]";
  } else {
    AppendType(out, unopt);
  }
  if (arg.alias_info && !arg.alias_info->before_sets.empty()) AppendAlias(out, *arg.alias_info);
  if (is_opt) out += "?";
  if (!arg.name.empty()) out += " " + arg.name;
  if (arg.default_value) {
    out += "=";
    AppendDefault(out, *arg.default_value, type, definable);
  }
}

std::string PrintSchema(const FunctionSchema& schema, bool definable) {
  std::string out;
  out.reserve(128);
  out += schema.qualified_name() + "(";
  bool seen_kwarg_only = false;
  for (size_t i = 0; i < schema.arguments.size(); ++i) {
    if (i > 0) out += ", ";
    if (schema.arguments[i].kwarg_only && !seen_kwarg_only) {
      out += "*, ";
      seen_kwarg_only = true;
    }
    AppendArgument(out, schema.arguments[i], definable);
  }
  if (schema.is_vararg) out += schema.arguments.empty() ? "..." : ", ...";
  out += ") -> ";
  const auto& returns = schema.returns;
  std::string rets;
  for (size_t i = 0; i < returns.size(); ++i) {
    if (i > 0) rets += ", ";
    AppendArgument(rets, returns[i]);
  }
  if (schema.is_varret) rets += returns.empty() ? "..." : ", ...";
  // One return, or `...` alone, goes without parentheses, unless it starts
  // with '(' (a tuple type) and would read as the return list.
  const bool alone = (returns.size() == 1 && !schema.is_varret) || (returns.empty() && schema.is_varret);
  const bool need_paren = !alone || rets.front() == '(';
  if (need_paren) out += "(";
  out += rets;
  if (need_paren) out += ")";
  return out;
}

void CollectSets(const AliasInfo& info, std::set<std::string>& out) {
  out.insert(info.before_sets.begin(), info.before_sets.end());
  out.insert(info.after_sets.begin(), info.after_sets.end());
  for (const auto& c : info.contained) CollectSets(c, out);
}

// `Tensor!` is a write to a fresh alias set that torch names `$0` and prints
// as `Tensor($0! -> )`, which its parser rejects. The same write to a named
// set that no other argument uses means the same to torch: `Tensor(_0!)`.
bool IsFresh(const std::string& set) { return !set.empty() && set[0] == '$'; }

void NameFreshSets(AliasInfo& info, std::map<std::string, std::string>& names, const std::set<std::string>& taken) {
  bool fresh = false;
  for (auto& set : info.before_sets) {
    if (!IsFresh(set)) continue;
    auto it = names.find(set);
    if (it == names.end()) {
      std::string name = "_" + set.substr(1);
      while (taken.count(name)) name += "_";
      it = names.emplace(set, name).first;
    }
    set = it->second;
    fresh = true;
  }
  if (fresh && info.after_sets.empty()) info.after_sets = info.before_sets;
  for (auto& c : info.contained) NameFreshSets(c, names, taken);
}

// The text `append` writes for `args`.
template <typename F, typename... Args>
std::string Printed(F append, const Args&... args) {
  std::string out;
  append(out, args...);
  return out;
}

}  // namespace

Value Value::Bool(bool v) { return Make(Kind::kBool, &Value::b, v); }
Value Value::Int(int64_t v) { return Make(Kind::kInt, &Value::i, v); }
Value Value::Double(double v) { return Make(Kind::kDouble, &Value::d, v); }
Value Value::String(std::string v) { return Make(Kind::kString, &Value::s, std::move(v)); }
Value Value::Device(std::string v) { return Make(Kind::kDevice, &Value::s, std::move(v)); }
Value Value::List(std::vector<Value> v) { return Make(Kind::kList, &Value::items, std::move(v)); }

Value Value::Complex(double re, double im) {
  Value out = Make(Kind::kComplex, &Value::d, re);
  out.imag = im;
  return out;
}

Value Value::Struct(std::vector<std::string> names, std::vector<Value> v) {
  Value out = Make(Kind::kStruct, &Value::items, std::move(v));
  out.names = std::move(names);
  return out;
}

bool Value::operator==(const Value& o) const {
  if (kind != o.kind) return false;
  // Doubles compare bitwise, so -0.0 != 0.0 and a NaN default equals itself.
  const auto same_bits = [](double x, double y) { return std::memcmp(&x, &y, sizeof(x)) == 0; };
  switch (kind) {
    case Kind::kNone: return true;
    case Kind::kBool: return b == o.b;
    case Kind::kInt: return i == o.i;
    case Kind::kDouble: return same_bits(d, o.d);
    case Kind::kComplex: return same_bits(d, o.d) && same_bits(imag, o.imag);
    case Kind::kString:
    case Kind::kDevice: return s == o.s;
    case Kind::kList: return items == o.items;
    case Kind::kStruct: return names == o.names && items == o.items;
  }
  return false;
}

TypePtr Type::Get(TypeKind kind) {
  // One shared instance per leaf kind; composites are built per use.
  static const auto* cache = [] {
    auto* table = new std::vector<TypePtr>();
    for (int k = 0; k <= static_cast<int>(TypeKind::kHandle); ++k) {
      table->push_back(std::make_shared<Type>(Type{static_cast<TypeKind>(k), {}, {}, {}}));
    }
    return table;
  }();
  return (*cache)[static_cast<size_t>(kind)];
}

TypePtr Type::Named(TypeKind kind, std::string name) {
  return std::make_shared<Type>(Type{kind, std::move(name), {}, {}});
}

TypePtr Type::Composite(TypeKind kind, std::vector<TypePtr> elements) {
  return std::make_shared<Type>(Type{kind, {}, std::move(elements), {}});
}

TypePtr Type::List(TypePtr element) { return Composite(TypeKind::kList, {std::move(element)}); }
TypePtr Type::Optional(TypePtr element) { return Composite(TypeKind::kOptional, {std::move(element)}); }

TypePtr Type::Literal(std::vector<Value> values) {
  return std::make_shared<Type>(Type{TypeKind::kLiteral, {}, {}, std::move(values)});
}

bool operator==(const Type& a, const Type& b) {
  return a.kind == b.kind && a.name == b.name && a.literals == b.literals &&
         std::equal(a.elements.begin(), a.elements.end(), b.elements.begin(), b.elements.end(),
                    [](const TypePtr& x, const TypePtr& y) { return *x == *y; });
}

std::string TypeStr(const Type& type) { return Printed(AppendType, type); }

std::string AnnotationStr(const Type& type) {
  // Python's names for the symbolic and Scalar types.
  if (type.kind == TypeKind::kSymInt) return "int";
  if (type.kind == TypeKind::kSymBool) return "bool";
  if (type.kind == TypeKind::kScalar) return "number";
  if (const char* leaf = NameIn(kLeafNames, type.kind)) return leaf;
  if (const char* composite = NameIn(kCompositeNames, type.kind)) {
    return std::string(composite) + "[" + JoinTypes(type.elements, /*annotation=*/true) + "]";
  }
  return TypeStr(type);
}

TypePtr LeafType(std::string_view name) {
  for (const auto& [kind, leaf] : kLeafNames) {
    if (name == leaf) return Type::Get(kind);
  }
  return nullptr;
}

bool IsTensorLike(const Type& type) {
  const Type& t = type.unwrap_optional();
  const Type& base = t.kind == TypeKind::kList ? t.element().unwrap_optional() : t;
  return base.kind == TypeKind::kTensor;
}

bool AliasInfo::operator==(const AliasInfo& o) const {
  return SameSets(before_sets, o.before_sets) && SameSets(after_sets, o.after_sets) &&
         is_write == o.is_write && contained == o.contained;
}

std::string ToString(const AliasInfo& alias_info) { return Printed(AppendAlias, alias_info); }

std::string ValueToString(const Value& value) { return Printed(AppendValue, value, /*quote_strings=*/false); }

std::string DefaultToString(const Value& value, const Type& type) {
  return Printed(AppendDefault, value, type, /*definable=*/false);
}

std::string ToString(const Argument& arg) { return Printed(AppendArgument, arg, /*definable=*/false); }

std::string ToString(const FunctionSchema& schema) { return PrintSchema(schema, false); }

std::string ToDefinableString(const FunctionSchema& schema) {
  std::set<std::string> taken;
  for (const auto* list : {&schema.arguments, &schema.returns}) {
    for (const auto& arg : *list) {
      if (arg.alias_info) CollectSets(*arg.alias_info, taken);
    }
  }
  if (std::none_of(taken.begin(), taken.end(), IsFresh)) return PrintSchema(schema, true);
  FunctionSchema named = schema;
  std::map<std::string, std::string> names;
  for (auto* list : {&named.arguments, &named.returns}) {
    for (auto& arg : *list) {
      if (arg.alias_info) NameFreshSets(*arg.alias_info, names, taken);
    }
  }
  return PrintSchema(named, true);
}

}  // namespace opforge
