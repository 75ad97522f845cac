// The autograd kernels of stable-ABI libraries' ops with a C++ backward
// (opforge/stable/backward.h): torch's stable ABI has no autograd, so this
// layer, built for the running torch, registers each such op's autograd
// kernel when the op's library commits (or when opforge loads, for libraries
// loaded before it) and calls the library's setup and backward through
// OpforgeStableAutogradV1. The graph node is a torch::autograd::Function, so
// saved-tensor checks, hooks and gradient materialization are torch's.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/stack.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "opforge/abi.h"
#include "opforge/backward.h"
#include "core/libraries.h"
#include "torch/ivalues.h"
#include "core/tags.h"

namespace opforge::detail {
namespace {

using torch::autograd::variable_list;
using torch::aot_inductor::new_tensor_handle;
using torch::aot_inductor::tensor_handle_to_tensor_pointer;

constexpr const char* kOpKey = "opforge.stable_op";
constexpr const char* kCountsKey = "opforge.stable_counts";
constexpr const char* kStateKey = "opforge.stable_state";

// One op with a stable-ABI C++ backward, made when it is wired and never
// freed (graph nodes may outlive everything else).
struct StableOp {
  std::string name;
  const OpforgeStableAutogradV1* desc;
  std::vector<std::string> param_names;
  std::vector<int> arg_param;  // per flat argument: the kernel parameter it belongs to
  c10::OperatorHandle handle;
};

at::Tensor Take(void* handle) {
  if (handle == nullptr) return at::Tensor();
  auto* h = static_cast<AtenTensorHandle>(handle);
  at::Tensor t = *tensor_handle_to_tensor_pointer(h);
  aoti_torch_delete_tensor_object(h);
  return t;
}

void* Give(const at::Tensor& t) { return t.defined() ? new_tensor_handle(at::Tensor(t)) : nullptr; }

// --- a read-only view of IValues ------------------------------------------------

struct Values {
  const std::vector<c10::IValue>* items;
  const c10::IValue& at(size_t i) const { return items->at(i); }
};

int64_t ToInt(const c10::IValue& v) {
  if (v.isSymInt()) return v.toSymInt().guard_int(__FILE__, __LINE__);
  return v.toInt();
}

const OpforgeValuesV1* ValuesTable() {
  static const OpforgeValuesV1 table = [] {
    OpforgeValuesV1 t{};
    t.size = [](void* s) { return static_cast<Values*>(s)->items->size(); };
    t.is_none = [](void* s, size_t i) -> int32_t { return static_cast<Values*>(s)->at(i).isNone(); };
    t.to_int = [](void* s, size_t i) { return ToInt(static_cast<Values*>(s)->at(i)); };
    t.to_double = [](void* s, size_t i) {
      const auto& v = static_cast<Values*>(s)->at(i);
      return v.isDouble() ? v.toDouble() : static_cast<double>(ToInt(v));
    };
    t.to_bool = [](void* s, size_t i) -> int32_t { return static_cast<Values*>(s)->at(i).toBool(); };
    t.to_string = [](void* s, size_t i, char* out, size_t capacity) {
      const std::string& str = static_cast<Values*>(s)->at(i).toStringRef();
      if (out) std::memcpy(out, str.data(), std::min(capacity, str.size()));
      return str.size();
    };
    t.list_size = [](void* s, size_t i) { return static_cast<Values*>(s)->at(i).toListRef().size(); };
    t.int_at = [](void* s, size_t i, size_t j) { return ToInt(static_cast<Values*>(s)->at(i).toListRef()[j]); };
    t.double_at = [](void* s, size_t i, size_t j) { return static_cast<Values*>(s)->at(i).toListRef()[j].toDouble(); };
    t.tensor = [](void* s, size_t i) -> void* {
      const auto& v = static_cast<Values*>(s)->at(i);
      return v.isTensor() ? Give(v.toTensor()) : nullptr;
    };
    t.tensor_at = [](void* s, size_t i, size_t j) -> void* {
      const auto& item = static_cast<Values*>(s)->at(i).toListRef()[j];
      return item.isTensor() ? Give(item.toTensor()) : nullptr;
    };
    t.device = [](void* s, size_t i, int32_t* index) -> int32_t {
      const c10::Device d = static_cast<Values*>(s)->at(i).toDevice();
      *index = d.index();
      return static_cast<int32_t>(d.type());
    };
    return t;
  }();
  return &table;
}

OpforgeValuesV1 View(Values& values) {
  OpforgeValuesV1 v = *ValuesTable();
  v.self = &values;
  return v;
}

// --- torch's autograd context, for the library ------------------------------------

struct StateHolder : torch::CustomClassHolder {
  void* state = nullptr;
  void (*destroy)(void*) = nullptr;
  ~StateHolder() override {
    if (destroy) destroy(state);
  }
};

struct Ctx {
  torch::autograd::AutogradContext* ctx;
  const StableOp* op;
  const std::vector<int64_t>* counts;  // tensors per flat argument
  std::optional<variable_list> saved;
};

OpforgeAutogradCtxV1 CtxTable(Ctx& self) {
  OpforgeAutogradCtxV1 t{};
  t.self = &self;
  t.save_for_backward = [](void* s, void* const* handles, size_t n) {
    variable_list tensors;
    for (size_t i = 0; i < n; ++i) {
      tensors.push_back(handles[i] ? *tensor_handle_to_tensor_pointer(static_cast<AtenTensorHandle>(handles[i]))
                                   : at::Tensor());
    }
    static_cast<Ctx*>(s)->ctx->save_for_backward(std::move(tensors));
  };
  auto saved = [](Ctx* c) -> variable_list& {
    if (!c->saved) c->saved = c->ctx->get_saved_variables();
    return *c->saved;
  };
  t.num_saved = [](void* s) {
    auto* c = static_cast<Ctx*>(s);
    if (!c->saved) c->saved = c->ctx->get_saved_variables();
    return c->saved->size();
  };
  t.saved = [](void* s, size_t i) -> void* {
    auto* c = static_cast<Ctx*>(s);
    if (!c->saved) c->saved = c->ctx->get_saved_variables();
    return Give(c->saved->at(i));
  };
  (void)saved;
  t.needs_input_grad = [](void* s, size_t param) -> int32_t {
    auto* c = static_cast<Ctx*>(s);
    size_t position = 0;
    for (size_t arg = 0; arg < c->counts->size(); ++arg) {
      const auto n = static_cast<size_t>((*c->counts)[arg]);
      for (size_t j = 0; j < n; ++j, ++position) {
        if (static_cast<size_t>(c->op->arg_param[arg]) == param && c->ctx->needs_input_grad(position)) return 1;
      }
    }
    return 0;
  };
  t.set_materialize_grads = [](void* s, int32_t value) {
    static_cast<Ctx*>(s)->ctx->set_materialize_grads(value != 0);
  };
  t.mark_non_differentiable = [](void* s, void* const* handles, size_t n) {
    variable_list tensors;
    for (size_t i = 0; i < n; ++i) tensors.push_back(*tensor_handle_to_tensor_pointer(static_cast<AtenTensorHandle>(handles[i])));
    static_cast<Ctx*>(s)->ctx->mark_non_differentiable(tensors);
  };
  t.state = [](void* s) -> void* {
    auto& data = static_cast<Ctx*>(s)->ctx->saved_data;
    auto it = data.find(kStateKey);
    if (it == data.end()) return nullptr;
    return static_cast<StateHolder*>(it->second.toCapsule().get())->state;
  };
  t.set_state = [](void* s, void* state, void (*destroy)(void*)) {
    auto holder = c10::make_intrusive<StateHolder>();
    holder->state = state;
    holder->destroy = destroy;
    static_cast<Ctx*>(s)->ctx->saved_data[kStateKey] = c10::IValue::make_capsule(std::move(holder));
  };
  t.op_name = [](void* s) { return static_cast<Ctx*>(s)->op->name.c_str(); };
  t.param_name = [](void* s, size_t param) { return static_cast<Ctx*>(s)->op->param_names.at(param).c_str(); };
  return t;
}

// --- the graph node ------------------------------------------------------------

struct Payload {
  const StableOp* op;
  c10::DispatchKeySet ks;
  torch::jit::Stack* stack;
  std::vector<c10::IValue> args;
  std::vector<int64_t> counts;
  std::vector<int64_t> list_sizes;  // per return: -1 for a Tensor, else its list's size
};

[[noreturn]] void Fail(const StableOp& op, char* message) {
  std::string text(message);
  std::free(message);
  TORCH_CHECK(false, op.name, ": ", text);
}

struct StableFunction : public torch::autograd::Function<StableFunction> {
  static variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList /*inputs*/, Payload* p) {
    const StableOp& op = *p->op;
    ctx->saved_data[kOpKey] = static_cast<int64_t>(reinterpret_cast<intptr_t>(p->op));
    ctx->saved_data[kCountsKey] = c10::IValue(p->counts);
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.handle.redispatchBoxed(p->ks & c10::after_autograd_keyset, p->stack);
    }
    const size_t num_returns = op.handle.schema().returns().size();
    std::vector<c10::IValue> returns(p->stack->end() - num_returns, p->stack->end());
    Ctx self{ctx, p->op, &p->counts, std::nullopt};
    OpforgeAutogradCtxV1 table = CtxTable(self);
    Values in{&p->args};
    Values out{&returns};
    OpforgeValuesV1 in_view = View(in);
    OpforgeValuesV1 out_view = View(out);
    if (char* error = op.desc->setup(&table, &in_view, &out_view)) Fail(op, error);
    variable_list outputs;
    for (const auto& r : returns) {
      if (r.isTensor()) {
        outputs.push_back(r.toTensor());
        p->list_sizes.push_back(-1);
      } else {
        auto list = r.toTensorVector();
        p->list_sizes.push_back(static_cast<int64_t>(list.size()));
        outputs.insert(outputs.end(), list.begin(), list.end());
      }
    }
    return outputs;
  }

