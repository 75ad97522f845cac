// The C surface of opforge/abi.h: how every C++ kernel library, whichever
// torch ABI it uses, declares its types and ops to the core and registers
// them with torch through its own backend, all or nothing.
#include "opforge/abi.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/handles.h"
#include "core/libraries.h"
#include "core/spec.h"
#include "core/tags.h"
#include "core/torch_layer.h"
#include "opforge/version.h"

namespace opforge {

namespace {

std::string Str(const char* s) { return s ? std::string(s) : std::string(); }

std::string Basename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// `NormCfg` declared by library `liba` is `liba.NormCfg`; a dotted name is
// taken as the author wrote it.
std::string ScopedName(const std::string& ns, const std::string& name) {
  return name.find('.') == std::string::npos ? ns + "." + name : name;
}

void CopyError(const std::string& message, char* out, size_t size) {
  if (out == nullptr || size == 0) return;
  std::snprintf(out, size, "%s", message.c_str());
}

// Takes a backend's malloc'd message; throws it as the failure of `what`
// (empty: the message already says where).
void CheckBackend(char* message, const std::string& op, const std::string& what) {
  if (message == nullptr) return;
  std::string text(message);
  std::free(message);
  if (what.empty()) throw std::runtime_error(text);
  throw Error(ErrorKind::kValueError, op, what, "torch refused it: " + text);
}

class Commit {
 public:
  explicit Commit(const OpforgeLibraryV1& lib) : lib_(lib), ns_(Str(lib.ns)) {}

  void Run() {
    CheckVersion();
    DeclareTypes();
    LowerOps();
    CheckKernels();
    ResolveTags();
    Register();
    AddSpecs();
    RegisterAutograd();
    Publish();
  }

  // The load errors of TVM-FFI kernels that could not be found: their ops
  // are defined, and a call raises the error.
  const std::vector<std::string>& unavailable() const { return unavailable_; }

  // Undoes what Run did before it failed.
  void Rollback() {
    for (auto it = layer_registrations_.rbegin(); it != layer_registrations_.rend(); ++it) torch_layer_->release(*it);
    layer_registrations_.clear();
    if (registered_ && lib_.backend.rollback) lib_.backend.rollback(lib_.backend.ctx);
    for (const auto& [op, tag] : tagged_) TagRegistry::Global().Set(op, tag, {});
    for (const auto& name : specs_) OpSpecRegistry::Global().Remove(name);
    for (auto it = types_.rbegin(); it != types_.rend(); ++it) TypeRegistry::Global().Remove(*it);
  }

  std::string Where() const {
    std::string where = Basename(Str(lib_.dso));
    if (!where.empty()) where += ": ";
    where += lib_.impl_key ? "OPFORGE_LIBRARY_IMPL(" + ns_ + ", " + Str(lib_.impl_key) + ")"
                           : "OPFORGE_LIBRARY(" + ns_ + ")";
    if (lib_.file) where += " at " + Str(lib_.file) + ":" + std::to_string(lib_.line);
    return where;
  }

 private:
  void CheckVersion() {
    // A library on libtorch's C++ API also links opforge's C++ symbols, which
    // change between releases; a stable-ABI library needs only this surface.
    if (Str(lib_.abi) == "unstable" && lib_.opforge_version &&
        std::strcmp(lib_.opforge_version, OPFORGE_VERSION_STRING) != 0) {
      throw Error(ErrorKind::kValueError, "", "",
                  "the library was built against opforge " + Str(lib_.opforge_version) +
                      " but opforge " OPFORGE_VERSION_STRING " is loaded.",
                  "Rebuild the library against this opforge, or build it on the stable ABI "
                  "(docs/stable_abi.md), which loads with any later opforge.");
    }
  }

