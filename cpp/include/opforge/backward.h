// A C++ backward for an OPFORGE_LIBRARY op, written against the op's own
// (struct) signature. Include this header where you declare one.
//
//   struct Cfg { double scale = 1.0; at::Tensor w; std::optional<at::Tensor> b; };
//   OPFORGE_STRUCT(Cfg, scale, w, b);
//   at::Tensor Affine(const at::Tensor& x, const Cfg& cfg);  // x * w * scale + b
//
//   struct AffineGrad {
//     static void setup_context(opforge::AutogradContext* ctx, const at::Tensor& x, const Cfg& cfg,
//                               const at::Tensor& out) {
//       ctx->save_for_backward({x, cfg.w});
//       ctx->saved_data["scale"] = cfg.scale;
//     }
//     static opforge::GradsFor<decltype(Affine)> backward(opforge::AutogradContext* ctx,
//                                                         const at::Tensor& grad) {
//       auto saved = ctx->get_saved_variables();
//       double scale = ctx->saved_data["scale"].toDouble();
//       opforge::Grad<Cfg> cfg;
//       cfg.set(&Cfg::w, grad * saved[0] * scale).set(&Cfg::b, grad);
//       return {grad * saved[1] * scale, cfg};  // one gradient per parameter: x, cfg
//     }
//   };
//
//   OPFORGE_LIBRARY(mylib, m) {
//     m.def("affine(Tensor x, Cfg cfg) -> Tensor", &Affine).autograd<AffineGrad>();
//   }
//
// The forward still runs the op's kernels through the dispatcher (per-device
// kernels, the Meta kernel); opforge wraps the call in a
// torch::autograd::Function, so the graph node, saved-tensor checks and
// gradient materialization are torch's. Nothing on either path is Python.
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>
#include <c10/util/flat_hash_map.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
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
struct OpBackward;
}  // namespace detail

// What setup_context and backward receive: torch's AutogradContext, with
// needs_input_grad counted in the op's original parameters.
class AutogradContext {
 public:
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
  friend struct detail::OpBackward;
  AutogradContext(torch::autograd::AutogradContext* ctx, const detail::AutogradOp* op,
                  const int64_t* counts);

  torch::autograd::AutogradContext* ctx_;
  const detail::AutogradOp* op_;
  const int64_t* counts_;  // tensors per tensor leaf, or null when each has one
};

namespace detail {

// ---------------------------------------------------------------------------
// The type-erased half, implemented once in the torch layer (backward.cc).

// One op's backward, made at registration and never freed: graph nodes may
// outlive the library that registered it.
struct AutogradOp : OpNames {
  std::vector<int> tensor_leaf_param;    // per Tensor leaf: its parameter
  bool dynamic = false;                  // Tensor? or Tensor[] leaves: counts vary per call
  std::vector<at::Tensor> (*backward)(AutogradContext& ctx, const AutogradOp& op,
                                      std::vector<at::Tensor>&& grads, const int64_t* counts) = nullptr;
};

// The forward of one call: runs the op below autograd, then setup_context.
class AutogradCall {
 public:
  virtual std::vector<at::Tensor> Forward(AutogradContext& ctx) = 0;

 protected:
  ~AutogradCall() = default;
};

// Runs `call` inside a torch::autograd::Function whose inputs are `inputs`
// (the defined tensors of the Tensor leaves, in flat order; `counts` says how
// many each leaf gave when op.dynamic). Returns the outputs with their history.
std::vector<at::Tensor> ApplyAutograd(const AutogradOp& op, std::vector<at::Tensor> inputs,
                                      std::vector<int64_t> counts, AutogradCall& call);

// Every runtime autograd key (AutogradCPU, AutogradCUDA, ...). The kernel goes
// to each: a registration to the Autograd alias would lose to a
// CompositeImplicitAutograd kernel from `m.def(schema, fn)`.
const std::vector<c10::DispatchKey>& AutogradRuntimeKeys();

// Checks that `qualified` may get a C++ backward and fills op's name and
// parameter names. Throws for an unknown op or one that mutates arguments.
void PrepareAutogradOp(const std::string& qualified, size_t num_params, AutogradOp& op);

[[noreturn]] void ThrowUndefinedInput(const AutogradOp& op, size_t param);

// ---------------------------------------------------------------------------
// Flat leaves as autograd sees them.

enum class TensorKind { kNone, kTensor, kOptional, kList, kOptionalList };

template <class F>
constexpr TensorKind KindOf() {
  using T = std::decay_t<F>;
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return TensorKind::kTensor;
  } else if constexpr (std::is_same_v<T, std::optional<at::Tensor>>) {
    return TensorKind::kOptional;
  } else if constexpr (std::is_same_v<T, at::TensorList>) {
    return TensorKind::kList;
  } else if constexpr (std::is_same_v<T, std::optional<at::TensorList>>) {
    return TensorKind::kOptionalList;
  } else {
    return TensorKind::kNone;
  }
}

