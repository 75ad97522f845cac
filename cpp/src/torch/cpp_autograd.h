// The torch layer's autograd of C++ ops (cpp_autograd.cc), as the rest of
// the torch layer and the Python extension use it.
#pragma once

#include <torch/library.h>

#include <string>
#include <vector>

#include "opforge/backward.h"

namespace opforge::detail {

// Registers the boxed Autograd kernel of `op` in `lib` (a stable-ABI op's;
// the C++ API mode registers its typed one, opforge/backward.h).
void RegisterAutogradKernel(torch::Library& lib, const std::string& qualified, const AutogradOp* op);

}  // namespace opforge::detail
