// Registering a stable-ABI library's block with torch's stable C shims, for
// the core (opforge/abi.h): one library object for the defs and one per
// dispatch key, all deleted (so everything they registered is undone) if the
// block fails.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include "opforge/detail/library_api.h"
#include "opforge/detail/plan.h"
#include "opforge/stable/kernel.h"

namespace opforge::detail {

class StableBackend {
 public:
  StableBackend(const char* ns, const char* impl_key, const char* file, uint32_t line)
      : ns_(ns), impl_key_(impl_key ? impl_key : ""), file_(file), line_(line) {}
  ~StableBackend() { Rollback(); }
  StableBackend(const StableBackend&) = delete;
  StableBackend& operator=(const StableBackend&) = delete;

  OpforgeBackendV1 backend() { return BackendTable(this); }
  void Finish(bool ok) {
    if (!ok) Rollback();
  }

  char* Def(const char* schema) {
    if (frag_ == nullptr &&
        aoti_torch_library_init_fragment(ns_.c_str(), file_.c_str(), line_, &frag_) != AOTI_TORCH_SUCCESS) {
      return Message("cannot create a library fragment");
    }
    return Check(aoti_torch_library_def(frag_, schema));
  }

  char* Impl(const char* op, const char* key, void* kernel) {
    TorchLibraryHandle& lib = impls_[key];
    if (lib == nullptr &&
        aoti_torch_library_init_impl(ns_.c_str(), key, file_.c_str(), line_, &lib) != AOTI_TORCH_SUCCESS) {
      return Message(std::string("cannot create a library for dispatch key ") + key);
    }
    return Check(torch_library_impl(lib, op, reinterpret_cast<BoxedKernel>(kernel), TORCH_ABI_VERSION));
  }

  char* Autograd(const char*, void*) { return Message("a stable-ABI backward is wired by opforge's torch layer"); }

  // Deletes every library object, so everything they registered is undone.
  void Rollback() {
    for (auto& [key, lib] : impls_) {
      if (lib) aoti_torch_delete_library_object(lib);
    }
    impls_.clear();
    if (frag_) aoti_torch_delete_library_object(frag_);
    frag_ = nullptr;
  }

  void Warn(const char* message) { std::fprintf(stderr, "opforge warning: %s\n", message); }

 private:
  static char* Check(AOTITorchError code) {
    if (code == AOTI_TORCH_SUCCESS) return nullptr;
#if defined(TORCH_VERSION_2_13_0) && TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0
    return Message(torch_exception_get_what_without_backtrace());
#else
    return Message("error " + std::to_string(code) + " (torch printed its message above)");
#endif
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

struct StableMode {
  template <class R, class... Args>
  static void* MakeKernel(StableBackend&, R (*fn)(Args...), KernelName name) {
    return reinterpret_cast<void*>(MakeStableKernel(fn, std::move(name)));
  }
  template <class G, class Sig>
  static void SetAutograd(LibraryPlan& plan, StableBackend&, const std::string& op) {
    static_assert(IsComplete<StableAutograd<G, Sig>>::value,
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
class LibraryInit {
 public:
  LibraryInit(const char* ns, const char* impl_key, void (*init)(LibraryApi<StableMode, StableBackend>&),
              const char* file, uint32_t line)
      : backend_(ns, impl_key, file, line) {
    LibraryPlan plan(ns, impl_key, file, line, reinterpret_cast<const void*>(init), "stable", TORCH_TARGET_VERSION);
    error_ = RunBlock(plan, backend_, init, &What);
  }
  const std::string& error() const { return error_; }

 private:
  StableBackend backend_;
  std::string error_;
};

}  // namespace opforge::detail