  static variable_list backward(torch::autograd::AutogradContext* ctx, variable_list grads) {
    const auto* op = reinterpret_cast<const StableOp*>(static_cast<intptr_t>(ctx->saved_data.at(kOpKey).toInt()));
    const std::vector<int64_t> counts = ctx->saved_data.at(kCountsKey).toIntVector();
    std::vector<c10::IValue> grad_values;
    for (auto& g : grads) grad_values.emplace_back(g.defined() ? c10::IValue(g) : c10::IValue());
    Ctx self{ctx, op, &counts, std::nullopt};
    OpforgeAutogradCtxV1 table = CtxTable(self);
    Values gv{&grad_values};
    OpforgeValuesV1 grad_view = View(gv);
    struct Out {
      const std::vector<int64_t>* counts;
      std::vector<std::vector<at::Tensor>> per_arg;
    } collected{&counts, std::vector<std::vector<at::Tensor>>(counts.size())};
    for (size_t arg = 0; arg < counts.size(); ++arg) collected.per_arg[arg].resize(static_cast<size_t>(counts[arg]));
    OpforgeGradsV1 out{};
    out.self = &collected;
    out.count = [](void* s, size_t arg) -> size_t {
      auto* c = static_cast<Out*>(s);
      return arg < c->counts->size() ? static_cast<size_t>((*c->counts)[arg]) : 0;
    };
    out.set = [](void* s, size_t arg, size_t j, void* tensor) {
      static_cast<Out*>(s)->per_arg.at(arg).at(j) = Take(tensor);
    };
    if (char* error = op->desc->backward(&table, &grad_view, &out)) Fail(*op, error);
    variable_list result;
    for (auto& tensors : collected.per_arg) result.insert(result.end(), tensors.begin(), tensors.end());
    result.emplace_back();  // the Payload input
    return result;
  }
};