  void DeclareTypes() {
    auto& registry = TypeRegistry::Global();
    for (size_t i = 0; i < lib_.num_types; ++i) {
      const OpforgeTypeV1& t = lib_.types[i];
      const std::string name = ScopedName(ns_, Str(t.name));
      const std::string what = (t.kind == kOpforgeEnum ? "enum " : "struct ") + Str(t.cpp_name);
      try {
        bool added;
        if (t.kind == kOpforgeEnum) {
          EnumDef def;
          def.name = name;
          for (size_t j = 0; j < t.num_members; ++j) {
            def.members.push_back(Str(t.members[j]));
            def.values.push_back(Value::Int(t.values[j]));
          }
          auto existing = registry.FindEnum(name);
          if (existing && (existing->members != def.members || existing->values != def.values)) {
            Clash(what, name, "an enum with other members");
          }
          added = registry.AddEnum(std::move(def));
        } else {
          std::vector<FieldText> fields;
          for (size_t j = 0; j < t.num_fields; ++j) {
            const OpforgeFieldV1& f = t.fields[j];
            fields.push_back(FieldText{Str(f.name), Str(f.type),
                                       f.default_value ? std::optional<std::string>(f.default_value) : std::nullopt});
          }
          StructDef def = MakeStruct(name, fields, registry, ns_);
          auto existing = registry.FindStruct(name);
          if (existing && !SameLayout(*existing, def)) {
            Clash(what, name, "a struct of another layout (" + Describe(*existing) + ")");
          }
          added = registry.AddStruct(std::move(def));
        }
        if (added) types_.push_back(name);
      } catch (const Error& e) {
        if (e.location().rfind(what, 0) == 0) throw;
        throw Error(e.kind(), e.op(), what + (e.location().empty() ? "" : ", " + e.location()), e.detail(), e.fix());
      }
    }
  }

  [[noreturn]] void Clash(const std::string& what, const std::string& name, const std::string& other) {
    throw Error(ErrorKind::kValueError, "", what,
                "is registered as '" + name + "', a name this library already gave " + other + ".",
                "Two C++ types of library " + ns_ + " share a name; give one another with "
                "OPFORGE_STRUCT_NAMED(Type, \"OtherName\", ...) or OPFORGE_ENUM_NAMED.");
  }

  void LowerOps() {
    LowerOptions options;
    options.scope = ns_;
    options.check_default_types = true;
    for (size_t i = 0; i < lib_.num_ops; ++i) {
      const std::string text = ns_ + "::" + Str(lib_.ops[i].schema);
      LoweredOp lowered;
      try {
        lowered = LowerText(text, options);
      } catch (const ParseError& e) {
        if (e.unknown_type().empty()) throw;
        const std::string& type = e.unknown_type();
        std::string known;
        for (size_t j = 0; j < lib_.num_types; ++j) known += (known.empty() ? "" : ", ") + Str(lib_.types[j].name);
        throw Error(ErrorKind::kTypeError, text.substr(0, text.find('(')), "",
                    "its schema names type '" + type + "', which this library block does not declare.",
                    "Declare it with OPFORGE_STRUCT (or OPFORGE_ENUM) and take it in a kernel of this block, or "
                    "list it with m.types<" + type + ">() (this block declares: " +
                        (known.empty() ? std::string("nothing") : known) + ").");
      }
      const std::string name = lowered.flat.name;
      if (lib_.ops[i].autograd || lib_.ops[i].torch_layer_autograd) CheckNoMutation(lowered);
      if (OpSpecRegistry::Global().Find(name)) {
        throw Error(ErrorKind::kValueError, name, "", "is already defined by another library block.",
                    "Define each op once; add kernels with m.impl(...).");
      }
      lowered_.push_back(std::move(lowered));
    }
  }

  // The op `name` ("ns::op") of this block, or null.
  const LoweredOp* FindLowered(const std::string& name) const {
    const auto it = std::find_if(lowered_.begin(), lowered_.end(),
                                 [&](const LoweredOp& l) { return l.flat.name == name; });
    return it == lowered_.end() ? nullptr : &*it;
  }

