// A C++ backward for an op of a stable-ABI library, written as in the C++ API
// mode (opforge/backward.h): `setup_context(ctx, <the kernel's parameters>,
// out)` and `backward(ctx, <one gradient per output>)` returning
// opforge::GradsFor<kernel>. torch's stable ABI has no autograd, so opforge's
// torch layer (built for the running torch, loaded by `import opforge`)
// registers the op's autograd kernel and calls these through
// OpforgeStableAutogradV1 (opforge/abi.h); the library stays one build for
// every torch. Included by opforge/stable/library.h.
#pragma once

#include <map>
#include <string>
#include <variant>
#include <vector>

#include "opforge/abi.h"
#include "opforge/detail/grads.h"
#include "opforge/detail/library_api.h"
#include "opforge/detail/reader.h"

namespace opforge {

// A value setup_context keeps for backward: an int, a float, a bool or a
// string, read back as torch's IValue would be.
//   ctx->saved_data["eps"] = cfg.eps;   ...   ctx->saved_data["eps"].toDouble()
class SavedValue {
 public:
  SavedValue() = default;
  SavedValue(int64_t v) : v_(v) {}  // NOLINT: assignment from each kind reads well
  SavedValue(int v) : v_(static_cast<int64_t>(v)) {}  // NOLINT
  SavedValue(double v) : v_(v) {}  // NOLINT
  SavedValue(bool v) : v_(v) {}  // NOLINT
  SavedValue(std::string v) : v_(std::move(v)) {}  // NOLINT
  SavedValue(const char* v) : v_(std::string(v)) {}  // NOLINT

  int64_t toInt() const { return Get<int64_t>("an int"); }
  double toDouble() const {
    if (auto* i = std::get_if<int64_t>(&v_)) return static_cast<double>(*i);
    return Get<double>("a float");
  }
  bool toBool() const { return Get<bool>("a bool"); }
  const std::string& toStringRef() const { return Get<std::string>("a string"); }

 private:
  template <class T>
  const T& Get(const char* what) const {
    if (auto* v = std::get_if<T>(&v_)) return *v;
    throw std::invalid_argument(std::string("opforge: saved_data holds no ") + what + " here.");
  }
  std::variant<std::monostate, int64_t, double, bool, std::string> v_;
};

// What setup_context and backward receive: torch's autograd context, with
// needs_input_grad counted in the kernel's parameters.
class AutogradContext {
 public:
  AutogradContext(const OpforgeAutogradCtxV1* ctx, std::map<std::string, SavedValue>& data)
      : saved_data(data), ctx_(ctx) {}

  // Non-tensor data for backward.
  std::map<std::string, SavedValue>& saved_data;

  void save_for_backward(const std::vector<Tensor>& tensors) {
    std::vector<void*> handles;
    for (const auto& t : tensors) handles.push_back(t.get());
    ctx_->save_for_backward(ctx_->self, handles.data(), handles.size());
  }
  std::vector<Tensor> get_saved_variables() const {
    std::vector<Tensor> out;
    const size_t n = ctx_->num_saved(ctx_->self);
    for (size_t i = 0; i < n; ++i) {
      void* h = ctx_->saved(ctx_->self, i);
      out.push_back(h ? Tensor(static_cast<AtenTensorHandle>(h)) : Tensor());
    }
    return out;
  }
  void mark_non_differentiable(const std::vector<Tensor>& outputs) {
    std::vector<void*> handles;
    for (const auto& t : outputs) handles.push_back(t.get());
    ctx_->mark_non_differentiable(ctx_->self, handles.data(), handles.size());
  }
  // Whether undefined output gradients reach backward as zeros (default true).
  void set_materialize_grads(bool value) { ctx_->set_materialize_grads(ctx_->self, value); }
  // Whether parameter `param` (its position in the kernel's signature) has a
  // tensor, or a struct field tensor, that needs a gradient.
  bool needs_input_grad(size_t param) const { return ctx_->needs_input_grad(ctx_->self, param) != 0; }

