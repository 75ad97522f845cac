// Lowering: op spec -> flat torch schema + mapping tree (docs/python_ops.md).
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "core/error.h"
#include "core/spec.h"

namespace opforge {
namespace {

using K = TypeKind;

// Kinds a parameter may have as they are.
constexpr TypeKind kPlainLeafKinds[] = {K::kTensor, K::kInt, K::kSymInt, K::kFloat, K::kBool, K::kSymBool, K::kStr,
                                        K::kComplex, K::kScalar, K::kScalarType, K::kLayout, K::kMemoryFormat,
                                        K::kDevice, K::kGenerator, K::kStream, K::kClass};
// Kinds a list parameter may hold.
constexpr TypeKind kListElementKinds[] = {K::kTensor, K::kInt, K::kSymInt, K::kFloat, K::kBool, K::kStr, K::kScalar,
                                          K::kEnum, K::kLiteral};
// Return leaves besides Tensor[] (see Lowerer::CheckReturnLeaf).
constexpr TypeKind kReturnKinds[] = {K::kTensor, K::kInt, K::kSymInt, K::kFloat, K::kBool, K::kScalar};

template <size_t N>
bool IsOneOf(TypeKind kind, const TypeKind (&kinds)[N]) {
  return std::find(std::begin(kinds), std::end(kinds), kind) != std::end(kinds);
}

// What to write instead of a parameter type torch schemas cannot hold.
const char* FixFor(const Type& t) {
  switch (t.kind) {
    case TypeKind::kTuple: return "Use a list (e.g. int[] / list[int]) instead of a tuple.";
    case TypeKind::kDict: return "Use a struct (a frozen dataclass) or separate parameters instead of a dict.";
    case TypeKind::kList:
      return t.element().unwrap_optional().kind == TypeKind::kStruct
                 ? "Lists of structs are not supported; pass one list per field."
                 : "Lists may hold Tensor, Tensor?, int, float, bool, str, Scalar, or an enum.";
    case TypeKind::kAny:
    case TypeKind::kVar: return "Give the parameter a concrete type.";
    default:
      return "Use a Tensor, a scalar (int, float, bool, str), a list of those, a struct, "
             "an enum, a Literal or a Handle.";
  }
}

[[noreturn]] void Unsupported(const Type& type, const std::string& op, const std::string& where) {
  throw Error(ErrorKind::kTypeError, op, where, "type " + TypeStr(type) + " cannot be expressed in a torch schema.",
              FixFor(type.unwrap_optional()));
}

// Installs the `Tensor(aN!)` annotation infer_schema would write.
void MarkMutated(Argument& arg, int index) {
  AliasInfo info;
  info.before_sets = {"a" + std::to_string(index)};
  info.after_sets = info.before_sets;
  info.is_write = true;
  if (arg.type->unwrap_optional().kind == TypeKind::kList) {
    AliasInfo container;
    container.is_write = true;
    container.contained.push_back(std::move(info));
    arg.alias_info = std::move(container);
  } else {
    arg.alias_info = std::move(info);
  }
}

bool IsWrite(const AliasInfo& info) {
  return info.is_write || std::any_of(info.contained.begin(), info.contained.end(), IsWrite);
}

class Lowerer {
 public:
  Lowerer(const FunctionSchema& spec, const LowerOptions& options, const TypeRegistry& registry)
      : spec_(spec), options_(options), registry_(registry), op_(spec.qualified_name()) {}

  LoweredOp Run() {
    CheckOpName(spec_.name);
    out_.original = spec_;
    out_.flat.name = spec_.name;
    out_.flat.overload = spec_.overload;
    out_.flat.is_vararg = spec_.is_vararg;
    out_.flat.is_varret = spec_.is_varret;
    for (const auto& arg : spec_.arguments) {
      out_.params.push_back(Expand(arg, arg.name, arg.name, arg.name, arg.type, arg.default_value,
                                   /*force_optional=*/false, "parameter '" + arg.name + "'"));
    }
    for (const auto& ret : spec_.returns) {
      out_.returns.push_back(ExpandReturn(ret, ret.name, ret.type, "return value"));
    }
    CheckNames();
    CheckArgumentCount();
    RestoreDefaultOrder();
    ResolveMutations();
    return std::move(out_);
  }

