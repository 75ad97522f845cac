// The kernels of a small kernel library written the way vLLM's csrc/ writes
// its own: in-place ops that take the tensors they write as `Tensor&`, flat
// scalars, one kernel per device. Compiled once per torch ABI: against
// libtorch's C++ API (Tensor is at::Tensor), or, with VLLM_STYLE_STABLE,
// against torch's stable ABI (Tensor is torch::stable::Tensor). Each variant
// of the benchmark registers these very functions its own way.
#pragma once

#include <cstdint>
#include <optional>

#ifdef VLLM_STYLE_STABLE
#include <torch/csrc/stable/tensor.h>
#else
#include <ATen/core/Tensor.h>
#endif

namespace vllm_style {

#ifdef VLLM_STYLE_STABLE
using Tensor = torch::stable::Tensor;
#else
using Tensor = at::Tensor;
#endif

// CPU kernels, csrc/cpu/.
// out = input / sqrt(mean(input^2) + epsilon) * weight, over the last dimension
void rms_norm(Tensor& out, Tensor& input, Tensor& weight, double epsilon);
// residual += input; input = rms_norm(residual)
void fused_add_rms_norm(Tensor& input, Tensor& residual, Tensor& weight, double epsilon);
// out = silu(input[..., :d]) * input[..., d:]
void silu_and_mul(Tensor& out, Tensor& input);
// Rotates query (and key) in place by cos_sin_cache[positions]: GPT-NeoX style
// (halves) when is_neox, GPT-J style (interleaved pairs) otherwise.
void rotary_embedding(Tensor& positions, Tensor& query, std::optional<Tensor> key, int64_t head_size,
                      Tensor& cos_sin_cache, bool is_neox);

#ifdef VLLM_STYLE_WITH_CUDA
// CUDA kernels, csrc/cuda/: the same ops on the current stream.
void rms_norm_cuda(Tensor& out, Tensor& input, Tensor& weight, double epsilon);
void fused_add_rms_norm_cuda(Tensor& input, Tensor& residual, Tensor& weight, double epsilon);
void silu_and_mul_cuda(Tensor& out, Tensor& input);
void rotary_embedding_cuda(Tensor& positions, Tensor& query, std::optional<Tensor> key, int64_t head_size,
                           Tensor& cos_sin_cache, bool is_neox);
#endif

// The same ops with their scalars in config structs, for the opforge variant
// that takes them (torch_bindings_structs.cpp); each calls the flat kernel.
struct NormCfg {
  double epsilon = 1e-6;
};

struct RopeCfg {
  int64_t head_size;  // required: no default
  bool is_neox = true;
};

namespace with_cfg {
void rms_norm(Tensor& out, Tensor& input, Tensor& weight, const NormCfg& cfg);
void fused_add_rms_norm(Tensor& input, Tensor& residual, Tensor& weight, const NormCfg& cfg);
void rotary_embedding(Tensor& positions, Tensor& query, std::optional<Tensor> key, Tensor& cos_sin_cache,
                      const RopeCfg& cfg);
#ifdef VLLM_STYLE_WITH_CUDA
void rms_norm_cuda(Tensor& out, Tensor& input, Tensor& weight, const NormCfg& cfg);
void fused_add_rms_norm_cuda(Tensor& input, Tensor& residual, Tensor& weight, const NormCfg& cfg);
void rotary_embedding_cuda(Tensor& positions, Tensor& query, std::optional<Tensor> key, Tensor& cos_sin_cache,
                           const RopeCfg& cfg);
#endif
}  // namespace with_cfg

}  // namespace vllm_style
