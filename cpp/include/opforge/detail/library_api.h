// `m` in OPFORGE_LIBRARY(ns, m): the registration API, the same in both torch
// ABI modes. Each call is recorded in the block's plan; the block commits
// when it ends (opforge/detail/plan.h).
#pragma once

#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "opforge/detail/nodes.h"
#include "opforge/detail/plan.h"

namespace opforge {
// A kernel that is a function exported through Apache TVM-FFI
// (docs/tvm_ffi.md#c-libraries): `symbol` as TVM_FFI_DLL_EXPORT_TYPED_FUNC
// names it, from `module` (a shared library's path; a relative one is found
// beside this library), or from this library itself when `module` is empty.
// It receives the op's flat leaves in schema order.
//
//   m.impl("rms_norm", c10::kCUDA, opforge::TvmFfi("rms_norm", "libnorm_ffi.so"));
//
// A function whose parameters are `ffi::Tensor` (owned) rather than
// `ffi::TensorView` gets owned TVM-FFI Tensors where its module says so in
// its type schema (built with TVM_FFI_DLL_EXPORT_INCLUDE_METADATA=1), or
// where the kernel says so:
//
//   m.impl("ident", opforge::TvmFfi("ident", "libmod.so").owned_tensors());
struct TvmFfi {
  explicit TvmFfi(std::string symbol, std::string module = "") : symbol(std::move(symbol)), module(std::move(module)) {}
  TvmFfi owned_tensors() const {
    TvmFfi f = *this;
    f.takes_owned_tensors = true;
    return f;
  }
  std::string symbol;
  std::string module;
  bool takes_owned_tensors = false;
};
}  // namespace opforge