 private:
  // torch's dispatcher finds an op's dispatch keys with one bit per argument
  // (c10::utils::bitset): more flat arguments fail in torch, naming nothing.
  static constexpr size_t kMaxArguments = 64;
  void CheckArgumentCount() const {
    const size_t n = out_.flat.arguments.size();
    if (n <= kMaxArguments) return;
    // Which parameters bring the leaves, the most first: "parameter 'cfg' brings 70".
    std::vector<std::pair<size_t, std::string>> counts;
    for (const auto& leaf : out_.leaves) {
      const std::string param = leaf.path.substr(0, leaf.path.find('.'));
      auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.second == param; });
      if (it == counts.end()) {
        counts.emplace_back(1, param);
      } else {
        ++it->first;
      }
    }
    std::stable_sort(counts.begin(), counts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::string brings;
    for (const auto& [count, param] : counts) {
      if (count < 2 && !brings.empty()) break;
      brings += (brings.empty() ? "" : ", ") + std::string("parameter '") + param + "' brings " + std::to_string(count);
    }
    throw Error(ErrorKind::kValueError, op_, "",
                "lowers to " + std::to_string(n) + " flat arguments (each struct field is one: " + brings +
                    "); torch's dispatcher takes at most " + std::to_string(kMaxArguments) + ".",
                "Take fewer leaves: keep rarely-set fields out of the op's structs (a Handle carries any object "
                "as one argument), or split the op.");
  }

  MappingNode Expand(const Argument& origin, const std::string& name, const std::string& flat_name,
                     const std::string& path, const TypePtr& type, const std::optional<Value>& def, bool force_optional,
                     const std::string& where) {
    const Type& unopt = type->unwrap_optional();
    if (unopt.kind == TypeKind::kStruct) return ExpandStruct(origin, name, flat_name, path, type,
                                                             def, force_optional, where);
    LeafInfo info;
    info.path = path;
    TypePtr leaf_type = type;
    const Type& base = unopt.kind == TypeKind::kList ? unopt.element().unwrap_optional() : unopt;
    if (base.kind == TypeKind::kEnum || base.kind == TypeKind::kLiteral) {
      CheckLowerable(*type, registry_, op_, where);
      if (base.kind == TypeKind::kEnum) {
        auto e = registry_.FindEnum(base.name);
        info.allowed = e->values;
        info.enum_name = e->name;
      } else {
        info.allowed = base.literals;
      }
      // The allowed values are all str or all int (AddEnum and the parser see to it).
      leaf_type = Type::Get(info.allowed[0].kind == Value::Kind::kInt ? TypeKind::kInt : TypeKind::kStr);
      if (unopt.kind == TypeKind::kList) leaf_type = Type::List(leaf_type);
      if (type->is_optional()) leaf_type = Type::Optional(leaf_type);
      if (def && def->kind != Value::Kind::kNone) CheckAllowed(*def, info.allowed, where);
    } else if (unopt.kind == TypeKind::kHandle) {
      info.handle_type = unopt.name;
      leaf_type = Type::Get(TypeKind::kSymInt);  // a graph input under torch.compile (docs/handles.md)
      if (type->is_optional()) leaf_type = Type::Optional(leaf_type);
    } else {
      CheckLowerable(*type, registry_, op_, where);
    }
    if (force_optional && !leaf_type->is_optional()) {
      info.forced_optional = true;
      leaf_type = Type::Optional(leaf_type);
    }

    Argument leaf;
    leaf.name = flat_name;
    leaf.type = leaf_type;
    leaf.N = flat_name == origin.name ? origin.N : std::nullopt;
    leaf.default_value = def;
    leaf.kwarg_only = origin.kwarg_only;
    if (flat_name == origin.name && origin.alias_info) {
      // A leaf written as `Tensor!` or `Tensor(a!)` (the C++ way of saying
      // mutates_args) is mutated like one named in mutates_args.
      leaf.alias_info = origin.alias_info;
      info.mutated = IsWrite(*origin.alias_info);
    }
    if (leaf.default_value && leaf.default_value->kind == Value::Kind::kNone && !leaf_type->is_optional() &&
        leaf_type->kind != TypeKind::kTensor && leaf_type->kind != TypeKind::kGenerator) {
      throw Error(ErrorKind::kValueError, op_, where,
                  "has default None but type " + TypeStr(*type) + " is not optional.",
                  "Make the type optional or give a non-None default.");
    }

    info.default_from_field = in_field_defaults_ && leaf.default_value.has_value();
    MappingNode node;
    node.kind = MappingNode::Kind::kLeaf;
    node.name = name;
    node.leaf_index = static_cast<int>(out_.flat.arguments.size());
    out_.flat.arguments.push_back(std::move(leaf));
    out_.leaves.push_back(std::move(info));
    return node;
  }

