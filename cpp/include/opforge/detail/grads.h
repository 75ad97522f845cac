// Gradients written against a kernel's own (struct) signature, the same for
// both torch ABIs: what a C++ backward returns (GradsFor), a struct's
// gradient field by field (Grad<S>), and how they become flat leaf gradients.
// `opforge::Tensor` is the ABI's tensor type (opforge/library.h or
// opforge/stable/library.h).
#pragma once

#include <array>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "opforge/detail/nodes.h"

// Types holding tensors are as hidden as the tensor type: torch declares
// torch::stable::Tensor hidden (each library keeps its own copy), and GCC
// warns of a type more visible than its fields (-Wattributes).
#if defined(OPFORGE_STABLE_ABI) && defined(__GNUC__) && !defined(_WIN32)
#define OPFORGE_DETAIL_TENSOR_VISIBILITY_ __attribute__((visibility("hidden")))
#else
#define OPFORGE_DETAIL_TENSOR_VISIBILITY_
#endif

namespace opforge {
namespace detail {

// What a backward's errors name.
struct OpNames {
  std::string name;                      // "mylib::affine"
  std::vector<std::string> param_names;  // the kernel's parameters
};

[[noreturn]] inline void ThrowNonTensorGrad(const OpNames& op, size_t param) {
  throw std::invalid_argument(op.name + ": parameter '" + op.param_names.at(param) +
                              "': backward returned a defined gradient, but the parameter is not a Tensor. "
                              "Return opforge::NoGrad{} (or an undefined tensor) for it.");
}

[[noreturn]] inline void ThrowListGradSize(const OpNames& op, size_t param, size_t expected, size_t got) {
  throw std::invalid_argument(op.name + ": parameter '" + op.param_names.at(param) + "': backward returned " +
                              std::to_string(got) + " gradients for a list of " + std::to_string(expected) +
                              " tensors. Return one gradient per tensor (undefined where there is none), or an "
                              "empty list.");
}

}  // namespace detail

// The gradient of a parameter that has none (a scalar, an enum, a handle).
struct NoGrad {
  NoGrad() = default;
  NoGrad(std::nullopt_t) {}  // NOLINT: `return {grad, std::nullopt}` reads well
};

namespace detail {

// The gradient of one flat leaf: a tensor, or the tensors of a Tensor[] leaf.
struct OPFORGE_DETAIL_TENSOR_VISIBILITY_ LeafGrad {
  Tensor one;
  std::vector<Tensor> many;
};

[[noreturn]] inline void ThrowUnknownField(const std::string& struct_name, const char* method) {
  throw std::invalid_argument("opforge::Grad<" + struct_name + ">::" + method +
                              ": the field is not one of those listed in OPFORGE_STRUCT. Add it to the "
                              "OPFORGE_STRUCT(...) field list.");
}

}  // namespace detail

// A struct parameter's gradient, given field by field: its Tensor fields (and
// those of nested structs) get gradients, the others have none.
//
//   opforge::Grad<Cfg> g;
//   g.set(&Cfg::w, grad_w).set(&Cfg::inner, opforge::Grad<Inner>().set(&Inner::t, grad_t));
template <class S>
class OPFORGE_DETAIL_TENSOR_VISIBILITY_ Grad {
  static_assert(kIsStruct<S>, "opforge::Grad<S>: S must be an OPFORGE_STRUCT type.");

 public:
  static constexpr size_t kLeaves = detail::StructNode<S>::kCount;

  Grad() = default;
  // No gradient for any field: `return {gx, opforge::NoGrad{}}` for a struct
  // parameter, config structs without tensors included.
  Grad(NoGrad) {}  // NOLINT

  Grad& set(Tensor S::*field, Tensor grad) {
    leaves_[Offset(field, "set")].one = std::move(grad);
    return *this;
  }
  Grad& set(std::optional<Tensor> S::*field, Tensor grad) {
    leaves_[Offset(field, "set")].one = std::move(grad);
    return *this;
  }
  Grad& set(std::vector<Tensor> S::*field, std::vector<Tensor> grads) {
    leaves_[Offset(field, "set")].many = std::move(grads);
    return *this;
  }
  template <class T>
  Grad& set(T S::*field, const Grad<T>& grad) {
    Place(Offset(field, "set"), grad);
    return *this;
  }
  template <class T>
  Grad& set(std::optional<T> S::*field, const Grad<T>& grad) {
    Place(Offset(field, "set") + 1, grad);  // after the presence leaf
    return *this;
  }
  const Tensor& get(Tensor S::*field) const { return leaves_[Offset(field, "get")].one; }
  const Tensor& get(std::optional<Tensor> S::*field) const {
    return leaves_[Offset(field, "get")].one;
  }