namespace opforge::detail {

// The dispatch key torch registers a device type's kernels under, for the
// device types that have one; null for the others. One list for both modes
// (each passes its c10::DeviceType: libtorch's, or the header-only one).
template <class DeviceType>
const char* DeviceKeyName(DeviceType device) {
  switch (device) {
    case DeviceType::CPU: return "CPU";
    case DeviceType::CUDA: return "CUDA";
    case DeviceType::HIP: return "HIP";
    case DeviceType::XPU: return "XPU";
    case DeviceType::MPS: return "MPS";
    case DeviceType::Meta: return "Meta";
    case DeviceType::PrivateUse1: return "PrivateUse1";
    default: return nullptr;
  }
}

template <class Mode, class Backend>
class LibraryApi;

// What a kernel's errors call it: its op ("ns::op") and itself ("the CPU kernel").
struct KernelName {
  std::string op;
  std::string what;
  std::vector<std::string> params;  // the schema's parameter names, when the block defines the op
};

// A backend's error for the C surface: a message it frees.
inline char* Message(const std::string& text) { return strdup(text.c_str()); }

inline std::string What(const std::exception& e) { return e.what(); }

// Why a throw that is not a std::exception (`throw 42;`) is caught: it would
// end the process where torch or Python meets it.
inline std::string Foreign(const std::string& who) {
  return who + " threw something that is not a std::exception; throw one (TORCH_CHECK does).";
}

// Runs `f` for the C surface: null, or the Message of what it threw
// (`describe` gives an exception's text; `who` names f for any other throw).
template <class F>
char* Catch(F&& f, const char* who, std::string (*describe)(const std::exception&) = &What) {
  try {
    f();
    return nullptr;
  } catch (const std::exception& e) {
    return Message(describe(e));
  } catch (...) {
    return Message(Foreign(who));
  }
}

// What a kernel (or a backward, a setup_context) threw, thrown on to torch;
// call it inside a catch block. A std::exception goes on as it is, but for
// a ParamError (reading parameter `index` failed: a stale handle, a missing
// field), which names the op, `what` ("the CPU kernel") and the parameter
// (its name from `params` where known); anything else becomes a
// std::runtime_error naming the op and `what`:
//   "ext::run: the CPU kernel, parameter 'runner': handle 5: is not an opforge handle. ..."
[[noreturn]] inline void Rethrow(const std::string& op, const char* what,
                                 const std::vector<std::string>* params = nullptr) {
  try {
    throw;
  } catch (const ParamError& e) {
    const std::string param = params != nullptr && e.index < params->size() ? "'" + (*params)[e.index] + "'"
                                                                            : std::to_string(e.index + 1);
    throw std::runtime_error(op + ": " + what + ", parameter " + param + ": " + e.what());
  } catch (const std::exception&) {
    throw;
  } catch (...) {
    throw std::runtime_error(Foreign(op + ": " + what));
  }
}
[[noreturn]] inline void Rethrow(const KernelName& name) { Rethrow(name.op, name.what.c_str(), &name.params); }

// Runs `f` for torch, what it throws passed through Rethrow.
template <class F>
decltype(auto) Guard(const std::string& op, const char* what, F&& f) {
  try {
    return f();
  } catch (...) {
    Rethrow(op, what);
  }
}

// A kernel's result checked as a Python op's is: an undefined tensor where
// the schema says Tensor (alone, in a tuple, a Tensor[] or a struct) is an
// error naming the op, not a None the caller gets.
[[noreturn]] inline void ThrowUndefinedReturn(const KernelName& name, const char* type) {
  throw std::runtime_error(name.op + ": " + name.what + " returned an undefined tensor where the schema says " + type +
                           "; return a defined one.");
}
template <class T>
void CheckReturned(const T& v, const KernelName& name);
template <class S, size_t... J>
void CheckFields(const S& s, const KernelName& name, std::index_sequence<J...>) {
  (CheckReturned(FieldOf<J>(s), name), ...);
}
template <class T>
void CheckReturned(const T& v, const KernelName& name) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, Tensor>) {
    if (!v.defined()) ThrowUndefinedReturn(name, "Tensor");
  } else if constexpr (std::is_same_v<D, std::vector<Tensor>>) {
    for (const Tensor& t : v) {
      if (!t.defined()) ThrowUndefinedReturn(name, "Tensor[]");
    }
  } else if constexpr (IsStdTupleOf<D>::value) {
    std::apply([&](const auto&... e) { (CheckReturned(e, name), ...); }, v);
  } else if constexpr (kIsStruct<D>) {
    CheckFields(v, name, std::make_index_sequence<kNumFields<D>>{});
  }
}

// The C surface's table (opforge/abi.h) of a backend B, whose members Def,
// Impl, Autograd, Rollback and Warn it calls.
template <class B>
OpforgeBackendV1 BackendTable(B* backend) {
  OpforgeBackendV1 t{};
  t.ctx = backend;
  t.def = [](void* b, const char* schema) { return static_cast<B*>(b)->Def(schema); };
  t.impl = [](void* b, const char* op, const char* key, void* fn) { return static_cast<B*>(b)->Impl(op, key, fn); };
  t.autograd = [](void* b, const char* op, void* autograd) { return static_cast<B*>(b)->Autograd(op, autograd); };
  t.rollback = [](void* b) { static_cast<B*>(b)->Rollback(); };
  t.warn = [](void* b, const char* message) { static_cast<B*>(b)->Warn(message); };
  return t;
}

// Whether T is defined here: a mode's backward header declares its autograd
// glue, and `.autograd<G>()` without that header is a compile error naming it.
template <class T, class = void>
struct IsComplete : std::false_type {};
template <class T>
struct IsComplete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};

// What `m.def(...)` returns: per-argument tags and a C++ backward. From
// `m.def(schema, &kernel)` it knows the kernel's signature `Sig`, so
// `.autograd<G>()` needs nothing else.
template <class Mode, class Backend, class Sig = void>
class OpBuilderApi {
 public:
  OpBuilderApi(LibraryApi<Mode, Backend>& lib, std::string name) : lib_(lib), name_(std::move(name)) {}

