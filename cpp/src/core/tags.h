// Argument tags (docs/symm_mem.md): names attached to (op, argument), validated
// against the op's lowered schema.
//
//   auto args = ResolveTensorArgs(lowered, {"cfg", "k"}, "symm_mem_args");   // struct -> its Tensor leaves
//   TagRegistry::Global().Set("mylib::attn", "symm_mem", args);
//   TagRegistry::Global().ArgsWithTag("mylib::attn", "symm_mem");           // {"cfg__buf", "k"}
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/spec.h"

namespace opforge {

// ResolveTensorLeafIndices (spec.h) giving the leaves' flat names, with
// `option` (e.g. "symm_mem_args") as the location of its errors.
std::vector<std::string> ResolveTensorArgs(const LoweredOp& op, const std::vector<std::string>& names,
                                           const std::string& option);

class TagRegistry {
 public:
  static TagRegistry& Global();

  // Replaces the arguments that carry `tag` on `op`.
  void Set(const std::string& op, const std::string& tag, std::vector<std::string> args);
  std::vector<std::string> ArgsWithTag(const std::string& op, const std::string& tag) const;
  // argument -> tags, for every tagged argument of `op`.
  std::map<std::string, std::vector<std::string>> TagsOf(const std::string& op) const;
  std::vector<std::string> OpsWithTag(const std::string& tag) const;
  void RemoveOp(const std::string& op);
  // Bumped on every change, so front ends can tell when to re-sync.
  uint64_t version() const;

 private:
  mutable std::mutex mu_;
  // op -> tag -> args
  std::map<std::string, std::map<std::string, std::vector<std::string>>> tags_;
  uint64_t version_ = 0;
};

// Lowered specs of ops defined through opforge (either front end), by name.
class OpSpecRegistry {
 public:
  static OpSpecRegistry& Global();
  void Add(const LoweredOp& op);
  std::shared_ptr<const LoweredOp> Find(const std::string& name) const;
  bool Remove(const std::string& name);
  std::vector<std::string> Names() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const LoweredOp>> ops_;
};

}  // namespace opforge
