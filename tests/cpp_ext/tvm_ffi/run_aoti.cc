// A C++ program with no Python runs an AOTInductor package of a model that
// calls an op whose kernel is a TVM-FFI function, and checks it against the
// op called eagerly.
//
//   run_aoti libopforge_test_tvm_ffi.so model.pt2   ->  prints "bitwise" (or "differs <max error>")
#include <ATen/ATen.h>
#include <dlfcn.h>
#include <opforge/opforge.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstdio>

#include "norm_cfg.h"


int main(int argc, char** argv) {
  if (argc != 3) return 2;
  // The op library first: the package calls its op by name.
  if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::printf("dlopen failed: %s\n", dlerror());
    return 1;
  }
  // The inputs the exporting test used: sin and cos of a ramp.
  at::Tensor x = at::sin(at::arange(4 * 32, at::kFloat)).reshape({4, 32});
  at::Tensor w = at::cos(at::arange(32, at::kFloat));
  torch::inductor::AOTIModelPackageLoader loader(argv[2]);
  std::vector<at::Tensor> outs = loader.run({x, w});
  at::Tensor eager = at::empty_like(x);
  opforge::Call("ffi_ext::rms_norm", eager, x, w, ffi_ext::NormCfg{1e-5, true});
  eager = eager * 2;
  if (outs.size() == 1 && at::equal(outs[0], eager)) {
    std::printf("bitwise\n");
  } else {
    std::printf("differs %g\n", outs.empty() ? -1.0 : (outs[0] - eager).abs().max().item<double>());
  }
  return 0;
}
