// What opforge's torch layer (libopforge_torch, built for the running torch)
// does for the core: one versioned table of the upward calls, handed to the
// core once, as the torch layer loads. The same for both ABI modes. The core
// never loads the torch layer itself: opforge._C and every library on
// libtorch's C++ API link it, and a stable-ABI library whose block needs it
// loads it from beside the core before it commits (opforge/detail/abi_access.h).
//
//   SetTorchLayer(&kLayer);                        // the torch layer, once, as it loads
//   if (const OpforgeTorchLayerV1* layer = TorchLayer()) layer->release(registration);   // the core
//
// Like nanobind's nb_internals, the table is all the process state the two
// share; each field says how it may be used from several threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/libraries.h"

namespace opforge {

// One `m.impl(op, key, opforge::TvmFfi(symbol, module))` of a block.
struct TorchLayerFfiKernel {
  std::string op;       // "mylib::rms_norm"
  std::string key;      // a dispatch key name: "CPU"
  std::string module;   // the module .so; a relative path is found beside `library`
  std::string library;  // the kernel library's path
  std::string symbol;   // as TVM_FFI_DLL_EXPORT_TYPED_FUNC names it
  std::string where;    // the block, for messages: "libk.so: OPFORGE_LIBRARY(mylib) at k.cc:12"
  bool owned_tensors = false;  // opforge::TvmFfi(...).owned_tensors()
};

constexpr uint32_t kTorchLayerVersion = 1;

struct OpforgeTorchLayerV1 {
  // kTorchLayerVersion and sizeof(OpforgeTorchLayerV1) of the torch layer's
  // build: the core takes only a table it knows.
  uint32_t version;
  uint32_t size;
  // The functions below may be called from any thread at once and take their
  // own locks; the core holds none of its locks while it calls them. Each
  // throws std::exception with a message that names the op and the fix.
  //
  // Registers `kernel.symbol` of its module as `kernel.op`'s kernel for
  // `kernel.key`; returns the registration. Where the module or the symbol
  // cannot be found, registers a kernel that raises instead, sets
  // `*unavailable` to the load error (naming the op, the symbol and the
  // library) and still returns the registration: the op stays defined.
  void* (*register_ffi_kernel)(const TorchLayerFfiKernel& kernel, std::string* unavailable);
  // Undoes a registration of register_ffi_kernel or define_tagged.
  void (*release)(void* registration);
  // Defines `schema` ("mylib::op(Tensor x) -> Tensor") with torch op tags by
  // name ("cudagraph_unsafe": also the capture guard, docs/cuda_graphs.md);
  // returns the registration.
  void* (*define_tagged)(const std::string& schema, const std::vector<std::string>& tags);
  // Called once for each op a block committed: for the ops committed before
  // the table was handed, as it is handed, then for each later one after its
  // block commits. Calls for two blocks committing at once may overlap.
  void (*on_commit)(const LibraryOp& op);
};

// Hands the core the torch layer's table, which must live for the rest of
// the process; false, and nothing changes, for a version the core does not
// know or when a table was already handed. Thread-safe.
bool SetTorchLayer(const OpforgeTorchLayerV1* layer);

// The torch layer's table, or null while none has been handed. Thread-safe.
const OpforgeTorchLayerV1* TorchLayer();

}  // namespace opforge
