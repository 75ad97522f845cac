// OPFORGE_LIBRARY on torch's stable ABI (docs/stable_abi.md): the same
// registrations as the libtorch C++ API mode (opforge/library.h), built once
// and loaded by every torch from TORCH_TARGET_VERSION on. Include
// <opforge/opforge.h> with OPFORGE_STABLE_ABI defined (opforge_add_library(...
// STABLE) does it).
//
// Kernels take torch::stable::Tensor (opforge::Tensor) and structs; torch
// calls a boxed kernel that reads the flat leaves from its stack, rebuilds
// the structs on the stack (no heap allocation for scalar fields) and calls
// yours. The library links nothing of torch or opforge: torch's C shims
// resolve in the process, opforge's C surface (opforge/abi.h) is looked up
// at load.
#pragma once

#ifndef OPFORGE_STABLE_ABI
#error "opforge/stable/library.h needs OPFORGE_STABLE_ABI; include <opforge/opforge.h>"
#endif
#ifndef TORCH_TARGET_VERSION
#error "a stable-ABI library targets a torch version: compile with -DTORCH_TARGET_VERSION=0x020A000000000000ULL (opforge_add_library(... STABLE) sets it)"
#endif

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/stableivalue_conversions.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/DeviceType.h>
#include <torch/headeronly/core/Layout.h>
#include <torch/headeronly/core/MemoryFormat.h>
#include <torch/headeronly/core/ScalarType.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
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
using Tensor = torch::stable::Tensor;