  // Leaf gradients in the struct's flat order.
  const std::array<detail::LeafGrad, kLeaves>& leaves() const { return leaves_; }
  std::array<detail::LeafGrad, kLeaves>& leaves() { return leaves_; }

 private:
  template <class T>
  void Place(size_t offset, const Grad<T>& grad) {
    for (size_t i = 0; i < Grad<T>::kLeaves; ++i) leaves_[offset + i] = grad.leaves()[i];
  }

  // The first leaf of `field`, found among the reflected fields of S.
  template <class M>
  static size_t Offset(M S::*field, const char* method) {
    size_t found = kLeaves;
    FindField(field, found, std::make_index_sequence<detail::StructNode<S>::kFields>{});
    if (found == kLeaves) detail::ThrowUnknownField(detail::StructName<S>(), method);
    return found;
  }
  template <class M, size_t... J>
  static void FindField(M S::*field, size_t& found, std::index_sequence<J...>) {
    constexpr auto fields = opforge_reflect(static_cast<S*>(nullptr));
    (
        [&] {
          if constexpr (std::is_same_v<detail::FieldType<S, J>, M>) {
            if (std::get<J>(fields).member == field) found = detail::StructNode<S>::template kOffset<J>;
          }
        }(),
        ...);
  }

  std::array<detail::LeafGrad, kLeaves> leaves_;
};

namespace detail {

// Declarations only: GradOf<T> is the type an overload returns.
template <class T>
struct GradTag {};
template <class T>
std::conditional_t<kIsStruct<T>, Grad<T>, NoGrad> GradOfTag(GradTag<T>);  // a scalar, an enum, a handle: none
template <class T>
std::conditional_t<kIsStruct<T>, Grad<T>, NoGrad> GradOfTag(GradTag<std::optional<T>>);
Tensor GradOfTag(GradTag<Tensor>);
Tensor GradOfTag(GradTag<std::optional<Tensor>>);
std::vector<Tensor> GradOfTag(GradTag<std::vector<Tensor>>);

template <class Fn>
struct GradsForImpl;
template <class R, class... Args>
struct GradsForImpl<R(Args...)> {
  using type = std::tuple<decltype(GradOfTag(GradTag<std::decay_t<Args>>{}))...>;
};
template <class R, class... Args>
struct GradsForImpl<R (*)(Args...)> : GradsForImpl<R(Args...)> {};

}  // namespace detail

// The gradient type of a parameter of type T: Tensor for tensors,
// std::vector<Tensor> for Tensor[], Grad<S> for structs, NoGrad otherwise.
template <class T>
using GradOf = decltype(detail::GradOfTag(detail::GradTag<std::decay_t<T>>{}));

// What backward returns for a kernel `Fn`: one gradient per parameter.
//   GradsFor<Tensor(const Tensor&, const Cfg&, int64_t)>
//     == std::tuple<Tensor, Grad<Cfg>, NoGrad>
template <class Fn>
using GradsFor = typename detail::GradsForImpl<std::decay_t<Fn>>::type;

namespace detail {

// Outputs: an op with a backward returns Tensor, a tuple of Tensors,
// Tensor[] or a struct whose fields are all Tensors (which travels as a tuple).
template <class R>
struct Outputs {
  using Flat = typename Ret<R>::Flat;

  template <size_t... I>
  static constexpr bool AllTensors(std::index_sequence<I...>) {
    return (std::is_same_v<std::tuple_element_t<I, Flat>, Tensor> && ...);
  }
  static constexpr bool Supported() {
    if constexpr (IsStdTupleOf<Flat>::value) {
      return AllTensors(std::make_index_sequence<std::tuple_size_v<Flat>>{});
    } else {
      return std::is_same_v<R, Tensor> || std::is_same_v<R, std::vector<Tensor>>;
    }
  }
  static constexpr bool kSupported = Supported();