  MappingNode ExpandStruct(const Argument& origin, const std::string& name, const std::string& flat_name,
                           const std::string& path, const TypePtr& type, const std::optional<Value>& def,
                           bool force_optional, const std::string& where) {
    const Type& unopt = type->unwrap_optional();
    auto st = registry_.FindStruct(unopt.name);
    if (!st) {
      throw Error(ErrorKind::kTypeError, op_, where, "unknown struct type '" + unopt.name + "'.",
                  "Register the struct before defining the op.");
    }
    const bool optional = type->is_optional();
    if (def && def->kind != Value::Kind::kNone && def->kind != Value::Kind::kStruct) {
      throw Error(ErrorKind::kValueError, op_, where,
                  "has a default that is not an instance of struct " + st->name + ".",
                  "Use a " + st->name + " instance, or None for an optional struct.");
    }
    if (def && def->kind == Value::Kind::kNone && !optional && !force_optional) {
      throw Error(ErrorKind::kValueError, op_, where, "has default None but struct " + st->name + " is not optional.",
                  "Annotate it as Optional[" + st->name + "].");
    }
    MappingNode node;
    node.kind = MappingNode::Kind::kStruct;
    node.name = name;
    node.struct_name = st->name;
    node.optional = optional;
    if (optional) {
      Argument presence;
      presence.name = flat_name + "__is_set";
      presence.type = Type::Get(TypeKind::kBool);
      presence.kwarg_only = origin.kwarg_only;
      if (def) presence.default_value = Value::Bool(def->kind == Value::Kind::kStruct);
      LeafInfo info;
      info.path = path;
      info.is_presence = true;
      node.presence_index = static_cast<int>(out_.flat.arguments.size());
      out_.flat.arguments.push_back(std::move(presence));
      out_.leaves.push_back(std::move(info));
    }
    // A required struct without a default of its own still lends its fields'
    // defaults to their leaves, so torch.ops callers may omit them too.
    const bool saved_field_defaults = in_field_defaults_;
    if (!def && !optional && !force_optional) in_field_defaults_ = true;
    for (const auto& field : st->fields) {
      node.children.push_back(Expand(origin, field.name, flat_name + "__" + field.name, path + "." + field.name,
                                     field.type, FieldDefault(field, def), force_optional || optional,
                                     where + ", field " + st->name + "." + field.name));
    }
    in_field_defaults_ = saved_field_defaults;
    return node;
  }

  // A field's value in its struct's default `def` (None in a None default),
  // else the field's own default where one applies.
  std::optional<Value> FieldDefault(const StructField& field, const std::optional<Value>& def) const {
    if (!def) return in_field_defaults_ ? field.default_value : std::nullopt;
    if (def->kind == Value::Kind::kNone) return Value::None();
    auto it = std::find(def->names.begin(), def->names.end(), field.name);
    if (it == def->names.end()) return field.default_value;
    return def->items[static_cast<size_t>(it - def->names.begin())];
  }

