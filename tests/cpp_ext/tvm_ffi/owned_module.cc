// A function that takes an owned ffi::Tensor, not a view: built once with
// TVM-FFI's type schema exported (TVM_FFI_DLL_EXPORT_INCLUDE_METADATA=1,
// libffi_owned_meta.so) and once without (libffi_owned_plain.so).
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>

namespace {
int64_t OwnedCount(tvm::ffi::Tensor x) { return x.numel(); }
}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(owned_count, OwnedCount);
