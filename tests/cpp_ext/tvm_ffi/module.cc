// Kernels exported through TVM-FFI by name (TVM_FFI_DLL_EXPORT_TYPED_FUNC
// exports `__tvm_ffi_<name>`), knowing nothing of torch.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <cmath>

namespace ffi = tvm::ffi;

namespace {

// out = x * rsqrt(mean(x^2) + eps) * (w + add_one), per row of a 2-D float32 x.
void RmsNorm(ffi::TensorView out, ffi::TensorView x, ffi::TensorView w, double eps, bool add_one) {
  TVM_FFI_ICHECK(x.ndim() == 2) << "x must be 2-D";
  TVM_FFI_ICHECK(x.dtype() == DLDataType({kDLFloat, 32, 1})) << "x must be float32";
  const int64_t n = x.size(0), d = x.size(1);
  const float* px = static_cast<const float*>(x.data_ptr());
  const float* pw = static_cast<const float*>(w.data_ptr());
  float* po = static_cast<float*>(out.data_ptr());
  for (int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (int64_t j = 0; j < d; ++j) s += double(px[i * d + j]) * px[i * d + j];
    const double r = 1.0 / std::sqrt(s / d + eps);
    for (int64_t j = 0; j < d; ++j) po[i * d + j] = float(px[i * d + j] * r * (pw[j] + (add_one ? 1.0 : 0.0)));
  }
}

void Noop(ffi::TensorView, ffi::TensorView, ffi::TensorView, double, bool) {}

int64_t Count(ffi::TensorView x) { return x.numel(); }

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(rms_norm, RmsNorm);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(count, Count);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(noop, Noop);
