// The struct of ffi_ext::rms_norm, shared by the library and the C++
// programs that call the op with it.
#pragma once

#include <opforge/opforge.h>

namespace ffi_ext {

struct NormCfg {
  double eps = 1e-6;
  bool add_one = false;
};
OPFORGE_STRUCT(NormCfg, eps, add_one);

}  // namespace ffi_ext
