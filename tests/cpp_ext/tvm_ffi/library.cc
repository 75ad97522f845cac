// An opforge library whose kernels live in libffi_module.so, found beside
// this library: the op's struct parameter reaches the function as its
// fields, in schema order.
#include "norm_cfg.h"

namespace ffi_ext {

OPFORGE_LIBRARY(ffi_ext, m) {
  m.types<NormCfg>();
  m.def("rms_norm(Tensor! out, Tensor x, Tensor w, NormCfg cfg) -> ()");
  m.impl("rms_norm", c10::kCPU, opforge::TvmFfi("rms_norm", "libffi_module.so"));
  m.def("noop(Tensor! out, Tensor x, Tensor w, NormCfg cfg) -> ()");  // benchmarks/bench_tvm_ffi_cpp.py
  m.impl("noop", c10::kCPU, opforge::TvmFfi("noop", "libffi_module.so"));
  m.def("count(Tensor x) -> int");
  m.impl("count", opforge::TvmFfi("count", "libffi_module.so"));
}

}  // namespace ffi_ext
