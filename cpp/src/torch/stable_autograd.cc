// The backward of a stable-ABI library's op (opforge/stable/backward.h):
// torch's stable ABI has no autograd, so the library hands its setup and
// backward to this layer (built for the running torch) as an
// OpforgeStableAutogradV1, and the op gets the Autograd kernel and graph node
// every C++ op gets (cpp_autograd.cc), here reading and writing through the
// C surface's tables when the op's library commits (or when opforge loads,
// for libraries loaded before it).
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/custom_class.h>

#include <cstring>
#include <memory>

#include "core/libraries.h"
#include "opforge/abi.h"
#include "torch/cpp_autograd.h"

namespace opforge::detail {
namespace {

using torch::aot_inductor::new_tensor_handle;
using torch::aot_inductor::tensor_handle_to_tensor_pointer;

constexpr const char* kStateKey = "opforge.stable_state";

at::Tensor Take(void* handle) {
  if (handle == nullptr) return at::Tensor();
  auto* h = static_cast<AtenTensorHandle>(handle);
  at::Tensor t = *tensor_handle_to_tensor_pointer(h);
  aoti_torch_delete_tensor_object(h);
  return t;
}

void* Give(const at::Tensor& t) { return t.defined() ? new_tensor_handle(at::Tensor(t)) : nullptr; }

std::vector<at::Tensor> FromHandles(void* const* handles, size_t n) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < n; ++i) {
    auto* handle = static_cast<AtenTensorHandle>(handles[i]);
    out.push_back(handle ? *tensor_handle_to_tensor_pointer(handle) : at::Tensor());
  }
  return out;
}

// --- values, read-only --------------------------------------------------------------

struct Values {
  const c10::IValue* items;
  size_t n;
  const c10::IValue& at(size_t i) const {
    TORCH_CHECK(i < n, "opforge: a stable-ABI backward read value ", i, " of ", n);
    return items[i];
  }
};

int64_t ToInt(const c10::IValue& v) {
  if (v.isSymInt()) return v.toSymInt().guard_int(__FILE__, __LINE__);
  if (v.isBool()) return v.toBool();  // an item of a bool[]
  return v.toInt();
}

Values& Of(void* s) { return *static_cast<Values*>(s); }

OpforgeValuesV1 View(Values& values) {
  OpforgeValuesV1 t{};
  t.self = &values;
  t.size = [](void* s) { return Of(s).n; };
  t.is_none = [](void* s, size_t i) -> int32_t { return Of(s).at(i).isNone(); };
  t.to_int = [](void* s, size_t i) { return ToInt(Of(s).at(i)); };
  t.to_double = [](void* s, size_t i) {
    const auto& v = Of(s).at(i);
    return v.isDouble() ? v.toDouble() : static_cast<double>(ToInt(v));
  };
  t.to_bool = [](void* s, size_t i) -> int32_t { return Of(s).at(i).toBool(); };
  t.to_string = [](void* s, size_t i, char* out, size_t capacity) {
    const std::string& str = Of(s).at(i).toStringRef();
    if (out) std::memcpy(out, str.data(), std::min(capacity, str.size()));
    return str.size();
  };
  t.list_size = [](void* s, size_t i) { return Of(s).at(i).toListRef().size(); };
  t.int_at = [](void* s, size_t i, size_t j) { return ToInt(Of(s).at(i).toListRef()[j]); };
  t.double_at = [](void* s, size_t i, size_t j) { return Of(s).at(i).toListRef()[j].toDouble(); };
  t.tensor = [](void* s, size_t i) -> void* {
    const auto& v = Of(s).at(i);
    return v.isTensor() ? Give(v.toTensor()) : nullptr;
  };
  t.tensor_at = [](void* s, size_t i, size_t j) -> void* {
    const auto& item = Of(s).at(i).toListRef()[j];
    return item.isTensor() ? Give(item.toTensor()) : nullptr;
  };
  t.device = [](void* s, size_t i, int32_t* index) -> int32_t {
    const c10::Device d = Of(s).at(i).toDevice();
    *index = d.index();
    return static_cast<int32_t>(d.type());
  };
  return t;
}

// --- the autograd context, for the library -----------------------------------------------

struct StateHolder : torch::CustomClassHolder {
  void* state = nullptr;
  void (*destroy)(void*) = nullptr;
  ~StateHolder() override {
    if (destroy) destroy(state);
  }
};

struct Ctx {
  AutogradContext* ctx;
  const AutogradOp* op;
  std::optional<std::vector<at::Tensor>> saved;
  const std::vector<at::Tensor>& Saved() {
    if (!saved) saved = ctx->get_saved_variables();
    return *saved;
  }
};

Ctx& CtxOf(void* s) { return *static_cast<Ctx*>(s); }

