#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/libraries.h"
#include "torch/autograd_kernels.h"
#include "torch/cpp_autograd.h"
#include "torch/ivalues.h"
#include "torch/nodes.h"

namespace opforge {
namespace {

using torch::autograd::Variable;

// The Autograd kernel of one op without backward.
class NoBackwardKernel : public c10::OperatorKernel {
 public:
  NoBackwardKernel(std::string message, const c10::FunctionSchema& schema, bool cpp_library)
      : message_(std::move(message)), cpp_library_(cpp_library) {
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const auto& alias = schema.arguments()[i].alias_info();
      if (alias && alias->isWrite()) written_.push_back(i);
    }
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const size_t num_args = schema.arguments().size();
    const size_t first = stack->size() - num_args;
    // Calls without a gradient in sight (inference, no input requiring grad)
    // pay one scan of the arguments, nothing more.
    bool needs_grad = false;
    if (c10::GradMode::is_enabled()) {
      for (size_t i = first; i < stack->size() && !needs_grad; ++i) {
        ForEachTensor((*stack)[i], [&](const at::Tensor& t) { needs_grad = needs_grad || t.requires_grad(); });
      }
    }
    const bool mutates = !written_.empty();  // its ADInplaceOrView kernel bumps versions
    if (!needs_grad && !cpp_library_) {
      RedispatchBelowAutograd(op, ks, stack, mutates);
      return;
    }
    if (!needs_grad) {
      // An op of a C++ library goes on as torch's autograd fallback takes a
      // TORCH_LIBRARY op (no dispatch-key guard: setting one costs more
      // than the whole fallback), doing its ADInplaceOrView kernel's work
      // (InplaceKernel<true>) on the stack as it is and skipping that kernel.
      for (size_t i : written_) {
        ForEachTensor((*stack)[first + i], [](const at::Tensor& t) {
          // increment_version's own work, inline: a tensor outside inference mode has a counter.
          if (t.defined() && !t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
        });
      }
      op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
      return;
    }
    std::vector<Variable> inputs;
    for (size_t i = first; i < stack->size(); ++i) {
      ForEachTensor((*stack)[i], [&](const at::Tensor& t) { inputs.push_back(t); });
    }
    std::vector<std::pair<size_t, at::Tensor>> written;  // (argument, tensor)
    for (size_t i : written_) {
      ForEachTensor((*stack)[first + i], [&](const at::Tensor& t) { written.emplace_back(i, t); });
    }
    RedispatchBelowAutograd(op, ks, stack, mutates);
    NodePtr node = MakeNode<torch::autograd::Error>(message_, torch::autograd::collect_next_edges(inputs));
    // Arguments the op writes (`Tensor(a!)`) now hold values computed from
    // inputs that require grad: they get the error node too.
    for (auto& [i, t] : written) {
      if (!t.defined() || !torch::autograd::isDifferentiableType(t.scalar_type())) continue;
      TORCH_CHECK(!(t.is_leaf() && t.requires_grad()), schema.name(), ": argument '", schema.arguments()[i].name(),
                  "' is a leaf tensor that requires grad, and the op writes it in place.");
      torch::autograd::set_history(t, node);
    }
    const size_t num_returns = schema.returns().size();
    for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
      ForEachTensor((*stack)[i], [&](const at::Tensor& t) {
        if (!t.defined() || !torch::autograd::isDifferentiableType(t.scalar_type())) return;
        // Outputs that are inputs (in-place results) keep their own history.
        if (std::any_of(inputs.begin(), inputs.end(), [&](const Variable& in) { return in.is_same(t); })) return;
        torch::autograd::set_history(const_cast<at::Tensor&>(t), node);
      });
    }
  }