namespace detail {

inline constexpr char kStableTensorSchema[] = "Tensor";
inline constexpr char kStableTensorListSchema[] = "Tensor[]";
inline constexpr char kStableScalarTypeSchema[] = "ScalarType";
inline constexpr char kStableDeviceSchema[] = "Device";
inline constexpr char kStableLayoutSchema[] = "Layout";
inline constexpr char kStableMemoryFormatSchema[] = "MemoryFormat";
template <>
struct LeafSchema<torch::stable::Tensor> : NamedLeaf<kStableTensorSchema> {};
template <>
struct LeafSchema<std::vector<torch::stable::Tensor>> : NamedLeaf<kStableTensorListSchema> {};
template <>
struct LeafSchema<c10::ScalarType> : NamedLeaf<kStableScalarTypeSchema> {};
template <>
struct LeafSchema<torch::stable::Device> : NamedLeaf<kStableDeviceSchema> {};
template <>
struct LeafSchema<c10::Layout> : NamedLeaf<kStableLayoutSchema> {};
template <>
struct LeafSchema<c10::MemoryFormat> : NamedLeaf<kStableMemoryFormatSchema> {};

using torch::stable::detail::from;
using torch::stable::detail::to;

// ---------------------------------------------------------------------------
// One leaf on a stable stack: read (taking what the slot owns) and written.

template <class T, class = void>
struct Stable {
  static_assert(kAlwaysFalse<T>, OPFORGE_UNSUPPORTED_TYPE_);
};

// Types torch's stable conversions know.
template <class T>
struct TorchStable {
  static T Read(StableIValue v) { return to<T>(v); }
  static StableIValue Write(const T& v) { return from(v); }
};
template <>
struct Stable<torch::stable::Tensor> : TorchStable<torch::stable::Tensor> {};
template <>
struct Stable<std::optional<torch::stable::Tensor>> : TorchStable<std::optional<torch::stable::Tensor>> {};
template <>
struct Stable<std::vector<torch::stable::Tensor>> : TorchStable<std::vector<torch::stable::Tensor>> {};
template <>
struct Stable<int64_t> : TorchStable<int64_t> {};
template <>
struct Stable<double> : TorchStable<double> {};
template <>
struct Stable<bool> : TorchStable<bool> {};
template <>
struct Stable<std::vector<int64_t>> : TorchStable<std::vector<int64_t>> {};
template <>
struct Stable<std::vector<double>> : TorchStable<std::vector<double>> {};
template <>
struct Stable<c10::ScalarType> : TorchStable<c10::ScalarType> {};
template <>
struct Stable<torch::stable::Device> : TorchStable<torch::stable::Device> {};
template <>
struct Stable<c10::Layout> : TorchStable<c10::Layout> {};
template <>
struct Stable<c10::MemoryFormat> : TorchStable<c10::MemoryFormat> {};

// Narrower scalars and enums travel as the schema's 64-bit types.
template <class T, class Wide>
struct NarrowStable {
  static T Read(StableIValue v) { return static_cast<T>(to<Wide>(v)); }
  static StableIValue Write(T v) { return from(static_cast<Wide>(v)); }
};
template <>
struct Stable<int32_t> : NarrowStable<int32_t, int64_t> {};
template <>
struct Stable<float> : NarrowStable<float, double> {};
template <class E>
struct Stable<E, std::enable_if_t<kIsEnum<E>>> : NarrowStable<E, int64_t> {};
template <class T>
struct Stable<Handle<T>> {
  static Handle<T> Read(StableIValue v) { return Handle<T>(to<int64_t>(v)); }
  static StableIValue Write(const Handle<T>& h) { return from(h.id()); }
};

// A string handle read without torch's to<std::string>, which does not free
// the string it copies.
template <>
struct Stable<std::string> {
  static std::string Read(StableIValue v) {
    auto handle = to<StringHandle>(v);
    size_t length = 0;
    const char* data = nullptr;
    TORCH_ERROR_CODE_CHECK(torch_string_length(handle, &length));
    TORCH_ERROR_CODE_CHECK(torch_string_c_str(handle, &data));
    std::string out(data, length);
    TORCH_ERROR_CODE_CHECK(torch_delete_string(handle));
    return out;
  }
  static StableIValue Write(const std::string& v) { return from(v); }
};

// An optional leaf: None, or a pointer to the value's own slot.
template <class T>
struct Stable<std::optional<T>, std::enable_if_t<!kIsStruct<T> && !std::is_same_v<T, torch::stable::Tensor>>> {
  static std::optional<T> Read(StableIValue v) {
    if (v == from(std::nullopt)) return std::nullopt;
    auto* slot = to<StableIValue*>(v);
    T value = Stable<T>::Read(*slot);
#if defined(TORCH_VERSION_2_13_0) && TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0
    TORCH_ERROR_CODE_CHECK(torch_delete_stable_ivalue(slot));
#else
    delete slot;
#endif
    return value;
  }
  static StableIValue Write(const std::optional<T>& v) {
    if (!v) return from(std::nullopt);
    return from(new StableIValue(Stable<T>::Write(*v)));
  }
};

// Reads a kernel's leaves from its stack.
struct StackReader {
  StableIValue* stack;
  template <class T, size_t I>
  T Leaf() {
    return Stable<T>::Read(stack[I]);
  }
  template <class T, size_t I>
  T LeafInOptional() {
    if constexpr (IsOptional<T>::value) {
      return Stable<T>::Read(stack[I]);
    } else {
      std::optional<T> v = Stable<std::optional<T>>::Read(stack[I]);
      if (!v) {
        throw std::invalid_argument(
            "opforge: an optional struct argument is set (its __is_set leaf is True) but one of its required "
            "fields is None; pass every field, or set __is_set to False.");
      }
      return std::move(*v);
    }
  }
  template <size_t I>
  bool Presence() {
    return to<bool>(stack[I]);
  }
};

template <class S, size_t... J>
void WriteFields(StableIValue* stack, const S& s, std::index_sequence<J...>);
template <class T, size_t... I>
void WriteTuple(StableIValue* stack, const T& t, std::index_sequence<I...>);

// Results of a kernel, written to its stack.
template <class R>
void WriteResult(StableIValue* stack, R&& out) {
  using T = std::decay_t<R>;
  if constexpr (kIsStruct<T>) {
    WriteFields(stack, out, std::make_index_sequence<kNumFields<T>>{});
  } else if constexpr (IsStdTupleOf<T>::value) {
    WriteTuple(stack, out, std::make_index_sequence<std::tuple_size_v<T>>{});
  } else {
    stack[0] = Stable<T>::Write(out);
  }
}

template <class S, size_t... J>
void WriteFields(StableIValue* stack, const S& s, std::index_sequence<J...>) {
  ((stack[J] = Stable<FieldType<S, J>>::Write(FieldOf<J>(s))), ...);
}

template <class T, size_t... I>
void WriteTuple(StableIValue* stack, const T& t, std::index_sequence<I...>) {
  ((stack[I] = Stable<std::tuple_element_t<I, T>>::Write(std::get<I>(t))), ...);
}

template <class R>
constexpr size_t ResultCount() {
  using T = std::decay_t<R>;
  if constexpr (std::is_void_v<T>) {
    return 0;
  } else if constexpr (kIsStruct<T>) {
    return kNumFields<T>;
  } else if constexpr (IsStdTupleOf<T>::value) {
    return std::tuple_size_v<T>;
  } else {
    return 1;
  }
}

// The boxed kernel of `fn`: leaves in, struct rebuilt, results out.
template <class R, class... Args>
struct Invoker {
  using Fn = R (*)(Args...);