  // The outputs as autograd's flat list, and back.
  static std::vector<Tensor> ToList(Flat out) {
    if constexpr (IsStdTupleOf<Flat>::value) {
      return std::apply([](auto&... t) { return std::vector<Tensor>{std::move(t)...}; }, out);
    } else if constexpr (IsVector<Flat>::value) {
      return out;
    } else {
      return {std::move(out)};
    }
  }
  static Flat FromList(std::vector<Tensor>&& outs) {
    if constexpr (IsStdTupleOf<Flat>::value) {
      return std::apply([&](auto... i) { return Flat(std::move(outs[i])...); }, Indices());
    } else if constexpr (IsVector<Flat>::value) {
      return std::move(outs);
    } else {
      return std::move(outs[0]);
    }
  }

  // What setup_context gets: the kernel's own return.
  static decltype(auto) Original(const Flat& out) {
    if constexpr (kIsStruct<R>) {
      return Rebuild(out);
    } else {
      return (out);
    }
  }

  // G::backward with one gradient per output, in the return's own form.
  template <class G, class Ctx>
  static auto Backward(Ctx* ctx, std::vector<Tensor>& grads) {
    if constexpr (kIsStruct<R>) {
      return G::backward(ctx, Rebuild(grads));
    } else if constexpr (IsStdTupleOf<R>::value) {
      return std::apply([&](auto... i) { return G::backward(ctx, grads[i]...); }, Indices());
    } else if constexpr (IsVector<R>::value) {
      return G::backward(ctx, grads);
    } else {
      return G::backward(ctx, grads[0]);
    }
  }

