// Type lists and the one fold every flat-leaf offset is computed with.
#pragma once

#include <cstddef>

namespace opforge::detail {

template <class... T>
struct TypeList {};

template <class... L>
struct Concat;
template <>
struct Concat<> {
  using type = TypeList<>;
};
template <class... A>
struct Concat<TypeList<A...>> {
  using type = TypeList<A...>;
};
template <class... A, class... B, class... Rest>
struct Concat<TypeList<A...>, TypeList<B...>, Rest...> {
  using type = typename Concat<TypeList<A..., B...>, Rest...>::type;
};

// The flat-leaf offset of item K of a list whose items have `Counts` leaves:
// LeafOffset<2, 1, 3, 2>() == 4. Struct fields, kernel parameters and
// backward parameters all use this one fold.
template <size_t K, size_t... Counts>
constexpr size_t LeafOffset() {
  constexpr size_t counts[] = {Counts..., 0};
  size_t offset = 0;
  for (size_t i = 0; i < K; ++i) offset += counts[i];
  return offset;
}

}  // namespace opforge::detail
