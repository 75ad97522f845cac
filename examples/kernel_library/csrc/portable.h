// The little a kernel needs from torch beyond opforge::Tensor's methods
// (data pointers, sizes, dtype), for both ABIs. This is the part of the
// library that a move to the stable ABI changes (docs/stable_abi.md#migrating).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ops.h"

#ifdef OPFORGE_STABLE_ABI
#include <torch/csrc/stable/ops.h>
#else
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#endif

#if defined(OPFORGE_WITH_CUDA) && !defined(OPFORGE_STABLE_ABI)
#include <c10/cuda/CUDAStream.h>
#endif

namespace kernels {

inline Tensor EmptyLike(const Tensor& t) {
#ifdef OPFORGE_STABLE_ABI
  return torch::stable::empty_like(t);
#else
  return at::empty_like(t);
#endif
}

inline Tensor Contiguous(const Tensor& t) {
#ifdef OPFORGE_STABLE_ABI
  return torch::stable::contiguous(t);
#else
  return t.contiguous();
#endif
}

// Throws with the op's name; torch turns it into a Python RuntimeError.
inline void Check(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::runtime_error(std::string(op) + ": " + what);
}

// Calls body(scalar_t{}) for the tensor's dtype:
//   DispatchFloating(x.scalar_type(), "rms_norm", [&](auto tag) { using scalar_t = decltype(tag); ... });
template <class Body>
void DispatchFloating(c10::ScalarType dtype, const char* op, Body&& body) {
  switch (dtype) {
    case c10::ScalarType::Float: body(float{}); break;
    case c10::ScalarType::Double: body(double{}); break;
    case c10::ScalarType::BFloat16: body(c10::BFloat16{}); break;
    case c10::ScalarType::Half: body(c10::Half{}); break;
    default: Check(false, op, "supports float32, float64, bfloat16 and float16 tensors");
  }
}

// Rows and row length of a contiguous tensor seen as [rows, d].
// The one float32 of a host tensor (a scale, a length) read at call time.
inline float HostScalar(const Tensor& t, const char* op) {
  Check(t.is_cpu() && t.scalar_type() == c10::ScalarType::Float && t.numel() == 1, op,
        "host_scale must be one float32 on the CPU");
  return *t.const_data_ptr<float>();
}

inline void RowsOf(const Tensor& t, int64_t& rows, int64_t& d) {
  d = t.size(t.dim() - 1);
  rows = d == 0 ? 0 : t.numel() / d;
}

#ifdef OPFORGE_WITH_CUDA
inline void* CurrentStream(const Tensor& t) {
#ifdef OPFORGE_STABLE_ABI
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream));
  return stream;
#else
  return c10::cuda::getCurrentCUDAStream(t.get_device()).stream();
#endif
}
#endif

}  // namespace kernels
