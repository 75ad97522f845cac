// OPFORGE_LIBRARY on libtorch's C++ API (docs/cpp_ops.md): struct, enum and
// handle parameters for ops written in C++, at the cost of a TORCH_LIBRARY op.
// For torch's stable ABI (one build for every torch), define
// OPFORGE_STABLE_ABI and include <opforge/opforge.h> instead
// (docs/stable_abi.md); the registrations read the same.
//
//   struct NormCfg { double eps = 1e-6; };
//   OPFORGE_STRUCT(NormCfg, eps);
//
//   void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, const NormCfg& cfg);
//
//   OPFORGE_LIBRARY(mylib, m) {
//     m.def("rms_norm(Tensor! out, Tensor x, Tensor w, NormCfg cfg) -> ()");
//     m.impl("rms_norm", c10::kCPU, &rms_norm);
//   }
//   // torch sees: mylib::rms_norm(Tensor(_0!) out, Tensor x, Tensor w, float cfg__eps=1e-06) -> ()
//
// The kernel torch calls has the flat signature; it rebuilds the struct on
// the stack and calls `rms_norm` (no heap allocation for scalar and tensor
// fields).
#pragma once

#ifdef OPFORGE_STABLE_ABI
#error "opforge/library.h is the libtorch C++ API mode; with OPFORGE_STABLE_ABI include <opforge/opforge.h>"
#endif

#include <ATen/core/Tensor.h>
#include <ATen/core/op_registration/op_registration.h>
#include <torch/library.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "opforge/detail/library_api.h"
#include "opforge/detail/nodes.h"
#include "opforge/detail/plan.h"
#include "opforge/handle.h"
#include "opforge/reflect.h"

