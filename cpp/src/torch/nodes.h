// Autograd graph nodes across torch releases: torch 2.12 moved nodes from
// shared_ptr to intrusive_ptr, so the pointer type is the one Edge holds;
// _wrap_outputs and node-creation hooks changed too.
#pragma once

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <optional>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

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

using torch::autograd::variable_list;
using OptionalVariables = std::vector<std::optional<torch::autograd::Variable>>;
using ImplSet = std::unordered_set<at::TensorImpl*>;

// torch 2.14+ runs node-creation hooks once a node has its saved variables
// (found through the node's namespace, where it exists).
template <class P>
auto FireCreationHooks(int, const P& node) -> decltype(fire_node_creation_hooks(node)) {
  return fire_node_creation_hooks(node);
}
template <class P>
void FireCreationHooks(long, const P&) {}

// _wrap_outputs' parameters differ between torch releases: newer ones take
// `pure_view`, and from 2.14 an out-parameter naming the node that took the
// outputs, for node-creation hooks. `wrap` is called with those it takes.
template <class Wrap>
OptionalVariables WrapCompat(Wrap&& wrap, NodePtr& attached) {
  if constexpr (std::is_invocable_v<Wrap, bool, NodePtr&>) {
    return wrap(false, attached);
  } else if constexpr (std::is_invocable_v<Wrap, bool>) {
    return wrap(false);
  } else {
    return wrap();
  }
}

// The outputs wrapped with `node` as their grad_fn; `attached` names the node
// that took them where torch says so.
inline OptionalVariables WrapOutputs(const variable_list& inputs, const ImplSet& non_differentiable,
                                     const ImplSet& dirty, const OptionalVariables& raw, const NodePtr& node,
                                     NodePtr& attached) {
  const torch::autograd::_jvp_fn_t jvp = [](const variable_list&, const variable_list&) -> variable_list {
    TORCH_CHECK(false, "opforge ops do not support forward-mode AD (jvp).");
  };
  const torch::autograd::_view_as_self_fn_t view_as_self = [](const at::Tensor& x) { return x.view_as(x); };
  // Empty: setup_context runs inside the forward, as an autograd.Function
  // whose forward takes ctx, so an input returned as-is may be saved.
  const ImplSet to_save_if_setup_context;
  auto wrap = [&](auto&&... newer) -> decltype(torch::autograd::_wrap_outputs(
                                        inputs, non_differentiable, dirty, raw, node, jvp, to_save_if_setup_context,
                                        view_as_self, newer...)) {
    return torch::autograd::_wrap_outputs(inputs, non_differentiable, dirty, raw, node, jvp,
                                          to_save_if_setup_context, view_as_self, newer...);
  };
  return WrapCompat(wrap, attached);
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
