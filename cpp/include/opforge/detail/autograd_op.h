// The graph node every C++ op with a C++ backward shares, in both ABI modes:
// what opforge's torch layer (torch/cpp_autograd.cc) offers the C++ API
// mode's typed Autograd kernel (opforge/backward.h) and the stable ABI's
// wiring (torch/stable_autograd.cc). Kernel authors include
// opforge/backward.h, never this.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/flat_hash_map.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "opforge/library.h"
// After library.h: it says what opforge::Tensor is.
#include "opforge/detail/grads.h"

namespace torch::autograd {
struct AutogradContext;
}  // namespace torch::autograd

namespace opforge {
namespace detail {
struct AutogradOp;
}  // namespace detail

// What setup_context and backward receive: torch's AutogradContext, with
// needs_input_grad counted in the op's original parameters.
class AutogradContext {
 public:
  AutogradContext(torch::autograd::AutogradContext* ctx, const detail::AutogradOp* op, const int64_t* counts);

  // Non-tensor data for backward, as in torch::autograd::AutogradContext.
  ska::flat_hash_map<std::string, at::IValue>& saved_data;

  void save_for_backward(std::vector<at::Tensor> tensors);
  std::vector<at::Tensor> get_saved_variables() const;
  void mark_non_differentiable(const std::vector<at::Tensor>& outputs);
  // Whether undefined output gradients reach backward as zeros (default true).
  void set_materialize_grads(bool value);
  // Whether parameter `param` (its position in the kernel's signature) has a
  // tensor, or a struct field tensor, that needs a gradient.
  bool needs_input_grad(size_t param) const;
  torch::autograd::AutogradContext& torch_context() const { return *ctx_; }

 private:
  torch::autograd::AutogradContext* ctx_;
  const detail::AutogradOp* op_;
  const int64_t* counts_;  // tensors per flat argument, or null when each tensor argument has one
};

namespace detail {

// What a flat argument holds for autograd: Tensor? and lists hold 0 or more.
enum : char { kNoTensor = 0, kOneTensor = 1, kSomeTensors = 2 };

// One op's backward as opforge's torch layer runs it, for both ABIs: made
// when the op is registered and never freed (graph nodes may outlive the
// library that registered it).
struct AutogradOp : OpNames {
  std::vector<int> arg_param;     // per flat argument: the kernel parameter it belongs to
  std::vector<char> arg_tensors;  // per flat argument: kNoTensor, kOneTensor or kSomeTensors
  bool dynamic = false;           // Tensor? or Tensor[] arguments: their tensor counts vary per call
  size_t num_returns = 0;
  // A boxed kernel's setup (stable_autograd.cc): after the forward, with the
  // call's flat arguments and returns.
  void (*setup)(AutogradContext& ctx, const AutogradOp& op, const c10::IValue* args,
                const c10::IValue* returns) = nullptr;
  // The outputs' gradients in, one gradient per tensor of the flat arguments
  // out; `counts` as Tensors() takes them.
  std::vector<at::Tensor> (*backward)(AutogradContext& ctx, const AutogradOp& op, std::vector<at::Tensor>&& grads,
                                      const int64_t* counts) = nullptr;
  const void* descriptor = nullptr;  // a stable-ABI library's OpforgeStableAutogradV1

  // How many tensors flat argument `arg` gave: `counts` per argument for a
  // dynamic op, else one per tensor argument.
  size_t Tensors(const int64_t* counts, size_t arg) const {
    return counts ? static_cast<size_t>(counts[arg]) : arg_tensors[arg] == kOneTensor ? 1 : 0;
  }
};

// Every runtime autograd key (AutogradCPU, AutogradCUDA, ...). The kernel goes
// to each: a registration to the Autograd alias would lose to a
// CompositeImplicitAutograd kernel from `m.def(schema, fn)`.
const std::vector<c10::DispatchKey>& AutogradRuntimeKeys();

// Fills `op`'s names and flat-argument map from the op's lowered spec. Throws
// for an op opforge did not define, or a signature of another parameter count.
void PrepareAutogradOp(const std::string& qualified, std::optional<size_t> num_params, AutogradOp& op);

// Runs `forward` (the op below autograd, then setup) inside the op's graph
// node, whose inputs are `inputs` (the defined tensors of the tensor
// arguments, in flat order; `counts` says how many each argument gave when
// op.dynamic). Returns the outputs with their history.
std::vector<at::Tensor> ApplyAutograd(const AutogradOp& op, at::TensorList inputs, const std::vector<int64_t>& counts,
                                      c10::function_ref<std::vector<at::Tensor>(AutogradContext&)> forward);

[[noreturn]] void ThrowUndefinedInput(const AutogradOp& op, size_t arg);

}  // namespace detail
}  // namespace opforge
