// The registry of C++ kernel libraries' ops and load errors (libraries.h).
#include "core/libraries.h"

#include <cstdio>

namespace opforge {

LibraryRegistry& LibraryRegistry::Global() {
  static auto* registry = new LibraryRegistry();
  return *registry;
}

void LibraryRegistry::SetOnCommit(void (*on_commit)(const LibraryOp&)) {
  std::vector<LibraryOp> past;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, op] : ops_) past.push_back(op);
    on_commit_ = on_commit;
  }
  for (const auto& op : past) on_commit(op);
}

void LibraryRegistry::Add(const std::vector<LibraryOp>& ops) {
  void (*on_commit)(const LibraryOp&);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& op : ops) ops_[op.name] = op;
    ++generation_;
    on_commit = on_commit_;
  }
  if (on_commit == nullptr) return;
  for (const auto& op : ops) on_commit(op);
}

std::optional<LibraryOp> LibraryRegistry::Find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ops_.find(name);
  return it == ops_.end() ? std::nullopt : std::make_optional(it->second);
}

uint64_t LibraryRegistry::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

void LibraryRegistry::AddLoadError(LoadError error) {
  std::fprintf(stderr, "opforge: %s\n", error.message.c_str());
  std::lock_guard<std::mutex> lock(mu_);
  errors_.push_back(std::move(error));
}

std::vector<LoadError> LibraryRegistry::LoadErrors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}

}  // namespace opforge