 private:
  const OpforgeAutogradCtxV1* ctx_;
};

namespace detail {

inline Tensor TensorFrom(void* handle) {
  return handle ? Tensor(static_cast<AtenTensorHandle>(handle)) : Tensor();
}

// Slots of a call as the torch layer shows it (OpforgeValuesV1): read-only.
struct ViewSlots {
  template <class W, size_t I>
  static W Get(const OpforgeValuesV1& v) {
    return Read<W>(v, I);
  }
  template <class W>
  static W Read(const OpforgeValuesV1& v, size_t i) {
    if constexpr (IsOptional<W>::value) {
      if (v.is_none(v.self, i)) return std::nullopt;
      return Read<typename W::value_type>(v, i);
    } else if constexpr (std::is_same_v<W, Tensor>) {
      return TensorFrom(v.tensor(v.self, i));
    } else if constexpr (std::is_same_v<W, std::vector<Tensor>>) {
      std::vector<Tensor> out;
      for (size_t j = 0, n = v.list_size(v.self, i); j < n; ++j) out.push_back(TensorFrom(v.tensor_at(v.self, i, j)));
      return out;
    } else if constexpr (std::is_same_v<W, bool>) {
      return v.to_bool(v.self, i) != 0;
    } else if constexpr (std::is_same_v<W, double>) {
      return v.to_double(v.self, i);
    } else if constexpr (std::is_same_v<W, std::string>) {
      std::string out(v.to_string(v.self, i, nullptr, 0), '\0');
      v.to_string(v.self, i, out.data(), out.size());
      return out;
    } else if constexpr (std::is_same_v<W, Device>) {
      int32_t index = -1;
      const int32_t type = v.device(v.self, i, &index);
      return Device(static_cast<c10::DeviceType>(type), static_cast<decltype(std::declval<Device>().index())>(index));
    } else if constexpr (std::is_same_v<W, HandleId>) {
      return HandleId{v.to_int(v.self, i), false};
    } else if constexpr (IsVector<W>::value) {
      W out;  // a list of scalars: int[], float[], bool[]
      for (size_t j = 0, n = v.list_size(v.self, i); j < n; ++j) {
        if constexpr (std::is_floating_point_v<typename W::value_type>) {
          out.push_back(v.double_at(v.self, i, j));
        } else {
          out.push_back(static_cast<typename W::value_type>(v.int_at(v.self, i, j)));
        }
      }
      return out;
    } else {
      return static_cast<W>(v.to_int(v.self, i));  // int, ScalarType, Layout, MemoryFormat
    }
  }
};

using SavedData = std::map<std::string, SavedValue>;

template <class G, class Sig>
struct StableAutograd;

template <class G, class R, class... Args>
struct StableAutograd<G, R(Args...)> {
  static_assert(CheckAutogradClass<G, R>::kOk);

  using Out = Outputs<R>;

  static OpNames Names(const OpforgeAutogradCtxV1* ctx) {
    OpNames names;
    names.name = ctx->op_name(ctx->self);
    for (size_t k = 0; k < sizeof...(Args); ++k) names.param_names.push_back(ctx->param_name(ctx->self, k));
    return names;
  }

  static char* Setup(const OpforgeAutogradCtxV1* ctx, const OpforgeValuesV1* inputs,
                     const OpforgeValuesV1* outputs) {
    return Catch([&] {
      auto* data = new SavedData();
      ctx->set_state(ctx->self, data, [](void* p) { delete static_cast<SavedData*>(p); });
      if constexpr (HasSetupContext<G>::value) {
        AutogradContext c(ctx, *data);
        Reader<ViewSlots, const OpforgeValuesV1> r{*inputs};
        auto params = ReadParams<Args...>(r);
        auto out = ReadResults<typename Out::Flat, ViewSlots>(*outputs);
        std::apply([&](auto&... p) { G::setup_context(&c, p..., Out::Original(out)); }, params);
      }
    }, "setup_context");
  }

  static char* Backward(const OpforgeAutogradCtxV1* ctx, const OpforgeValuesV1* grads, const OpforgeGradsV1* out) {
    return Catch([&] {
      auto* data = static_cast<SavedData*>(ctx->state(ctx->self));
      SavedData empty;
      AutogradContext c(ctx, data ? *data : empty);
      std::vector<Tensor> gs;
      for (size_t i = 0, n = grads->size(grads->self); i < n; ++i) gs.push_back(ViewSlots::Read<Tensor>(*grads, i));
      const OpNames names = Names(ctx);
      auto leaves = LeafGrads<G, R, Args...>(&c, names, gs);
      EmitGrads<Args...>(
          names, leaves, [&](size_t i) { return out->count(out->self, i); },
          [&](size_t i, size_t j, Tensor&& g) {
            if (!g.defined()) return;
            AtenTensorHandle h = nullptr;
            TORCH_ERROR_CODE_CHECK(aoti_torch_new_tensor_handle(g.get(), &h));
            out->set(out->self, i, j, h);
          });
    }, "the backward");
  }

  static constexpr OpforgeStableAutogradV1 kDescriptor = {sizeof(OpforgeStableAutogradV1), &Setup, &Backward};
};

}  // namespace detail
}  // namespace opforge
