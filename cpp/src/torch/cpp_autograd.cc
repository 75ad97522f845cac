// The autograd of C++ ops with a C++ backward, the same for both ABIs: one
// boxed Autograd kernel and one graph node (a torch::autograd::Function). An
// op's backward reaches them as an AutogradOp (opforge/detail/autograd_op.h):
// typed callbacks in the C++ API mode, the stable ABI's descriptor behind
// stable_autograd.cc's. Kernel libraries compile none of torch's autograd.
#include "opforge/detail/autograd_op.h"

#include <algorithm>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/stack.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "core/error.h"
#include "core/tags.h"
#include "torch/cpp_autograd.h"
#include "torch/ivalues.h"

namespace opforge {
namespace detail {
namespace {

using torch::autograd::variable_list;

// saved_data key of the op (and, for a dynamic op, the number of tensors each
// flat argument gave): an int, or an int list [op, counts...].
constexpr const char* kOpKey = "opforge.op";

struct ForwardArgs {
  const AutogradOp* op;
  const std::vector<int64_t>* counts;
  c10::function_ref<std::vector<at::Tensor>(AutogradContext&)> forward;
};

}  // namespace

struct OpBackward : public torch::autograd::Function<OpBackward> {
  static variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList /*inputs*/, ForwardArgs* args) {
    const auto op_id = static_cast<int64_t>(reinterpret_cast<intptr_t>(args->op));
    const int64_t* counts = nullptr;
    if (args->op->dynamic) {
      std::vector<int64_t> tag{op_id};
      tag.insert(tag.end(), args->counts->begin(), args->counts->end());
      ctx->saved_data[kOpKey] = c10::IValue(std::move(tag));
      counts = args->counts->data();
    } else {
      ctx->saved_data[kOpKey] = op_id;
    }
    AutogradContext wrapper(ctx, args->op, counts);
    // The forward's kernel guards itself; what else throws is setup_context.
    return Guard(args->op->name, "setup_context", [&] { return args->forward(wrapper); });
  }

  static variable_list backward(torch::autograd::AutogradContext* ctx, variable_list grads) {
    const c10::IValue& tag = ctx->saved_data.at(kOpKey);
    const std::vector<int64_t> ids = tag.isInt() ? std::vector<int64_t>{tag.toInt()} : tag.toIntVector();
    const auto* op = reinterpret_cast<const AutogradOp*>(static_cast<intptr_t>(ids.front()));
    const int64_t* counts_data = op->dynamic ? ids.data() + 1 : nullptr;
    AutogradContext wrapper(ctx, op, counts_data);
    std::vector<at::Tensor> out =
        Guard(op->name, "the backward", [&] { return op->backward(wrapper, *op, std::move(grads), counts_data); });
    out.emplace_back();  // the ForwardArgs input
    return out;
  }
};

std::vector<at::Tensor> ApplyAutograd(const AutogradOp& op, at::TensorList inputs, const std::vector<int64_t>& counts,
                                      c10::function_ref<std::vector<at::Tensor>(AutogradContext&)> forward) {
  ForwardArgs args{&op, &counts, forward};
  return OpBackward::apply(inputs, &args);
}

void ThrowUndefinedInput(const AutogradOp& op, size_t arg) {
  throw Error(ErrorKind::kValueError, op.name, "parameter '" + op.param_names.at(op.arg_param.at(arg)) + "'",
              "is an undefined tensor.", "Pass a defined tensor, or make the parameter optional.");
}

namespace {

// The Autograd kernel of a boxed op (the stable ABI's): the steps of
// AutogradKernel (opforge/backward.h) over the dispatcher's stack.
class BoxedAutogradKernel final : public c10::OperatorKernel {
 public:
  explicit BoxedAutogradKernel(const AutogradOp* op) : op_(op) {}

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const AutogradOp& op = *op_;
    const size_t num_args = op.arg_tensors.size();
    const size_t first = stack->size() - num_args;
    std::vector<at::Tensor> inputs;
    std::vector<int64_t> counts(num_args, 0);
    bool needs_grad = false;
    for (size_t i = 0; i < num_args; ++i) {
      if (!op.arg_tensors[i]) continue;
      const c10::IValue& v = (*stack)[first + i];
      if (op.arg_tensors[i] == kOneTensor && !(v.isTensor() && v.toTensor().defined())) ThrowUndefinedInput(op, i);
      ForEachTensor(v, [&](const at::Tensor& t) {
        inputs.push_back(t);
        ++counts[i];
        needs_grad = needs_grad || (t.defined() && t.requires_grad());
      });
    }
    const auto below = ks & c10::after_autograd_keyset;
    if (!needs_grad || !c10::GradMode::is_enabled()) {
      at::AutoDispatchBelowADInplaceOrView guard;
      handle.redispatchBoxed(below, stack);
      return;
    }
    // setup reads the arguments after the redispatch has consumed them.
    std::vector<c10::IValue> args;
    if (op.setup) args.assign(stack->begin() + static_cast<ptrdiff_t>(first), stack->end());
    const size_t num_returns = handle.schema().returns().size();
    FlatReturns returns;
    auto forward = [&](AutogradContext& ctx) {
      {
        at::AutoDispatchBelowADInplaceOrView guard;
        handle.redispatchBoxed(below, stack);
      }
      const c10::IValue* out = stack->data() + (stack->size() - num_returns);
      if (op.setup) op.setup(ctx, op, args.data(), out);
      return returns.Expand(out, num_returns, [](size_t) { return true; });
    };
    std::vector<at::Tensor> outputs = ApplyAutograd(op, inputs, counts, forward);
    // The returns, now with their history, in place of the ones without.
    returns.Collapse(stack->data() + (stack->size() - num_returns), std::move(outputs));
  }

