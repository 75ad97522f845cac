// The torch layer's table (torch_layer.h).
#include "core/torch_layer.h"

#include <atomic>

namespace opforge {
namespace {

std::atomic<const OpforgeTorchLayerV1*> g_layer{nullptr};

}  // namespace

bool SetTorchLayer(const OpforgeTorchLayerV1* layer) {
  if (layer == nullptr || layer->version != kTorchLayerVersion || layer->size < sizeof(OpforgeTorchLayerV1)) {
    return false;
  }
  const OpforgeTorchLayerV1* none = nullptr;
  if (!g_layer.compare_exchange_strong(none, layer)) return false;
  LibraryRegistry::Global().SetOnCommit(layer->on_commit);
  return true;
}

const OpforgeTorchLayerV1* TorchLayer() { return g_layer.load(std::memory_order_acquire); }

}  // namespace opforge