namespace opforge {

// The tensor type of this ABI mode: code written against opforge::Tensor
// builds in both modes.
using Tensor = at::Tensor;

namespace detail {

// ---------------------------------------------------------------------------
// Leaf types of this ABI and how a flat argument becomes a field or parameter.
//   Flat:    the C++ type of the flat kernel parameter
//   OptFlat: the same inside an Optional[Struct] (made optional)

inline constexpr char kTensorSchema[] = "Tensor";
inline constexpr char kTensorListSchema[] = "Tensor[]";
inline constexpr char kScalarTypeSchema[] = "ScalarType";
inline constexpr char kDeviceSchema[] = "Device";
inline constexpr char kLayoutSchema[] = "Layout";
inline constexpr char kMemoryFormatSchema[] = "MemoryFormat";
template <>
struct LeafSchema<at::Tensor> : NamedLeaf<kTensorSchema> {};
template <>
struct LeafSchema<std::vector<at::Tensor>> : NamedLeaf<kTensorListSchema> {};
template <>
struct LeafSchema<c10::ScalarType> : NamedLeaf<kScalarTypeSchema> {};
template <>
struct LeafSchema<c10::Device> : NamedLeaf<kDeviceSchema> {};
template <>
struct LeafSchema<c10::Layout> : NamedLeaf<kLayoutSchema> {};
template <>
struct LeafSchema<c10::MemoryFormat> : NamedLeaf<kMemoryFormatSchema> {};

// A present Optional[Struct] must have its required fields.
template <class Opt>
const Opt& Present(const Opt& v) {
  TORCH_CHECK(v.has_value(),
              "opforge: an optional struct argument is set (its __is_set leaf is True) but one of "
              "its required fields is None; pass every field, or set __is_set to False.");
  return v;
}

template <class T, class = void>
struct Unboxed {
  static_assert(kAlwaysFalse<T>, OPFORGE_UNSUPPORTED_TYPE_);
};

// A leaf whose flat type is its own type.
template <class T>
struct SameUnboxed {
  using Flat = T;
  using OptFlat = std::optional<T>;
  static T Build(T v) { return v; }
  static T FromOpt(const std::optional<T>& v) { return *Present(v); }
};
template <>
struct Unboxed<int64_t> : SameUnboxed<int64_t> {};
template <>
struct Unboxed<double> : SameUnboxed<double> {};
template <>
struct Unboxed<bool> : SameUnboxed<bool> {};
template <>
struct Unboxed<c10::ScalarType> : SameUnboxed<c10::ScalarType> {};
template <>
struct Unboxed<c10::Device> : SameUnboxed<c10::Device> {};
template <>
struct Unboxed<c10::Layout> : SameUnboxed<c10::Layout> {};
template <>
struct Unboxed<c10::MemoryFormat> : SameUnboxed<c10::MemoryFormat> {};

// Narrower scalars travel as the schema's 64-bit types.
template <class T, class Wide>
struct NarrowUnboxed {
  using Flat = Wide;
  using OptFlat = std::optional<Wide>;
  static T Build(Wide v) { return static_cast<T>(v); }
  static T FromOpt(const std::optional<Wide>& v) { return static_cast<T>(*Present(v)); }
};
template <>
struct Unboxed<int32_t> : NarrowUnboxed<int32_t, int64_t> {};
template <>
struct Unboxed<float> : NarrowUnboxed<float, double> {};
template <class E>
struct Unboxed<E, std::enable_if_t<kIsEnum<E>>> : NarrowUnboxed<E, int64_t> {};

template <>
struct Unboxed<at::Tensor> {
  using Flat = const at::Tensor&;
  using OptFlat = const std::optional<at::Tensor>&;
  static const at::Tensor& Build(const at::Tensor& v) { return v; }
  static const at::Tensor& FromOpt(const std::optional<at::Tensor>& v) { return *Present(v); }
};
template <>
struct Unboxed<std::optional<at::Tensor>> {
  using Flat = const std::optional<at::Tensor>&;
  using OptFlat = const std::optional<at::Tensor>&;
  static const std::optional<at::Tensor>& Build(const std::optional<at::Tensor>& v) { return v; }
  static const std::optional<at::Tensor>& FromOpt(const std::optional<at::Tensor>& v) { return v; }
};
template <>
struct Unboxed<std::vector<at::Tensor>> {
  using Flat = at::TensorList;
  using OptFlat = const std::optional<at::TensorList>&;
  static std::vector<at::Tensor> Build(at::TensorList v) { return v.vec(); }
  static std::vector<at::Tensor> FromOpt(const std::optional<at::TensorList>& v) { return Present(v)->vec(); }
};
template <>
struct Unboxed<std::string> {
  using Flat = c10::string_view;
  using OptFlat = std::optional<c10::string_view>;
  static std::string Build(c10::string_view v) { return std::string(v); }
  static std::string FromOpt(const std::optional<c10::string_view>& v) { return std::string(*Present(v)); }
};
template <>
struct Unboxed<std::vector<int64_t>> {
  using Flat = c10::IntArrayRef;
  using OptFlat = at::OptionalIntArrayRef;
  static std::vector<int64_t> Build(c10::IntArrayRef v) { return v.vec(); }
  static std::vector<int64_t> FromOpt(at::OptionalIntArrayRef v) { return Present(v)->vec(); }
};
template <>
struct Unboxed<std::vector<double>> {
  using Flat = c10::ArrayRef<double>;
  using OptFlat = std::optional<c10::ArrayRef<double>>;
  static std::vector<double> Build(c10::ArrayRef<double> v) { return v.vec(); }
  static std::vector<double> FromOpt(const std::optional<c10::ArrayRef<double>>& v) { return Present(v)->vec(); }
};
// Handle leaves are SymInt: a graph input under torch.compile (docs/handles.md).
template <class T>
struct Unboxed<Handle<T>> {
  using Flat = c10::SymInt;
  using OptFlat = std::optional<c10::SymInt>;
  static Handle<T> Build(const c10::SymInt& v) {
    if (auto concrete = v.maybe_as_int()) return Handle<T>(*concrete);
    return Handle<T>::Symbolic();
  }
  static Handle<T> FromOpt(const std::optional<c10::SymInt>& v) { return Build(*Present(v)); }
};
// std::optional<leaf>: already optional, so unchanged inside Optional[Struct].
template <class T>
struct Unboxed<std::optional<T>, std::enable_if_t<!kIsStruct<T> && !std::is_same_v<T, at::Tensor>>> {
  using Inner = Unboxed<T>;
  using Flat = typename Inner::OptFlat;
  using OptFlat = typename Inner::OptFlat;
  static std::optional<T> Build(Flat v) {
    if (!v.has_value()) return std::nullopt;
    return Inner::FromOpt(v);
  }
  static std::optional<T> FromOpt(Flat v) { return Build(v); }
};

// The flat parameter types of a node: FlatOf<Lin>::type == TypeList<const Tensor&, ...>.
template <class T, bool InOptional = false, class = void>
struct FlatOf {
  using type = TypeList<std::conditional_t<InOptional, typename Unboxed<T>::OptFlat, typename Unboxed<T>::Flat>>;
};
template <class S, bool InOptional>
struct FlatOf<S, InOptional, std::enable_if_t<kIsStruct<S>>> {
  template <size_t... J>
  static auto Of(std::index_sequence<J...>) -> typename Concat<typename FlatOf<FieldType<S, J>, InOptional>::type...>::type;
  using type = decltype(Of(std::make_index_sequence<kNumFields<S>>{}));
};
template <class S, bool InOptional>
struct FlatOf<std::optional<S>, InOptional, std::enable_if_t<kIsStruct<S>>> {
  using type = typename Concat<TypeList<bool>, typename FlatOf<S, true>::type>::type;
};

// A kernel parameter's flat types: `at::Tensor&` stays a mutable reference,
// as TORCH_LIBRARY passes a `Tensor(a!)` argument.
template <class Arg>
struct ParamFlat {
  using type = typename FlatOf<std::remove_cv_t<std::remove_reference_t<Arg>>>::type;
};
template <>
struct ParamFlat<at::Tensor&> {
  using type = TypeList<at::Tensor&>;
};

// Reads leaves from the flat arguments of one call.
template <class Tuple>
struct TupleReader {
  Tuple& t;
  template <class T, size_t I>
  decltype(auto) Leaf() {
    return Unboxed<T>::Build(std::get<I>(t));
  }
  template <class T, size_t I>
  decltype(auto) LeafInOptional() {
    return Unboxed<T>::FromOpt(std::get<I>(t));
  }
  template <size_t I>
  bool Presence() {
    return std::get<I>(t);
  }
};

// Parameter K of a kernel, from the flat arguments.
template <class Arg, size_t Offset, class Reader>
decltype(auto) Param(Reader& r) {
  if constexpr (std::is_same_v<Arg, at::Tensor&>) {
    return std::get<Offset>(r.t);
  } else {
    return ParamNode<Arg>::template Build<Offset>(r);
  }
}

// ---------------------------------------------------------------------------
// The dispatcher-facing kernel: a functor with the flat signature.

template <class R, class ArgList, class FlatList>
struct StructKernel;

template <class R, class... Args, class... FlatArgs>
struct StructKernel<R, TypeList<Args...>, TypeList<FlatArgs...>> {
  using FnPtr = R (*)(Args...);
  using Result = typename Ret<R>::Flat;

