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
#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/flat_hash_map.h>

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

// Flat arguments as autograd sees them.
template <class F>
constexpr char TensorsIn() {
  using T = std::decay_t<F>;
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return kOneTensor;
  } else if constexpr (std::is_same_v<T, std::optional<at::Tensor>> || std::is_same_v<T, at::TensorList> ||
                       std::is_same_v<T, std::optional<at::TensorList>>) {
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
  } else if constexpr (std::is_same_v<T, at::TensorList>) {
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
    G::setup_context(&ctx, Param<Args, kParamOffset<K, Args...>>(r)..., Out::Original(out));
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

  static void Register(torch::Library& lib, const std::string& qualified) {
    auto* op = new AutogradOp();  // never freed: see AutogradOp
    PrepareAutogradOp(qualified, sizeof...(Args), *op);
    op->backward = &Kernel::Backward;
    auto handle = c10::Dispatcher::singleton()
                      .findSchemaOrThrow(qualified.c_str(), "")
                      .template typed<typename Kernel::Signature>();
    for (c10::DispatchKey key : AutogradRuntimeKeys()) lib.impl(qualified.c_str(), torch::dispatch(key, Kernel{op, handle}));
  }
};

}  // namespace detail
}  // namespace opforge