 private:
  // (0, 1, ..., n - 1) as integral constants, for a tuple's n outputs.
  template <size_t... I>
  static auto IndicesOf(std::index_sequence<I...>) {
    return std::make_tuple(std::integral_constant<size_t, I>{}...);
  }
  static auto Indices() { return IndicesOf(std::make_index_sequence<std::tuple_size_v<Flat>>{}); }
  template <class List>
  static R Rebuild(const List& items) {
    return std::apply(
        [&](auto... j) {
          R s{};
          ((FieldOf<decltype(j)::value>(s) = Item<decltype(j)::value>(items)), ...);
          return s;
        },
        Indices());
  }
  template <size_t J>
  static const Tensor& Item(const Flat& t) {
    return std::get<J>(t);
  }
  template <size_t J>
  static const Tensor& Item(const std::vector<Tensor>& v) {
    return v[J];
  }
};

// ---------------------------------------------------------------------------
// Gradients returned by backward -> leaf gradients.

template <class P, class V>
void PutGrad(const OpNames& op, size_t param, LeafGrad* leaves, V&& value) {
  using T = std::decay_t<V>;
  if constexpr (std::is_same_v<T, NoGrad> || std::is_same_v<T, std::nullopt_t>) {
    return;
  } else if constexpr (std::is_same_v<P, Tensor> || std::is_same_v<P, std::optional<Tensor>>) {
    if constexpr (std::is_same_v<T, std::optional<Tensor>>) {
      if (value.has_value()) leaves[0].one = *std::forward<V>(value);
    } else {
      static_assert(std::is_convertible_v<V, Tensor>,
                    "opforge: the gradient of a Tensor parameter is an Tensor (or NoGrad).");
      leaves[0].one = std::forward<V>(value);
    }
  } else if constexpr (std::is_same_v<P, std::vector<Tensor>>) {
    static_assert(std::is_convertible_v<V, std::vector<Tensor>>,
                  "opforge: the gradient of a Tensor[] parameter is a std::vector<Tensor> (or NoGrad).");
    leaves[0].many = std::forward<V>(value);
  } else if constexpr (kIsStruct<P>) {
    static_assert(std::is_same_v<T, Grad<P>>,
                  "opforge: the gradient of a struct parameter S is an opforge::Grad<S> (or NoGrad).");
    for (size_t i = 0; i < Grad<P>::kLeaves; ++i) leaves[i] = value.leaves()[i];
  } else if constexpr (IsOptionalStruct<P>::value) {
    using S = typename P::value_type;
    static_assert(std::is_same_v<T, Grad<S>>,
                  "opforge: the gradient of an optional struct parameter S is an opforge::Grad<S> (or NoGrad).");
    for (size_t i = 0; i < Grad<S>::kLeaves; ++i) leaves[1 + i] = value.leaves()[i];
  } else {
    // Scalars, enums, handles: only "no gradient" is accepted.
    static_assert(std::is_same_v<T, Tensor>,
                  "opforge: a parameter that is not a Tensor has no gradient; return opforge::NoGrad{} for it.");
    if (value.defined()) ThrowNonTensorGrad(op, param);
  }
}

// The kernel parameter a flat leaf belongs to: LeafParam<const Tensor&, const Cfg&>(2) == 1.
template <class... Args>
size_t LeafParam(size_t leaf) {
  constexpr size_t counts[] = {ParamNode<Args>::kCount..., 0};
  size_t param = 0;
  for (size_t end = counts[0]; leaf >= end && param + 1 < sizeof...(Args); end += counts[++param]) {
  }
  return param;
}

template <class... Args, class Tuple, size_t... K>
void ScatterGrads(const OpNames& op, LeafGrad* leaves, Tuple&& result, std::index_sequence<K...>) {
  (PutGrad<std::decay_t<Args>>(op, K, leaves + kParamOffset<K, Args...>, std::get<K>(std::forward<Tuple>(result))),
   ...);
}

// G::backward on the outputs' gradients, as one gradient per flat leaf of
// the kernel `R(Args...)`.
template <class G, class R, class... Args, class Ctx>
std::array<LeafGrad, kLeafCount<Args...>> LeafGrads(Ctx* ctx, const OpNames& op, std::vector<Tensor>& grads) {
  auto result = Outputs<R>::template Backward<G>(ctx, grads);
  std::array<LeafGrad, kLeafCount<Args...>> leaves;
  if constexpr (IsStdTupleOf<decltype(result)>::value) {
    static_assert(std::tuple_size_v<decltype(result)> == sizeof...(Args),
                  "opforge: backward must return one gradient per parameter of the op, in order; use "
                  "opforge::NoGrad{} for parameters without one (see opforge::GradsFor).");
    ScatterGrads<Args...>(op, leaves.data(), std::move(result), std::index_sequence_for<Args...>{});
  } else {
    static_assert(sizeof...(Args) == 1,
                  "opforge: backward must return a std::tuple with one gradient per parameter of the op "
                  "(see opforge::GradsFor).");
    ScatterGrads<Args...>(op, leaves.data(), std::make_tuple(std::move(result)), std::index_sequence_for<Args...>{});
  }
  return leaves;
}

// The leaves' gradients as autograd takes them: `count(i)` tensors for leaf
// i (1 for a Tensor, a list's length, 0 for None or a scalar), each handed
// to `emit(i, j, grad)`, undefined where backward gave none.
template <class... Args, size_t N, class Count, class Emit>
void EmitGrads(const OpNames& op, std::array<LeafGrad, N>& leaves, Count&& count, Emit&& emit) {
  for (size_t i = 0; i < N; ++i) {
    const size_t n = count(i);
    auto& many = leaves[i].many;
    if (!many.empty() && many.size() != n) ThrowListGradSize(op, LeafParam<Args...>(i), n, many.size());
    for (size_t j = 0; j < n; ++j) {
      emit(i, j, many.empty() ? (j == 0 ? std::move(leaves[i].one) : Tensor()) : std::move(many[j]));
    }
  }
}

// What a C++ backward class must have, checked where an op declares it:
// `static ... backward(opforge::AutogradContext* ctx, <one gradient per
// output>)`, and `setup_context` if it saves anything.
template <class T, class = void>
struct HasSetupContext : std::false_type {};
template <class T>
struct HasSetupContext<T, std::void_t<decltype(&T::setup_context)>> : std::true_type {};
template <class T, class = void>
struct HasBackwardFn : std::false_type {};
template <class T>
struct HasBackwardFn<T, std::void_t<decltype(&T::backward)>> : std::true_type {};

template <class G, class R>
struct CheckAutogradClass {
  static_assert(HasBackwardFn<G>::value,
                "opforge: the autograd class needs `static ... backward(opforge::AutogradContext* ctx, "
                "<one gradient per output>)`.");
  static_assert(Outputs<R>::kSupported,
                "opforge: an op with a C++ backward returns a Tensor, a std::tuple of Tensors, "
                "std::vector<Tensor> or a struct whose fields are all Tensors.");
  static constexpr bool kOk = true;
};

}  // namespace detail
}  // namespace opforge