template <class F>
bool RequiresGrad(const F& v) {
  constexpr TensorKind kind = KindOf<F>();
  if constexpr (kind == TensorKind::kTensor) {
    return v.requires_grad();
  } else if constexpr (kind == TensorKind::kOptional) {
    return v.has_value() && v->requires_grad();
  } else if constexpr (kind == TensorKind::kList || kind == TensorKind::kOptionalList) {
    at::TensorList list;
    if constexpr (kind == TensorKind::kList) {
      list = v;
    } else if (v.has_value()) {
      list = *v;
    }
    for (const auto& t : list) {
      if (t.requires_grad()) return true;
    }
    return false;
  } else {
    return false;
  }
}

// The tensors autograd sees for one leaf; returns how many were defined.
template <class F>
int64_t CollectInputs(const F& v, std::vector<at::Tensor>& inputs) {
  constexpr TensorKind kind = KindOf<F>();
  if constexpr (kind == TensorKind::kTensor) {
    if (!v.defined()) return 0;
    inputs.push_back(v);
    return 1;
  } else if constexpr (kind == TensorKind::kOptional) {
    if (!v.has_value() || !v->defined()) return 0;
    inputs.push_back(*v);
    return 1;
  } else {
    at::TensorList list;
    if constexpr (kind == TensorKind::kList) {
      list = v;
    } else if (v.has_value()) {
      list = *v;
    }
    inputs.insert(inputs.end(), list.begin(), list.end());
    return static_cast<int64_t>(list.size());
  }
}

template <class T>
struct IsTuple : std::false_type {};
template <class... T>
struct IsTuple<std::tuple<T...>> : std::true_type {};

// The autograd kernel: registered for every runtime autograd key with the
// op's flat signature.
template <class G, class R, class ArgList, class FlatList>
struct AutogradKernel;

template <class G, class R, class... Args, class... FlatArgs>
struct AutogradKernel<G, R, TypeList<Args...>, TypeList<FlatArgs...>> {
  using Out = Outputs<R>;
  using Result = typename Out::Flat;
  using Signature = Result(FlatArgs...);
  using Handle = c10::TypedOperatorHandle<Signature>;
  static constexpr size_t kLeaves = sizeof...(FlatArgs);
  static constexpr std::array<TensorKind, kLeaves> kKinds = {KindOf<FlatArgs>()...};

  static constexpr bool Dynamic() {
    for (TensorKind k : kKinds) {
      if (k != TensorKind::kNone && k != TensorKind::kTensor) return true;
    }
    return false;
  }


  const AutogradOp* op;
  Handle handle;