OpforgeAutogradCtxV1 CtxTable(Ctx& self) {
  OpforgeAutogradCtxV1 t{};
  t.self = &self;
  t.save_for_backward = [](void* s, void* const* handles, size_t n) {
    CtxOf(s).ctx->save_for_backward(FromHandles(handles, n));
  };
  t.num_saved = [](void* s) { return CtxOf(s).Saved().size(); };
  t.saved = [](void* s, size_t i) -> void* { return Give(CtxOf(s).Saved().at(i)); };
  t.needs_input_grad = [](void* s, size_t param) -> int32_t { return CtxOf(s).ctx->needs_input_grad(param); };
  t.set_materialize_grads = [](void* s, int32_t value) { CtxOf(s).ctx->set_materialize_grads(value != 0); };
  t.mark_non_differentiable = [](void* s, void* const* handles, size_t n) {
    CtxOf(s).ctx->mark_non_differentiable(FromHandles(handles, n));
  };
  t.state = [](void* s) -> void* {
    auto& data = CtxOf(s).ctx->saved_data;
    auto it = data.find(kStateKey);
    if (it == data.end()) return nullptr;
    return static_cast<StateHolder*>(it->second.toCapsule().get())->state;
  };
  t.set_state = [](void* s, void* state, void (*destroy)(void*)) {
    auto holder = c10::make_intrusive<StateHolder>();
    holder->state = state;
    holder->destroy = destroy;
    CtxOf(s).ctx->saved_data[kStateKey] = c10::IValue::make_capsule(std::move(holder));
  };
  t.op_name = [](void* s) { return CtxOf(s).op->name.c_str(); };
  t.param_name = [](void* s, size_t param) { return CtxOf(s).op->param_names.at(param).c_str(); };
  return t;
}

const OpforgeStableAutogradV1& Descriptor(const AutogradOp& op) {
  return *static_cast<const OpforgeStableAutogradV1*>(op.descriptor);
}

[[noreturn]] void Fail(const AutogradOp& op, char* message) {
  std::string text(message);
  std::free(message);
  TORCH_CHECK(false, op.name, ": ", text);
}

void Setup(AutogradContext& ctx, const AutogradOp& op, const c10::IValue* args, const c10::IValue* returns) {
  Ctx self{&ctx, &op, std::nullopt};
  OpforgeAutogradCtxV1 table = CtxTable(self);
  Values in{args, op.arg_tensors.size()};
  Values out{returns, op.num_returns};
  OpforgeValuesV1 in_view = View(in);
  OpforgeValuesV1 out_view = View(out);
  if (char* error = Descriptor(op).setup(&table, &in_view, &out_view)) Fail(op, error);
}

std::vector<at::Tensor> Backward(AutogradContext& ctx, const AutogradOp& op, std::vector<at::Tensor>&& grads,
                                 const int64_t* counts) {
  std::vector<c10::IValue> grad_values;
  for (auto& g : grads) grad_values.emplace_back(g.defined() ? c10::IValue(std::move(g)) : c10::IValue());
  Ctx self{&ctx, &op, std::nullopt};
  OpforgeAutogradCtxV1 table = CtxTable(self);
  Values gv{grad_values.data(), grad_values.size()};
  OpforgeValuesV1 grad_view = View(gv);
  using PerArg = std::vector<std::vector<at::Tensor>>;  // the gradients of each flat argument's tensors
  PerArg per_arg(op.arg_tensors.size());
  for (size_t arg = 0; arg < per_arg.size(); ++arg) per_arg[arg].resize(op.Tensors(counts, arg));
  OpforgeGradsV1 out{};
  out.self = &per_arg;
  out.count = [](void* s, size_t arg) -> size_t {
    const PerArg& p = *static_cast<PerArg*>(s);
    return arg < p.size() ? p[arg].size() : 0;
  };
  out.set = [](void* s, size_t arg, size_t j, void* tensor) { static_cast<PerArg*>(s)->at(arg).at(j) = Take(tensor); };
  if (char* error = Descriptor(op).backward(&table, &grad_view, &out)) Fail(op, error);
  std::vector<at::Tensor> result;
  for (auto& tensors : per_arg) result.insert(result.end(), tensors.begin(), tensors.end());
  return result;
}

}  // namespace

void WireStableAutograd(const LibraryOp& lib_op) {
  auto handle = c10::Dispatcher::singleton().findSchema({lib_op.name, ""});
  if (!handle) return;
  auto* op = new AutogradOp();  // never freed: see AutogradOp
  PrepareAutogradOp(lib_op.name, std::nullopt, *op);
  op->setup = &Setup;
  op->backward = &Backward;
  op->descriptor = lib_op.torch_layer_autograd;
  KeepForever(RegisterAutogradKernel(lib_op.name, op));
}

}  // namespace opforge::detail