  MappingNode ExpandReturn(const Argument& ret, const std::string& name, const TypePtr& type,
                           const std::string& where) {
    MappingNode node;
    node.name = name;
    if (type->kind == TypeKind::kStruct) {
      auto st = registry_.FindStruct(type->name);
      node.kind = MappingNode::Kind::kStruct;
      node.struct_name = st->name;
      for (const auto& field : st->fields) {
        Argument leaf;
        leaf.type = field.type;
        node.children.push_back(
            ExpandReturn(leaf, field.name, field.type, where + ", field " + st->name + "." + field.name));
      }
      return node;
    }
    if (type->unwrap_optional().kind == TypeKind::kStruct) {
      throw Error(ErrorKind::kTypeError, op_, where, "an optional struct cannot be returned.",
                  "Return the struct, or its fields as a tuple.");
    }
    CheckReturnLeaf(*type, where);
    node.leaf_index = static_cast<int>(out_.flat.returns.size());
    out_.flat.returns.push_back(ret);
    return node;
  }

  // What a body may return, besides structs of these: Tensor, Tensor[], and
  // the scalars torch turns into Python numbers.
  void CheckReturnLeaf(const Type& type, const std::string& where) {
    const bool ok = IsOneOf(type.kind, kReturnKinds) ||
                    (type.kind == TypeKind::kList && type.element().kind == TypeKind::kTensor);
    if (!ok) {
      throw Error(ErrorKind::kTypeError, op_, where, "type " + TypeStr(type) + " cannot be returned from an op.",
                  "Return Tensor, tuple[Tensor, ...], list[Tensor], a frozen dataclass of tensors, "
                  "int, float, bool or None.");
    }
  }

  void CheckAllowed(const Value& v, const std::vector<Value>& allowed, const std::string& where) {
    if (v.kind == Value::Kind::kList) {
      for (const auto& item : v.items) CheckAllowed(item, allowed, where);
      return;
    }
    if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      throw Error(ErrorKind::kValueError, op_, where,
                  "default " + ValueToString(v) + " is not one of the allowed values.",
                  "Use one of the declared values.");
    }
  }

  void CheckNames() {
    std::map<std::string, std::string> seen;  // flat name -> path
    for (size_t i = 0; i < out_.flat.arguments.size(); ++i) {
      const auto& name = out_.flat.arguments[i].name;
      const auto& path = out_.leaves[i].path;
      auto [it, inserted] = seen.emplace(name, path);
      if (!inserted) {
        throw Error(ErrorKind::kValueError, op_, "parameter '" + path.substr(0, path.find('.')) + "'",
                    "its flat argument name '" + name + "' collides with the one from '" + it->second + "'.",
                    "Rename the parameter or the field.");
      }
    }
  }

  // torch rejects a positional argument without a default after one with a
  // default. That happens when a default could not be carried to a leaf;
  // earlier positional defaults are dropped then (the front ends still apply
  // the original defaults).
  void RestoreDefaultOrder() {
    auto& args = out_.flat.arguments;
    size_t last_required = 0;
    for (size_t i = 0; i < args.size(); ++i) {
      if (!args[i].kwarg_only && !args[i].default_value) last_required = i;
    }
    for (size_t i = 0; i < last_required; ++i) {
      if (!args[i].kwarg_only && args[i].default_value) {
        // A field default of a required struct is a convenience for torch.ops
        // callers; losing it here changes nothing for the front ends.
        if (!out_.leaves[i].default_from_field) {
          out_.warnings.push_back("the default of '" + args[i].name +
                                  "' is not in the flat schema because a later positional "
                                  "argument has none");
        }
        args[i].default_value.reset();
        out_.leaves[i].default_from_field = false;
      }
    }
  }

  void ResolveMutations() {
    // A struct written as mutable in a spec (`Bufs(a!) bufs`, the C++ way of
    // saying mutates_args) mutates its Tensor leaves.
    std::vector<std::string> names = options_.mutates_args;
    for (const auto& arg : spec_.arguments) {
      if (arg.type->unwrap_optional().kind == TypeKind::kStruct && arg.alias_info) {
        if (!arg.alias_info->is_write) {
          throw Error(ErrorKind::kValueError, op_, "parameter '" + arg.name + "'",
                      "a struct parameter can only carry a write annotation.",
                      "Write " + arg.type->unwrap_optional().name + "(a!) to mutate its Tensor fields.");
        }
        names.push_back(arg.name);
      }
    }
    for (int index : ResolveTensorLeafIndices(out_, names, "mutates_args", "can be mutated")) {
      MarkMutated(out_.flat.arguments[static_cast<size_t>(index)], index);
      out_.leaves[static_cast<size_t>(index)].mutated = true;
    }
  }