  template <size_t... K>
  static std::tuple<std::decay_t<Args>...> Read(StackReader& r, std::index_sequence<K...>) {
    // Braced initialization reads the leaves in order.
    return std::tuple<std::decay_t<Args>...>{ParamNode<Args>::template Build<kParamOffset<K, Args...>>(r)...};
  }

  static void Call(void* fn, StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
    constexpr size_t kArgs = kLeafCount<Args...>;
    if (num_args != kArgs || num_outputs != ResultCount<R>()) {
      throw std::runtime_error("opforge: the registered schema has " + std::to_string(num_args) + " arguments and " +
                               std::to_string(num_outputs) + " returns, the kernel's flat signature " +
                               std::to_string(kArgs) + " and " + std::to_string(ResultCount<R>()) + ".");
    }
    StackReader r{stack};
    auto args = Read(r, std::index_sequence_for<Args...>{});
    auto f = reinterpret_cast<Fn>(fn);
    if constexpr (std::is_void_v<R>) {
      std::apply(f, args);
    } else {
      WriteResult(stack, std::apply(f, args));
    }
  }
};

// ---------------------------------------------------------------------------
// Kernels as torch's stable ABI takes them: a plain function pointer per
// kernel. A library's kernels are bound to a fixed set of trampolines (per
// shared library, hidden), each calling its kernel's Invoker.

#ifndef OPFORGE_STABLE_MAX_KERNELS
#define OPFORGE_STABLE_MAX_KERNELS 512
#endif

using BoxedKernel = void (*)(StableIValue*, uint64_t, uint64_t);

#pragma GCC visibility push(hidden)
struct KernelSlot {
  void (*invoke)(void*, StableIValue*, uint64_t, uint64_t);
  void* fn;
};
inline KernelSlot* KernelSlots() {
  static KernelSlot slots[OPFORGE_STABLE_MAX_KERNELS];
  return slots;
}
inline size_t& KernelSlotsUsed() {
  static size_t used = 0;
  return used;
}
template <size_t I>
void Trampoline(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  const KernelSlot& slot = KernelSlots()[I];
  slot.invoke(slot.fn, stack, num_args, num_outputs);
}
template <size_t... I>
constexpr std::array<BoxedKernel, sizeof...(I)> MakeTrampolines(std::index_sequence<I...>) {
  return {&Trampoline<I>...};
}
inline BoxedKernel BindKernel(void (*invoke)(void*, StableIValue*, uint64_t, uint64_t), void* fn) {
  static constexpr auto kTrampolines = MakeTrampolines(std::make_index_sequence<OPFORGE_STABLE_MAX_KERNELS>{});
  size_t& used = KernelSlotsUsed();
  if (used == kTrampolines.size()) {
    throw std::runtime_error("opforge: more than " + std::to_string(kTrampolines.size()) +
                             " kernels in one stable-ABI library; build it with a larger "
                             "-DOPFORGE_STABLE_MAX_KERNELS=N.");
  }
  KernelSlots()[used] = KernelSlot{invoke, fn};
  return kTrampolines[used++];
}
#pragma GCC visibility pop

// Registers with torch's stable C shims for the core (opforge/abi.h): one
// library object for the defs and one per dispatch key, all deleted (so
// everything they registered is undone) if the block fails.
class StableBackend {
 public:
  StableBackend(const char* ns, const char* impl_key, const char* file, uint32_t line)
      : ns_(ns), impl_key_(impl_key ? impl_key : ""), file_(file), line_(line) {}
  ~StableBackend() { Reset(); }
  StableBackend(const StableBackend&) = delete;
  StableBackend& operator=(const StableBackend&) = delete;

  OpforgeBackendV1 backend() {
    OpforgeBackendV1 b{};
    b.ctx = this;
    b.def = &Def;
    b.impl = &Impl;
    b.autograd = &Autograd;
    b.rollback = &Rollback;
    b.warn = &Warn;
    return b;
  }
  void Finish(bool ok) {
    if (!ok) Reset();
  }

 private:
  static char* Message(const std::string& text) { return strdup(text.c_str()); }
  static std::string TorchMessage(AOTITorchError code) {
#if defined(TORCH_VERSION_2_13_0) && TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0
    (void)code;
    return torch_exception_get_what_without_backtrace();
#else
    return "error " + std::to_string(code) + " (torch printed its message above)";
#endif
  }

