// (c) and (d): torch_bindings.cpp with its registration macro changed to
// OPFORGE_LIBRARY, every def and impl line as it was. Built twice: on
// libtorch's C++ API (opforge_add_library(...)) and on torch's stable ABI
// (opforge_add_library(... STABLE ...)), where the kernels take
// torch::stable::Tensor. VLLM_STYLE_NS names the op namespace of each build.
#include <opforge/opforge.h>

#include "ops.h"

using namespace vllm_style;

OPFORGE_LIBRARY(VLLM_STYLE_NS, ops) {
  // Layernorm
  // Apply Root Mean Square (RMS) Normalization to the input tensor.
  ops.def("rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()");
  ops.impl("rms_norm", c10::kCPU, &rms_norm);

  // In-place fused Add and RMS Normalization.
  ops.def("fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()");
  ops.impl("fused_add_rms_norm", c10::kCPU, &fused_add_rms_norm);

  // Activation ops
  // Activation function used in SwiGLU.
  ops.def("silu_and_mul(Tensor! out, Tensor input) -> ()");
  ops.impl("silu_and_mul", c10::kCPU, &silu_and_mul);

  // Rotary embedding
  // Apply GPT-NeoX or GPT-J style rotary embedding to query and key.
  ops.def("rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, Tensor cos_sin_cache, "
          "bool is_neox) -> ()");
  ops.impl("rotary_embedding", c10::kCPU, &rotary_embedding);

#ifdef VLLM_STYLE_WITH_CUDA
  ops.impl("rms_norm", c10::kCUDA, &rms_norm_cuda);
  ops.impl("fused_add_rms_norm", c10::kCUDA, &fused_add_rms_norm_cuda);
  ops.impl("silu_and_mul", c10::kCUDA, &silu_and_mul_cuda);
  ops.impl("rotary_embedding", c10::kCUDA, &rotary_embedding_cuda);
#endif
}
