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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace opforge {
// The tensor and device types of this ABI mode: code written against
// opforge::Tensor builds in both modes.
using Tensor = at::Tensor;
using Device = c10::Device;
}  // namespace opforge

#include "opforge/detail/library_api.h"
#include "opforge/detail/macros.h"
#include "opforge/detail/nodes.h"
#include "opforge/detail/plan.h"
#include "opforge/detail/reader.h"
#include "opforge/handle.h"
#include "opforge/reflect.h"

namespace opforge {
namespace detail {

// ---------------------------------------------------------------------------
// Slots: an unboxed kernel receives each leaf's wide value in TORCH_LIBRARY's
// argument type (IntArrayRef for int[], string_view for str, ...).

template <class W>
struct Tag {};
// Declarations only: UnboxedArg<W> is the type an overload returns.
template <class W>
W ArgOf(Tag<W>);  // int, float, bool, ScalarType, Device, Layout, MemoryFormat: itself
const at::Tensor& ArgOf(Tag<at::Tensor>);
at::TensorList ArgOf(Tag<std::vector<at::Tensor>>);
c10::string_view ArgOf(Tag<std::string>);
c10::IntArrayRef ArgOf(Tag<std::vector<int64_t>>);
c10::ArrayRef<double> ArgOf(Tag<std::vector<double>>);
template <class T>
const c10::List<T>& ArgOf(Tag<std::vector<T>>);  // other lists: bool[]
c10::SymInt ArgOf(Tag<HandleId>);  // a graph input under torch.compile (docs/handles.md)
template <class W>
std::optional<std::decay_t<decltype(ArgOf(Tag<W>{}))>> ArgOf(Tag<std::optional<W>>);
const std::optional<at::Tensor>& ArgOf(Tag<std::optional<at::Tensor>>);
const std::optional<at::TensorList>& ArgOf(Tag<std::optional<std::vector<at::Tensor>>>);
at::OptionalIntArrayRef ArgOf(Tag<std::optional<std::vector<int64_t>>>);

template <class W>
using UnboxedArg = decltype(ArgOf(Tag<W>{}));

// An unboxed argument as wide type W; a tensor passes through uncopied.
template <class W, class A>
decltype(auto) FromUnboxed(A& a) {
  if constexpr (std::is_same_v<std::remove_const_t<A>, W>) {
    return (a);
  } else if constexpr (IsOptional<W>::value) {
    if (!a.has_value()) return W();
    return W(FromUnboxed<typename W::value_type>(*a));
  } else if constexpr (std::is_same_v<W, HandleId>) {
    if (auto concrete = a.maybe_as_int()) return HandleId{*concrete, false};
    return HandleId{0, true};
  } else if constexpr (std::is_same_v<W, std::string>) {
    return std::string(a);
  } else {
    return W(a.begin(), a.end());  // a list
  }
}

struct UnboxedSlots {
  template <class W, size_t I, class Tuple>
  static decltype(auto) Get(Tuple& args) {
    return FromUnboxed<W>(std::get<I>(args));
  }
};

// The flat parameter types of a node: FlatOf<Lin>::type == TypeList<const Tensor&, ...>.
// Inside an Optional[Struct] every leaf is optional.
template <class T, bool InOptional = false, class = void>
struct FlatOf {
  using W = LeafWide<T>;
  using type = TypeList<UnboxedArg<std::conditional_t<InOptional && !IsOptional<W>::value, std::optional<W>, W>>>;
};
template <class S, bool InOptional>
struct FlatOf<S, InOptional, std::enable_if_t<kIsStruct<S>>> {
  template <size_t... J>
  static auto Of(std::index_sequence<J...>) ->
      typename Concat<typename FlatOf<FieldType<S, J>, InOptional>::type...>::type;
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

// The types TORCH_LIBRARY unboxes a schema argument into as a kernel names
// them: a kernel whose every parameter is one of these, by value or const
// reference (or a Tensor&), and whose return is a torch type, can give its op
// its own C++ signature, so C++ callers' `typed<Sig>()` takes the kernel's
// (docs/cpp_ops.md#typed-calls).
template <class D>
constexpr bool kTorchScalar = std::is_same_v<D, at::Tensor> || std::is_same_v<D, int64_t> ||
                              std::is_same_v<D, double> || std::is_same_v<D, bool> ||
                              std::is_same_v<D, std::string> || std::is_same_v<D, c10::ScalarType> ||
                              std::is_same_v<D, c10::Device> || std::is_same_v<D, c10::Layout> ||
                              std::is_same_v<D, c10::MemoryFormat>;
template <class D>
constexpr bool kTorchValue = kTorchScalar<D> || std::is_same_v<D, std::vector<at::Tensor>> ||
                             std::is_same_v<D, std::vector<int64_t>> || std::is_same_v<D, std::vector<double>>;
template <class D>
struct IsTorchValue : std::bool_constant<kTorchValue<D>> {};
template <class D>
struct IsTorchValue<std::optional<D>> : std::bool_constant<kTorchScalar<D>> {};
template <class Arg, class D = std::remove_cv_t<std::remove_reference_t<Arg>>>
constexpr bool kTorchParam = IsTorchValue<D>::value && (!std::is_reference_v<Arg> || std::is_same_v<Arg, const D&> ||
                                                        std::is_same_v<Arg, at::Tensor&>);
template <class R, class... Args>
constexpr bool kOwnSignature = !kIsStruct<std::decay_t<R>> && (kTorchParam<Args> && ...);

// Parameter K of a kernel, from the flat arguments.
template <size_t K, class Arg, size_t Offset, class Rd>
decltype(auto) Param(Rd& r) {
  if constexpr (std::is_same_v<Arg, at::Tensor&>) {
    return std::get<Offset>(r.src);
  } else {
    return ReadParam<K, Arg, Offset>(r);
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

  template <class Rd, size_t... K>
  static decltype(auto) Call(FnPtr fn, Rd& r, std::index_sequence<K...>) {
    return fn(Param<K, Args, kParamOffset<K, Args...>>(r)...);
  }

  // A function-try-block: no wrapper between torch and the kernel's result.
  Result operator()(FlatArgs... flat) const try {
    if constexpr (std::is_void_v<R>) {
      Run(flat...);
    } else {
      decltype(auto) out = Run(flat...);
      CheckReturned(out, name);
      if constexpr (kIsStruct<R>) {
        return Ret<R>::Flatten(std::move(out));
      } else {
        return out;  // NRVO, or the reference a Tensor(a!) return is
      }
    }
  } catch (...) {
    Rethrow(name);
  }

  // The kernel on the flat arguments: handed on as they are where they are
  // its own parameters, else read into them (structs rebuilt on the stack).
  decltype(auto) Run(FlatArgs&... flat) const {
    if constexpr (std::is_same_v<TypeList<Args...>, TypeList<FlatArgs...>>) {
      return fn(static_cast<FlatArgs&&>(flat)...);
    } else {
      auto t = std::forward_as_tuple(flat...);
      Reader<UnboxedSlots, decltype(t)> r{t};
      return Call(fn, r, std::index_sequence_for<Args...>{});
    }
  }

  FnPtr fn;
  KernelName name;
};

// Whether torch takes `Sig` as the C++ signature of `op`: true until one of
// its kernels has recorded another.
template <class Sig>
bool Fits(const c10::OperatorHandle& op) {
  try {
    op.typed<Sig>();
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

// A kernel as torch may register it: with opforge's flat signature, and,
// where kOwnSignature holds, with the kernel's own, which its op records
// when every kernel of the op in the block has the same one
// (UnstableBackend::Impl).
struct KernelForms {
  std::string op;  // "ns::op"
  std::unique_ptr<torch::CppFunction> flat, own;
  bool (*flat_fits)(const c10::OperatorHandle&) = nullptr;
  bool (*own_fits)(const c10::OperatorHandle&) = nullptr;
  const std::type_info* own_type = nullptr;  // null where the kernel has no own form
};

// The C++ signature a kernel (or a backward's `Sig`) gives its op when it
// is its own (kOwnSignature); null where torch gets the flat one.
template <class R, class... Args>
const std::type_info* OwnType(R (*)(Args...)) {
  if constexpr (kOwnSignature<R, Args...>) return &typeid(R(Args...));
  return nullptr;
}

template <class R, class... Args>
std::unique_ptr<KernelForms> MakeKernel(R (*fn)(Args...), KernelName name) {
  using Flat = typename Concat<typename ParamFlat<Args>::type...>::type;
  using FlatKernel = StructKernel<R, TypeList<Args...>, Flat>;
  auto forms = std::make_unique<KernelForms>();
  forms->op = name.op;
  forms->flat_fits = &Fits<typename c10::guts::infer_function_traits_t<FlatKernel>::func_type>;
  if constexpr (kOwnSignature<R, Args...>) {
    forms->own = std::make_unique<torch::CppFunction>(StructKernel<R, TypeList<Args...>, TypeList<Args...>>{fn, name});
    forms->own_fits = &Fits<R(Args...)>;
  }
  forms->own_type = OwnType(fn);
  forms->flat = std::make_unique<torch::CppFunction>(FlatKernel{fn, std::move(name)});
  return forms;
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
                  const char* file, uint32_t line)
      : lib_(std::make_unique<torch::Library>(kind, ns, key, file, line)) {}
  OpforgeBackendV1 backend() { return BackendTable(this); }
  // Kernels are made while the block runs and handed over at commit.
  void* Keep(std::unique_ptr<KernelForms> kernel) {
    Agree(kernel->op, kernel->own_type);
    kernels_.push_back(std::move(kernel));
    return kernels_.back().get();
  }
  // Records a C++ signature a kernel or backward of `op` is written against
  // (null: one torch cannot record); the op takes the kernels' own where all agree.
  void Agree(const std::string& op, const std::type_info* own) {
    auto [it, first] = own_signatures_.emplace(op, own);
    if (!first && (it->second == nullptr || own == nullptr || *it->second != *own)) it->second = nullptr;
  }
  // Keeps the registrations for as long as the library is loaded.
  void Finish(bool ok);

  // The C surface's calls (opforge/abi.h): null, or what went wrong.
  char* Def(const char* schema);
  char* Impl(const char* op, const char* key, void* kernel);
  char* Autograd(const char* qualified, void* registrar);
  void Rollback() { lib_.reset(); }  // a torch::Library undoes its registrations when destroyed
  void Warn(const char* message);

 private:
  std::unique_ptr<torch::Library> lib_;
  std::vector<std::unique_ptr<KernelForms>> kernels_;
  std::map<std::string, const std::type_info*> own_signatures_;  // by "ns::op"; null: flat
};

// Registers G as the backward of `qualified` with the backend's library;
// see opforge/backward.h.
using AutogradRegistrarFn = void (*)(torch::Library& lib, const std::string& qualified);

template <class G, class Sig>
struct AutogradRegistrar;

struct UnstableMode {
  template <class R, class... Args>
  static void* MakeKernel(UnstableBackend& backend, R (*fn)(Args...), KernelName name) {
    return backend.Keep(detail::MakeKernel(fn, std::move(name)));
  }
  template <class G, class Sig>
  static void SetAutograd(LibraryPlan& plan, UnstableBackend& backend, const std::string& op) {
    static_assert(IsComplete<AutogradRegistrar<G, Sig>>::value,
                  "opforge: include <opforge/backward.h> to declare a C++ backward.");
    backend.Agree(plan.ns() + "::" + op, OwnType(static_cast<Sig*>(nullptr)));
    AutogradRegistrarFn registrar = &AutogradRegistrar<G, Sig>::Register;
    plan.SetAutograd(op, reinterpret_cast<void*>(registrar));
  }
  static std::string Key(const std::string&, c10::DeviceType device) { return KeyName(device); }
  static std::string Key(const std::string&, c10::DispatchKey key) { return KeyName(key); }
};

}  // namespace detail

using Library = detail::LibraryApi<detail::UnstableMode, detail::UnstableBackend>;
using OpBuilder = detail::OpBuilderApi<detail::UnstableMode, detail::UnstableBackend>;
template <class Sig>
using TypedOpBuilder = detail::OpBuilderApi<detail::UnstableMode, detail::UnstableBackend, Sig>;

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

// OPFORGE_LIBRARY's blocks in this mode (opforge/detail/macros.h): a
// fragment, and an IMPL library whose key is checked when compiled.
#define OPFORGE_DETAIL_LIBRARY_ARGS_(ns) torch::Library::FRAGMENT, #ns, std::nullopt
#define OPFORGE_DETAIL_IMPL_ARGS_(ns, key) torch::Library::IMPL, #ns, c10::DispatchKey::key
