// The leaf types of kernel parameters and struct fields, written once for
// both torch ABIs: each one's schema type and the wide type its value travels
// as (the schema's own type). How a slot holding a wide value is read or
// written is all an ABI adds (opforge/library.h, opforge/stable/slots.h).
//
//   LeafTraits<int32_t>::Schema() == "int"        Wide == int64_t
//   LeafTraits<std::optional<Act>>::Schema() == "Act?"   Wide == std::optional<int64_t>
//   LeafTraits<Tensor>::FromWide(t)               t itself, no copy
//
// A new leaf type is one line of the table below. Included by the ABI headers
// once they have said what opforge::Tensor and opforge::Device are.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "opforge/reflect.h"

namespace opforge {

template <class T>
class Handle;

namespace detail {

#define OPFORGE_UNSUPPORTED_TYPE_                                                                     \
  "opforge: this C++ type has no torch schema equivalent (the compiler names it in the 'In "        \
  "instantiation of' line above). Kernel parameters and struct fields may be: a tensor (const "     \
  "Tensor&, Tensor&, std::optional<Tensor>, std::vector<Tensor>), int64_t, int32_t, double, float, " \
  "bool, std::string, c10::ScalarType, c10::Device, c10::Layout, c10::MemoryFormat, "                \
  "std::vector<int64_t>, std::vector<double>, std::vector<bool>, std::optional of these, an "         \
  "OPFORGE_STRUCT or OPFORGE_ENUM type, or opforge::Handle<T>."

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <class T>
struct IsVector : std::false_type {};
template <class T>
struct IsVector<std::vector<T>> : std::true_type {};

// A Handle<T> leaf's value: the handle, or a symbolic int while torch.compile traces.
struct HandleId {
  int64_t id = 0;
  bool symbolic = false;
};

template <class T, class = void>
struct LeafTraits {
  static_assert(kAlwaysFalse<T>, OPFORGE_UNSUPPORTED_TYPE_);
};

// The wide type of leaf T: LeafWide<float> == double.
template <class T>
using LeafWide = typename LeafTraits<T>::Wide;

// A leaf that travels as itself; a slot's reference passes through uncopied.
template <class T>
struct SameWide {
  using Wide = T;
  template <class V>
  static V FromWide(V&& v) {
    return std::forward<V>(v);
  }
  static const T& ToWide(const T& v) { return v; }
};

// A narrower scalar or an enum, which travels as the schema's 64-bit type.
template <class T, class W>
struct NarrowWide {
  using Wide = W;
  static T FromWide(W v) { return static_cast<T>(v); }
  static W ToWide(T v) { return static_cast<W>(v); }
};

// The table: a leaf type, its schema type, how it travels.
#define OPFORGE_LEAF_(T, schema, ...)              \
  template <>                                      \
  struct LeafTraits<T> : __VA_ARGS__ {             \
    static std::string Schema() { return schema; } \
  }
OPFORGE_LEAF_(int64_t, "int", SameWide<int64_t>);
OPFORGE_LEAF_(int32_t, "int", NarrowWide<int32_t, int64_t>);
OPFORGE_LEAF_(double, "float", SameWide<double>);
OPFORGE_LEAF_(float, "float", NarrowWide<float, double>);
OPFORGE_LEAF_(bool, "bool", SameWide<bool>);
OPFORGE_LEAF_(std::string, "str", SameWide<std::string>);
OPFORGE_LEAF_(std::vector<int64_t>, "int[]", SameWide<std::vector<int64_t>>);
OPFORGE_LEAF_(std::vector<double>, "float[]", SameWide<std::vector<double>>);
OPFORGE_LEAF_(std::vector<bool>, "bool[]", SameWide<std::vector<bool>>);
OPFORGE_LEAF_(Tensor, "Tensor", SameWide<Tensor>);
OPFORGE_LEAF_(std::vector<Tensor>, "Tensor[]", SameWide<std::vector<Tensor>>);
OPFORGE_LEAF_(c10::ScalarType, "ScalarType", SameWide<c10::ScalarType>);
OPFORGE_LEAF_(Device, "Device", SameWide<Device>);
OPFORGE_LEAF_(c10::Layout, "Layout", SameWide<c10::Layout>);
OPFORGE_LEAF_(c10::MemoryFormat, "MemoryFormat", SameWide<c10::MemoryFormat>);
#undef OPFORGE_LEAF_

// The schema name of an enum as its macro gave it.
template <class E>
const char* EnumName() {
  return opforge_enum_name(static_cast<E*>(nullptr));
}

template <class E>
struct LeafTraits<E, std::enable_if_t<kIsEnum<E>>> : NarrowWide<E, int64_t> {
  static std::string Schema() { return EnumName<E>(); }
};

// LeafTraits<Handle<T>> is in opforge/handle.h.

// An optional leaf: None, or the leaf's wide value.
template <class T>
struct OptionalWide {
  using Inner = LeafTraits<T>;
  using Wide = std::optional<typename Inner::Wide>;
  template <class V>
  static std::optional<T> FromWide(V&& v) {
    if (!v.has_value()) return std::nullopt;
    return Inner::FromWide(*std::forward<V>(v));
  }
  static Wide ToWide(const std::optional<T>& v) {
    if (!v.has_value()) return std::nullopt;
    return Inner::ToWide(*v);
  }
};
template <class T>
struct LeafTraits<std::optional<T>, std::enable_if_t<!kIsStruct<T>>>
    : std::conditional_t<std::is_same_v<LeafWide<T>, T>, SameWide<std::optional<T>>, OptionalWide<T>> {
  static std::string Schema() { return LeafTraits<T>::Schema() + "?"; }
};

}  // namespace detail
}  // namespace opforge