  // A kernel whose C++ types are not its op's schema would read its arguments
  // wrongly: the stable ABI checks nothing, and the C++ API mode's check (torch's)
  // names no opforge type. Each kernel's types (KernelSignature) against the
  // schema of its op, when the op is this block's or another C++ library's.
  void CheckKernels() {
    if (lib_.size < offsetof(OpforgeLibraryV1, kernel_signatures) + sizeof(lib_.kernel_signatures)) return;
    ParseOptions options;
    options.registry = &TypeRegistry::Global();
    options.scope = ns_;
    for (size_t i = 0; i < lib_.num_kernels; ++i) {
      const std::string op = ns_ + "::" + Str(lib_.kernels[i].op);
      const LoweredOp* here = FindLowered(op);
      std::shared_ptr<const LoweredOp> other;  // an op of another C++ library block
      if (!here && LibraryRegistry::Global().Find(op)) other = OpSpecRegistry::Global().Find(op);
      const FunctionSchema* schema = here ? &here->original : other ? &other->original : nullptr;
      if (schema == nullptr || lib_.kernel_signatures[i] == nullptr) continue;
      const std::string signature = lib_.kernel_signatures[i];
      const size_t arrow = signature.find(" -> ");
      const std::string where = Str(lib_.kernels[i].key) + " kernel";
      CheckTypes(op, where, "parameter", SplitTypes(signature.substr(0, arrow), options), schema->arguments);
      CheckTypes(op, where, "return", SplitTypes(signature.substr(arrow + 4), options), schema->returns);
    }
  }

  static std::vector<TypePtr> SplitTypes(const std::string& text, const ParseOptions& options) {
    std::vector<TypePtr> types;
    for (size_t begin = 0; begin < text.size();) {
      const size_t end = std::min(text.find(", ", begin), text.size());
      types.push_back(ParseType(text.substr(begin, end - begin), options));
      begin = end + 2;
    }
    return types;
  }

  void CheckTypes(const std::string& op, const std::string& where, const std::string& what,
                  const std::vector<TypePtr>& kernel, const std::vector<Argument>& schema) const {
    auto listed = [&](auto&& describe) {
      std::string out;
      for (const auto& a : schema) out += (out.empty() ? "" : ", ") + describe(a);
      return "(" + out + ")";
    };
    if (kernel.size() != schema.size()) {
      throw Error(ErrorKind::kTypeError, op, where,
                  "has " + std::to_string(kernel.size()) + " " + what + "s but the schema has " +
                      std::to_string(schema.size()) + " " + listed([](const Argument& a) { return ToString(a); }) + ".",
                  "Give the kernel one " + what + " per schema " + what + ", in order: " +
                      listed([&](const Argument& a) { return CppParam(*a.type); }) + ".");
    }
    for (size_t j = 0; j < kernel.size(); ++j) {
      if (KernelTypeStr(*kernel[j]) == KernelTypeStr(*schema[j].type)) continue;
      const std::string name = schema[j].name.empty() ? std::to_string(j) : "'" + schema[j].name + "'";
      throw Error(ErrorKind::kTypeError, op, where + ", " + what + " " + name,
                  "is " + CppParam(*kernel[j]) + " (" + TypeStr(*kernel[j]) + ") in C++ but " +
                      TypeStr(*schema[j].type) + " in the schema.",
                  "Write it as " + CppParam(*schema[j].type) + ", or change the schema.");
    }
  }

  // A type as a kernel receives it: SymInt as int, a Literal as its values'
  // type, any Handle(T) as a handle (its type is checked per call).
  static std::string KernelTypeStr(const Type& t) {
    switch (t.kind) {
      case TypeKind::kHandle: return "Handle";
      case TypeKind::kSymInt: return "int";
      case TypeKind::kSymBool: return "bool";
      case TypeKind::kLiteral: return t.literals.at(0).kind == Value::Kind::kString ? "str" : "int";
      case TypeKind::kOptional: return KernelTypeStr(t.element()) + "?";
      case TypeKind::kList: return KernelTypeStr(t.element()) + "[]";
      default: return TypeStr(t);
    }
  }

