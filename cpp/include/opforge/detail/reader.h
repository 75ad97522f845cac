// A call's flat leaves read and written, once for both torch ABIs, over a
// `Slots` policy each ABI supplies: how slot I of a call is read as a wide
// value (opforge/detail/leaves.h) and how one is written.
//
//   struct Slots {
//     template <class W, size_t I> static W Get(Src& src);   // or const W&, to pass a tensor uncopied
//     template <class W> static void Put(Dst& dst, size_t i, const W& value);
//     static void PutNone(Dst& dst, size_t i);
//   };
//
//   Reader<StableSlots, StableIValue*> r{stack};
//   auto [x, cfg] = ReadParams<const Tensor&, const NormCfg&>(r);  // cfg rebuilt from slots 1 and 2
//   PutArgs<IValueSlots>(stack, x, cfg);                             // x, cfg.eps, cfg.gemma
#pragma once

#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "opforge/detail/leaves.h"
#include "opforge/detail/nodes.h"

namespace opforge::detail {

// Reads the leaves of one call, for Node<T>::Build.
template <class Slots, class Src>
struct Reader {
  Src& src;

  template <class T, size_t I>
  decltype(auto) Leaf() {
    return LeafTraits<T>::FromWide(Slots::template Get<LeafWide<T>, I>(src));
  }
  // A field of a present Optional[Struct]: its slot takes None (for an absent
  // struct), but a present struct must have the field.
  template <class T, size_t I>
  decltype(auto) LeafInOptional() {
    if constexpr (IsOptional<T>::value) {
      return Leaf<T, I>();
    } else {
      decltype(auto) v = Slots::template Get<std::optional<LeafWide<T>>, I>(src);
      if (!v.has_value()) ThrowMissingField();
      if constexpr (std::is_reference_v<decltype(v)>) {
        return LeafTraits<T>::FromWide(*v);
      } else {
        return LeafTraits<T>::FromWide(std::move(*v));
      }
    }
  }
  template <size_t I>
  bool Presence() {
    return Slots::template Get<bool, I>(src);
  }
};

// Parameter K (of type Arg, from slots Offset...): what reading it throws
// becomes a ParamError.
template <size_t K, class Arg, size_t Offset, class R>
decltype(auto) ReadParam(R& r) {
  try {
    return ParamNode<Arg>::template Build<Offset>(r);
  } catch (const std::exception& e) {
    throw ParamError(K, e.what());
  }
}

template <class... Args, class R, size_t... K>
std::tuple<std::decay_t<Args>...> ReadParamsImpl(R& r, std::index_sequence<K...>) {
  // Braced initialization reads the leaves in order.
  return std::tuple<std::decay_t<Args>...>{ReadParam<K, Args, kParamOffset<K, Args...>>(r)...};
}

// A kernel's parameters as values, structs rebuilt: what a boxed kernel
// calls its function with.
template <class... Args, class R>
std::tuple<std::decay_t<Args>...> ReadParams(R& r) {
  return ReadParamsImpl<Args...>(r, std::index_sequence_for<Args...>{});
}

template <class Slots, class T, class Dst>
void PutValue(Dst& dst, size_t i, const T& v);

template <class Slots, class S, class Dst, size_t... J>
void PutFields(Dst& dst, size_t i, const S& s, std::index_sequence<J...>) {
  (PutValue<Slots>(dst, i + StructNode<S>::template kOffset<J>, FieldOf<J>(s)), ...);
}

// Writes `v`, a parameter, field or return of type T, to slots i... (as many
// as Node<T>::kCount).
template <class Slots, class T, class Dst>
void PutValue(Dst& dst, size_t i, const T& v) {
  if constexpr (kIsStruct<T>) {
    PutFields<Slots>(dst, i, v, std::make_index_sequence<kNumFields<T>>{});
  } else if constexpr (IsOptionalStruct<T>::value) {
    using S = typename T::value_type;
    Slots::Put(dst, i, v.has_value());
    if (v.has_value()) {
      PutFields<Slots>(dst, i + 1, *v, std::make_index_sequence<kNumFields<S>>{});
    } else {
      for (size_t k = 0; k < StructNode<S>::kCount; ++k) Slots::PutNone(dst, i + 1 + k);
    }
  } else {
    Slots::Put(dst, i, LeafTraits<T>::ToWide(v));
  }
}

template <class Slots, class Dst, class... Args, size_t... K>
void PutArgsImpl(Dst& dst, std::index_sequence<K...>, const Args&... args) {
  (PutValue<Slots>(dst, kParamOffset<K, Args...>, args), ...);
}

// The flat arguments of a call given the op's own (struct) parameters.
template <class Slots, class Dst, class... Args>
void PutArgs(Dst& dst, const Args&... args) {
  PutArgsImpl<Slots>(dst, std::index_sequence_for<Args...>{}, args...);
}

// Results: none, a leaf, a std::tuple of leaves, or a struct of leaves.
template <class R>
constexpr size_t ResultCount() {
  if constexpr (std::is_void_v<R>) {
    return 0;
  } else if constexpr (kIsStruct<R>) {
    return kNumFields<R>;
  } else if constexpr (IsStdTupleOf<R>::value) {
    return std::tuple_size_v<R>;
  } else {
    return 1;
  }
}

template <class R, class Slots, class Src, size_t... I>
R ReadTuple(Src& src, std::index_sequence<I...>) {
  Reader<Slots, Src> r{src};
  return R{r.template Leaf<std::tuple_element_t<I, R>, I>()...};
}

// A call's results, from slots 0...
template <class R, class Slots, class Src>
R ReadResults(Src& src) {
  if constexpr (std::is_void_v<R>) {
    return;
  } else if constexpr (IsStdTupleOf<R>::value) {
    return ReadTuple<R, Slots>(src, std::make_index_sequence<std::tuple_size_v<R>>{});
  } else {
    Reader<Slots, Src> r{src};
    return Node<R>::template Build<0>(r);
  }
}

template <class Slots, class Dst, class R, size_t... I>
void WriteTuple(Dst& dst, const R& out, std::index_sequence<I...>) {
  (PutValue<Slots>(dst, I, std::get<I>(out)), ...);
}

// A kernel's results, to slots 0...
template <class Slots, class Dst, class R>
void WriteResults(Dst& dst, const R& out) {
  if constexpr (IsStdTupleOf<R>::value) {
    WriteTuple<Slots>(dst, out, std::make_index_sequence<std::tuple_size_v<R>>{});
  } else {
    PutValue<Slots>(dst, 0, out);
  }
}

}  // namespace opforge::detail
