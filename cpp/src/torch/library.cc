#include "opforge/library.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

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

void RegisterStructDef(const std::string& name, std::vector<FieldText> fields,
                       const std::vector<std::optional<Value>>& defaults) {
  auto& registry = TypeRegistry::Global();
  if (!defaults.empty()) {
    // Printed, then parsed with the field's type by MakeStruct: a value the
    // type cannot hold (an enum value that is no member) is an error here.
    ParseOptions options;
    options.registry = &registry;
    for (size_t i = 0; i < fields.size() && i < defaults.size(); ++i) {
      if (!defaults[i]) continue;
      TypePtr type = ParseType(fields[i].type, options);
      fields[i].default_value = DefaultToString(*defaults[i], *type);
    }
  }
  registry.AddStruct(MakeStruct(name, fields, registry));
}

namespace {

// Keeps the compiler from treating `p`'s bytes as dead or unknown across this
// point: the fill before construction and the reads after it stay real.
inline void Opaque(void* p) { asm volatile("" : : "r"(p) : "memory"); }

}  // namespace

DefaultProbe::DefaultProbe(size_t size, size_t align, void (*construct)(void*), void (*destroy)(void*))
    : size_(size),
      align_(align),
      destroy_(destroy),
      a_(::operator new(size, std::align_val_t(align))),
      b_(::operator new(size, std::align_val_t(align))) {
  std::memset(a_, 0x00, size);
  std::memset(b_, 0xff, size);
  Opaque(a_);
  Opaque(b_);
  try {
    construct(a_);
  } catch (...) {
    return;
  }
  try {
    construct(b_);
  } catch (...) {
    destroy_(a_);
    return;
  }
  Opaque(a_);
  Opaque(b_);
  ok_ = true;
}

DefaultProbe::~DefaultProbe() {
  if (ok_) {
    destroy_(a_);
    destroy_(b_);
  }
  ::operator delete(a_, std::align_val_t(align_));
  ::operator delete(b_, std::align_val_t(align_));
}

bool DefaultProbe::Written(size_t offset, size_t size) const {
  return offset + size <= size_ &&
         std::memcmp(static_cast<const char*>(a_) + offset, static_cast<const char*>(b_) + offset, size) == 0;
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
  // Struct fields' C++ defaults become leaf defaults in the core's lowering,
  // so torch.ops callers may omit them (docs/cpp_ops.md#defaults).
  LoweredOp lowered = LowerText(qualified, LowerOptions{});
  const std::string flat = ToDefinableString(lowered.flat);
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