  // The C++ type a kernel takes for schema type `t`, the same in both ABI modes.
  std::string CppValue(const Type& t) const {
    switch (t.kind) {
      case TypeKind::kTensor: return "opforge::Tensor";
      case TypeKind::kInt:
      case TypeKind::kSymInt: return "int64_t";
      case TypeKind::kFloat: return "double";
      case TypeKind::kBool:
      case TypeKind::kSymBool: return "bool";
      case TypeKind::kStr: return "std::string";
      case TypeKind::kScalarType: return "c10::ScalarType";
      case TypeKind::kLayout: return "c10::Layout";
      case TypeKind::kMemoryFormat: return "c10::MemoryFormat";
      case TypeKind::kDevice: return "opforge::Device";
      case TypeKind::kLiteral: return KernelTypeStr(t) == "str" ? "std::string" : "int64_t";
      case TypeKind::kOptional: return "std::optional<" + CppValue(t.element()) + ">";
      case TypeKind::kList: return "std::vector<" + CppValue(t.element()) + ">";
      case TypeKind::kHandle: return "opforge::Handle<" + t.name + ">";
      case TypeKind::kStruct:
      case TypeKind::kEnum:
        for (size_t i = 0; i < lib_.num_types; ++i) {
          const OpforgeTypeV1& type = lib_.types[i];
          if (ScopedName(ns_, Str(type.name)) == t.name && type.cpp_name) return type.cpp_name;
        }
        return t.name;
      default: return TypeStr(t);
    }
  }
  // ... as a parameter: scalars by value, the rest by const reference.
  std::string CppParam(const Type& t) const {
    static const TypeKind kByValue[] = {TypeKind::kInt, TypeKind::kSymInt, TypeKind::kFloat, TypeKind::kBool,
                                        TypeKind::kSymBool, TypeKind::kScalarType, TypeKind::kLayout,
                                        TypeKind::kMemoryFormat, TypeKind::kEnum};
    const bool by_value = std::find(std::begin(kByValue), std::end(kByValue), t.kind) != std::end(kByValue) ||
                          (t.kind == TypeKind::kLiteral && KernelTypeStr(t) == "int");
    return by_value ? CppValue(t) : "const " + CppValue(t) + "&";
  }

  void Register() {
    const auto& b = lib_.backend;
    registered_ = true;
    for (const auto& lowered : lowered_) {
      const std::string flat = ToDefinableString(lowered.flat);
      auto tags = op_tags_.find(lowered.flat.name);
      if (tags != op_tags_.end()) {
        // The stable ABI's def takes no tags: the torch layer defines a tagged
        // op in both modes (and guards a cudagraph_unsafe one's captures).
        layer_registrations_.push_back(Layer(lowered.flat.name, "torch.Tag")->define_tagged(flat, tags->second));
        continue;
      }
      CheckBackend(b.def(b.ctx, flat.substr(ns_.size() + 2).c_str()), lowered.flat.name, "schema '" + flat + "'");
    }
    for (size_t i = 0; i < lib_.num_kernels; ++i) {
      const OpforgeKernelV1& k = lib_.kernels[i];
      CheckBackend(b.impl(b.ctx, k.op, k.key, k.kernel), ns_ + "::" + Str(k.op), Str(k.key) + " kernel");
    }
    RegisterFfiKernels();
  }

  // TVM-FFI kernels, registered by the torch layer in both ABI modes.
  void RegisterFfiKernels() {
    if (lib_.size < offsetof(OpforgeLibraryV1, num_ffi_kernels) + sizeof(lib_.num_ffi_kernels)) return;
    for (size_t i = 0; i < lib_.num_ffi_kernels; ++i) {
      const OpforgeFfiKernelV1& k = lib_.ffi_kernels[i];
      const std::string op = ns_ + "::" + Str(k.op);
      if (!FindLowered(op)) {
        throw Error(ErrorKind::kLookupError, op, Str(k.key) + " kernel", "the op is not defined in this library block.",
                    "Define it with m.def(schema) in the block that gives its TVM-FFI kernel.");
      }
      const bool has_flags = lib_.size >= offsetof(OpforgeLibraryV1, ffi_kernel_flags) + sizeof(lib_.ffi_kernel_flags);
      TorchLayerFfiKernel kernel;
      kernel.op = op;
      kernel.key = Str(k.key);
      kernel.module = Str(k.module);
      kernel.library = Str(lib_.dso);
      kernel.symbol = Str(k.symbol);
      kernel.where = Where();
      kernel.owned_tensors = has_flags && lib_.ffi_kernel_flags && (lib_.ffi_kernel_flags[i] & kOpforgeFfiOwnedTensors);
      std::string unavailable;
      layer_registrations_.push_back(Layer(op, kernel.key + " kernel")->register_ffi_kernel(kernel, &unavailable));
      if (!unavailable.empty()) unavailable_.push_back(std::move(unavailable));
    }
  }

