// C++ kernel libraries as the core sees them: the ops each OPFORGE_LIBRARY
// block committed (through the C surface of opforge/abi.h), and the errors of
// blocks that could not be committed.
//
//   LibraryRegistry::Global().Find("liba::rms_norm");   // {name, library, abi, ...}
//   LibraryRegistry::Global().LoadErrors();  // [{library: "/x/libk.so", message: "..."}]
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace opforge {

struct LibraryOp {
  std::string name;     // "liba::rms_norm"
  std::string library;  // the shared library's path
  std::string abi;      // "unstable" or "stable"
  bool has_cpp_autograd = false;               // the backend registered a C++ backward
  const void* torch_layer_autograd = nullptr;  // a backward for the torch layer to wire
};

struct LoadError {
  std::string library;
  std::string message;
};

class LibraryRegistry {
 public:
  static LibraryRegistry& Global();

  // Calls `on_commit` for every op committed so far, then for each later
  // one: the torch layer's (core/torch_layer.h, SetTorchLayer), set once.
  void SetOnCommit(void (*on_commit)(const LibraryOp&));
  void Add(const std::vector<LibraryOp>& ops);
  std::optional<LibraryOp> Find(const std::string& name) const;
  // Bumped whenever ops are added, so front ends know when to look again.
  uint64_t generation() const;

  void AddLoadError(LoadError error);
  std::vector<LoadError> LoadErrors() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, LibraryOp> ops_;
  void (*on_commit_)(const LibraryOp&) = nullptr;
  std::vector<LoadError> errors_;
  uint64_t generation_ = 0;
};

}  // namespace opforge
