#include "core/tags.h"

namespace opforge {

std::vector<std::string> ResolveTensorArgs(const LoweredOp& op, const std::vector<std::string>& names,
                                           const std::string& option) {
  std::vector<std::string> out;
  for (int index : ResolveTensorLeafIndices(op, names, option, "can be " + option)) {
    out.push_back(op.flat.arguments[static_cast<size_t>(index)].name);
  }
  return out;
}

TagRegistry& TagRegistry::Global() {
  static auto* registry = new TagRegistry();
  return *registry;
}

void TagRegistry::Set(const std::string& op, const std::string& tag, std::vector<std::string> args) {
  std::lock_guard<std::mutex> lock(mu_);
  if (args.empty()) {
    auto it = tags_.find(op);
    if (it != tags_.end()) {
      it->second.erase(tag);
      if (it->second.empty()) tags_.erase(it);
    }
  } else {
    tags_[op][tag] = std::move(args);
  }
  ++version_;
}

std::vector<std::string> TagRegistry::ArgsWithTag(const std::string& op, const std::string& tag) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tags_.find(op);
  if (it == tags_.end()) return {};
  auto jt = it->second.find(tag);
  return jt == it->second.end() ? std::vector<std::string>{} : jt->second;
}

std::map<std::string, std::vector<std::string>> TagRegistry::TagsOf(const std::string& op) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::vector<std::string>> out;
  auto it = tags_.find(op);
  if (it == tags_.end()) return out;
  for (const auto& [tag, args] : it->second) {
    for (const auto& arg : args) out[arg].push_back(tag);
  }
  return out;
}

std::vector<std::string> TagRegistry::OpsWithTag(const std::string& tag) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [op, tags] : tags_) {
    if (tags.count(tag)) out.push_back(op);
  }
  return out;
}

void TagRegistry::RemoveOp(const std::string& op) {
  std::lock_guard<std::mutex> lock(mu_);
  tags_.erase(op);
  ++version_;
}

uint64_t TagRegistry::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

OpSpecRegistry& OpSpecRegistry::Global() {
  static auto* registry = new OpSpecRegistry();
  return *registry;
}

void OpSpecRegistry::Add(const LoweredOp& op) {
  std::lock_guard<std::mutex> lock(mu_);
  ops_[op.flat.name] = std::make_shared<const LoweredOp>(op);
}

std::shared_ptr<const LoweredOp> OpSpecRegistry::Find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : it->second;
}

bool OpSpecRegistry::Remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  return ops_.erase(name) > 0;
}

std::vector<std::string> OpSpecRegistry::Names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, _] : ops_) out.push_back(name);
  return out;
}

}  // namespace opforge
