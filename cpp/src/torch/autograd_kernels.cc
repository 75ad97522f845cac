#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/library.h>

#include <string>

#include "opforge/autograd.h"

namespace opforge {
namespace {

using torch::autograd::Variable;

// torch 2.12 moved autograd nodes from shared_ptr to intrusive_ptr.
using NodePtr = decltype(torch::autograd::Edge{}.function);

template <typename T, typename... Args>
NodePtr MakeNode(Args&&... args) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

template <class F>
void ForEachTensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& item : v.toListRef()) {
      if (item.isTensor()) f(item.toTensor());
    }
  }
}

// The Autograd kernel of one op without backward.
class NoBackwardKernel : public c10::OperatorKernel {
 public:
  NoBackwardKernel(std::string message, bool mutates) : message_(std::move(message)), mutates_(mutates) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const size_t num_args = op.schema().arguments().size();
    // Most calls need no gradient: ask before collecting anything.
    bool needs_grad = false;
    if (c10::GradMode::is_enabled()) {
      for (size_t i = stack->size() - num_args; i < stack->size() && !needs_grad; ++i) {
        ForEachTensor((*stack)[i], [&](const at::Tensor& t) {
          if (t.defined() && t.requires_grad()) needs_grad = true;
        });
      }
    }
    std::vector<Variable> inputs;
    if (needs_grad) {
      for (size_t i = stack->size() - num_args; i < stack->size(); ++i) {
        ForEachTensor((*stack)[i], [&](const at::Tensor& t) { inputs.push_back(t); });
      }
    }
    RedispatchBelowAutograd(op, ks, stack, mutates_);
    if (!needs_grad) return;
    NodePtr node = MakeNode<torch::autograd::Error>(message_, torch::autograd::collect_next_edges(inputs));
    const size_t num_returns = op.schema().returns().size();
    for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
      ForEachTensor((*stack)[i], [&](const at::Tensor& t) {
        if (!t.defined() || !torch::autograd::isDifferentiableType(t.scalar_type())) return;
        // Outputs that are inputs (in-place results) keep their own history.
        for (const auto& in : inputs) {
          if (in.defined() && in.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return;
        }
        torch::autograd::set_history(const_cast<at::Tensor&>(t), node);
      });
    }
  }

 private:
  std::string message_;
  bool mutates_;
};

class LibraryRegistration : public KernelRegistration {
 public:
  explicit LibraryRegistration(std::unique_ptr<torch::Library> lib) : lib_(std::move(lib)) {}

 private:
  std::unique_ptr<torch::Library> lib_;
};

}  // namespace

void RedispatchBelowAutograd(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack,
                             bool mutates) {
  BelowAutograd guard(mutates);
  op.redispatchBoxed(ks & (mutates ? c10::after_autograd_keyset : c10::after_ADInplaceOrView_keyset), stack);
}

std::unique_ptr<KernelRegistration> RegisterNoBackwardKernel(const std::string& qualname,
                                                             const std::string& message) {
  const size_t sep = qualname.find("::");
  const std::string ns = qualname.substr(0, sep);
  const std::string name = qualname.substr(sep + 2);
  const bool mutates = c10::Dispatcher::singleton().findSchemaOrThrow(qualname.c_str(), "").schema().is_mutable();
  auto lib = std::make_unique<torch::Library>(torch::Library::FRAGMENT, ns, std::nullopt,
                                              __FILE__, __LINE__);
  lib->impl(name.c_str(), torch::dispatch(c10::DispatchKey::Autograd,
                                          torch::CppFunction::makeFromBoxedFunctor(
                                              std::make_unique<NoBackwardKernel>(message, mutates))));
  return std::make_unique<LibraryRegistration>(std::move(lib));
}

}  // namespace opforge
