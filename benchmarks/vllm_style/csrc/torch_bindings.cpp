// (a) The ops registered with plain TORCH_LIBRARY, as vLLM's
// csrc/torch_bindings.cpp registers its own: a schema in torch's grammar, then
// one kernel per device. The baseline of the drop-in rows.
#include <torch/library.h>

#include "ops.h"

using namespace vllm_style;

TORCH_LIBRARY(vllm_style_torch, ops) {
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