  static char* Def(void* ctx, const char* schema) {
    auto* self = static_cast<StableBackend*>(ctx);
    if (self->frag_ == nullptr) {
      if (aoti_torch_library_init_fragment(self->ns_.c_str(), self->file_.c_str(), self->line_, &self->frag_) !=
          AOTI_TORCH_SUCCESS) {
        return Message("cannot create a library fragment");
      }
    }
    const AOTITorchError code = aoti_torch_library_def(self->frag_, schema);
    return code == AOTI_TORCH_SUCCESS ? nullptr : Message(TorchMessage(code));
  }

  static char* Impl(void* ctx, const char* op, const char* key, void* kernel) {
    auto* self = static_cast<StableBackend*>(ctx);
    TorchLibraryHandle& lib = self->impls_[key];
    if (lib == nullptr &&
        aoti_torch_library_init_impl(self->ns_.c_str(), key, self->file_.c_str(), self->line_, &lib) !=
            AOTI_TORCH_SUCCESS) {
      return Message(std::string("cannot create a library for dispatch key ") + key);
    }
    const AOTITorchError code =
        torch_library_impl(lib, op, reinterpret_cast<BoxedKernel>(kernel), TORCH_ABI_VERSION);
    return code == AOTI_TORCH_SUCCESS ? nullptr : Message(TorchMessage(code));
  }

  static char* Autograd(void*, const char*, void*) {
    return Message("a stable-ABI library's backward is wired by opforge's torch layer");
  }

  static void Rollback(void* ctx) { static_cast<StableBackend*>(ctx)->Reset(); }

  static void Warn(void*, const char* message) { std::fprintf(stderr, "opforge warning: %s\n", message); }

  void Reset() {
    for (auto& [key, lib] : impls_) {
      if (lib) aoti_torch_delete_library_object(lib);
    }
    impls_.clear();
    if (frag_) aoti_torch_delete_library_object(frag_);
    frag_ = nullptr;
  }

  std::string ns_;
  std::string impl_key_;
  std::string file_;
  uint32_t line_;
  TorchLibraryHandle frag_ = nullptr;
  std::map<std::string, TorchLibraryHandle> impls_;
};

template <class G, class Sig>
struct StableAutograd;  // opforge/stable/backward.h

template <class T, class = void>
struct IsCompleteStable : std::false_type {};
template <class T>
struct IsCompleteStable<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};

struct StableMode {
  template <class R, class... Args>
  static void* MakeKernel(StableBackend&, R (*fn)(Args...)) {
    return reinterpret_cast<void*>(BindKernel(&Invoker<R, Args...>::Call, reinterpret_cast<void*>(fn)));
  }
  template <class G, class Sig>
  static void SetAutograd(LibraryPlan& plan, const std::string& op) {
    static_assert(IsCompleteStable<StableAutograd<G, Sig>>::value,
                  "opforge: a C++ backward in a stable-ABI library needs <opforge/opforge.h> (it includes "
                  "opforge/stable/backward.h).");
    plan.SetTorchLayerAutograd(op, &StableAutograd<G, Sig>::kDescriptor);
  }
  // The key name a stable IMPL library takes for m.impl(op, key, fn).
  static std::string Key(const std::string& op, c10::DeviceType device) {
    if (const char* name = DeviceKeyName(device)) return name;
    throw std::invalid_argument(
        "m.impl(\"" + op + "\", device type " + std::to_string(static_cast<int>(device)) +
        "): a stable-ABI library registers kernels by device type for CPU, CUDA, HIP, XPU, MPS, Meta and "
        "PrivateUse1; for another dispatch key, name it as a string: m.impl(\"" + op + "\", \"<key>\", &fn).");
  }
  static std::string Key(const std::string&, const char* key) { return key; }
};

// Runs an OPFORGE_LIBRARY block at load, then commits it; a failure is a
// recorded load error (printed, and raised by opforge.load_library), never
// an abort, and leaves nothing registered.
class StableLibraryInit {
 public:
  StableLibraryInit(const char* ns, const char* impl_key,
                    void (*init)(LibraryApi<StableMode, StableBackend>&), const char* file, uint32_t line)
      : backend_(ns, impl_key, file, line) {
    LibraryPlan plan(ns, impl_key, file, line, reinterpret_cast<const void*>(init), "stable", TORCH_TARGET_VERSION);
    error_ = RunBlock(plan, backend_, init, [](const std::exception& e) { return std::string(e.what()); });
  }
  const std::string& error() const { return error_; }

 private:
  StableBackend backend_;
  std::string error_;
};

}  // namespace detail

using Library = detail::LibraryApi<detail::StableMode, detail::StableBackend>;
using OpBuilder = detail::OpBuilderApi<detail::StableMode, detail::StableBackend>;
template <class Sig>
using TypedOpBuilder = detail::TypedOpBuilderApi<detail::StableMode, detail::StableBackend, Sig>;