 private:
  const AutogradOp* op_;
};

}  // namespace

const std::vector<c10::DispatchKey>& AutogradRuntimeKeys() {
  static const c10::DispatchKeySet set = c10::getRuntimeDispatchKeySet(c10::DispatchKey::Autograd);
  static const std::vector<c10::DispatchKey> keys(set.begin(), set.end());
  return keys;
}

void PrepareAutogradOp(const std::string& qualified, std::optional<size_t> num_params, AutogradOp& op) {
  auto lowered = OpSpecRegistry::Global().Find(qualified);
  if (!lowered) {
    throw Error(ErrorKind::kLookupError, qualified, "autograd", "the op was not defined through opforge::Library.",
                "Define it with m.def(...) in an OPFORGE_LIBRARY block first.");
  }
  op.name = qualified;
  op.num_returns = lowered->flat.returns.size();
  for (const auto& arg : lowered->original.arguments) op.param_names.push_back(arg.name);
  for (size_t i = 0; i < lowered->leaves.size(); ++i) {
    const std::string& path = lowered->leaves[i].path;
    const auto param = std::find(op.param_names.begin(), op.param_names.end(), path.substr(0, path.find('.')));
    op.arg_param.push_back(param == op.param_names.end() ? 0 : static_cast<int>(param - op.param_names.begin()));
    const Type& type = *lowered->flat.arguments[i].type;
    const bool one = type.kind == TypeKind::kTensor;
    op.arg_tensors.push_back(one ? kOneTensor : IsTensorLike(type) ? kSomeTensors : kNoTensor);
    op.dynamic = op.dynamic || op.arg_tensors.back() == kSomeTensors;
  }
  if (num_params && op.param_names.size() != *num_params) {
    throw Error(ErrorKind::kTypeError, qualified, "autograd",
                "the schema has " + std::to_string(op.param_names.size()) +
                    " parameters but the kernel signature given for the backward has " + std::to_string(*num_params) +
                    ".",
                "Pass the kernel's own signature.");
  }
}

std::unique_ptr<KernelRegistration> RegisterAutogradKernel(const std::string& qualified, const AutogradOp* op) {
  return RegisterBoxed(qualified, AutogradRuntimeKeys(), [op] {
    return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<BoxedAutogradKernel>(op));
  });
}

}  // namespace detail

AutogradContext::AutogradContext(torch::autograd::AutogradContext* ctx, const detail::AutogradOp* op,
                                 const int64_t* counts)
    : saved_data(ctx->saved_data), ctx_(ctx), op_(op), counts_(counts) {}

void AutogradContext::save_for_backward(std::vector<at::Tensor> tensors) {
  ctx_->save_for_backward(std::move(tensors));
}

std::vector<at::Tensor> AutogradContext::get_saved_variables() const { return ctx_->get_saved_variables(); }

void AutogradContext::mark_non_differentiable(const std::vector<at::Tensor>& outputs) {
  ctx_->mark_non_differentiable(outputs);
}

void AutogradContext::set_materialize_grads(bool value) { ctx_->set_materialize_grads(value); }

bool AutogradContext::needs_input_grad(size_t param) const {
  size_t position = 0;
  for (size_t arg = 0; arg < op_->arg_param.size(); ++arg) {
    const size_t n = op_->Tensors(counts_, arg);
    if (static_cast<size_t>(op_->arg_param[arg]) == param) {
      for (size_t i = 0; i < n; ++i) {
        if (ctx_->needs_input_grad(position + i)) return true;
      }
    }
    position += n;
  }
  return false;
}

}  // namespace opforge