class StableAutogradKernel final : public c10::OperatorKernel {
 public:
  explicit StableAutogradKernel(const StableOp* op) : op_(op) {}

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const size_t num_args = handle.schema().arguments().size();
    const size_t first = stack->size() - num_args;
    std::vector<at::Tensor> inputs;
    std::vector<int64_t> counts(num_args, 0);
    bool needs_grad = false;
    for (size_t i = 0; i < num_args; ++i) {
      const auto& type = handle.schema().arguments()[i].real_type();
      const bool tensors = type->kind() == c10::TypeKind::TensorType ||
                           (type->castRaw<c10::OptionalType>() &&
                            type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType) ||
                           type->isSubtypeOf(*c10::ListType::ofOptionalTensors());
      if (!tensors) continue;
      const auto& v = (*stack)[first + i];
      if (v.isNone()) continue;
      ForEachTensor(v, [&](const at::Tensor& t) {
        inputs.push_back(t);
        ++counts[i];
        needs_grad = needs_grad || (t.defined() && t.requires_grad());
      });
    }
    if (!needs_grad || !c10::GradMode::is_enabled()) {
      at::AutoDispatchBelowADInplaceOrView guard;
      handle.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
      return;
    }
    Payload p{op_, ks, stack, std::vector<c10::IValue>(stack->begin() + static_cast<ptrdiff_t>(first), stack->end()),
              std::move(counts), {}};
    variable_list outputs = StableFunction::apply(at::TensorList(inputs), &p);
    // The returns, now with their history, in place of the ones without.
    const size_t num_returns = p.list_sizes.size();
    torch::jit::drop(*stack, num_returns);
    size_t k = 0;
    for (int64_t n : p.list_sizes) {
      if (n < 0) {
        stack->emplace_back(outputs[k++]);
      } else {
        std::vector<at::Tensor> list(outputs.begin() + static_cast<ptrdiff_t>(k),
                                     outputs.begin() + static_cast<ptrdiff_t>(k + static_cast<size_t>(n)));
        k += static_cast<size_t>(n);
        stack->emplace_back(std::move(list));
      }
    }
  }

 private:
  const StableOp* op_;
};

