// The C surface of opforge/abi.h: how every C++ kernel library, whichever
// torch ABI it uses, declares its types and ops to the core and registers
// them with torch through its own backend, all or nothing.
#include "opforge/abi.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/handles.h"
#include "core/libraries.h"
#include "core/spec.h"
#include "core/tags.h"
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
    ResolveTags();
    Register();
    AddSpecs();
    RegisterAutograd();
    Publish();
  }

  // Undoes what Run did before it failed.
  void Rollback() {
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

  void Register() {
    const auto& b = lib_.backend;
    registered_ = true;
    for (const auto& lowered : lowered_) {
      const std::string flat = ToDefinableString(lowered.flat);
      CheckBackend(b.def(b.ctx, flat.substr(ns_.size() + 2).c_str()), lowered.flat.name, "schema '" + flat + "'");
    }
    for (size_t i = 0; i < lib_.num_kernels; ++i) {
      const OpforgeKernelV1& k = lib_.kernels[i];
      CheckBackend(b.impl(b.ctx, k.op, k.key, k.kernel), ns_ + "::" + Str(k.op), Str(k.key) + " kernel");
    }
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
      const auto lowered = std::find_if(lowered_.begin(), lowered_.end(),
                                        [&](const LoweredOp& l) { return l.flat.name == op; });
      if (lowered == lowered_.end()) {
        throw Error(ErrorKind::kLookupError, op, Str(t.tag), "the op is not defined in this library block.",
                    "Tag the op where it is defined.");
      }
      std::vector<std::string> names;
      for (size_t j = 0; j < t.num_names; ++j) names.push_back(Str(t.names[j]));
      const std::string tag = Str(t.tag);
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
  bool registered_ = false;
};

int32_t CommitLibrary(const OpforgeLibraryV1* lib, char* error, size_t error_size) {
  if (lib == nullptr || lib->size < sizeof(OpforgeLibraryV1)) {
    CopyError("opforge: a library passed an OpforgeLibraryV1 of the wrong size.", error, error_size);
    return 1;
  }
  Commit commit(*lib);
  std::string message;
  try {
    commit.Run();
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

constexpr OpforgeAbiV1 kAbiV1 = {
    sizeof(OpforgeAbiV1), &CommitLibrary, &HandleAcquire, &HandleRelease, &HandleRegister,
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
