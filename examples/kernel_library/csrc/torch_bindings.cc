// The library's ops, registered the way vLLM's csrc/torch_bindings.cpp does:
// a schema in torch's grammar (`Tensor!` for what a kernel writes), then one
// impl per device. Structs and enums in a schema are this library's own
// (`NormCfg` is `kernels.NormCfg`; another library may have its NormCfg too).
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

  ops.def("make_scale_table(float[] scales) -> int", &make_scale_table);
  ops.def("scale_rows(Tensor! out, Tensor x, Handle(ScaleTable) table, int[] rows, float? clamp=None) -> ()");
  ops.impl("scale_rows", c10::kCPU, &scale_rows_cpu);

  ops.def("one_shot_all_reduce(Tensor input, ReduceCfg cfg, str group_name) -> Tensor", &one_shot_all_reduce)
      .symm_mem_args({"input"});
  ops.fake("one_shot_all_reduce", &one_shot_all_reduce_meta);

  // A functional op with a C++ backward; the kernel serves every device.
  ops.def("rms_norm_fn(Tensor input, Tensor weight, NormCfg cfg) -> Tensor", &rms_norm_fn)
      .autograd<RmsNormGrad>();
  ops.fake("rms_norm_fn", &rms_norm_fn_meta);

#ifdef OPFORGE_WITH_CUDA
  ops.impl("rms_norm", c10::kCUDA, &rms_norm_cuda);
  ops.impl("fused_add_rms_norm", c10::kCUDA, &fused_add_rms_norm_cuda);
  ops.impl("act_and_mul", c10::kCUDA, &act_and_mul_cuda);
  ops.impl("rms_norm_backward", c10::kCUDA, &rms_norm_backward_cuda);
#endif
}
