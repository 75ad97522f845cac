// (e) The same ops with their scalars in config structs, as opforge lets a
// library write them: torch sees the flat schema (rms_norm(..., float
// cfg__epsilon=1e-06)), opforge.ops takes the struct. Built on libtorch's C++
// API and on torch's stable ABI; VLLM_STYLE_NS names the op namespace.
#include <opforge/opforge.h>

#include "ops.h"

namespace vllm_style {
OPFORGE_STRUCT(NormCfg, epsilon);
OPFORGE_STRUCT(RopeCfg, head_size, is_neox);
}  // namespace vllm_style

using namespace vllm_style;

OPFORGE_LIBRARY(VLLM_STYLE_NS, ops) {
  ops.def("rms_norm(Tensor! out, Tensor input, Tensor weight, NormCfg cfg) -> ()");
  ops.impl("rms_norm", c10::kCPU, &with_cfg::rms_norm);

  ops.def("fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, NormCfg cfg) -> ()");
  ops.impl("fused_add_rms_norm", c10::kCPU, &with_cfg::fused_add_rms_norm);

  ops.def("silu_and_mul(Tensor! out, Tensor input) -> ()");
  ops.impl("silu_and_mul", c10::kCPU, &silu_and_mul);

  ops.def("rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, Tensor cos_sin_cache, RopeCfg cfg) -> ()");
  ops.impl("rotary_embedding", c10::kCPU, &with_cfg::rotary_embedding);

#ifdef VLLM_STYLE_WITH_CUDA
  ops.impl("rms_norm", c10::kCUDA, &with_cfg::rms_norm_cuda);
  ops.impl("fused_add_rms_norm", c10::kCUDA, &with_cfg::fused_add_rms_norm_cuda);
  ops.impl("silu_and_mul", c10::kCUDA, &silu_and_mul_cuda);
  ops.impl("rotary_embedding", c10::kCUDA, &with_cfg::rotary_embedding_cuda);
#endif
}