 private:
  std::string message_;
  bool cpp_library_;  // an op of a C++ library, whose ADInplaceOrView kernel is InplaceKernel<true>
  std::vector<size_t> written_;  // the arguments the op writes (`Tensor(a!)`)
};

// Bumps the version of every tensor the op writes (`Tensor(a!)`), as torch's
// own in-place ops do, so autograd sees a saved tensor was modified. For an
// op of a C++ library (kCppLibrary) the kernel runs below ADInplaceOrView and
// inference tensors are skipped, as a TORCH_LIBRARY op (which bumps nothing)
// writes them; a Python op's body bumps what its own in-place ops write, and
// an inference tensor outside inference mode is torch's error.
template <bool kCppLibrary>
void InplaceKernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  std::vector<at::Tensor> written;
  const size_t first = stack->size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].alias_info() && args[i].alias_info()->isWrite()) {
      ForEachTensor((*stack)[first + i], [&](const at::Tensor& t) {
        if (t.defined()) written.push_back(t);
      });
    }
  }
  if constexpr (kCppLibrary) {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
  } else {
    op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const auto& t : written) {
    if (!kCppLibrary || !t.is_inference()) torch::autograd::increment_version(t);
  }
}

// The no-backward kernels the torch layer gives the ops of C++ libraries, by op.
std::mutex& LibraryKernelsMutex() {
  static std::mutex mu;
  return mu;
}
std::unordered_map<std::string, std::unique_ptr<KernelRegistration>>& NoBackwardKernels() {
  static auto* kernels = new std::unordered_map<std::string, std::unique_ptr<KernelRegistration>>();
  return *kernels;
}

bool HasAutogradKernel(const c10::OperatorHandle& op) {
  const c10::DispatchKey keys[] = {c10::DispatchKey::Autograd, c10::DispatchKey::AutogradCPU,
                                   c10::DispatchKey::AutogradCUDA, c10::DispatchKey::CompositeImplicitAutograd};
  return std::any_of(std::begin(keys), std::end(keys), [&](auto key) { return op.hasKernelForDispatchKey(key); });
}

}  // namespace

// What a C++ library's op gets from the torch layer once its block commits:
// version bumps for the tensors it writes, and, without a backward, the error
// a Python op without one gives (docs/cpp_ops.md#autograd).
void OnLibraryOp(const LibraryOp& lib_op) {
  auto op = c10::Dispatcher::singleton().findSchema({lib_op.name, ""});
  if (!op) return;
  std::lock_guard<std::mutex> lock(LibraryKernelsMutex());
  if (op->schema().is_mutable() && !op->hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView)) {
    KeepForever(RegisterBoxed(lib_op.name, {c10::DispatchKey::ADInplaceOrView},
                              [] { return torch::CppFunction::makeFromBoxedFunction<&InplaceKernel<true>>(); }));
  }
  if (lib_op.torch_layer_autograd != nullptr) {
    detail::WireStableAutograd(lib_op);
  } else if (!lib_op.has_cpp_autograd && !HasAutogradKernel(*op)) {
    std::string dotted = lib_op.name;
    dotted.replace(dotted.find("::"), 2, ".");
    const std::string message =
        lib_op.name + ": a gradient was requested through this op, but it has no backward. Declare one in C++ "
        "(m.def(...).autograd<G>()) or from Python (opforge.ops." + dotted + ".register_autograd(backward)).";
    NoBackwardKernels()[lib_op.name] = RegisterNoBackwardKernel(lib_op.name, message, /*cpp_library=*/true);
  }
}

void RedispatchBelowAutograd(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack,
                             bool mutates) {
  BelowAutograd guard(mutates);
  op.redispatchBoxed(ks & (mutates ? c10::after_autograd_keyset : c10::after_ADInplaceOrView_keyset), stack);
}

bool DropNoBackwardKernel(const std::string& qualname) {
  std::lock_guard<std::mutex> lock(LibraryKernelsMutex());
  return NoBackwardKernels().erase(qualname) > 0;
}

std::unique_ptr<KernelRegistration> RegisterNoBackwardKernel(const std::string& qualname, const std::string& message,
                                                             bool cpp_library) {
  const auto& schema = c10::Dispatcher::singleton().findSchemaOrThrow(qualname.c_str(), "").schema();
  return RegisterBoxed(qualname, {c10::DispatchKey::Autograd}, [&] {
    return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<NoBackwardKernel>(message, schema, cpp_library));
  });
}

std::unique_ptr<KernelRegistration> RegisterInplaceKernel(const std::string& qualname) {
  return RegisterBoxed(qualname, {c10::DispatchKey::ADInplaceOrView},
                       [] { return torch::CppFunction::makeFromBoxedFunction<&InplaceKernel<false>>(); });
}

}  // namespace opforge