std::mutex& Mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<std::unique_ptr<torch::Library>>& Libraries() {
  static auto* libs = new std::vector<std::unique_ptr<torch::Library>>();
  return *libs;
}

}  // namespace

// Wires a stable-ABI op's C++ backward (LibraryOp::torch_layer_autograd).
void WireStableAutograd(const LibraryOp& lib_op) {
  auto handle = c10::Dispatcher::singleton().findSchema({lib_op.name, ""});
  auto spec = OpSpecRegistry::Global().Find(lib_op.name);
  if (!handle || !spec) return;
  auto* op = new StableOp{lib_op.name, static_cast<const OpforgeStableAutogradV1*>(lib_op.torch_layer_autograd),
                          {}, {}, *handle};
  for (const auto& arg : spec->original.arguments) op->param_names.push_back(arg.name);
  for (const auto& leaf : spec->leaves) {
    const std::string top = leaf.path.substr(0, leaf.path.find('.'));
    int param = 0;
    for (size_t k = 0; k < op->param_names.size(); ++k) {
      if (op->param_names[k] == top) param = static_cast<int>(k);
    }
    op->arg_param.push_back(param);
  }
  const size_t sep = lib_op.name.find("::");
  std::lock_guard<std::mutex> lock(Mutex());
  auto lib = std::make_unique<torch::Library>(torch::Library::FRAGMENT, lib_op.name.substr(0, sep), std::nullopt,
                                              __FILE__, __LINE__);
  for (c10::DispatchKey key : AutogradRuntimeKeys()) {
    lib->impl(lib_op.name.substr(sep + 2).c_str(),
              torch::dispatch(key, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<StableAutogradKernel>(op))));
  }
  Libraries().push_back(std::move(lib));
}

}  // namespace opforge::detail
