// The C++ front end (docs/cpp_ops.md): struct parameters and runner handles for ops
// written in C++, at the cost of a plain TORCH_LIBRARY op.
//
//   struct AttnCfg { double scale; bool causal = true; };
//   OPFORGE_STRUCT(AttnCfg, scale, causal);
//
//   at::Tensor attn(const at::Tensor& q, const at::Tensor& k, const AttnCfg& cfg);
//
//   OPFORGE_LIBRARY(mylib, m) {
//     m.def("attn(Tensor q, Tensor k, AttnCfg cfg) -> Tensor", &attn).symm_mem_args({"k"});
//   }
//   // registered: mylib::attn(Tensor q, Tensor k, float cfg__scale, bool cfg__causal) -> Tensor
//
// The kernel registered with the dispatcher has the flat signature; it
// rebuilds the struct on the stack and calls `attn` (no heap allocation for
// scalar and tensor fields).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/op_registration/op_registration.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "opforge/detail/pp.h"
#include "opforge/error.h"
#include "opforge/handles.h"
#include "opforge/spec.h"
#include "opforge/structs.h"
#include "opforge/tags.h"

namespace opforge {

// ---------------------------------------------------------------------------
// Reflection. OPFORGE_STRUCT / OPFORGE_ENUM define functions found by ADL in
// the type's namespace, so the macros work in any namespace.

template <class S, class M>
struct FieldRef {
  const char* name;
  M S::*member;
};

template <class S, class M>
constexpr FieldRef<S, M> MakeField(const char* name, M S::*member) {
  return {name, member};
}

// "mylib::AttnCfg" -> "mylib.AttnCfg": a name the schema grammar accepts.
std::string SchemaTypeName(const char* cpp_name);

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

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

}  // namespace detail

template <class T>
inline constexpr bool kIsStruct = detail::IsStruct<T>::value;
template <class T>
inline constexpr bool kIsEnum = detail::IsEnum<T>::value;

// ---------------------------------------------------------------------------
// Handles: `opforge::Handle<Runner>` parameters receive the object behind
// the int the dispatcher passes.

std::string DemangledName(const char* mangled);

template <class T>
std::string HandleTypeName() {
  static const std::string name = SchemaTypeName(DemangledName(typeid(T).name()).c_str());
  return name;
}

// Registers a C++ object for Handle<T> parameters; strong unless `weak`.
template <class T>
int64_t RegisterHandle(std::shared_ptr<T> object, bool weak = false) {
  return HandleTable::Global().Register(std::static_pointer_cast<void>(std::move(object)),
                                        HandleTypeName<T>(), weak);
}

template <class T>
class Handle {
 public:
  // Throws opforge::Error for a stale, released or wrong-type handle.
  explicit Handle(int64_t id)
      : id_(id), object_(std::static_pointer_cast<T>(HandleTable::Global().Resolve(id, HandleTypeName<T>()))) {}

  // What a kernel gets from the dispatcher (handle leaves are SymInt, see
  // docs/handles.md). While torch.compile traces, a fake (Meta) kernel gets a
  // symbolic handle: it has no object, and using it throws.
  explicit Handle(const c10::SymInt& id) {
    if (auto concrete = id.maybe_as_int()) *this = Handle(*concrete);
  }

  T& operator*() const { return *Object(); }
  T* operator->() const { return Object(); }
  T& get() const { return *Object(); }
  int64_t id() const {
    Object();
    return id_;
  }
  // True in a fake kernel under torch.compile.
  bool is_symbolic() const { return object_ == nullptr; }

 private:
  T* Object() const {
    if (!object_) {
      throw Error(ErrorKind::kValueError, "", "opforge::Handle<" + HandleTypeName<T>() + ">",
                  "is symbolic: a fake kernel runs while torch.compile traces, without the runner.",
                  "Compute the fake kernel's outputs from its other arguments.");
    }
    return object_.get();
  }

  int64_t id_ = 0;
  std::shared_ptr<T> object_;
};