  // Declares arguments that must live in symmetric memory (docs/symm_mem.md).
  // Names may be parameters (a struct expands to its Tensor leaves) or leaves.
  OpBuilderApi& symm_mem_args(const std::vector<std::string>& names) { return arg_tag("symm_mem", names); }
  // Attaches `tag` to arguments; the generic form of symm_mem_args.
  OpBuilderApi& arg_tag(const std::string& tag, const std::vector<std::string>& names) {
    lib_.plan().AddTag(name_, tag, names);
    return *this;
  }
  // Gives the op one of torch's op tags, spelled as torch.Tag spells it:
  // .tag("cudagraph_unsafe") says it cannot be captured into a CUDA graph
  // (docs/cuda_graphs.md). torch.ops.ns.op.default.tags lists it.
  OpBuilderApi& tag(const std::string& torch_tag) {
    lib_.plan().AddTag(name_, OPFORGE_TORCH_TAG_PREFIX + torch_tag, {});
    return *this;
  }
  // Declares the op's backward, written against the kernel's C++ signature
  // `S` (e.g. `at::Tensor(const at::Tensor&, const Cfg&)`); see
  // opforge/backward.h and docs/cpp_ops.md#autograd-in-c.
  template <class G, class S = Sig>
  OpBuilderApi& autograd() {
    static_assert(!std::is_void_v<S>, "opforge: name the kernel's signature, .autograd<G, Signature>(), or define "
                                      "the op with its kernel, m.def(schema, &kernel).autograd<G>().");
    lib_.template SetAutograd<G, S>(name_);
    return *this;
  }
  // The op's name in its namespace ("rms_norm").
  const std::string& name() const { return name_; }

 private:
  LibraryApi<Mode, Backend>& lib_;
  std::string name_;
};

template <class Mode, class Backend>
class LibraryApi {
 public:
  LibraryApi(LibraryPlan& plan, Backend& backend) : plan_(plan), backend_(backend) {}

  // Defines an op from a schema in torch's grammar (`Tensor!`, `Tensor(a!)`,
  // defaults, ...) that may also name this library's structs and enums,
  // Literal[...] and Handle(T). torch registers the flat schema.
  OpBuilderApi<Mode, Backend> def(const std::string& schema) {
    return OpBuilderApi<Mode, Backend>(*this, plan_.AddOp(schema));
  }

  // Defines an op and its kernel for every backend. Unlike TORCH_LIBRARY's
  // def(schema, fn) (a CompositeImplicitAutograd kernel), the kernel is
  // CompositeExplicitAutograd: fake tensors reach it only when the op has no
  // fake kernel (m.fake), and gradients come from the op's backward, never
  // from tracing through a kernel that reads data pointers
  // (docs/cpp_ops.md#what-mdef-with-a-kernel-means).
  template <class R, class... Args>
  OpBuilderApi<Mode, Backend, R(Args...)> def(const std::string& schema, R (*fn)(Args...)) {
    OpBuilderApi<Mode, Backend, R(Args...)> builder(*this, plan_.AddOp(schema));
    AddKernel(builder.name(), "CompositeExplicitAutograd", fn);
    return builder;
  }

  // A kernel for this OPFORGE_LIBRARY_IMPL block's key; in an OPFORGE_LIBRARY
  // block, for every backend (as def(schema, fn)).
  template <class R, class... Args>
  LibraryApi& impl(const std::string& name, R (*fn)(Args...)) {
    AddKernel(name, plan_.impl_key().empty() ? "CompositeExplicitAutograd" : plan_.impl_key(), fn);
    return *this;
  }

  // A kernel for one device type or dispatch key: c10::kCUDA,
  // c10::DispatchKey::Meta, c10::DispatchKey::CompositeImplicitAutograd, ...
  template <class Key, class R, class... Args>
  LibraryApi& impl(const std::string& name, Key key, R (*fn)(Args...)) {
    AddKernel(name, Mode::Key(name, key), fn);
    return *this;
  }