// ---------------------------------------------------------------------------
// Calling an op with structs through torch's dispatcher (torch_call_dispatcher),
// as in the C++ API mode (opforge/call.h):
//   auto y = opforge::Call<opforge::Tensor>("kernels::rms_norm_fn", x, w, NormCfg{1e-5});

namespace detail {

template <class T>
void PushStable(std::vector<StableIValue>& stack, const T& v);

template <class S, size_t... J>
void PushStableFields(std::vector<StableIValue>& stack, const S& s, std::index_sequence<J...>) {
  (PushStable(stack, FieldOf<J>(s)), ...);
}

template <class T>
void PushStable(std::vector<StableIValue>& stack, const T& v) {
  if constexpr (kIsStruct<T>) {
    PushStableFields(stack, v, std::make_index_sequence<kNumFields<T>>{});
  } else if constexpr (IsOptionalStruct<T>::value) {
    using S = typename T::value_type;
    stack.push_back(from(v.has_value()));
    if (v) {
      PushStableFields(stack, *v, std::make_index_sequence<kNumFields<S>>{});
    } else {
      for (size_t i = 0; i < StructNode<S>::kCount; ++i) stack.push_back(from(std::nullopt));
    }
  } else {
    stack.push_back(Stable<T>::Write(v));
  }
}

template <class R, size_t... I>
R ReadStableTuple(StableIValue* stack, std::index_sequence<I...>) {
  return R{Stable<std::tuple_element_t<I, R>>::Read(stack[I])...};
}

template <class S, size_t... J>
S ReadStableStruct(StableIValue* stack, std::index_sequence<J...>) {
  S s{};
  ((FieldOf<J>(s) = Stable<FieldType<S, J>>::Read(stack[J])), ...);
  return s;
}

}  // namespace detail

template <class R = void, class... Args>
R Call(const char* qualified, const Args&... args) {
  std::string name(qualified);
  std::string overload;
  if (auto dot = name.find('.', name.find("::")); dot != std::string::npos) {
    overload = name.substr(dot + 1);
    name = name.substr(0, dot);
  }
  std::vector<StableIValue> stack;
  (detail::PushStable(stack, args), ...);
  stack.resize(std::max<size_t>(stack.size(), detail::ResultCount<R>()));
  TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(name.c_str(), overload.c_str(), stack.data(), TORCH_ABI_VERSION));
  if constexpr (std::is_void_v<R>) {
    return;
  } else if constexpr (detail::IsStdTupleOf<R>::value) {
    return detail::ReadStableTuple<R>(stack.data(), std::make_index_sequence<std::tuple_size_v<R>>{});
  } else if constexpr (kIsStruct<R>) {
    return detail::ReadStableStruct<R>(stack.data(), std::make_index_sequence<detail::kNumFields<R>>{});
  } else {
    return detail::Stable<R>::Read(stack[0]);
  }
}

}  // namespace opforge

#include "opforge/stable/backward.h"

#define OPFORGE_UID_(prefix, line) OPFORGE_PP_CAT(prefix, line)

// OPFORGE_LIBRARY(ns, m) { m.def(...); }
#define OPFORGE_LIBRARY(ns, m)                                                                 \
  static void OPFORGE_PP_CAT(opforge_library_init_, ns)(::opforge::Library&);                 \
  static const ::opforge::detail::StableLibraryInit OPFORGE_UID_(opforge_library_, __LINE__)( \
      #ns, nullptr, &OPFORGE_PP_CAT(opforge_library_init_, ns), __FILE__, __LINE__);           \
  void OPFORGE_PP_CAT(opforge_library_init_, ns)(::opforge::Library & m)

// OPFORGE_LIBRARY_IMPL(ns, CUDA, m) { m.impl("op", &op_cuda); }
#define OPFORGE_LIBRARY_IMPL(ns, key, m)                                                                  \
  static void OPFORGE_PP_CAT(OPFORGE_PP_CAT(opforge_library_impl_, ns), key)(::opforge::Library&);      \
  static const ::opforge::detail::StableLibraryInit OPFORGE_UID_(opforge_library_impl_, __LINE__)(      \
      #ns, #key, &OPFORGE_PP_CAT(OPFORGE_PP_CAT(opforge_library_impl_, ns), key), __FILE__, __LINE__); \
  void OPFORGE_PP_CAT(OPFORGE_PP_CAT(opforge_library_impl_, ns), key)(::opforge::Library & m)
