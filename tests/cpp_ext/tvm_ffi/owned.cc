// TVM-FFI kernels that take owned tensors (tests/python/test_tvm_ffi_cpp.py):
// known from the module's type schema, said by the kernel, or neither.
#include <opforge/opforge.h>

OPFORGE_LIBRARY(ffi_owned, m) {
  m.def("by_schema(Tensor x) -> int");
  m.impl("by_schema", opforge::TvmFfi("owned_count", "libffi_owned_meta.so"));
  m.def("by_option(Tensor x) -> int");
  m.impl("by_option", opforge::TvmFfi("owned_count", "libffi_owned_plain.so").owned_tensors());
  m.def("untold(Tensor x) -> int");
  m.impl("untold", opforge::TvmFfi("owned_count", "libffi_owned_plain.so"));
}
