// The torch layer's autograd of C++ ops (cpp_autograd.cc), as the rest of
// the torch layer and the Python extension use it.
#pragma once

#include <torch/library.h>

#include <memory>
#include <string>

#include "core/libraries.h"
#include "opforge/detail/autograd_op.h"
#include "torch/registration.h"

namespace opforge::detail {

// Registers the boxed Autograd kernel of `op` (a stable-ABI op's; the C++ API
// mode registers its typed one, opforge/backward.h).
std::unique_ptr<KernelRegistration> RegisterAutogradKernel(const std::string& qualified, const AutogradOp* op);

// Wires a stable-ABI op's C++ backward (LibraryOp::torch_layer_autograd; stable_autograd.cc).
void WireStableAutograd(const LibraryOp& lib_op);

}  // namespace opforge::detail
