// A C++ backward for an op of a stable-ABI library, written as in the C++ API
// mode (opforge/backward.h): `setup_context(ctx, <the kernel's parameters>,
// out)` and `backward(ctx, <one gradient per output>)` returning
// opforge::GradsFor<kernel>. torch's stable ABI has no autograd, so opforge's
// torch layer (built for the running torch, loaded by `import opforge`)
// registers the op's autograd kernel and calls these through
// OpforgeStableAutogradV1 (opforge/abi.h); the library stays one build for
// every torch. Included by opforge/stable/library.h.
#pragma once

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "opforge/abi.h"
#include "opforge/detail/grads.h"

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

// One flat value of a call, read through the torch layer's view.
template <class T, class = void>
struct ViewValue {
  static_assert(kAlwaysFalse<T>, OPFORGE_UNSUPPORTED_TYPE_);
};

inline Tensor TensorFrom(void* handle) {
  return handle ? Tensor(static_cast<AtenTensorHandle>(handle)) : Tensor();
}

template <>
struct ViewValue<Tensor> {
  static Tensor Read(const OpforgeValuesV1& v, size_t i) { return TensorFrom(v.tensor(v.self, i)); }
};
template <>
struct ViewValue<std::vector<Tensor>> {
  static std::vector<Tensor> Read(const OpforgeValuesV1& v, size_t i) {
    std::vector<Tensor> out;
    for (size_t j = 0, n = v.list_size(v.self, i); j < n; ++j) out.push_back(TensorFrom(v.tensor_at(v.self, i, j)));
    return out;
  }
};
template <class I>
struct ViewValue<I, std::enable_if_t<std::is_same_v<I, int64_t> || std::is_same_v<I, int32_t> || kIsEnum<I> ||
                                     std::is_same_v<I, c10::ScalarType> || std::is_same_v<I, c10::Layout> ||
                                     std::is_same_v<I, c10::MemoryFormat>>> {
  static I Read(const OpforgeValuesV1& v, size_t i) { return static_cast<I>(v.to_int(v.self, i)); }
};
template <class F>
struct ViewValue<F, std::enable_if_t<std::is_same_v<F, double> || std::is_same_v<F, float>>> {
  static F Read(const OpforgeValuesV1& v, size_t i) { return static_cast<F>(v.to_double(v.self, i)); }
};
template <>
struct ViewValue<bool> {
  static bool Read(const OpforgeValuesV1& v, size_t i) { return v.to_bool(v.self, i) != 0; }
};
template <>
struct ViewValue<std::string> {
  static std::string Read(const OpforgeValuesV1& v, size_t i) {
    std::string out(v.to_string(v.self, i, nullptr, 0), '\0');
    v.to_string(v.self, i, out.data(), out.size());
    return out;
  }
};
template <class T>
struct ViewValue<std::vector<T>, std::enable_if_t<std::is_same_v<T, int64_t> || std::is_same_v<T, double>>> {
  static std::vector<T> Read(const OpforgeValuesV1& v, size_t i) {
    std::vector<T> out;
    for (size_t j = 0, n = v.list_size(v.self, i); j < n; ++j) {
      if constexpr (std::is_same_v<T, int64_t>) {
        out.push_back(v.int_at(v.self, i, j));
      } else {
        out.push_back(v.double_at(v.self, i, j));
      }
    }
    return out;
  }
};
template <>
struct ViewValue<torch::stable::Device> {
  static torch::stable::Device Read(const OpforgeValuesV1& v, size_t i) {
    int32_t index = -1;
    const int32_t type = v.device(v.self, i, &index);
    using Index = decltype(std::declval<torch::stable::Device>().index());
    return torch::stable::Device(static_cast<c10::DeviceType>(type), static_cast<Index>(index));
  }
};
template <class T>
struct ViewValue<Handle<T>> {
  static Handle<T> Read(const OpforgeValuesV1& v, size_t i) { return Handle<T>(v.to_int(v.self, i)); }
};
template <class T>
struct ViewValue<std::optional<T>, std::enable_if_t<!kIsStruct<T>>> {
  static std::optional<T> Read(const OpforgeValuesV1& v, size_t i) {
    if (v.is_none(v.self, i)) return std::nullopt;
    return ViewValue<T>::Read(v, i);
  }
};

// Reads a kernel's parameters from a view, for Node::Build.
struct ViewReader {
  const OpforgeValuesV1& v;
  template <class T, size_t I>
  T Leaf() {
    return ViewValue<T>::Read(v, I);
  }
  template <class T, size_t I>
  T LeafInOptional() {
    if constexpr (!IsOptional<T>::value) {
      if (v.is_none(v.self, I)) {
        throw std::invalid_argument("opforge: an optional struct argument is set but one of its required fields is "
                                    "None.");
      }
    }
    return ViewValue<T>::Read(v, I);
  }
  template <size_t I>
  bool Presence() {
    return v.to_bool(v.self, I) != 0;
  }
};

