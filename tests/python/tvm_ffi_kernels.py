"""CPU kernels written against TVM-FFI as its users write them (tvm::ffi
TensorView, ICHECK, typed errors), built once with tvm_ffi.cpp.load_inline.

    mod = kernels()
    mod.scale_out(out, x, 2.0)   # out = x * 2
"""

import tvm_ffi.cpp

SOURCE = r"""
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/container/tuple.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <cmath>

namespace ffi = tvm::ffi;

namespace {
constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kF64{kDLFloat, 64, 1};

template <class F>
void Each(ffi::TensorView t, F f) {
  TVM_FFI_ICHECK(t.dtype() == kF32 || t.dtype() == kF64) << "expected float32 or float64";
  TVM_FFI_ICHECK(t.IsContiguous()) << "expected a contiguous tensor";
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype() == kF32) f(static_cast<float*>(t.data_ptr())[i], i);
    else f(static_cast<double*>(t.data_ptr())[i], i);
  }
}

double At(ffi::TensorView t, int64_t i) {
  return t.dtype() == kF32 ? static_cast<const float*>(t.data_ptr())[i] : static_cast<const double*>(t.data_ptr())[i];
}
}  // namespace

// out = x * rsqrt(mean(x^2) + eps) * (w + add_one), rows of a 2-D x.
void rms_norm(ffi::TensorView out, ffi::TensorView x, ffi::TensorView w, double eps, bool add_one) {
  TVM_FFI_ICHECK(x.ndim() == 2) << "x must be 2-D";
  TVM_FFI_ICHECK(x.dtype() == kF32) << "x must be float32";
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

// out = x * s (contiguous tensors of one dtype).
void scale_out(ffi::TensorView out, ffi::TensorView x, double s) {
  TVM_FFI_ICHECK(out.numel() == x.numel()) << "out and x differ in size";
  TVM_FFI_ICHECK(x.IsContiguous()) << "x must be contiguous";
  Each(out, [&](auto& o, int64_t i) { o = At(x, i) * s; });
}

// out[0] = k + 100 for mode "fast", k + 200 for "exact"; anything else is a ValueError.
void pick(ffi::TensorView out, ffi::String mode, int64_t k) {
  double base = 0;
  if (mode == "fast") base = 100;
  else if (mode == "exact") base = 200;
  else TVM_FFI_THROW(ValueError) << "unknown mode " << mode;
  Each(out, [&](auto& o, int64_t) { o = base + k; });
}

// out = present ? x * scale + shift : x (an Optional struct's presence leaf, then its fields).
void affine(ffi::TensorView out, ffi::TensorView x, bool present, ffi::Optional<double> scale,
            ffi::Optional<double> shift) {
  const double a = present ? scale.value() : 1.0, b = present ? shift.value() : 0.0;
  Each(out, [&](auto& o, int64_t i) { o = At(x, i) * a + b; });
}

ffi::Tensor ident(ffi::Tensor x) { return x; }
ffi::Tuple<ffi::Tensor, int64_t> with_size(ffi::Tensor x) { return ffi::Tuple<ffi::Tensor, int64_t>(x, x.numel()); }

// A new tensor x * 2, allocated through TVM-FFI's environment allocator.
ffi::Tensor doubled(ffi::TensorView x) {
  ffi::Tensor out = ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, x.shape(), x.dtype(), x.device());
  scale_out(out, x, 2.0);
  return out;
}
int64_t add_ints(int64_t a, int64_t b) { return a + b; }
double half(double a) { return a / 2; }
int64_t sum_list(ffi::Array<int64_t> xs) {
  int64_t s = 0;
  for (int64_t x : xs) s += x;
  return s;
}
void fill_all(ffi::Array<ffi::Tensor> ts, double v) {
  for (ffi::Tensor t : ts) Each(t, [&](auto& o, int64_t) { o = v; });
}
void takes_int(ffi::TensorView out, int64_t n) { Each(out, [&](auto& o, int64_t) { o = double(n); }); }
int64_t dtype_bits(DLDataType dt) { return dt.bits; }
"""

FUNCTIONS = ["rms_norm", "scale_out", "pick", "affine", "ident", "add_ints", "half", "sum_list", "fill_all",
             "takes_int", "dtype_bits", "doubled", "with_size"]

_MODULE: list = []


def kernels():
    if not _MODULE:
        _MODULE.append(tvm_ffi.cpp.load_inline("opforge_test_kernels", cpp_sources=SOURCE, functions=FUNCTIONS))
    return _MODULE[0]
