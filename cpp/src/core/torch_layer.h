// What the core asks of opforge's torch layer (libopforge_torch, built for the
// running torch) while it commits a library block: registering a kernel that
// is a TVM-FFI function, and defining an op that carries torch op tags, the
// same for both ABI modes. The torch layer sets
// these when it loads; the core loads it from beside itself when a block
// needs it and nothing has.
//
//   void* reg = TorchLayer()->register_ffi_kernel("mylib::op", "CPU", "/lib/mod.so", "/lib/libk.so", "op");
//   TorchLayer()->release(reg);   // undoes it
#pragma once

#include <string>
#include <vector>

namespace opforge {

struct TorchLayerHooks {
  // Registers `symbol` of `module` (relative: beside `library`) as `op`'s
  // kernel for dispatch key `key`; returns the registration. Throws
  // std::exception with a message naming the op and the fix.
  void* (*register_ffi_kernel)(const std::string& op, const std::string& key, const std::string& module,
                               const std::string& library, const std::string& symbol);
  // Undoes a registration.
  void (*release)(void* registration);
  // Defines `schema` ("mylib::op(Tensor x) -> Tensor") with torch op tags by
  // name ("cudagraph_unsafe": also the capture guard, docs/cuda_graphs.md);
  // returns the registration. Throws std::exception naming the op.
  void* (*define_tagged)(const std::string& schema, const std::vector<std::string>& tags);
};

void SetTorchLayerHooks(const TorchLayerHooks& hooks);

// The torch layer's hooks, loading libopforge_torch.so from beside the core
// if it is not loaded yet; null with `why` set when it cannot be loaded.
const TorchLayerHooks* TorchLayer(std::string* why);

}  // namespace opforge
