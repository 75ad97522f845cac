// A library naming a TVM-FFI function its module does not export: a load
// error naming the op and the symbol, and nothing of the block registered.
#include <opforge/opforge.h>

OPFORGE_LIBRARY(ffi_missing, m) {
  m.def("fine(Tensor x) -> int");
  m.impl("fine", opforge::TvmFfi("count", "libffi_module.so"));
  m.def("gone(Tensor x) -> int");
  m.impl("gone", opforge::TvmFfi("no_such_function", "libffi_module.so"));
}

// A TVM-FFI kernel for an op no block defines.
OPFORGE_LIBRARY(ffi_undefined, m) { m.impl("nowhere", opforge::TvmFfi("count", "libffi_module.so")); }

// A TVM-FFI kernel whose module is not there.
OPFORGE_LIBRARY(ffi_no_module, m) {
  m.def("f(Tensor x) -> int");
  m.impl("f", opforge::TvmFfi("count", "libno_such_module.so"));
}
