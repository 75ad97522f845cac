// The torch layer's hooks (torch_layer.h).
#include "core/torch_layer.h"

#include <dlfcn.h>

#include <mutex>

namespace opforge {
namespace {

std::mutex g_mu;
TorchLayerHooks g_hooks{};
bool g_set = false;

}  // namespace

void SetTorchLayerHooks(const TorchLayerHooks& hooks) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_hooks = hooks;
  g_set = true;
}

const TorchLayerHooks* TorchLayer(std::string* why) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_set) return &g_hooks;
  }
  // A stable-ABI library in a program that loaded only it and torch: the
  // torch layer sits beside the core (opforge/lib/).
  Dl_info info{};
  std::string path = "libopforge_torch.so";
  if (dladdr(reinterpret_cast<void*>(&SetTorchLayerHooks), &info) && info.dli_fname) {
    const std::string core = info.dli_fname;
    const size_t slash = core.rfind('/');
    if (slash != std::string::npos) path = core.substr(0, slash + 1) + path;
  }
  if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* error = dlerror();
    *why = "opforge's torch layer (" + path + ") cannot be loaded: " + (error ? error : "unknown error");
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_set) {
    *why = path + " loaded but did not register with the core";
    return nullptr;
  }
  return &g_hooks;
}

}  // namespace opforge
