// (b) The ops registered on torch's stable ABI by hand, as vLLM's
// _C_stable_libtorch registers its own: STABLE_TORCH_LIBRARY for the schemas,
// one STABLE_TORCH_LIBRARY_IMPL block per device, each kernel boxed with
// TORCH_BOX. The baseline of the stable drop-in rows.
#include <torch/csrc/stable/library.h>

#include "ops.h"

using namespace vllm_style;

STABLE_TORCH_LIBRARY(vllm_style_box, ops) {
  ops.def("rms_norm(Tensor! out, Tensor input, Tensor weight, float epsilon) -> ()");
  ops.def("fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()");
  ops.def("silu_and_mul(Tensor! out, Tensor input) -> ()");
  ops.def("rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, Tensor cos_sin_cache, "
          "bool is_neox) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(vllm_style_box, CPU, ops) {
  ops.impl("rms_norm", TORCH_BOX(&rms_norm));
  ops.impl("fused_add_rms_norm", TORCH_BOX(&fused_add_rms_norm));
  ops.impl("silu_and_mul", TORCH_BOX(&silu_and_mul));
  ops.impl("rotary_embedding", TORCH_BOX(&rotary_embedding));
}

#ifdef VLLM_STYLE_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(vllm_style_box, CUDA, ops) {
  ops.impl("rms_norm", TORCH_BOX(&rms_norm_cuda));
  ops.impl("fused_add_rms_norm", TORCH_BOX(&fused_add_rms_norm_cuda));
  ops.impl("silu_and_mul", TORCH_BOX(&silu_and_mul_cuda));
  ops.impl("rotary_embedding", TORCH_BOX(&rotary_embedding_cuda));
}
#endif
