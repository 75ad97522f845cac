// Runs model.pt2 (export_model.py) with no Python: the kernel library is
// dlopened first, since the package calls its op by name; then the package's
// output is checked against the op called through the dispatcher.
//
//   run_model libopforge_kernels.so model.pt2   ->  prints "bitwise" (or "differs <max error>")
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: run_model <kernel library .so> <model.pt2>\n");
    return 2;
  }
  if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  // The inputs export_model.py exported with: sin and cos of a ramp.
  at::Tensor x = at::sin(at::arange(4 * 64, at::kFloat)).reshape({4, 64});
  at::Tensor w = at::cos(at::arange(64, at::kFloat));
  torch::inductor::AOTIModelPackageLoader loader(argv[2]);
  std::vector<at::Tensor> outs = loader.run({x, w});

  // The model by hand: kernels::rms_norm(out, x, w, eps=1e-5, gemma=True) flat, then out * 2.
  at::Tensor out = at::empty_like(x);
  std::vector<c10::IValue> stack{out, x, w, 1e-5, true};
  c10::Dispatcher::singleton().findSchemaOrThrow("kernels::rms_norm", "").callBoxed(stack);
  const at::Tensor eager = out * 2;
  if (outs.size() == 1 && at::equal(outs[0], eager)) {
    std::printf("bitwise\n");
  } else {
    std::printf("differs %g\n", outs.empty() ? -1.0 : (outs[0] - eager).abs().max().item<double>());
  }
  return 0;
}
