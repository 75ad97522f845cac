// Autograd kernels the front ends install for ops (torch layer).
#pragma once

#include <memory>
#include <string>

namespace opforge {

// Keeps a kernel registered for as long as it lives.
class KernelRegistration {
 public:
  virtual ~KernelRegistration() = default;
};

// For ops without a backward: runs the op below autograd and, when an input
// requires grad, gives the outputs a grad_fn that raises a clear error if a
// gradient is ever requested through them. Inference calls pay one boxed
// C++ kernel, as with torch's own autograd fallback.
//
//   auto reg = RegisterNoBackwardKernel("mylib::op", "mylib::op has no backward; ...");
std::unique_ptr<KernelRegistration> RegisterNoBackwardKernel(const std::string& qualname,
                                                             const std::string& message);

// Drops the no-backward kernel the torch layer gave an op of a C++ library,
// so that a backward registered from Python can take its place. False when
// the op had none.
bool DropNoBackwardKernel(const std::string& qualname);

}  // namespace opforge