namespace detail {

template <class T>
struct IsHandle : std::false_type {};
template <class T>
struct IsHandle<Handle<T>> : std::true_type {};

// ---------------------------------------------------------------------------
// Type lists.

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

// ---------------------------------------------------------------------------
// Leaves: how one C++ field/parameter type maps to a flat schema argument.
//   Flat:    the C++ type of the flat kernel parameter
//   OptFlat: the same inside an Optional[Struct] (made optional)
//   Schema:  the schema type text

template <class T, class = void>
struct Leaf {
  static_assert(kAlwaysFalse<T>,
                "opforge: this C++ type has no torch schema equivalent. Use at::Tensor, "
                "std::optional<at::Tensor>, std::vector<at::Tensor>, int64_t, int, double, float, "
                "bool, std::string, c10::ScalarType, c10::Device, c10::MemoryFormat, "
                "std::vector<int64_t>, std::vector<double>, std::optional of these, an "
                "OPFORGE_STRUCT or OPFORGE_ENUM type, or opforge::Handle<T>.");
};

// A present Optional[Struct] must have its required fields.
template <class Opt>
const Opt& Present(const Opt& v) {
  TORCH_CHECK(v.has_value(),
              "opforge: an optional struct argument is set (its __is_set leaf is True) but one of "
              "its required fields is None; pass every field, or set __is_set to False.");
  return v;
}

// A leaf whose flat type is its own type.
template <class T, const char* kName>
struct SameLeaf {
  using Flat = T;
  using OptFlat = std::optional<T>;
  static std::string Schema() { return kName; }
  static T Build(T v) { return v; }
  static T FromOpt(const std::optional<T>& v) { return *Present(v); }
};

inline constexpr char kTensorName[] = "Tensor";
inline constexpr char kIntName[] = "int";
inline constexpr char kFloatName[] = "float";
inline constexpr char kBoolName[] = "bool";
inline constexpr char kScalarTypeName[] = "ScalarType";
inline constexpr char kDeviceName[] = "Device";
inline constexpr char kMemoryFormatName[] = "MemoryFormat";
inline constexpr char kLayoutName[] = "Layout";

template <>
struct Leaf<at::Tensor> {
  using Flat = const at::Tensor&;
  using OptFlat = const std::optional<at::Tensor>&;
  static std::string Schema() { return "Tensor"; }
  static const at::Tensor& Build(const at::Tensor& v) { return v; }
  static const at::Tensor& FromOpt(const std::optional<at::Tensor>& v) { return *Present(v); }
};
template <>
struct Leaf<std::optional<at::Tensor>> {
  using Flat = const std::optional<at::Tensor>&;
  using OptFlat = const std::optional<at::Tensor>&;
  static std::string Schema() { return "Tensor?"; }
  static const std::optional<at::Tensor>& Build(const std::optional<at::Tensor>& v) { return v; }
  static const std::optional<at::Tensor>& FromOpt(const std::optional<at::Tensor>& v) { return v; }
};
template <>
struct Leaf<std::vector<at::Tensor>> {
  using Flat = at::TensorList;
  using OptFlat = const std::optional<at::TensorList>&;
  static std::string Schema() { return "Tensor[]"; }
  static std::vector<at::Tensor> Build(at::TensorList v) { return v.vec(); }
  static std::vector<at::Tensor> FromOpt(const std::optional<at::TensorList>& v) { return Present(v)->vec(); }
};
template <>
struct Leaf<int64_t> : SameLeaf<int64_t, kIntName> {};
template <>
struct Leaf<double> : SameLeaf<double, kFloatName> {};
template <>
struct Leaf<bool> : SameLeaf<bool, kBoolName> {};
template <>
struct Leaf<c10::ScalarType> : SameLeaf<c10::ScalarType, kScalarTypeName> {};
template <>
struct Leaf<c10::Device> : SameLeaf<c10::Device, kDeviceName> {};
template <>
struct Leaf<c10::MemoryFormat> : SameLeaf<c10::MemoryFormat, kMemoryFormatName> {};
template <>
struct Leaf<c10::Layout> : SameLeaf<c10::Layout, kLayoutName> {};

// Narrower scalars travel as the schema's 64-bit types.
template <class T, class Wide, const char* kName>
struct NarrowLeaf {
  using Flat = Wide;
  using OptFlat = std::optional<Wide>;
  static std::string Schema() { return kName; }
  static T Build(Wide v) { return static_cast<T>(v); }
  static T FromOpt(const std::optional<Wide>& v) { return static_cast<T>(*Present(v)); }
};
template <>
struct Leaf<int32_t> : NarrowLeaf<int32_t, int64_t, kIntName> {};
template <>
struct Leaf<float> : NarrowLeaf<float, double, kFloatName> {};

template <>
struct Leaf<std::string> {
  using Flat = c10::string_view;
  using OptFlat = std::optional<c10::string_view>;
  static std::string Schema() { return "str"; }
  static std::string Build(c10::string_view v) { return std::string(v); }
  static std::string FromOpt(const std::optional<c10::string_view>& v) { return std::string(*Present(v)); }
};
template <>
struct Leaf<std::vector<int64_t>> {
  using Flat = c10::IntArrayRef;
  using OptFlat = at::OptionalIntArrayRef;
  static std::string Schema() { return "int[]"; }
  static std::vector<int64_t> Build(c10::IntArrayRef v) { return v.vec(); }
  static std::vector<int64_t> FromOpt(at::OptionalIntArrayRef v) { return Present(v)->vec(); }
};
template <>
struct Leaf<std::vector<double>> {
  using Flat = c10::ArrayRef<double>;
  using OptFlat = std::optional<c10::ArrayRef<double>>;
  static std::string Schema() { return "float[]"; }
  static std::vector<double> Build(c10::ArrayRef<double> v) { return v.vec(); }
  static std::vector<double> FromOpt(const std::optional<c10::ArrayRef<double>>& v) { return Present(v)->vec(); }
};

template <class E>
struct Leaf<E, std::enable_if_t<kIsEnum<E>>> {
  using Flat = int64_t;
  using OptFlat = std::optional<int64_t>;
  static std::string Schema();
  static E Build(int64_t v) { return static_cast<E>(v); }
  static E FromOpt(const std::optional<int64_t>& v) { return static_cast<E>(*Present(v)); }
};

template <class T>
struct Leaf<Handle<T>> {
  using Flat = c10::SymInt;
  using OptFlat = std::optional<c10::SymInt>;
  static std::string Schema() { return "Handle(" + HandleTypeName<T>() + ")"; }
  static Handle<T> Build(const c10::SymInt& v) { return Handle<T>(v); }
  static Handle<T> FromOpt(const std::optional<c10::SymInt>& v) { return Handle<T>(*Present(v)); }
};

// std::optional<leaf>: already optional, so unchanged inside Optional[Struct].
template <class T>
struct Leaf<std::optional<T>,
            std::enable_if_t<!kIsStruct<T> && !std::is_same_v<T, at::Tensor>>> {
  using Inner = Leaf<T>;
  using Flat = typename Inner::OptFlat;
  using OptFlat = typename Inner::OptFlat;
  static std::string Schema() { return Inner::Schema() + "?"; }
  static std::optional<T> Build(Flat v) {
    if (!v.has_value()) return std::nullopt;
    return Inner::FromOpt(v);
  }
  static std::optional<T> FromOpt(Flat v) { return Build(v); }
};

// ---------------------------------------------------------------------------
// Nodes: a leaf, a struct or an optional struct, with the rules of the core's
// lowering (docs/python_ops.md). The flat signature derived here must match the schema
// the core emits; the dispatcher checks that at registration.

template <class T, class = void>
struct Node;

template <class T>
struct LeafNode {
  using Flat = TypeList<typename Leaf<T>::Flat>;
  using OptFlat = TypeList<typename Leaf<T>::OptFlat>;
  static constexpr size_t kCount = 1;
  static std::string Schema() { return Leaf<T>::Schema(); }
  static void Register() {
    if constexpr (kIsEnum<T>) RegisterEnum();
    if constexpr (IsOptional<T>::value) {
      if constexpr (kIsEnum<typename T::value_type>) Node<typename T::value_type>::Register();
    }
  }
  static void RegisterEnum();
  template <size_t I, class Tuple>
  static decltype(auto) Build(Tuple& t) {
    return Leaf<T>::Build(std::get<I>(t));
  }
  template <size_t I, class Tuple>
  static decltype(auto) BuildInOptional(Tuple& t) {
    return Leaf<T>::FromOpt(std::get<I>(t));
  }
};

template <class T, class = void>
struct FieldsOf;

template <class S>
using FieldsTuple = decltype(opforge_reflect(static_cast<S*>(nullptr)));

template <class F>
struct FieldMember;
template <class S, class M>
struct FieldMember<FieldRef<S, M>> {
  using type = M;
};

template <class S, size_t J>
using FieldType = typename FieldMember<std::tuple_element_t<J, FieldsTuple<S>>>::type;

// Offset of field J's first leaf, relative to the struct's first leaf.
template <class S, size_t J>
constexpr size_t FieldOffset() {
  if constexpr (J == 0) {
    return 0;
  } else {
    return FieldOffset<S, J - 1>() + Node<FieldType<S, J - 1>>::kCount;
  }
}

// Registers a struct; `defaults` (parallel to `fields`) are the values C++
// default member initializers give, checked against the field types.
void RegisterStructDef(const std::string& name, std::vector<FieldText> fields,
                       const std::vector<std::optional<Value>>& defaults = {});

// ---------------------------------------------------------------------------
// Field defaults. A default-constructible struct is default-initialized
// (`new (p) S`, no braces) into two buffers filled with different bytes: a
// scalar field whose bytes agree was written by a default member initializer
// (or the default constructor); one whose bytes differ has no default. Fields
// of class type (std::optional, std::string, std::vector) are always
// initialized, so their value is their default. docs/cpp_ops.md#defaults.

class DefaultProbe {
 public:
  DefaultProbe(size_t size, size_t align, void (*construct)(void*), void (*destroy)(void*));
  ~DefaultProbe();
  DefaultProbe(const DefaultProbe&) = delete;
  DefaultProbe& operator=(const DefaultProbe&) = delete;

