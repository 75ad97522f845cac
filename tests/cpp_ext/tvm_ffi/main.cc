// A C++ program with no Python: loads an opforge library whose kernel is a
// TVM-FFI function and calls the op with its struct, through the dispatcher.
//
//   call_ffi_op path/to/libopforge_test_tvm_ffi.so   ->  prints "ok <max error> <count>"
#include <ATen/ATen.h>
#include <dlfcn.h>
#include <opforge/opforge.h>

#include <cstdio>

#include "norm_cfg.h"


int main(int argc, char** argv) {
  if (argc != 2) return 2;
  if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::printf("dlopen failed: %s\n", dlerror());
    return 1;
  }
  at::Tensor x = at::randn({4, 32}), w = at::randn({32}), out = at::zeros({4, 32});
  opforge::Call("ffi_ext::rms_norm", out, x, w, ffi_ext::NormCfg{1e-5, true});
  at::Tensor ref = x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-5) * (w + 1);
  const double err = (out - ref).abs().max().item<double>();
  const int64_t n = opforge::Call<int64_t>("ffi_ext::count", x);
  std::printf("%s %.3g %lld\n", err < 1e-4 ? "ok" : "wrong", err, static_cast<long long>(n));
  return 0;
}