  template <class Reader, size_t... K>
  static decltype(auto) Call(FnPtr fn, Reader& r, std::index_sequence<K...>) {
    return fn(Param<Args, kParamOffset<K, Args...>>(r)...);
  }

  Result operator()(FlatArgs... flat) const {
    auto t = std::forward_as_tuple(flat...);
    TupleReader<decltype(t)> r{t};
    if constexpr (std::is_void_v<R>) {
      Call(fn, r, std::index_sequence_for<Args...>{});
    } else if constexpr (kIsStruct<R>) {
      return Ret<R>::Flatten(Call(fn, r, std::index_sequence_for<Args...>{}));
    } else {
      return Call(fn, r, std::index_sequence_for<Args...>{});
    }
  }

  FnPtr fn;
};

template <class R, class... Args>
torch::CppFunction* MakeKernel(R (*fn)(Args...)) {
  using Flat = typename Concat<typename ParamFlat<Args>::type...>::type;
  return new torch::CppFunction(StructKernel<R, TypeList<Args...>, Flat>{fn});
}

// A dispatch key as torch names it: c10::kCUDA -> "CUDA".
std::string KeyName(c10::DeviceType device);
std::string KeyName(c10::DispatchKey key);

// Registers with libtorch's C++ API for the core (opforge/abi.h): one
// torch::Library, destroyed (so everything it registered is undone) if the
// block fails.
class UnstableBackend {
 public:
  UnstableBackend(torch::Library::Kind kind, const char* ns, std::optional<c10::DispatchKey> key,
                  const char* file, uint32_t line);
  OpforgeBackendV1 backend();
  // Kernels are made while the block runs and handed over at commit.
  void* Keep(torch::CppFunction* kernel) {
    kernels_.emplace_back(kernel);
    return kernel;
  }
  // Keeps the registrations for as long as the library is loaded.
  void Finish(bool ok);

