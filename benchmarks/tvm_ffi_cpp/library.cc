// The ops, each with its struct, and the module's functions as kernels.
#include <opforge/opforge.h>

namespace bench_ffi {

struct NormCfg {
  double eps = 1e-6;
  bool add_one = false;
};
OPFORGE_STRUCT(NormCfg, eps, add_one);

OPFORGE_LIBRARY(bench_ffi, m) {
  m.types<NormCfg>();
  m.def("noop(Tensor! out, Tensor x, Tensor w, NormCfg cfg) -> ()");
  m.impl("noop", c10::kCPU, opforge::TvmFfi("noop", "libbench_ffi_module.so"));
  m.def("rms_norm(Tensor! out, Tensor x, Tensor w, NormCfg cfg) -> ()");
  m.impl("rms_norm", c10::kCPU, opforge::TvmFfi("rms_norm", "libbench_ffi_module.so"));
}

}  // namespace bench_ffi
