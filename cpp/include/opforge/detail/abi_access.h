// How a built library reaches opforge's C surface (opforge/abi.h).
//
// A library on libtorch's C++ API links libopforge_core and calls it. A
// stable-ABI library links nothing of opforge: it finds the core that is
// loaded (import opforge) or, failing that, the one its RUNPATH names (the
// wheel recipe puts opforge's lib/ there), so the same .so works with every
// opforge that serves ABI version 1.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>

#include "opforge/abi.h"

#ifdef OPFORGE_STABLE_ABI
#include <dlfcn.h>
#endif

namespace opforge::detail {

#ifdef OPFORGE_STABLE_ABI
// The core for a library that links nothing of opforge: the one loaded
// (import opforge), else the one its RUNPATH names; null when there is none.
inline void* Core() {
  void* core = dlopen("libopforge_core.so", RTLD_NOW | RTLD_NOLOAD);
  return core ? core : dlopen("libopforge_core.so", RTLD_NOW | RTLD_GLOBAL);
}

// opforge's torch layer, which registers what the stable ABI cannot (TVM-FFI
// kernels, ops with torch op tags) and hands the core its table as it loads:
// the one loaded (import opforge), else the one beside the core. A library
// on libtorch's C++ API links it instead. Null when neither is there; the
// core's commit then says what the block needs it for.
inline void* LoadTorchLayer() {
  if (void* layer = dlopen("libopforge_torch.so", RTLD_NOW | RTLD_NOLOAD)) return layer;
  void* core = Core();
  Dl_info info{};
  void* get = core ? dlsym(core, "opforge_abi_get") : nullptr;
  if (get == nullptr || !dladdr(get, &info) || info.dli_fname == nullptr) return nullptr;
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  path = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + "libopforge_torch.so";
  return dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
}
#endif

// The C surface, or null with `why` set when opforge is missing or older
// than this library needs.
inline const OpforgeAbiV1* FindAbi(std::string* why) {
  using Get = const void* (*)(uint32_t, uint32_t*);
  using Version = const char* (*)();
#ifdef OPFORGE_STABLE_ABI
  void* core = Core();
  if (core == nullptr) {
    if (why) {
      *why = "opforge is not loaded and libopforge_core.so was not found; import opforge before "
             "loading this library.";
    }
    return nullptr;
  }
  auto get = reinterpret_cast<Get>(dlsym(core, "opforge_abi_get"));
  auto version = reinterpret_cast<Version>(dlsym(core, "opforge_version"));
#else
  Get get = &opforge_abi_get;
  Version version = &opforge_version;
#endif
  uint32_t newest = 0;
  const void* table = get ? get(OPFORGE_ABI_VERSION, &newest) : nullptr;
  if (table == nullptr) {
    if (why) {
      *why = std::string("this library needs opforge's C ABI version ") + std::to_string(OPFORGE_ABI_VERSION) +
             " but the loaded opforge " + (version ? version() : "(unknown version)") +
             " provides versions up to " + std::to_string(newest) + "; install a newer opforge.";
    }
    return nullptr;
  }
  return static_cast<const OpforgeAbiV1*>(table);
}

// The C surface; throws when there is none (see FindAbi).
inline const OpforgeAbiV1& Abi() {
  static const OpforgeAbiV1* abi = FindAbi(nullptr);
  if (abi == nullptr) {
    std::string why;
    FindAbi(&why);
    throw std::runtime_error("opforge: " + why);
  }
  return *abi;
}

}  // namespace opforge::detail
