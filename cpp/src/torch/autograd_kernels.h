// Autograd kernels the front ends install for ops (torch layer).
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <memory>
#include <optional>
#include <string>

#include "core/libraries.h"
#include "torch/registration.h"

namespace opforge {

// For ops without a backward: runs the op below autograd and, when an input
// requires grad, gives the outputs a grad_fn that raises a clear error if a
// gradient is ever requested through them. Inference calls pay one boxed
// C++ kernel, as with torch's own autograd fallback; an op of a C++ library
// (`cpp_library`) that writes arguments bumps their versions there too,
// skipping its ADInplaceOrView kernel.
//
//   auto reg = RegisterNoBackwardKernel("mylib::op", "mylib::op has no backward; ...");
std::unique_ptr<KernelRegistration> RegisterNoBackwardKernel(const std::string& qualname, const std::string& message,
                                                             bool cpp_library = false);

// The dispatch keys a kernel runs below, as the op's Autograd kernel sets
// them (see RedispatchBelowAutograd): below autograd, and below ADInplaceOrView
// too unless the op mutates an argument.
class BelowAutograd {
 public:
  explicit BelowAutograd(bool mutates) {
    if (mutates) {
      autograd_.emplace();
    } else {
      inplace_or_view_.emplace();
    }
  }

 private:
  std::optional<at::AutoDispatchBelowAutograd> autograd_;
  std::optional<at::AutoDispatchBelowADInplaceOrView> inplace_or_view_;
};

// What an Autograd kernel does to run the op itself: redispatch below
// autograd, and past ADInplaceOrView too unless the op mutates an argument
// (its ADInplaceOrView kernel bumps versions), as torch's autograd fallback does.
void RedispatchBelowAutograd(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack,
                             bool mutates);

// The ADInplaceOrView kernel of a Python op that writes arguments
// (`Tensor(a!)`): bumps their versions as custom_op's does, an inference
// tensor outside inference mode being torch's error. (An op of a C++ library
// gets its own when its block commits, which skips inference tensors as a
// TORCH_LIBRARY op that bumps nothing would.)
std::unique_ptr<KernelRegistration> RegisterInplaceKernel(const std::string& qualname);

// What an op of a C++ library gets from the torch layer once its block
// commits (the torch layer's on_commit, core/torch_layer.h): version bumps
// for what it writes, its stable-ABI backward wired, or the no-backward error.
void OnLibraryOp(const LibraryOp& op);

// Drops the no-backward kernel the torch layer gave an op of a C++ library,
// so that a backward registered from Python can take its place. False when
// the op had none.
bool DropNoBackwardKernel(const std::string& qualname);

}  // namespace opforge