  // False when the default constructor threw: the struct gets no defaults.
  bool ok() const { return ok_; }
  const void* object() const { return a_; }
  // True when bytes [offset, offset + size) are the same in both objects.
  bool Written(size_t offset, size_t size) const;

 private:
  size_t size_;
  size_t align_;
  void (*destroy_)(void*);
  void* a_;
  void* b_;
  bool ok_ = false;
};

template <class S>
void DefaultInitAt(void* p) {
  ::new (p) S;
}
template <class S>
void DestroyAt(void* p) {
  static_cast<S*>(p)->~S();
}

// The schema default of a field value; nullopt where the schema has no form
// for it (a Tensor, a struct, a handle, a device).
template <class M, class = void>
struct FieldDefault {
  static std::optional<Value> Get(const M&) { return std::nullopt; }
};
template <>
struct FieldDefault<bool> {
  static std::optional<Value> Get(bool v) { return Value::Bool(v); }
};
template <class I>
struct FieldDefault<I, std::enable_if_t<std::is_same_v<I, int64_t> || std::is_same_v<I, int32_t>>> {
  static std::optional<Value> Get(I v) { return Value::Int(static_cast<int64_t>(v)); }
};
template <class F>
struct FieldDefault<F, std::enable_if_t<std::is_same_v<F, double> || std::is_same_v<F, float>>> {
  static std::optional<Value> Get(F v) { return Value::Double(static_cast<double>(v)); }
};
template <class E>
struct FieldDefault<E, std::enable_if_t<kIsEnum<E> || std::is_same_v<E, c10::ScalarType>>> {
  static std::optional<Value> Get(E v) { return Value::Int(static_cast<int64_t>(v)); }
};
template <>
struct FieldDefault<std::string> {
  static std::optional<Value> Get(const std::string& v) { return Value::String(v); }
};
template <class T>
struct FieldDefault<std::vector<T>, std::enable_if_t<std::is_same_v<T, int64_t> || std::is_same_v<T, double>>> {
  static std::optional<Value> Get(const std::vector<T>& v) {
    std::vector<Value> items;
    for (T x : v) items.push_back(*FieldDefault<T>::Get(x));
    return Value::List(std::move(items));
  }
};
template <class T>
struct FieldDefault<std::optional<T>> {
  static std::optional<Value> Get(const std::optional<T>& v) {
    if (!v) return Value::None();
    return FieldDefault<T>::Get(*v);
  }
};

// Per field: its default, or nullopt when it has none (see DefaultProbe).
template <class S>
struct StructDefaults {
  template <class M>
  static std::optional<Value> Of(const DefaultProbe& probe, const S& s, M S::*member) {
    const M& value = s.*member;
    if constexpr (std::is_trivially_default_constructible_v<M>) {
      const size_t offset = static_cast<size_t>(reinterpret_cast<const char*>(&value) -
                                                reinterpret_cast<const char*>(&s));
      if (!probe.Written(offset, sizeof(M))) return std::nullopt;
    }
    return FieldDefault<M>::Get(value);
  }
  template <size_t... J>
  static std::vector<std::optional<Value>> Get(std::index_sequence<J...>) {
    std::vector<std::optional<Value>> out(sizeof...(J));
    // A struct that cannot be default-constructed has no defaults: there is
    // no object whose field values C++ would fill in.
    if constexpr (std::is_default_constructible_v<S> && std::is_destructible_v<S>) {
      DefaultProbe probe(sizeof(S), alignof(S), &DefaultInitAt<S>, &DestroyAt<S>);
      if (probe.ok()) {
        constexpr auto fields = opforge_reflect(static_cast<S*>(nullptr));
        const S& s = *static_cast<const S*>(probe.object());
        ((out[J] = Of(probe, s, std::get<J>(fields).member)), ...);
      }
    }
    return out;
  }
};
void RegisterEnumDef(const std::string& name, std::vector<std::string> members,
                     std::vector<int64_t> values);

template <class S>
struct StructNode {
  static constexpr size_t kFields = std::tuple_size_v<FieldsTuple<S>>;

