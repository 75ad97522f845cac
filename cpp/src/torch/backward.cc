// The type-erased half of opforge/backward.h: one torch::autograd::Function
// serves every op with a C++ backward, so kernel libraries do not compile
// torch's autograd headers.
#include "opforge/backward.h"

#include <torch/csrc/autograd/custom_function.h>

#include "core/error.h"
#include "core/tags.h"

namespace opforge {
namespace detail {
namespace {

// saved_data key of the op (and, for ops with Tensor? or Tensor[] leaves, the
// number of tensors each leaf gave): an int, or an int list [op, counts...].
constexpr const char* kOpKey = "opforge.op";

struct ForwardArgs {
  const AutogradOp* op;
  AutogradCall* call;
  const std::vector<int64_t>* counts;
};

}  // namespace

struct OpBackward : public torch::autograd::Function<OpBackward> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList /*inputs*/, ForwardArgs* args) {
    const auto op_id = static_cast<int64_t>(reinterpret_cast<intptr_t>(args->op));
    if (args->op->dynamic) {
      std::vector<int64_t> tag;
      tag.reserve(args->counts->size() + 1);
      tag.push_back(op_id);
      tag.insert(tag.end(), args->counts->begin(), args->counts->end());
      ctx->saved_data[kOpKey] = c10::IValue(std::move(tag));
    } else {
      ctx->saved_data[kOpKey] = op_id;
    }
    AutogradContext wrapper(ctx, args->op, args->counts->empty() ? nullptr : args->counts->data());
    return args->call->Forward(wrapper);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const c10::IValue& tag = ctx->saved_data.at(kOpKey);
    const AutogradOp* op = nullptr;
    std::vector<int64_t> counts;
    if (tag.isInt()) {
      op = reinterpret_cast<const AutogradOp*>(static_cast<intptr_t>(tag.toInt()));
    } else {
      counts = tag.toIntVector();
      op = reinterpret_cast<const AutogradOp*>(static_cast<intptr_t>(counts.front()));
      counts.erase(counts.begin());
    }
    const int64_t* counts_data = op->dynamic ? counts.data() : nullptr;
    AutogradContext wrapper(ctx, op, counts_data);
    std::vector<at::Tensor> out = op->backward(wrapper, *op, std::move(grads), counts_data);
    out.emplace_back();  // the ForwardArgs input
    return out;
  }
};

std::vector<at::Tensor> ApplyAutograd(const AutogradOp& op, std::vector<at::Tensor> inputs,
                                      std::vector<int64_t> counts, AutogradCall& call) {
  ForwardArgs args{&op, &call, &counts};
  return OpBackward::apply(at::TensorList(inputs), &args);
}

const std::vector<c10::DispatchKey>& AutogradRuntimeKeys() {
  static const std::vector<c10::DispatchKey> keys = [] {
    std::vector<c10::DispatchKey> out;
    for (c10::DispatchKey key : c10::getRuntimeDispatchKeySet(c10::DispatchKey::Autograd)) {
      out.push_back(key);
    }
    return out;
  }();
  return keys;
}

void PrepareAutogradOp(const std::string& qualified, size_t num_params, AutogradOp& op) {
  auto lowered = OpSpecRegistry::Global().Find(qualified);
  if (!lowered) {
    throw Error(ErrorKind::kLookupError, qualified, "autograd",
                "the op was not defined through opforge::Library.",
                "Define it with m.def(...) in an OPFORGE_LIBRARY block first.");
  }
  op.name = qualified;
  for (const auto& arg : lowered->original.arguments) op.param_names.push_back(arg.name);
  if (op.param_names.size() != num_params) {
    throw Error(ErrorKind::kTypeError, qualified, "autograd",
                "the schema has " + std::to_string(op.param_names.size()) +
                    " parameters but the kernel signature given for the backward has " +
                    std::to_string(num_params) + ".",
                "Pass the kernel's own signature.");
  }
  for (const auto& leaf : lowered->leaves) {
    if (leaf.mutated) {
      throw Error(ErrorKind::kValueError, qualified, "autograd",
                  "the op mutates '" + leaf.path + "'; a C++ backward is only supported for ops "
                  "that mutate nothing.",
                  "Return a new tensor instead of writing into an argument.");
    }
  }
}

void ThrowUndefinedInput(const AutogradOp& op, size_t param) {
  throw Error(ErrorKind::kValueError, op.name, "parameter '" + op.param_names.at(param) + "'",
              "is an undefined tensor.", "Pass a defined tensor, or make the parameter optional.");
}

}  // namespace detail

AutogradContext::AutogradContext(torch::autograd::AutogradContext* ctx, const detail::AutogradOp* op,
                                 const int64_t* counts)
    : saved_data(ctx->saved_data), ctx_(ctx), op_(op), counts_(counts) {}

void AutogradContext::save_for_backward(std::vector<at::Tensor> tensors) {
  ctx_->save_for_backward(std::move(tensors));
}

std::vector<at::Tensor> AutogradContext::get_saved_variables() const {
  return ctx_->get_saved_variables();
}

void AutogradContext::mark_non_differentiable(const std::vector<at::Tensor>& outputs) {
  ctx_->mark_non_differentiable(outputs);
}

void AutogradContext::set_materialize_grads(bool value) { ctx_->set_materialize_grads(value); }

bool AutogradContext::needs_input_grad(size_t param) const {
  size_t position = 0;
  const auto& owners = op_->tensor_leaf_param;
  for (size_t leaf = 0; leaf < owners.size(); ++leaf) {
    const size_t n = counts_ ? static_cast<size_t>(counts_[leaf]) : 1;
    if (static_cast<size_t>(owners[leaf]) == param) {
      for (size_t i = 0; i < n; ++i) {
        if (ctx_->needs_input_grad(position + i)) return true;
      }
    }
    position += n;
  }
  return false;
}

}  // namespace opforge
