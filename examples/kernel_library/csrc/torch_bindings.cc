// The library's ops, registered the way vLLM's csrc/torch_bindings.cpp does:
// a schema in torch's grammar (`Tensor!` for what a kernel writes), then one
// impl per device. Structs and enums in a schema are this library's own
// (`NormCfg` is `kernels.NormCfg`; another library may have its NormCfg too).
#include <limits>

#include "ops.h"
#include "portable.h"

namespace kernels {

Tensor rms_norm_fn(const Tensor& input, const Tensor& weight, const NormCfg& cfg) {
  Tensor out = EmptyLike(input);
  // Through the dispatcher, so each device gets its own kernel.
  opforge::Call("kernels::rms_norm", out, input, weight, cfg);
  return out;
}

Tensor one_shot_all_reduce(const Tensor& input, const ReduceCfg& cfg, const std::string& group_name) {
  return opforge::Call<Tensor>("symm_mem::one_shot_all_reduce", input, cfg.reduce_op, group_name);
}

Tensor one_shot_all_reduce_meta(const Tensor& input, const ReduceCfg&, const std::string&) { return EmptyLike(input); }

Tensor two_shot_all_reduce(Tensor& input, const ReduceCfg& cfg, const std::string& group_name) {
  Tensor out = EmptyLike(input);
  return opforge::Call<Tensor>("symm_mem::two_shot_all_reduce_out", input, cfg.reduce_op, group_name, out);
}

Tensor two_shot_all_reduce_meta(Tensor& input, const ReduceCfg&, const std::string&) { return EmptyLike(input); }

// Where all_reduce turns from one-shot to two-shot. One-shot reads each
// peer's whole message, (N - 1) * S bytes per rank, between two barriers;
// two-shot reads a 1/N slice from each peer twice (reduce, then gather),
// 2 (N - 1) / N * S bytes, with a third barrier between. One-shot wins while
// the message is latency-bound, two-shot once it is bandwidth-bound, the sooner
// the more ranks. vLLM's and SGLang's custom all-reduce switch at 512 KB up to
// 4 ranks and at 256 KB up to 8 (CustomAllreduce::allreduce in
// csrc/custom_all_reduce.cuh and sgl-kernel/csrc/allreduce/custom_all_reduce.cuh):
// taken as it is for 8. At 2 ranks both move S bytes and vLLM stays
// one-shot at every size; torch's two kernels differ there (one-shot runs at
// most 24 x 512 threads, two-shot 24 x 1024), and the sweep of
// benchmarks/bench_symm_mem_tp.py on 2 H200s has one-shot ahead up to 1 MB
// (13.6 against 14.7 us in a CUDA graph) and two-shot ahead from 4 MB (24.9
// against 32.1 us): 2 ranks switch at 2 MB. On 4 H200s one-shot is still
// ahead at 512 KB (13.0 against 13.7 us, float32, CUDA graph) and two-shot
// from 1 MB (16.0 against 18.3 us): 4 ranks switch at 1 MB. torch's
// two_shot_all_reduce_out exists for 2, 4 and 8 ranks only: other world
// sizes stay one-shot.
int64_t all_reduce_two_shot_min_bytes(int64_t world_size) {
  switch (world_size) {
    case 2: return 2 * 1024 * 1024;
    case 4: return 1024 * 1024;
    case 8: return 256 * 1024;
    default: return std::numeric_limits<int64_t>::max();
  }
}

Tensor all_reduce(Tensor& input, const ReduceCfg& cfg, const std::string& group_name, int64_t world_size,
                  int64_t two_shot_min_bytes) {
  const int64_t table = all_reduce_two_shot_min_bytes(world_size);
  const int64_t threshold = two_shot_min_bytes >= 0 && table != std::numeric_limits<int64_t>::max()
                                ? two_shot_min_bytes
                                : table;
  const int64_t bytes = input.numel() * static_cast<int64_t>(input.element_size());
  if (bytes >= threshold) return two_shot_all_reduce(input, cfg, group_name);
  return one_shot_all_reduce(input, cfg, group_name);
}

Tensor all_reduce_meta(Tensor& input, const ReduceCfg&, const std::string&, int64_t, int64_t) {
  return EmptyLike(input);
}

Tensor rms_norm_fn_meta(const Tensor& input, const Tensor&, const NormCfg&) { return EmptyLike(input); }

std::tuple<Tensor, Tensor> rms_norm_backward_meta(const Tensor&, const Tensor& input, const Tensor& weight,
                                                  const NormCfg&) {
  return {EmptyLike(input), EmptyLike(weight)};
}

// The backward of rms_norm_fn, written against its own signature. It calls
// the backward kernel as an op, so torch.compile traces it.
struct RmsNormGrad {
  static void setup_context(opforge::AutogradContext* ctx, const Tensor& input, const Tensor& weight,
                            const NormCfg& cfg, const Tensor& /*out*/) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["eps"] = cfg.eps;
    ctx->saved_data["gemma"] = cfg.gemma;
  }
  static opforge::GradsFor<decltype(rms_norm_fn)> backward(opforge::AutogradContext* ctx, const Tensor& grad) {
    auto saved = ctx->get_saved_variables();
    const NormCfg cfg{ctx->saved_data["eps"].toDouble(), ctx->saved_data["gemma"].toBool()};
    auto [grad_input, grad_weight] = opforge::Call<std::tuple<Tensor, Tensor>>(
        "kernels::rms_norm_backward", Contiguous(grad), saved[0], saved[1], cfg);
    return {grad_input, grad_weight, opforge::NoGrad{}};
  }
};

}  // namespace kernels

