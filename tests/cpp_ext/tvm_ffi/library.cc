// An opforge library whose kernels live in libffi_module.so, found beside
// this library: the op's struct parameter reaches the function as its
// fields, in schema order.
#include <opforge/opforge.h>

namespace ffi_ext {

struct NormCfg {
  double eps = 1e-6;
  bool add_one = false;
};
OPFORGE_STRUCT(NormCfg, eps, add_one);

OPFORGE_LIBRARY(ffi_ext, m) {
  m.types<NormCfg>();
  m.def("rms_norm(Tensor! out, Tensor x, Tensor w, NormCfg cfg) -> ()");
  m.impl("rms_norm", c10::kCPU, opforge::TvmFfi("rms_norm", "libffi_module.so"));
  m.def("count(Tensor x) -> int");
  m.impl("count", opforge::TvmFfi("count", "libffi_module.so"));
}

}  // namespace ffi_ext
