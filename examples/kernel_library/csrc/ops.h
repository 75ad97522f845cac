// The kernels of this library and their config structs, written the way
// vLLM's csrc/ops.h declares its ops: in-place kernels take `Tensor& out`.
// `opforge::Tensor` is at::Tensor, or torch::stable::Tensor in a stable-ABI
// build (docs/stable_abi.md): the same source builds both ways.
#pragma once

#include <opforge/opforge.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace kernels {

using opforge::Tensor;

struct NormCfg {
  double eps = 1e-6;
  bool gemma = false;  // scale by (1 + weight), as Gemma's RMSNorm does
};
OPFORGE_STRUCT(NormCfg, eps, gemma);

enum class Act : int64_t { kSilu = 0, kGelu = 1 };
OPFORGE_ENUM(Act, kSilu, kGelu);

struct ActCfg {
  Act act = Act::kSilu;
  double limit = 0.0;  // > 0: clamp the gate's input to [-limit, limit]
};
OPFORGE_STRUCT(ActCfg, act, limit);

// out = x / sqrt(mean(x^2) + eps) * w   (over the last dimension)
void rms_norm_cpu(Tensor& out, const Tensor& input, const Tensor& weight, const NormCfg& cfg);
// residual += input; input = rms_norm(residual)
void fused_add_rms_norm_cpu(Tensor& input, Tensor& residual, const Tensor& weight, const NormCfg& cfg);
// The gradients of rms_norm: (d input, d weight).
std::tuple<Tensor, Tensor> rms_norm_backward_cpu(const Tensor& grad, const Tensor& input, const Tensor& weight,
                                                 const NormCfg& cfg);
// out = act(input[..., :d]) * input[..., d:]
void act_and_mul_cpu(Tensor& out, const Tensor& input, const ActCfg& cfg);

// out = x * host_scale[0], the scale read on the host at each call (as an
// attention op reads its host-side metadata): a CUDA graph would keep the
// value of the capture, so the op is tagged cudagraph_unsafe
// (docs/cuda_graphs.md). host_scale: one float32 on the CPU.
void scale_by_host_cpu(Tensor& out, const Tensor& x, const Tensor& host_scale);

#ifdef OPFORGE_WITH_CUDA
void scale_by_host_cuda(Tensor& out, const Tensor& x, const Tensor& host_scale);
void rms_norm_cuda(Tensor& out, const Tensor& input, const Tensor& weight, const NormCfg& cfg);
void fused_add_rms_norm_cuda(Tensor& input, Tensor& residual, const Tensor& weight, const NormCfg& cfg);
std::tuple<Tensor, Tensor> rms_norm_backward_cuda(const Tensor& grad, const Tensor& input, const Tensor& weight,
                                                  const NormCfg& cfg);
void act_and_mul_cuda(Tensor& out, const Tensor& input, const ActCfg& cfg);
#endif

// Per-row scales held by C++ and passed to ops as a runner handle
// (docs/handles.md): out[i] = x[i] * table.scales[rows[i]], clamped.
struct ScaleTable {
  std::vector<double> scales;
};
int64_t make_scale_table(const std::vector<double>& scales);
void scale_rows_cpu(Tensor& out, const Tensor& x, opforge::Handle<ScaleTable> table, const std::vector<int64_t>& rows,
                    std::optional<double> clamp);

// A one-shot all-reduce whose input must live in symmetric memory
// (docs/symm_mem.md): torch's own symm_mem::one_shot_all_reduce, called
// through the dispatcher. Under torch.compile, Inductor allocates the
// producer of `input` as a symmetric buffer.
struct ReduceCfg {
  std::string reduce_op = "sum";
};
OPFORGE_STRUCT(ReduceCfg, reduce_op);
Tensor one_shot_all_reduce(const Tensor& input, const ReduceCfg& cfg, const std::string& group_name);
Tensor one_shot_all_reduce_meta(const Tensor& input, const ReduceCfg& cfg, const std::string& group_name);

// A two-shot all-reduce (reduce-scatter, then all-gather): torch's
// symm_mem::two_shot_all_reduce_out. It writes this rank's reduced slice
// into `input` for the peers to gather, so `input` is written (Tensor!).
// torch runs it at world sizes 2, 4 and 8 only.
Tensor two_shot_all_reduce(Tensor& input, const ReduceCfg& cfg, const std::string& group_name);
Tensor two_shot_all_reduce_meta(Tensor& input, const ReduceCfg& cfg, const std::string& group_name);

// The all-reduce that picks one of the two by message size and world size:
// two-shot from all_reduce_two_shot_min_bytes(world_size) bytes, one-shot
// below (torch_bindings.cc says why). `world_size` is the group's size (the
// stable ABI cannot ask a process group), the same on every rank.
// two_shot_min_bytes >= 0 replaces the table's threshold (0: two-shot at every
// size the world size allows). `input` is written on the two-shot path.
Tensor all_reduce(Tensor& input, const ReduceCfg& cfg, const std::string& group_name, int64_t world_size,
                  int64_t two_shot_min_bytes);
Tensor all_reduce_meta(Tensor& input, const ReduceCfg& cfg, const std::string& group_name, int64_t world_size,
                       int64_t two_shot_min_bytes);
// The smallest message, in bytes, that all_reduce sends two-shot at this
// world size; INT64_MAX where torch has no two-shot kernel (one-shot always).
int64_t all_reduce_two_shot_min_bytes(int64_t world_size);

// The functional norm: a new output, and a C++ backward (torch_bindings.cc).
Tensor rms_norm_fn(const Tensor& input, const Tensor& weight, const NormCfg& cfg);
Tensor rms_norm_fn_meta(const Tensor& input, const Tensor& weight, const NormCfg& cfg);

}  // namespace kernels
