// The torch layer's table for the core (core/torch_layer.h), handed over
// once, as libopforge_torch loads.
#include "core/torch_layer.h"

#include "torch/autograd_kernels.h"
#include "torch/capture_guard.h"
#include "torch/ffi_kernel.h"
#include "torch/registration.h"

namespace opforge {
namespace {

void Release(void* registration) { delete static_cast<KernelRegistration*>(registration); }

constexpr OpforgeTorchLayerV1 kLayer = {
    kTorchLayerVersion, sizeof(OpforgeTorchLayerV1), &detail::RegisterFfiKernel, &Release, &DefineTagged,
    &OnLibraryOp,
};

const bool kHanded = SetTorchLayer(&kLayer);

}  // namespace
}  // namespace opforge
