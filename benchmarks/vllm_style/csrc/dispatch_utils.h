// What the kernels need from torch beyond a tensor's own methods, for both
// ABIs: a check that throws, a dtype switch (vLLM's
// VLLM_DISPATCH_FLOATING_TYPES) and a tensor's rows.
#pragma once

#include <cstdint>

#include "ops.h"

#ifdef VLLM_STYLE_STABLE
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Exception.h>
#include <torch/headeronly/util/Half.h>
#define VLLM_STYLE_CHECK(cond, ...) STD_TORCH_CHECK(cond, __VA_ARGS__)
#else
#include <c10/util/Exception.h>
#define VLLM_STYLE_CHECK(cond, ...) TORCH_CHECK(cond, __VA_ARGS__)
#endif

namespace vllm_style {

// Calls body(scalar_t{}) for float32, float16 and bfloat16 tensors:
//   DispatchFloatingTypes(x.scalar_type(), "rms_norm", [&](auto tag) { using scalar_t = decltype(tag); ... });
template <class Body>
void DispatchFloatingTypes(c10::ScalarType dtype, const char* op, Body&& body) {
  switch (dtype) {
    case c10::ScalarType::Float:
      body(float{});
      break;
    case c10::ScalarType::Half:
      body(c10::Half{});
      break;
    case c10::ScalarType::BFloat16:
      body(c10::BFloat16{});
      break;
    default:
      VLLM_STYLE_CHECK(false, op, ": supports float32, float16 and bfloat16 tensors");
  }
}

// The size of the last dimension, and how many rows of it the tensor holds.
inline int64_t LastDim(const Tensor& t) { return t.size(t.dim() - 1); }
inline int64_t NumRows(const Tensor& t) {
  const int64_t d = LastDim(t);
  return d == 0 ? 0 : t.numel() / d;
}

}  // namespace vllm_style