  // A TVM-FFI function as the op's kernel for this block's key (every
  // backend in an OPFORGE_LIBRARY block), or for one device type or key.
  LibraryApi& impl(const std::string& name, const TvmFfi& fn) {
    AddFfiKernel(name, plan_.impl_key().empty() ? "CompositeExplicitAutograd" : plan_.impl_key(), fn);
    return *this;
  }
  template <class Key>
  LibraryApi& impl(const std::string& name, Key key, const TvmFfi& fn) {
    AddFfiKernel(name, Mode::Key(name, key), fn);
    return *this;
  }

  // The shape function torch.compile, opcheck and fake tensors use (a Meta
  // kernel); it takes the kernel's own (struct) parameters.
  template <class R, class... Args>
  LibraryApi& fake(const std::string& name, R (*fn)(Args...)) {
    AddKernel(name, "Meta", fn);
    return *this;
  }

  // Declares structs and enums that a schema of this block names but no
  // kernel of the block takes (kernels declare their own).
  template <class... T>
  LibraryApi& types() {
    (Node<T>::Declare(plan_.types()), ...);
    return *this;
  }

  const std::string& ns() const { return plan_.ns(); }
  Backend& backend() { return backend_; }
  LibraryPlan& plan() { return plan_; }

  template <class G, class Sig>
  void SetAutograd(const std::string& op) {
    Mode::template SetAutograd<G, Sig>(plan_, backend_, op);
  }

 private:
  template <class R, class... Args>
  void AddKernel(const std::string& name, const std::string& key, R (*fn)(Args...)) {
    DeclareKernelTypes<R, Args...>(plan_.types());
    if (plan_.HasKernel(name, key)) {
      plan_.Fail(ns() + "::" + name + ": a " + key + " kernel is given twice. Give one kernel per op and key.");
      return;
    }
    KernelName kernel_name{ns() + "::" + name, "the " + key + " kernel", plan_.ParamNames(name)};
    void* kernel = Mode::MakeKernel(backend_, fn, std::move(kernel_name));
    plan_.AddKernel(name, key, kernel, KernelSignature<R, Args...>());
  }

  void AddFfiKernel(const std::string& name, const std::string& key, const TvmFfi& fn) {
    if (plan_.HasKernel(name, key)) {
      plan_.Fail(ns() + "::" + name + ": a " + key + " kernel is given twice. Give one kernel per op and key.");
      return;
    }
    // Registered by opforge's torch layer at commit, in both ABI modes.
    plan_.AddFfiKernel(name, key, fn.module.empty() ? plan_.dso() : fn.module, fn.symbol,
                       fn.takes_owned_tensors ? uint32_t{kOpforgeFfiOwnedTensors} : uint32_t{0});
  }

  LibraryPlan& plan_;
  Backend& backend_;
};

// Runs a library block and commits it: what OPFORGE_LIBRARY does at load,
// the same for both ABIs. A failure never escapes (an exception here would
// end the process while the library loads): it becomes the returned error,
// recorded as a load error, and the backend keeps nothing. `describe` turns
// a kernel library's exception into its message.
template <class Mode, class Backend>
std::string RunBlock(LibraryPlan& plan, Backend& backend, void (*init)(LibraryApi<Mode, Backend>&),
                     std::string (*describe)(const std::exception&)) {
  std::string error;
  try {
    LibraryApi<Mode, Backend> m(plan, backend);
    init(m);
  } catch (const std::exception& e) {
    plan.Fail(describe(e));
  }
  try {
    error = plan.Commit(backend.backend());
  } catch (const std::exception& e) {
    error = describe(e);
  }
  backend.Finish(error.empty());
  return error;
}

}  // namespace opforge::detail

namespace opforge {
// Before library blocks declared their own types, a schema naming a struct
// no kernel took needed this call; a block now declares what its kernels
// take, and m.types<T...>() the rest.
template <class... T>
[[deprecated("opforge::RegisterTypes is no longer needed: an OPFORGE_LIBRARY block declares the types its kernels "
             "take; list any other with m.types<T...>().")]] void
RegisterTypes() {}
}  // namespace opforge