  const FunctionSchema& spec_;
  const LowerOptions& options_;
  const TypeRegistry& registry_;
  std::string op_;
  LoweredOp out_;
  bool in_field_defaults_ = false;  // expanding a required struct that has no default
};

const MappingNode* FindNamed(const std::vector<MappingNode>& nodes, std::string_view name) {
  auto it = std::find_if(nodes.begin(), nodes.end(), [&](const MappingNode& n) { return n.name == name; });
  return it == nodes.end() ? nullptr : &*it;
}

const MappingNode* FindPath(const LoweredOp& op, const std::string& name) {
  // "cfg", "cfg.inner.w" or a flat leaf name "cfg__inner__w".
  const std::string sep = name.find('.') != std::string::npos ? "." : "__";
  const std::vector<MappingNode>* level = &op.params;
  size_t start = 0;
  while (true) {
    const size_t end = name.find(sep, start);
    const MappingNode* found = FindNamed(*level, std::string_view(name).substr(start, end - start));
    if (!found || end == std::string::npos) return found;
    level = &found->children;
    start = end + sep.size();
  }
}

void CollectTensorLeaves(const LoweredOp& op, const MappingNode& node, std::vector<int>& out) {
  if (node.kind == MappingNode::Kind::kLeaf) {
    if (IsTensorLike(*op.flat.arguments[static_cast<size_t>(node.leaf_index)].type)) {
      out.push_back(node.leaf_index);
    }
    return;
  }
  for (const auto& child : node.children) CollectTensorLeaves(op, child, out);
}

}  // namespace

std::vector<int> ResolveTensorLeafIndices(const LoweredOp& op, const std::vector<std::string>& names,
                                          const std::string& option, const std::string& purpose) {
  const std::string op_name = op.flat.qualified_name();
  std::set<int> found_all;
  for (const auto& name : names) {
    // A parameter, then a flat leaf name, then a path (cfg.w or cfg__w).
    const MappingNode* node = FindNamed(op.params, name);
    MappingNode leaf_node;
    for (size_t i = 0; !node && i < op.flat.arguments.size(); ++i) {
      if (op.flat.arguments[i].name == name && !op.leaves[i].is_presence) {
        leaf_node.leaf_index = static_cast<int>(i);
        node = &leaf_node;
      }
    }
    if (!node) node = FindPath(op, name);
    if (!node) {
      std::string known;
      for (const auto& p : op.params) known += (known.empty() ? "" : ", ") + p.name;
      throw Error(ErrorKind::kValueError, op_name, option,
                  "'" + name + "' is not a parameter or a struct field of the op.",
                  "Name a parameter (" + known + "), a leaf (cfg__w) or a field path (cfg.w).");
    }
    std::vector<int> leaves;
    CollectTensorLeaves(op, *node, leaves);
    if (leaves.empty()) {
      const std::string what =
          node->kind == MappingNode::Kind::kStruct
              ? "'" + name + "' is a struct with no Tensor fields, so none of it " + purpose + "."
              : "'" + name + "' has type " +
                    TypeStr(*op.flat.arguments[static_cast<size_t>(node->leaf_index)].type) +
                    "; only Tensor arguments " + purpose + ".";
      throw Error(ErrorKind::kValueError, op_name, option, what, "Remove it from " + option + ".");
    }
    found_all.insert(leaves.begin(), leaves.end());
  }
  return std::vector<int>(found_all.begin(), found_all.end());
}