  template <size_t... J>
  static auto FlatOf(std::index_sequence<J...>) ->
      typename Concat<typename Node<FieldType<S, J>>::Flat...>::type;
  template <size_t... J>
  static auto OptFlatOf(std::index_sequence<J...>) ->
      typename Concat<typename Node<FieldType<S, J>>::OptFlat...>::type;
  template <size_t... J>
  static constexpr size_t CountOf(std::index_sequence<J...>) {
    return (size_t{0} + ... + Node<FieldType<S, J>>::kCount);
  }

  using Flat = decltype(FlatOf(std::make_index_sequence<kFields>{}));
  using OptFlat = decltype(OptFlatOf(std::make_index_sequence<kFields>{}));
  static constexpr size_t kCount = CountOf(std::make_index_sequence<kFields>{});

  static std::string Name() { return SchemaTypeName(opforge_struct_name(static_cast<S*>(nullptr))); }
  static std::string Schema() { return Name(); }

  template <size_t... J>
  static void RegisterFields(std::index_sequence<J...>) {
    (Node<FieldType<S, J>>::Register(), ...);
    constexpr auto fields = opforge_reflect(static_cast<S*>(nullptr));
    RegisterStructDef(Name(),
                      {FieldText{std::get<J>(fields).name, Node<FieldType<S, J>>::Schema(), std::nullopt}...},
                      StructDefaults<S>::Get(std::index_sequence<J...>{}));
  }
  static void Register() {
    static const bool once = (RegisterFields(std::make_index_sequence<kFields>{}), true);
    (void)once;
  }

