// OPFORGE_LIBRARY on torch's stable ABI (docs/stable_abi.md): the same
// registrations as the libtorch C++ API mode (opforge/library.h), built once
// and loaded by every torch from TORCH_TARGET_VERSION on. Include
// <opforge/opforge.h> with OPFORGE_STABLE_ABI defined (opforge_add_library(...
// STABLE) does it).
//
// Kernels take torch::stable::Tensor (opforge::Tensor) and structs; torch
// calls a boxed kernel (opforge/stable/kernel.h) that reads the flat leaves
// from its stack, rebuilds the structs and calls yours. The library links
// nothing of torch or opforge: torch's C shims resolve in the process,
// opforge's C surface (opforge/abi.h) is looked up at load.
//
// What this mode adds to the shared model (opforge/detail/): how a slot is
// read and written (stable/slots.h), the boxed kernel (stable/kernel.h), the
// backend (stable/backend.h), opforge::Call (stable/call.h) and the backward
// the torch layer wires (stable/backward.h).
#pragma once

#ifndef OPFORGE_STABLE_ABI
#error "opforge/stable/library.h needs OPFORGE_STABLE_ABI; include <opforge/opforge.h>"
#endif
#ifndef TORCH_TARGET_VERSION
#error "a stable-ABI library targets a torch version: compile with -DTORCH_TARGET_VERSION=0x020A000000000000ULL (opforge_add_library(... STABLE) sets it)"
#endif

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/stableivalue_conversions.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/DeviceType.h>
#include <torch/headeronly/core/Layout.h>
#include <torch/headeronly/core/MemoryFormat.h>
#include <torch/headeronly/core/ScalarType.h>

namespace opforge {
// The tensor and device types of this ABI mode: code written against
// opforge::Tensor builds in both modes.
using Tensor = torch::stable::Tensor;
using Device = torch::stable::Device;
}  // namespace opforge

#include "opforge/detail/library_api.h"
#include "opforge/detail/macros.h"
#include "opforge/handle.h"
#include "opforge/reflect.h"
#include "opforge/stable/backend.h"
#include "opforge/stable/call.h"

namespace opforge {
using Library = detail::LibraryApi<detail::StableMode, detail::StableBackend>;
using OpBuilder = detail::OpBuilderApi<detail::StableMode, detail::StableBackend>;
template <class Sig>
using TypedOpBuilder = detail::OpBuilderApi<detail::StableMode, detail::StableBackend, Sig>;
}  // namespace opforge

#include "opforge/stable/backward.h"

// OPFORGE_LIBRARY's blocks in this mode (opforge/detail/macros.h).
#define OPFORGE_DETAIL_LIBRARY_ARGS_(ns) #ns, nullptr
#define OPFORGE_DETAIL_IMPL_ARGS_(ns, key) #ns, #key