using namespace kernels;

OPFORGE_LIBRARY(kernels, ops) {
  ops.def("rms_norm(Tensor! out, Tensor input, Tensor weight, NormCfg cfg) -> ()");
  ops.impl("rms_norm", c10::kCPU, &rms_norm_cpu);

  ops.def("fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, NormCfg cfg) -> ()");
  ops.impl("fused_add_rms_norm", c10::kCPU, &fused_add_rms_norm_cpu);

  ops.def("act_and_mul(Tensor! out, Tensor input, ActCfg cfg) -> ()");
  ops.impl("act_and_mul", c10::kCPU, &act_and_mul_cpu);

  ops.def("rms_norm_backward(Tensor grad, Tensor input, Tensor weight, NormCfg cfg) -> (Tensor, Tensor)");
  ops.impl("rms_norm_backward", c10::kCPU, &rms_norm_backward_cpu);
  ops.fake("rms_norm_backward", &rms_norm_backward_meta);

  // Reads a host value at each call: a CUDA graph capture must break around it.
  ops.def("scale_by_host(Tensor! out, Tensor x, Tensor host_scale) -> ()").tag("cudagraph_unsafe");
  ops.impl("scale_by_host", c10::kCPU, &scale_by_host_cpu);

  ops.def("make_scale_table(float[] scales) -> int", &make_scale_table);
  ops.def("scale_rows(Tensor! out, Tensor x, Handle(ScaleTable) table, int[] rows, float? clamp=None) -> ()");
  ops.impl("scale_rows", c10::kCPU, &scale_rows_cpu);

  ops.def("one_shot_all_reduce(Tensor input, ReduceCfg cfg, str group_name) -> Tensor", &one_shot_all_reduce)
      .symm_mem_args({"input"});
  ops.fake("one_shot_all_reduce", &one_shot_all_reduce_meta);
  ops.def("two_shot_all_reduce(Tensor! input, ReduceCfg cfg, str group_name) -> Tensor", &two_shot_all_reduce)
      .symm_mem_args({"input"});
  ops.fake("two_shot_all_reduce", &two_shot_all_reduce_meta);
  ops.def("all_reduce(Tensor! input, ReduceCfg cfg, str group_name, int world_size, int two_shot_min_bytes=-1) "
          "-> Tensor",
          &all_reduce)
      .symm_mem_args({"input"});
  ops.fake("all_reduce", &all_reduce_meta);
  ops.def("all_reduce_two_shot_min_bytes(int world_size) -> int", &all_reduce_two_shot_min_bytes);

  // A functional op with a C++ backward; the kernel serves every device.
  ops.def("rms_norm_fn(Tensor input, Tensor weight, NormCfg cfg) -> Tensor", &rms_norm_fn)
      .autograd<RmsNormGrad>();
  ops.fake("rms_norm_fn", &rms_norm_fn_meta);

#ifdef OPFORGE_WITH_CUDA
  ops.impl("rms_norm", c10::kCUDA, &rms_norm_cuda);
  ops.impl("fused_add_rms_norm", c10::kCUDA, &fused_add_rms_norm_cuda);
  ops.impl("act_and_mul", c10::kCUDA, &act_and_mul_cuda);
  ops.impl("scale_by_host", c10::kCUDA, &scale_by_host_cuda);
  ops.impl("rms_norm_backward", c10::kCUDA, &rms_norm_backward_cuda);
#endif
}
