// Everything a C++ kernel library needs from opforge: OPFORGE_STRUCT,
// OPFORGE_ENUM, OPFORGE_LIBRARY, opforge::Handle<T> and opforge::Tensor.
//
// Built with OPFORGE_STABLE_ABI defined (CMake: opforge_add_library(... STABLE)),
// the library uses only torch's stable ABI and loads on every torch from its
// target version on (docs/stable_abi.md); otherwise it uses libtorch's C++ API
// and is built for one torch release (docs/cpp_ops.md). The registrations read
// the same in both modes.
//
// This header gives no tensor arithmetic: include the ATen headers your
// kernels use (<ATen/ATen.h>, or narrow ones such as <ATen/ops/empty.h>), or
// torch's stable ops (<torch/csrc/stable/ops.h>) in stable mode.
#pragma once

#ifdef OPFORGE_STABLE_ABI
#include "opforge/stable/library.h"
#else
#include "opforge/backward.h"
#include "opforge/library.h"
#endif