void CheckOpName(const std::string& name) {
  // A NUL or other control byte: printed raw, the message would end at it.
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c != 0x7f) continue;
    std::string shown;
    for (unsigned char b : name) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", b);
      shown += b >= 0x20 && b != 0x7f ? std::string(1, static_cast<char>(b)) : std::string(hex);
    }
    char code[5];
    std::snprintf(code, sizeof code, "\\x%02x", c);
    throw Error(ErrorKind::kValueError, shown, "",
                std::string("the op name holds the control byte ") + code + " at position " + std::to_string(i) +
                    (c == 0 ? " (a NUL byte, which ends the name for torch)." : "."),
                "Use letters, digits and underscores: 'namespace::name'.");
  }
  const size_t sep = name.find("::");
  if (sep == std::string::npos || sep == 0 || sep + 2 >= name.size() || name.find("::", sep + 2) != std::string::npos) {
    throw Error(ErrorKind::kValueError, name, "", "the op name must have the form 'namespace::name'.",
                "Add a namespace, e.g. 'mylib::" + name.substr(name.rfind(':') + 1) + "'.");
  }
  for (const std::string& part : {name.substr(0, sep), name.substr(sep + 2)}) {
    if (!IsIdentifier(part)) {
      throw Error(ErrorKind::kValueError, name, "",
                  "'" + part + "' is not a valid identifier for an op namespace or name.",
                  "Use letters, digits and underscores.");
    }
  }
}

void CheckLowerable(const Type& type, const TypeRegistry& registry, const std::string& op, const std::string& where) {
  const Type& t = type.unwrap_optional();
  if (t.kind == TypeKind::kOptional) Unsupported(type, op, where);
  if (IsOneOf(t.kind, kPlainLeafKinds)) return;
  switch (t.kind) {
    case TypeKind::kStruct:
    case TypeKind::kEnum: {
      const bool is_struct = t.kind == TypeKind::kStruct;
      if (is_struct ? !registry.FindStruct(t.name) : !registry.FindEnum(t.name)) {
        const std::string what = is_struct ? "struct" : "enum";
        throw Error(ErrorKind::kTypeError, op, where, "unknown " + what + " type '" + t.name + "'.",
                    "Register the " + what + " before using it.");
      }
      return;
    }
    case TypeKind::kLiteral:
    case TypeKind::kHandle:
      return;
    case TypeKind::kList: {
      const Type& elem = t.element();
      const Type& base = elem.unwrap_optional();
      // Optional elements only for Tensor?[] and Scalar?[], as in torch.
      bool ok = IsOneOf(base.kind, kListElementKinds) &&
                (!elem.is_optional() || base.kind == TypeKind::kTensor || base.kind == TypeKind::kScalar);
      if (!ok) Unsupported(type, op, where);
      if (base.kind == TypeKind::kEnum || base.kind == TypeKind::kLiteral) CheckLowerable(base, registry, op, where);
      return;
    }
    default:
      Unsupported(type, op, where);
  }
}

bool LoweredOp::is_identity() const {
  const auto is_leaf = [](const MappingNode& node) { return node.kind == MappingNode::Kind::kLeaf; };
  const auto is_plain = [](const LeafInfo& l) { return l.allowed.empty() && l.handle_type.empty() && !l.is_presence; };
  return std::all_of(leaves.begin(), leaves.end(), is_plain) && std::all_of(params.begin(), params.end(), is_leaf) &&
         std::all_of(returns.begin(), returns.end(), is_leaf);
}

LoweredOp Lower(const FunctionSchema& spec, const LowerOptions& options, const TypeRegistry& registry) {
  return Lowerer(spec, options, registry).Run();
}

LoweredOp LowerText(std::string_view spec_text, const LowerOptions& options, const TypeRegistry& registry) {
  ParseOptions parse;
  parse.registry = &registry;
  parse.allow_default_before_required = true;
  parse.scope = options.scope;
  parse.check_default_types = options.check_default_types;
  FunctionSchema spec;
  try {
    spec = ParseSchema(spec_text, parse);
  } catch (const ParseError& e) {
    throw ParseError(e, std::string(spec_text.substr(0, spec_text.find('('))));
  }
  return Lower(spec, options, registry);
}

}  // namespace opforge
