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
// kernels, the Meta kernel). The op's Autograd kernel and graph node are
// opforge's torch layer's, the same for both ABIs (a torch::autograd::Function,
// so saved-tensor checks and gradient materialization are torch's); this
// header adapts G to them. Nothing on either path is Python.
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/GradMode.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "opforge/detail/autograd_op.h"

namespace opforge {
namespace detail {

// Flat arguments as autograd sees them (a kernel's own signature may take a
// Tensor[] as std::vector<at::Tensor>).
template <class F>
constexpr char TensorsIn() {
  using T = std::decay_t<F>;
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return kOneTensor;
  } else if constexpr (std::is_same_v<T, std::optional<at::Tensor>> || std::is_same_v<T, at::TensorList> ||
                       std::is_same_v<T, std::vector<at::Tensor>> || std::is_same_v<T, std::optional<at::TensorList>>) {
    return kSomeTensors;
  } else {
    return kNoTensor;
  }
}

// The tensors of one flat argument: `f(tensor)` for each.
template <class F, class Fn>
void ForEachTensorOf(const F& v, Fn&& f) {
  using T = std::decay_t<F>;
  if constexpr (std::is_same_v<T, at::Tensor>) {
    f(v);
  } else if constexpr (std::is_same_v<T, std::optional<at::Tensor>>) {
    if (v.has_value()) f(*v);
  } else if constexpr (std::is_same_v<T, at::TensorList> || std::is_same_v<T, std::vector<at::Tensor>>) {
    for (const auto& t : v) f(t);
  } else if constexpr (std::is_same_v<T, std::optional<at::TensorList>>) {
    if (v.has_value()) {
      for (const auto& t : *v) f(t);
    }
  }
}

template <class F>
bool RequiresGrad(const F& v) {
  bool any = false;
  ForEachTensorOf(v, [&](const at::Tensor& t) { any = any || t.requires_grad(); });
  return any;
}

// The op's Autograd kernel, with its flat signature: below autograd when no
// input needs a gradient, else the forward inside the op's graph node.
template <class G, class R, class ArgList, class FlatList>
struct AutogradKernel;

template <class G, class R, class... Args, class... FlatArgs>
struct AutogradKernel<G, R, TypeList<Args...>, TypeList<FlatArgs...>> {
  using Out = Outputs<R>;
  using Result = typename Out::Flat;
  using Signature = Result(FlatArgs...);

  const AutogradOp* op;
  c10::TypedOperatorHandle<Signature> handle;

  Result operator()(c10::DispatchKeySet ks, FlatArgs... flat) const {
    const auto below = ks & c10::after_autograd_keyset;
    if (!c10::GradMode::is_enabled() || !(RequiresGrad(flat) || ...)) {
      at::AutoDispatchBelowADInplaceOrView guard;
      return handle.redispatch(below, flat...);
    }
    std::vector<at::Tensor> inputs;
    inputs.reserve(sizeof...(FlatArgs));
    std::vector<int64_t> counts;
    if (op->dynamic) counts.assign(sizeof...(FlatArgs), 0);
    size_t i = 0;
    (Collect(flat, i++, inputs, counts), ...);
    auto args = std::forward_as_tuple(flat...);
    auto forward = [&](AutogradContext& ctx) {
      Result out = [&] {
        at::AutoDispatchBelowADInplaceOrView guard;
        return handle.redispatch(below, flat...);
      }();
      if constexpr (HasSetupContext<G>::value) Setup(ctx, args, out, std::index_sequence_for<Args...>{});
      return Out::ToList(std::move(out));
    };
    return Out::FromList(ApplyAutograd(*op, inputs, counts, forward));
  }

  template <class F>
  void Collect(const F& v, size_t i, std::vector<at::Tensor>& inputs, std::vector<int64_t>& counts) const {
    if constexpr (TensorsIn<F>() != kNoTensor) {
      const size_t before = inputs.size();
      ForEachTensorOf(v, [&](const at::Tensor& t) {
        if (t.defined()) inputs.push_back(t);
      });
      if (!counts.empty()) {
        counts[i] = static_cast<int64_t>(inputs.size() - before);
      } else if (inputs.size() == before) {
        ThrowUndefinedInput(*op, i);
      }
    }
  }

  template <class Tuple, size_t... K>
  static void Setup(AutogradContext& ctx, Tuple& args, const Result& out, std::index_sequence<K...>) {
    Reader<UnboxedSlots, Tuple> r{args};
    G::setup_context(&ctx, Param<K, Args, kParamOffset<K, Args...>>(r)..., Out::Original(out));
  }

  // Flat output gradients -> G::backward -> one gradient per autograd input.
  static std::vector<at::Tensor> Backward(AutogradContext& ctx, const AutogradOp& op, std::vector<at::Tensor>&& grads,
                                          const int64_t* counts) {
    auto leaves = LeafGrads<G, R, Args...>(&ctx, op, grads);
    std::vector<at::Tensor> out;
    EmitGrads<Args...>(op, leaves, [&](size_t i) { return op.Tensors(counts, i); },
                       [&](size_t, size_t, at::Tensor&& g) { out.push_back(std::move(g)); });
    return out;
  }
};

template <class G, class R, class... Args>
struct AutogradRegistrar<G, R(Args...)> {
  static_assert(CheckAutogradClass<G, R>::kOk);
  using Kernel = AutogradKernel<G, R, TypeList<Args...>, typename Concat<typename ParamFlat<Args>::type...>::type>;
  using OwnKernel = AutogradKernel<G, R, TypeList<Args...>, TypeList<Args...>>;

  // Takes the C++ signature the op's kernels recorded: the kernel's own
  // (opforge/library.h, kOwnSignature) or opforge's flat one.
  static void Register(torch::Library& lib, const std::string& qualified) {
    const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(qualified.c_str(), "");
    if constexpr (kOwnSignature<R, Args...>) {
      if (!Fits<typename Kernel::Signature>(op)) return RegisterAs<OwnKernel>(lib, qualified, op);
    }
    RegisterAs<Kernel>(lib, qualified, op);
  }

  template <class K>
  static void RegisterAs(torch::Library& lib, const std::string& qualified, const c10::OperatorHandle& op) {
    auto* autograd_op = new AutogradOp();  // never freed: see AutogradOp
    PrepareAutogradOp(qualified, sizeof...(Args), *autograd_op);
    autograd_op->backward = &K::Backward;
    auto handle = op.typed<typename K::Signature>();
    for (c10::DispatchKey key : AutogradRuntimeKeys()) {
      lib.impl(qualified.c_str(), torch::dispatch(key, K{autograd_op, handle}));
    }
  }
};

}  // namespace detail
}  // namespace opforge