  template <size_t I, bool InOptional, class Tuple, size_t... J>
  static S BuildFields(Tuple& t, std::index_sequence<J...>) {
    constexpr auto fields = opforge_reflect(static_cast<S*>(nullptr));
    S s{};
    if constexpr (InOptional) {
      ((s.*(std::get<J>(fields).member) =
            Node<FieldType<S, J>>::template BuildInOptional<I + FieldOffset<S, J>()>(t)),
       ...);
    } else {
      ((s.*(std::get<J>(fields).member) =
            Node<FieldType<S, J>>::template Build<I + FieldOffset<S, J>()>(t)),
       ...);
    }
    return s;
  }
  template <size_t I, class Tuple>
  static S Build(Tuple& t) {
    return BuildFields<I, false>(t, std::make_index_sequence<kFields>{});
  }
  template <size_t I, class Tuple>
  static S BuildInOptional(Tuple& t) {
    return BuildFields<I, true>(t, std::make_index_sequence<kFields>{});
  }
};

// Optional[Struct]: a `bool` presence leaf, then the fields made optional.
template <class S>
struct OptionalStructNode {
  using Inner = StructNode<S>;
  using Flat = typename Concat<TypeList<bool>, typename Inner::OptFlat>::type;
  using OptFlat = Flat;
  static constexpr size_t kCount = 1 + Inner::kCount;
  static std::string Schema() { return Inner::Name() + "?"; }
  static void Register() { Inner::Register(); }
  template <size_t I, class Tuple>
  static std::optional<S> Build(Tuple& t) {
    if (!std::get<I>(t)) return std::nullopt;
    return Inner::template BuildInOptional<I + 1>(t);
  }
  template <size_t I, class Tuple>
  static std::optional<S> BuildInOptional(Tuple& t) {
    return Build<I>(t);
  }
};

template <class T>
struct IsOptionalStruct : std::false_type {};
template <class T>
struct IsOptionalStruct<std::optional<T>> : std::bool_constant<kIsStruct<T>> {};

template <class T>
struct Node<T, std::enable_if_t<!kIsStruct<T> && !IsOptionalStruct<T>::value>> : LeafNode<T> {};
template <class T>
struct Node<T, std::enable_if_t<kIsStruct<T>>> : StructNode<T> {};
template <class T>
struct Node<std::optional<T>, std::enable_if_t<kIsStruct<T>>> : OptionalStructNode<T> {};

template <class E>
std::string Leaf<E, std::enable_if_t<kIsEnum<E>>>::Schema() {
  return SchemaTypeName(opforge_enum_name(static_cast<E*>(nullptr)));
}

template <class T>
void LeafNode<T>::RegisterEnum() {
  static const bool once = [] {
    const auto members = opforge_reflect_enum(static_cast<T*>(nullptr));
    std::vector<std::string> names;
    std::vector<int64_t> values;
    for (const auto& [name, value] : members) {
      names.emplace_back(name);
      values.push_back(static_cast<int64_t>(value));
    }
    RegisterEnumDef(Leaf<T>::Schema(), std::move(names), std::move(values));
    return true;
  }();
  (void)once;
}

// ---------------------------------------------------------------------------
// Returns: a struct returns as a tuple of its leaves.

template <class R, class = void>
struct Ret {
  using Flat = R;
  static void Register() {}
};

template <class S>
struct Ret<S, std::enable_if_t<kIsStruct<S>>> {
  template <size_t... J>
  static auto TupleOf(std::index_sequence<J...>) -> std::tuple<FieldType<S, J>...>;
  using Flat = decltype(TupleOf(std::make_index_sequence<StructNode<S>::kFields>{}));
  static Flat Flatten(S&& s) { return FlattenImpl(std::move(s), std::make_index_sequence<StructNode<S>::kFields>{}); }
  template <size_t... J>
  static Flat FlattenImpl(S&& s, std::index_sequence<J...>) {
    constexpr auto fields = opforge_reflect(static_cast<S*>(nullptr));
    return Flat(std::move(s.*(std::get<J>(fields).member))...);
  }
  static void Register() { StructNode<S>::Register(); }
};

// ---------------------------------------------------------------------------
// The dispatcher-facing kernel: a functor with the flat signature.

template <class R, class ArgList, class FlatList>
struct StructKernel;

template <class R, class... Args, class... FlatArgs>
struct StructKernel<R, TypeList<Args...>, TypeList<FlatArgs...>> {
  using FnPtr = R (*)(Args...);
  using Result = typename Ret<R>::Flat;

