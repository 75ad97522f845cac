#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>

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

// Messages by op name; the boxed kernel looks its own up.
std::mutex& MessagesMutex() {
  static std::mutex mu;
  return mu;
}
std::unordered_map<std::string, std::string>& Messages() {
  static auto* messages = new std::unordered_map<std::string, std::string>();
  return *messages;
}

void ForEachTensor(const c10::IValue& v, const std::function<void(const at::Tensor&)>& f) {
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

void NoBackwardKernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                      torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const bool grad_mode = c10::GradMode::is_enabled();
  bool needs_grad = false;
  std::vector<Variable> inputs;
  if (grad_mode) {
    for (size_t i = stack->size() - num_args; i < stack->size(); ++i) {
      ForEachTensor((*stack)[i], [&](const at::Tensor& t) {
        if (t.defined() && t.requires_grad()) needs_grad = true;
        inputs.push_back(t);
      });
    }
  }
  {
    at::AutoDispatchBelowAutograd guard;
    op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
  }
  if (!needs_grad) return;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(MessagesMutex());
    message = Messages()[schema.name()];
  }
  NodePtr node =
      MakeNode<torch::autograd::Error>(message, torch::autograd::collect_next_edges(inputs));
  const size_t num_returns = schema.returns().size();
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

class LibraryRegistration : public KernelRegistration {
 public:
  LibraryRegistration(std::string qualname, std::unique_ptr<torch::Library> lib)
      : qualname_(std::move(qualname)), lib_(std::move(lib)) {}
  ~LibraryRegistration() override {
    lib_.reset();
    std::lock_guard<std::mutex> lock(MessagesMutex());
    Messages().erase(qualname_);
  }

 private:
  std::string qualname_;
  std::unique_ptr<torch::Library> lib_;
};

}  // namespace

std::unique_ptr<KernelRegistration> RegisterNoBackwardKernel(const std::string& qualname,
                                                             const std::string& message) {
  const size_t sep = qualname.find("::");
  const std::string ns = qualname.substr(0, sep);
  const std::string name = qualname.substr(sep + 2);
  {
    std::lock_guard<std::mutex> lock(MessagesMutex());
    Messages()[qualname] = message;
  }
  auto lib = std::make_unique<torch::Library>(torch::Library::FRAGMENT, ns, std::nullopt,
                                              __FILE__, __LINE__);
  lib->impl(name.c_str(),
            torch::dispatch(c10::DispatchKey::Autograd,
                            torch::CppFunction::makeFromBoxedFunction<&NoBackwardKernel>()));
  return std::make_unique<LibraryRegistration>(qualname, std::move(lib));
}

}  // namespace opforge
