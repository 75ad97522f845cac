// OPFORGE_STRUCT and OPFORGE_ENUM: what a C++ struct or enum must say to be a
// parameter type of an op. Torch-free; the same for both torch ABIs.
//
//   struct NormCfg { double eps = 1e-6; bool weight_offset = false; };
//   OPFORGE_STRUCT(NormCfg, eps, weight_offset);
//
//   enum class Act : int64_t { kSilu = 0, kGelu = 1 };
//   OPFORGE_ENUM(Act, kSilu, kGelu);
//
// The macros define functions found by argument-dependent lookup, so use them
// in the type's own namespace. A library registers its types under its op
// namespace (`liba.NormCfg`), so two libraries may each have a NormCfg.
#pragma once

#include <array>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "opforge/detail/pp.h"

namespace opforge {

template <class S, class M>
struct FieldRef {
  const char* name;
  M S::*member;
};

template <class S, class M>
constexpr FieldRef<S, M> MakeField(const char* name, M S::*member) {
  return {name, member};
}

namespace detail {

template <class T>
inline constexpr bool kAlwaysFalse = false;

template <class T, class = void>
struct IsStruct : std::false_type {};
template <class T>
struct IsStruct<T, std::void_t<decltype(opforge_reflect(static_cast<T*>(nullptr)))>> : std::true_type {};

template <class T, class = void>
struct IsEnum : std::false_type {};
template <class T>
struct IsEnum<T, std::void_t<decltype(opforge_reflect_enum(static_cast<T*>(nullptr)))>> : std::true_type {};

}  // namespace detail

template <class T>
inline constexpr bool kIsStruct = detail::IsStruct<T>::value;
template <class T>
inline constexpr bool kIsEnum = detail::IsEnum<T>::value;

namespace detail {

template <class S>
using FieldsTuple = decltype(opforge_reflect(static_cast<S*>(nullptr)));

template <class F>
struct FieldMember;
template <class S, class M>
struct FieldMember<FieldRef<S, M>> {
  using type = M;
};

// The type of field J of struct S.
template <class S, size_t J>
using FieldType = typename FieldMember<std::tuple_element_t<J, FieldsTuple<S>>>::type;

template <class S>
inline constexpr size_t kNumFields = std::tuple_size_v<FieldsTuple<S>>;

// Field J of `s`, by reference.
template <size_t J, class S>
constexpr decltype(auto) FieldOf(S& s) {
  constexpr auto fields = opforge_reflect(static_cast<std::remove_const_t<S>*>(nullptr));
  return s.*(std::get<J>(fields).member);
}

template <class S, size_t J>
constexpr const char* FieldName() {
  return std::get<J>(opforge_reflect(static_cast<S*>(nullptr))).name;
}

}  // namespace detail
}  // namespace opforge

// OPFORGE_STRUCT(Type, field, ...): Type becomes a schema type named after it.
#define OPFORGE_STRUCT(Type, ...) OPFORGE_STRUCT_NAMED(Type, #Type, __VA_ARGS__)

// OPFORGE_STRUCT_NAMED(Type, "Name", field, ...): the schema name is "Name".
// A dotted name ("mylib.Cfg") is taken as written, not put under the library.
#define OPFORGE_STRUCT_NAMED(Type, Name, ...)                                         \
  [[maybe_unused]] inline constexpr auto opforge_reflect(Type*) {                    \
    return std::make_tuple(OPFORGE_PP_MAP(OPFORGE_STRUCT_FIELD_, Type, __VA_ARGS__)); \
  }                                                                                  \
  [[maybe_unused]] inline constexpr const char* opforge_struct_name(Type*) { return Name; }
#define OPFORGE_STRUCT_FIELD_(Type, field) ::opforge::MakeField(#field, &Type::field)

// OPFORGE_ENUM(Type, A, B, ...): an enum usable as a schema type; it lowers to
// int (the underlying values) and Python sees an Enum with these members.
#define OPFORGE_ENUM(Type, ...) OPFORGE_ENUM_NAMED(Type, #Type, __VA_ARGS__)

#define OPFORGE_ENUM_NAMED(Type, Name, ...)                                            \
  [[maybe_unused]] inline auto opforge_reflect_enum(Type*) {                          \
    return std::array{OPFORGE_PP_MAP(OPFORGE_ENUM_MEMBER_, Type, __VA_ARGS__)};        \
  }                                                                                   \
  [[maybe_unused]] inline constexpr const char* opforge_enum_name(Type*) { return Name; }
#define OPFORGE_ENUM_MEMBER_(Type, member) std::pair<const char*, Type>(#member, Type::member)
