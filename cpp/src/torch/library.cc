#include "opforge/library.h"

#include <cxxabi.h>

#include <cstdlib>

#include "opforge/error.h"

namespace opforge {

std::string SchemaTypeName(const char* cpp_name) {
  std::string name(cpp_name);
  if (name.rfind("::", 0) == 0) name = name.substr(2);
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name.compare(i, 2, "::") == 0) {
      out += '.';
      ++i;
    } else {
      out += name[i];
    }
  }
  return out;
}

std::string DemangledName(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string out = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  return out;
}

namespace detail {

void RegisterStructDef(const std::string& name, std::vector<FieldText> fields) {
  auto& registry = TypeRegistry::Global();
  registry.AddStruct(MakeStruct(name, fields, registry));
}

void RegisterEnumDef(const std::string& name, std::vector<std::string> members,
                     std::vector<int64_t> values) {
  EnumDef def;
  def.name = name;
  def.members = std::move(members);
  for (int64_t v : values) def.values.push_back(Value::Int(v));
  TypeRegistry::Global().AddEnum(std::move(def));
}

LibraryInit::LibraryInit(torch::Library::Kind kind, const char* ns, std::optional<c10::DispatchKey> key,
                         void (*init)(Library&), const char* file, uint32_t line)
    : lib_(kind, ns, key, file, line) {
  Library wrapper(lib_, ns);
  init(wrapper);
}

}  // namespace detail

OpBuilder Library::def(const std::string& schema) {
  const std::string qualified = ns_ + "::" + schema;
  LoweredOp lowered = LowerText(qualified, LowerOptions{});
  const std::string flat = ToString(lowered.flat);
  lib_.def(flat.substr(ns_.size() + 2).c_str());
  OpSpecRegistry::Global().Add(lowered);
  return OpBuilder(*this, lowered.flat.name);
}

bool Library::HasHandleLeaf(const std::string& qualified) {
  auto lowered = OpSpecRegistry::Global().Find(qualified);
  if (!lowered) return false;
  for (const auto& leaf : lowered->leaves) {
    if (!leaf.handle_type.empty()) return true;
  }
  return false;
}

OpBuilder& OpBuilder::arg_tag(const std::string& tag, const std::vector<std::string>& names) {
  auto lowered = OpSpecRegistry::Global().Find(name_);
  if (!lowered) {
    throw Error(ErrorKind::kLookupError, name_, tag, "the op was not defined through opforge.");
  }
  TagRegistry::Global().Set(name_, tag, ResolveTensorArgs(*lowered, names, tag + " args"));
  return *this;
}

OpBuilder& OpBuilder::symm_mem_args(const std::vector<std::string>& names) {
  arg_tag("symm_mem", names);
  auto lowered = OpSpecRegistry::Global().Find(name_);
  bool has_group = false;
  for (const auto& arg : lowered->flat.arguments) has_group = has_group || arg.name == "group_name";
  if (!has_group) {
    TORCH_WARN(name_, ": symm_mem_args are declared but the op has no 'group_name' argument; "
               "Inductor needs one to allocate its inputs in symmetric memory automatically.");
  }
  return *this;
}

}  // namespace opforge