  template <size_t K>
  static constexpr size_t ArgOffset() {
    if constexpr (K == 0) {
      return 0;
    } else {
      using Prev = std::decay_t<std::tuple_element_t<K - 1, std::tuple<Args...>>>;
      return ArgOffset<K - 1>() + Node<Prev>::kCount;
    }
  }

  template <class Tuple, size_t... K>
  static decltype(auto) Call(FnPtr fn, Tuple& t, std::index_sequence<K...>) {
    return fn(Node<std::decay_t<std::tuple_element_t<K, std::tuple<Args...>>>>::template Build<ArgOffset<K>()>(t)...);
  }

  Result operator()(FlatArgs... flat) const {
    auto t = std::forward_as_tuple(flat...);
    if constexpr (std::is_void_v<R>) {
      Call(fn, t, std::index_sequence_for<Args...>{});
    } else if constexpr (kIsStruct<R>) {
      return Ret<R>::Flatten(Call(fn, t, std::index_sequence_for<Args...>{}));
    } else {
      return Call(fn, t, std::index_sequence_for<Args...>{});
    }
  }

  FnPtr fn;
};

template <class R, class... Args>
torch::CppFunction MakeKernel(R (*fn)(Args...)) {
  (Node<std::decay_t<Args>>::Register(), ...);
  Ret<R>::Register();
  using Flat = typename Concat<typename Node<std::decay_t<Args>>::Flat...>::type;
  return torch::CppFunction(StructKernel<R, TypeList<Args...>, Flat>{fn});
}

}  // namespace detail

// Registers the struct types T (and what they contain) with the core, for
// schemas that name a struct no kernel signature mentions.
template <class... T>
void RegisterTypes() {
  (detail::Node<T>::Register(), ...);
}

class Library;

namespace detail {

// Defined in opforge/backward.h: registers G as the backward of an op whose
// kernel has the C++ signature Sig.
template <class G, class Sig>
struct AutogradRegistrar;

template <class T, class = void>
struct IsComplete : std::false_type {};
template <class T>
struct IsComplete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};

}  // namespace detail