 private:
  static char* Def(void* ctx, const char* schema);
  static char* Impl(void* ctx, const char* op, const char* key, void* kernel);
  static char* Autograd(void* ctx, const char* qualified, void* registrar);
  static void Rollback(void* ctx);
  static void Warn(void* ctx, const char* message);

  torch::Library::Kind kind_;
  std::string ns_;
  std::optional<c10::DispatchKey> key_;
  std::string file_;
  uint32_t line_;
  std::unique_ptr<torch::Library> lib_;
  std::vector<std::unique_ptr<torch::CppFunction>> kernels_;
};

// Registers G as the backward of `qualified` with the backend's library;
// see opforge/backward.h.
using AutogradRegistrarFn = void (*)(torch::Library& lib, const std::string& qualified);

template <class G, class Sig>
struct AutogradRegistrar;

template <class T, class = void>
struct IsComplete : std::false_type {};
template <class T>
struct IsComplete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};

struct UnstableMode {
  using Kernel = torch::CppFunction*;
  template <class R, class... Args>
  static void* MakeKernel(UnstableBackend& backend, R (*fn)(Args...)) {
    return backend.Keep(detail::MakeKernel(fn));
  }
  template <class G, class Sig>
  static void SetAutograd(LibraryPlan& plan, const std::string& op) {
    static_assert(IsComplete<AutogradRegistrar<G, Sig>>::value,
                  "opforge: include <opforge/backward.h> to declare a C++ backward.");
    plan.SetAutograd(op, reinterpret_cast<void*>(static_cast<AutogradRegistrarFn>(&AutogradRegistrar<G, Sig>::Register)));
  }
  static std::string Key(const std::string&, c10::DeviceType device) { return KeyName(device); }
  static std::string Key(const std::string&, c10::DispatchKey key) { return KeyName(key); }
};

}  // namespace detail

using Library = detail::LibraryApi<detail::UnstableMode, detail::UnstableBackend>;
using OpBuilder = detail::OpBuilderApi<detail::UnstableMode, detail::UnstableBackend>;
template <class Sig>
using TypedOpBuilder = detail::TypedOpBuilderApi<detail::UnstableMode, detail::UnstableBackend, Sig>;

namespace detail {

// Runs an OPFORGE_LIBRARY block at static initialization, then commits it.
// A failure never aborts the process: it is recorded (opforge.load_errors(),
// opforge.load_library raises it) and printed, and nothing stays registered.
class LibraryInit {
 public:
  LibraryInit(torch::Library::Kind kind, const char* ns, std::optional<c10::DispatchKey> key,
              void (*init)(Library&), const char* file, uint32_t line);
  // Empty when the block was committed; else what went wrong (also recorded
  // as a load error).
  const std::string& error() const { return error_; }

 private:
  UnstableBackend backend_;
  std::string error_;
};

}  // namespace detail

// A library block run when it is constructed rather than at load, e.g. from
// a function: its registrations last as long as the object.
//   opforge::LibraryBlock block(torch::Library::FRAGMENT, "mylib", std::nullopt,
//                               [](opforge::Library& m) { m.def(...); }, __FILE__, __LINE__);
//   if (!block.error().empty()) ...
using LibraryBlock = detail::LibraryInit;
}  // namespace opforge

#include "opforge/call.h"

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
