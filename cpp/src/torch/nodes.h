// Autograd graph nodes across torch releases: torch 2.12 moved nodes from
// shared_ptr to intrusive_ptr, so the pointer type is the one Edge holds.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace opforge {

using NodePtr = decltype(torch::autograd::Edge{}.function);

inline constexpr bool kSharedNodes = std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>;

template <typename T, typename... Args>
auto MakeNode(Args&&... args) {
  if constexpr (kSharedNodes) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

// An owning pointer to a live node, from the node itself.
template <class T>
NodePtr SelfPtr(T* node) {
  if constexpr (kSharedNodes) {
    return node->shared_from_this();
  } else {
    return node->getptr();
  }
}

}  // namespace opforge