template <class Flat>
struct ViewOutputs;
template <>
struct ViewOutputs<Tensor> {
  static Tensor Read(const OpforgeValuesV1& v) { return ViewValue<Tensor>::Read(v, 0); }
};
template <>
struct ViewOutputs<std::vector<Tensor>> {
  static std::vector<Tensor> Read(const OpforgeValuesV1& v) { return ViewValue<std::vector<Tensor>>::Read(v, 0); }
};
template <class... T>
struct ViewOutputs<std::tuple<T...>> {
  static std::tuple<T...> Read(const OpforgeValuesV1& v) { return ReadAll(v, std::index_sequence_for<T...>{}); }
  template <size_t... I>
  static std::tuple<T...> ReadAll(const OpforgeValuesV1& v, std::index_sequence<I...>) {
    return std::tuple<T...>{ViewValue<T>::Read(v, I)...};
  }
};

using SavedData = std::map<std::string, SavedValue>;

inline char* ErrorMessage(const std::string& text) { return strdup(text.c_str()); }

template <class G, class Sig>
struct StableAutograd;

template <class G, class R, class... Args>
struct StableAutograd<G, R(Args...)> {
  static_assert(CheckAutogradClass<G, R>::kOk);

  using Out = Outputs<R>;
  static constexpr size_t kLeaves = kLeafCount<Args...>;

  static size_t ParamOfLeaf(size_t leaf) {
    constexpr size_t counts[] = {ParamNode<Args>::kCount..., 0};
    size_t param = 0;
    for (size_t end = counts[0]; leaf >= end && param + 1 < sizeof...(Args); end += counts[++param]) {
    }
    return param;
  }

  static OpNames Names(const OpforgeAutogradCtxV1* ctx) {
    OpNames names;
    names.name = ctx->op_name(ctx->self);
    for (size_t k = 0; k < sizeof...(Args); ++k) names.param_names.push_back(ctx->param_name(ctx->self, k));
    return names;
  }

  template <size_t... K>
  static std::tuple<std::decay_t<Args>...> ReadParams(ViewReader& r, std::index_sequence<K...>) {
    return std::tuple<std::decay_t<Args>...>{ParamNode<Args>::template Build<kParamOffset<K, Args...>>(r)...};
  }

  static char* Setup(const OpforgeAutogradCtxV1* ctx, const OpforgeValuesV1* inputs,
                     const OpforgeValuesV1* outputs) {
    try {
      auto* data = new SavedData();
      ctx->set_state(ctx->self, data, [](void* p) { delete static_cast<SavedData*>(p); });
      if constexpr (HasSetupContext<G>::value) {
        AutogradContext c(ctx, *data);
        ViewReader r{*inputs};
        auto params = ReadParams(r, std::index_sequence_for<Args...>{});
        auto out = ViewOutputs<typename Out::Flat>::Read(*outputs);
        std::apply([&](auto&... p) { G::setup_context(&c, p..., Out::Original(out)); }, params);
      }
      return nullptr;
    } catch (const std::exception& e) {
      return ErrorMessage(e.what());
    }
  }

  template <class Tuple, size_t... K>
  static void Scatter(const OpNames& names, std::array<LeafGrad, kLeaves>& leaves, Tuple&& result,
                      std::index_sequence<K...>) {
    (PutGrad<std::decay_t<Args>>(names, K, leaves.data() + kParamOffset<K, Args...>,
                                 std::get<K>(std::forward<Tuple>(result))),
     ...);
  }

  static char* Backward(const OpforgeAutogradCtxV1* ctx, const OpforgeValuesV1* grads, const OpforgeGradsV1* out) {
    try {
      auto* data = static_cast<SavedData*>(ctx->state(ctx->self));
      SavedData empty;
      AutogradContext c(ctx, data ? *data : empty);
      std::vector<Tensor> gs;
      for (size_t i = 0, n = grads->size(grads->self); i < n; ++i) gs.push_back(ViewValue<Tensor>::Read(*grads, i));
      auto result = Out::template Backward<G>(&c, gs);
      const OpNames names = Names(ctx);
      std::array<LeafGrad, kLeaves> leaves;
      if constexpr (IsStdTupleOf<decltype(result)>::value) {
        static_assert(std::tuple_size_v<decltype(result)> == sizeof...(Args),
                      "opforge: backward must return one gradient per parameter of the op, in order; use "
                      "opforge::NoGrad{} for parameters without one (see opforge::GradsFor).");
        Scatter(names, leaves, std::move(result), std::index_sequence_for<Args...>{});
      } else {
        static_assert(sizeof...(Args) == 1,
                      "opforge: backward must return a std::tuple with one gradient per parameter of the op "
                      "(see opforge::GradsFor).");
        Scatter(names, leaves, std::make_tuple(std::move(result)), std::index_sequence_for<Args...>{});
      }
      for (size_t i = 0; i < kLeaves; ++i) {
        const size_t n = out->count(out->self, i);
        auto& many = leaves[i].many;
        if (!many.empty() && many.size() != n) ThrowListGradSize(names, ParamOfLeaf(i), n, many.size());
        for (size_t j = 0; j < n; ++j) {
          const Tensor& g = many.empty() ? leaves[i].one : many[j];
          if (!many.empty() || j == 0) {
            if (g.defined()) {
              AtenTensorHandle h = nullptr;
              TORCH_ERROR_CODE_CHECK(aoti_torch_new_tensor_handle(g.get(), &h));
              out->set(out->self, i, j, h);
            }
          }
        }
      }
      return nullptr;
    } catch (const std::exception& e) {
      return ErrorMessage(e.what());
    }
  }

  static constexpr OpforgeStableAutogradV1 kDescriptor = {sizeof(OpforgeStableAutogradV1), &Setup, &Backward};
};

}  // namespace detail
}  // namespace opforge