  // opforge's torch layer, which whoever needs it has loaded: opforge._C,
  // a library on libtorch's C++ API (linked), a stable-ABI block (its header).
  const OpforgeTorchLayerV1* Layer(const std::string& op, const std::string& what) {
    if (torch_layer_ == nullptr) torch_layer_ = TorchLayer();
    if (torch_layer_ == nullptr) {
      throw Error(ErrorKind::kLookupError, op, what,
                  "it needs opforge's torch layer, which is not loaded (it is opforge/lib/ beside the core).",
                  "import opforge, or load opforge's torch layer (opforge/lib/) before this library.");
    }
    return torch_layer_;
  }

  // A C++ backward reads its op's lowered spec, so the specs go in first.
  void AddSpecs() {
    for (const auto& l : lowered_) {
      OpSpecRegistry::Global().Add(l);
      specs_.push_back(l.flat.name);
    }
  }

  void RegisterAutograd() {
    const auto& b = lib_.backend;
    for (size_t i = 0; i < lowered_.size(); ++i) {
      if (lib_.ops[i].autograd) {
        CheckBackend(b.autograd(b.ctx, lowered_[i].flat.name.c_str(), lib_.ops[i].autograd), lowered_[i].flat.name, "");
      }
    }
  }

  // A C++ backward is for functional ops: autograd cannot see what a kernel
  // writes into its arguments.
  static void CheckNoMutation(const LoweredOp& lowered) {
    for (const auto& leaf : lowered.leaves) {
      if (leaf.mutated) {
        throw Error(ErrorKind::kValueError, lowered.flat.name, "autograd",
                    "the op mutates '" + leaf.path + "'; a C++ backward is only supported for ops that mutate nothing.",
                    "Return a new tensor instead of writing into an argument.");
      }
    }
  }

  void ResolveTags() {
    for (size_t i = 0; i < lib_.num_tags; ++i) {
      const OpforgeTagV1& t = lib_.tags[i];
      const std::string op = ns_ + "::" + Str(t.op);
      const LoweredOp* lowered = FindLowered(op);
      if (!lowered) {
        throw Error(ErrorKind::kLookupError, op, Str(t.tag), "the op is not defined in this library block.",
                    "Tag the op where it is defined.");
      }
      std::vector<std::string> names;
      for (size_t j = 0; j < t.num_names; ++j) names.push_back(Str(t.names[j]));
      const std::string tag = Str(t.tag);
      if (tag.rfind(OPFORGE_TORCH_TAG_PREFIX, 0) == 0) {  // an op tag of torch's: .tag("cudagraph_unsafe")
        auto& tags = op_tags_[op];
        const std::string name = tag.substr(std::strlen(OPFORGE_TORCH_TAG_PREFIX));
        if (std::find(tags.begin(), tags.end(), name) == tags.end()) tags.push_back(name);
        continue;
      }
      auto args = ResolveTensorArgs(*lowered, names, tag == "symm_mem" ? "symm_mem_args" : tag + " args");
      const auto& flat_args = lowered->flat.arguments;
      if (tag == "symm_mem" && std::none_of(flat_args.begin(), flat_args.end(),
                                            [](const Argument& arg) { return arg.name == "group_name"; })) {
        warnings_.push_back(op + ": symm_mem_args are declared but the op has no 'group_name' argument; "
                            "Inductor needs one to allocate its inputs in symmetric memory automatically.");
      }
      pending_tags_.push_back({op, tag, std::move(args)});
    }
  }

  void Publish() {
    // Nothing below can fail.
    for (auto& t : pending_tags_) {
      TagRegistry::Global().Set(t.op, t.tag, std::move(t.args));
      tagged_.emplace_back(t.op, t.tag);
    }
    std::vector<LibraryOp> ops;
    for (size_t i = 0; i < lowered_.size(); ++i) {
      ops.push_back({lowered_[i].flat.name, Str(lib_.dso), Str(lib_.abi), lib_.ops[i].autograd != nullptr,
                     lib_.ops[i].torch_layer_autograd});
    }
    LibraryRegistry::Global().Add(ops);
    if (lib_.backend.warn) {
      for (const auto& w : warnings_) lib_.backend.warn(lib_.backend.ctx, w.c_str());
    }
  }