// What `m.def(...)` returns, for per-argument tags and a C++ backward.
class OpBuilder {
 public:
  OpBuilder(Library& lib, std::string name) : lib_(lib), name_(std::move(name)) {}
  // Declares arguments that must live in symmetric memory (docs/symm_mem.md).
  // Names may be parameters (a struct expands to its Tensor leaves) or leaves.
  OpBuilder& symm_mem_args(const std::vector<std::string>& names);
  // Attaches `tag` to arguments; the generic form of symm_mem_args.
  OpBuilder& arg_tag(const std::string& tag, const std::vector<std::string>& names);
  // Declares the op's backward, written against the kernel's C++ signature
  // `Sig` (e.g. `at::Tensor(const at::Tensor&, const Cfg&)`); see
  // opforge/backward.h and docs/cpp_ops.md.
  template <class G, class Sig>
  OpBuilder& autograd() {
    static_assert(detail::IsComplete<detail::AutogradRegistrar<G, Sig>>::value,
                  "opforge: include <opforge/backward.h> to declare a C++ backward.");
    detail::AutogradRegistrar<G, Sig>::Register(lib_, name_);
    return *this;
  }
  const std::string& name() const { return name_; }

 private:
  Library& lib_;
  std::string name_;  // "ns::op"
};

// What `m.def(schema, &kernel)` returns: it knows the kernel's signature, so
// `.autograd<G>()` needs no other argument.
template <class Sig>
class TypedOpBuilder : public OpBuilder {
 public:
  using OpBuilder::OpBuilder;
  explicit TypedOpBuilder(OpBuilder builder) : OpBuilder(std::move(builder)) {}
  TypedOpBuilder& symm_mem_args(const std::vector<std::string>& names) {
    OpBuilder::symm_mem_args(names);
    return *this;
  }
  TypedOpBuilder& arg_tag(const std::string& tag, const std::vector<std::string>& names) {
    OpBuilder::arg_tag(tag, names);
    return *this;
  }
  template <class G>
  TypedOpBuilder& autograd() {
    OpBuilder::autograd<G, Sig>();
    return *this;
  }
};

class Library {
 public:
  Library(torch::Library& lib, std::string ns) : lib_(lib), ns_(std::move(ns)) {}

  // Defines an op from a schema that may name registered structs, enums,
  // Literal[...] and Handle(T); the flat schema is what torch registers.
  OpBuilder def(const std::string& schema);

  // Defines an op and its kernel for every backend (as TORCH_LIBRARY's
  // def(schema, fn) does: a CompositeImplicitAutograd kernel).
  // An op with a Handle parameter gets a CompositeExplicitAutograd kernel
  // instead: torch.compile must not trace into the runner, so the op stays
  // opaque and needs a fake kernel (`fake()`), as in docs/handles.md.
  template <class R, class... Args>
  TypedOpBuilder<R(Args...)> def(const std::string& schema, R (*fn)(Args...)) {
    auto kernel = detail::MakeKernel(fn);
    OpBuilder builder = def(schema);
    if (HasHandleLeaf(builder.name())) {
      lib_.impl(OpName(builder.name()).c_str(),
                torch::dispatch(c10::DispatchKey::CompositeExplicitAutograd, std::move(kernel)));
    } else {
      lib_.impl(OpName(builder.name()).c_str(), std::move(kernel));
    }
    return TypedOpBuilder<R(Args...)>(std::move(builder));
  }

  // A kernel for the dispatch key of an OPFORGE_LIBRARY_IMPL block.
  template <class R, class... Args>
  Library& impl(const std::string& name, R (*fn)(Args...)) {
    lib_.impl(name.c_str(), detail::MakeKernel(fn));
    return *this;
  }

  // A kernel for one device type or dispatch key: kCUDA, DispatchKey::Meta, ...
  template <class R, class... Args>
  Library& impl(const std::string& name, c10::DeviceType device, R (*fn)(Args...)) {
    lib_.impl(name.c_str(), torch::dispatch(device, detail::MakeKernel(fn)));
    return *this;
  }
  template <class R, class... Args>
  Library& impl(const std::string& name, c10::DispatchKey key, R (*fn)(Args...)) {
    lib_.impl(name.c_str(), torch::dispatch(key, detail::MakeKernel(fn)));
    return *this;
  }