  Result operator()(c10::DispatchKeySet ks, FlatArgs... flat) const {
    if (!c10::GradMode::is_enabled() || !(RequiresGrad(flat) || ...)) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return handle.redispatch(ks & c10::after_autograd_keyset, flat...);
    }
    auto args = std::forward_as_tuple(flat...);
    Call<decltype(args)> call(*this, ks, args);
    std::vector<at::Tensor> inputs;
    std::vector<int64_t> counts;
    Collect(args, inputs, counts, std::index_sequence_for<FlatArgs...>{});
    return Out::FromList(ApplyAutograd(*op, std::move(inputs), std::move(counts), call));
  }

  template <class Tuple, size_t... I>
  void Collect(Tuple& args, std::vector<at::Tensor>& inputs, std::vector<int64_t>& counts,
               std::index_sequence<I...>) const {
    inputs.reserve(kLeaves);
    size_t tensor_leaf = 0;
    (
        [&] {
          if constexpr (kKinds[I] != TensorKind::kNone) {
            const int64_t n = CollectInputs(std::get<I>(args), inputs);
            if constexpr (Dynamic()) {
              counts.push_back(n);
            } else if (n == 0) {
              ThrowUndefinedInput(*op, static_cast<size_t>(op->tensor_leaf_param[tensor_leaf]));
            }
            ++tensor_leaf;
          }
        }(),
        ...);
  }

  template <class Tuple>
  class Call final : public AutogradCall {
   public:
    Call(const AutogradKernel& kernel, c10::DispatchKeySet ks, Tuple& args)
        : kernel_(kernel), ks_(ks), args_(args) {}

    std::vector<at::Tensor> Forward(AutogradContext& ctx) override {
      Result out = [&] {
        at::AutoDispatchBelowADInplaceOrView guard;
        return std::apply(
            [&](auto&... a) { return kernel_.handle.redispatch(ks_ & c10::after_autograd_keyset, a...); },
            args_);
      }();
      if constexpr (HasSetupContext<G>::value) {
        Setup(ctx, out, std::index_sequence_for<Args...>{});
      }
      return Out::ToList(std::move(out));
    }

   private:
    template <size_t... K>
    void Setup(AutogradContext& ctx, const Result& out, std::index_sequence<K...>) {
      TupleReader<Tuple> r{args_};
      G::setup_context(&ctx, Param<Args, kParamOffset<K, Args...>>(r)..., Out::Original(out));
    }

    const AutogradKernel& kernel_;
    c10::DispatchKeySet ks_;
    Tuple& args_;
  };

  // Flat output gradients -> G::backward -> one gradient per autograd input.
  static std::vector<at::Tensor> Backward(AutogradContext& ctx, const AutogradOp& op,
                                          std::vector<at::Tensor>&& grads, const int64_t* counts) {
    auto result = Out::template Backward<G>(&ctx, grads);
    std::array<LeafGrad, kLeaves> leaves;
    if constexpr (IsTuple<decltype(result)>::value) {
      static_assert(std::tuple_size_v<decltype(result)> == sizeof...(Args),
                    "opforge: backward must return one gradient per parameter of the op, in order; "
                    "use opforge::NoGrad{} for parameters without one (see opforge::GradsFor).");
      Scatter(op, leaves, std::move(result), std::index_sequence_for<Args...>{});
    } else {
      static_assert(sizeof...(Args) == 1,
                    "opforge: backward must return a std::tuple with one gradient per parameter of "
                    "the op (see opforge::GradsFor).");
      Scatter(op, leaves, std::make_tuple(std::move(result)), std::index_sequence_for<Args...>{});
    }
    return Positions(op, leaves, counts, std::make_index_sequence<kLeaves>{});
  }

  template <class Tuple, size_t... K>
  static void Scatter(const AutogradOp& op, std::array<LeafGrad, kLeaves>& leaves, Tuple&& result,
                      std::index_sequence<K...>) {
    (PutGrad<std::decay_t<Args>>(op, K, leaves.data() + kParamOffset<K, Args...>,
                                 std::get<K>(std::forward<Tuple>(result))),
     ...);
  }

  template <size_t... I>
  static std::vector<at::Tensor> Positions(const AutogradOp& op, std::array<LeafGrad, kLeaves>& leaves,
                                           const int64_t* counts, std::index_sequence<I...>) {
    std::vector<at::Tensor> out;
    out.reserve(kLeaves);
    size_t tensor_leaf = 0;
    (
        [&] {
          if constexpr (kKinds[I] != TensorKind::kNone) {
            const int64_t n = counts ? counts[tensor_leaf] : 1;
            if constexpr (kKinds[I] == TensorKind::kTensor || kKinds[I] == TensorKind::kOptional) {
              if (n == 1) out.push_back(std::move(leaves[I].one));
            } else {
              auto& many = leaves[I].many;
              if (!many.empty() && many.size() != static_cast<size_t>(n)) {
                ThrowListGradSize(op, static_cast<size_t>(op.tensor_leaf_param[tensor_leaf]),
                                  static_cast<size_t>(n), many.size());
              }
              for (int64_t j = 0; j < n; ++j) {
                out.push_back(many.empty() ? at::Tensor() : std::move(many[static_cast<size_t>(j)]));
              }
            }
            ++tensor_leaf;
          }
        }(),
        ...);
    return out;
  }
};

template <class G, class R, class... Args>
struct AutogradRegistrar<G, R(Args...)> {
  static_assert(CheckAutogradClass<G, R>::kOk);

  using Flat = typename Concat<typename ParamFlat<Args>::type...>::type;
  using Kernel = AutogradKernel<G, R, TypeList<Args...>, Flat>;

  template <size_t... K>
  static void TensorLeafParams(std::vector<int>& out, std::index_sequence<K...>) {
    size_t flat = 0;
    (
        [&] {
          for (size_t i = 0; i < ParamNode<Args>::kCount; ++i, ++flat) {
            if (Kernel::kKinds[flat] != TensorKind::kNone) out.push_back(static_cast<int>(K));
          }
        }(),
        ...);
  }

  static void Register(torch::Library& lib, const std::string& qualified) {
    auto* op = new AutogradOp();  // never freed: see AutogradOp
    PrepareAutogradOp(qualified, sizeof...(Args), *op);
    TensorLeafParams(op->tensor_leaf_param, std::index_sequence_for<Args...>{});
    op->dynamic = Kernel::Dynamic();
    op->backward = &Kernel::Backward;
    auto handle = c10::Dispatcher::singleton()
                      .findSchemaOrThrow(qualified.c_str(), "")
                      .template typed<typename Kernel::Signature>();
    for (c10::DispatchKey key : AutogradRuntimeKeys()) {
      lib.impl(qualified.c_str(), torch::dispatch(key, Kernel{op, handle}));
    }
  }
};

}  // namespace detail
}  // namespace opforge