  struct PendingTag {
    std::string op;
    std::string tag;
    std::vector<std::string> args;
  };

  const OpforgeLibraryV1& lib_;
  std::string ns_;
  std::vector<std::string> types_;  // added by this block, in order
  std::vector<LoweredOp> lowered_;
  std::vector<PendingTag> pending_tags_;
  std::vector<std::string> warnings_;
  std::vector<std::string> specs_;
  std::vector<std::pair<std::string, std::string>> tagged_;
  const OpforgeTorchLayerV1* torch_layer_ = nullptr;
  std::vector<std::string> unavailable_;  // TVM-FFI kernels registered as their load errors
  std::vector<void*> layer_registrations_;  // the torch layer's: TVM-FFI kernels, tagged defs
  std::map<std::string, std::vector<std::string>> op_tags_;  // op -> torch op tags ("cudagraph_unsafe")
  bool registered_ = false;
};

int32_t CommitLibrary(const OpforgeLibraryV1* lib, char* error, size_t error_size) {
  if (lib == nullptr || lib->size < offsetof(OpforgeLibraryV1, kernel_signatures)) {
    CopyError("opforge: a library passed an OpforgeLibraryV1 of the wrong size.", error, error_size);
    return 1;
  }
  Commit commit(*lib);
  std::string message;
  try {
    commit.Run();
    for (const std::string& message : commit.unavailable()) LibraryRegistry::Global().AddLoadError({Str(lib->dso), message});
    return 0;
  } catch (const std::exception& e) {
    message = commit.Where() + ": " + e.what() + " Nothing of this block was registered.";
  } catch (...) {
    message = commit.Where() + ": an unknown error. Nothing of this block was registered.";
  }
  try {
    commit.Rollback();
  } catch (...) {
  }
  LibraryRegistry::Global().AddLoadError({Str(lib->dso), message});
  CopyError(message, error, error_size);
  return 1;
}

// A handle's object kept alive for one kernel call.
struct HandleToken {
  std::shared_ptr<void> object;
};

void* HandleAcquire(int64_t handle, const char* type, void** token, char* error, size_t error_size) {
  try {
    auto object = HandleTable::Global().Resolve(handle, Str(type));
    void* raw = object.get();
    *token = new HandleToken{std::move(object)};
    return raw;
  } catch (const std::exception& e) {
    CopyError(e.what(), error, error_size);
    *token = nullptr;
    return nullptr;
  }
}

void HandleRelease(void* token) { delete static_cast<HandleToken*>(token); }

int64_t HandleRegister(void* object, void (*destroy)(void*), const char* type, int32_t weak, char* error,
                       size_t error_size) {
  try {
    std::shared_ptr<void> owned(object, destroy);
    return HandleTable::Global().Register(std::move(owned), Str(type), weak != 0);
  } catch (const std::exception& e) {
    CopyError(e.what(), error, error_size);
    return 0;
  }
}

int32_t OpCounts(const char* qualified, size_t* num_args, size_t* num_returns) {
  try {
    auto op = OpSpecRegistry::Global().Find(Str(qualified));
    if (!op) return 0;
    *num_args = op->flat.arguments.size();
    *num_returns = op->flat.returns.size();
    return 1;
  } catch (...) {
    return 0;
  }
}

constexpr OpforgeAbiV1 kAbiV1 = {
    sizeof(OpforgeAbiV1), &CommitLibrary, &HandleAcquire, &HandleRelease, &HandleRegister, &OpCounts,
};

}  // namespace
}  // namespace opforge

extern "C" {

const void* opforge_abi_get(uint32_t version, uint32_t* newest) {
  if (newest) *newest = OPFORGE_ABI_VERSION;
  if (version == 1) return &opforge::kAbiV1;
  return nullptr;
}

const char* opforge_version(void) { return OPFORGE_VERSION_STRING; }

void opforge_report_load_error(const char* library, const char* message) {
  opforge::LibraryRegistry::Global().AddLoadError({opforge::Str(library), opforge::Str(message)});
}

}  // extern "C"