  // The shape function torch.compile and fake tensors use (a Meta kernel).
  template <class R, class... Args>
  Library& fake(const std::string& name, R (*fn)(Args...)) {
    return impl(name, c10::DispatchKey::Meta, fn);
  }

  torch::Library& torch_library() { return lib_; }
  const std::string& ns() const { return ns_; }

 private:
  friend class OpBuilder;
  static std::string OpName(const std::string& qualified) {
    return qualified.substr(qualified.find("::") + 2);
  }
  static bool HasHandleLeaf(const std::string& qualified);

  torch::Library& lib_;
  std::string ns_;
};

namespace detail {

// Runs an OPFORGE_LIBRARY block at static initialization.
class LibraryInit {
 public:
  LibraryInit(torch::Library::Kind kind, const char* ns, std::optional<c10::DispatchKey> key,
              void (*init)(Library&), const char* file, uint32_t line);

 private:
  torch::Library lib_;
};

}  // namespace detail
}  // namespace opforge

// OPFORGE_STRUCT(Type, field, ...): makes Type usable as a schema type named
// after it ("Type"; "a::Type" becomes "a.Type"). Use it in Type's namespace.
#define OPFORGE_STRUCT(Type, ...) OPFORGE_STRUCT_NAMED(Type, #Type, __VA_ARGS__)

#define OPFORGE_STRUCT_NAMED(Type, Name, ...)                                         \
  [[maybe_unused]] inline constexpr auto opforge_reflect(Type*) {                    \
    return std::make_tuple(OPFORGE_PP_MAP(OPFORGE_STRUCT_FIELD_, Type, __VA_ARGS__)); \
  }                                                                                  \
  [[maybe_unused]] inline const char* opforge_struct_name(Type*) { return Name; }
#define OPFORGE_STRUCT_FIELD_(Type, field) ::opforge::MakeField(#field, &Type::field)

// OPFORGE_ENUM(Type, A, B, ...): an enum usable as a schema type; it lowers to
// int (the underlying values) and Python sees an Enum with these members.
#define OPFORGE_ENUM(Type, ...) OPFORGE_ENUM_NAMED(Type, #Type, __VA_ARGS__)

#define OPFORGE_ENUM_NAMED(Type, Name, ...)                                            \
  [[maybe_unused]] inline auto opforge_reflect_enum(Type*) {                          \
    return std::array{OPFORGE_PP_MAP(OPFORGE_ENUM_MEMBER_, Type, __VA_ARGS__)};        \
  }                                                                                   \
  [[maybe_unused]] inline const char* opforge_enum_name(Type*) { return Name; }
#define OPFORGE_ENUM_MEMBER_(Type, member) std::pair<const char*, Type>(#member, Type::member)

#define OPFORGE_UID_(prefix, line) OPFORGE_PP_CAT(prefix, line)

// OPFORGE_LIBRARY(ns, m) { m.def(...); } -- like TORCH_LIBRARY (a fragment,
// so Python and C++ ops can share a namespace).
#define OPFORGE_LIBRARY(ns, m)                                                          \
  static void OPFORGE_PP_CAT(opforge_library_init_, ns)(::opforge::Library&);          \
  static const ::opforge::detail::LibraryInit OPFORGE_UID_(opforge_library_, __LINE__)( \
      torch::Library::FRAGMENT, #ns, std::nullopt,                                     \
      &OPFORGE_PP_CAT(opforge_library_init_, ns), __FILE__, __LINE__);                  \
  void OPFORGE_PP_CAT(opforge_library_init_, ns)(::opforge::Library & m)

// OPFORGE_LIBRARY_IMPL(ns, CUDA, m) { m.impl("op", &op_cuda); }
#define OPFORGE_LIBRARY_IMPL(ns, key, m)                                                  \
  static void OPFORGE_PP_CAT(OPFORGE_PP_CAT(opforge_library_impl_, ns), key)(::opforge::Library&); \
  static const ::opforge::detail::LibraryInit OPFORGE_UID_(opforge_library_impl_, __LINE__)(    \
      torch::Library::IMPL, #ns, c10::DispatchKey::key,                                  \
      &OPFORGE_PP_CAT(OPFORGE_PP_CAT(opforge_library_impl_, ns), key), __FILE__, __LINE__); \
  void OPFORGE_PP_CAT(OPFORGE_PP_CAT(opforge_library_impl_, ns), key)(::opforge::Library & m)
