// _C.FfiKernel: a TVM-FFI function as an op's kernel (docs/tvm_ffi.md), and
// the eager call that reaches it from C with the op's flat arguments.
//
//   k = _C.FfiKernel("mylib::rms_norm", "rms_norm", fn.__chandle__(), find_libtvm_ffi(), True)
//   reg = _C.register_ffi_kernel(k, "CPU")   # the dispatcher's kernel while `reg` lives
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <memory>

#include "torch/ffi_kernel.h"

namespace opforge {

class Boundary;

struct PyFfiKernel {
  std::shared_ptr<FfiKernel> kernel;
  bool release_gil = true;  // the function's own `release_gil` (false for a Python callback that needs it)
};

// The PyFfiKernel a Python object holds, or null when it is something else.
PyFfiKernel* AsFfiKernel(PyObject* obj);

// An eager call's converted arguments (Boundary::ConvertAll's output)
// flattened and passed to the kernel: the op's original output, a new
// reference, or null with a Python error set.
PyObject* CallFfi(const PyFfiKernel& kernel, Boundary& boundary, PyObject* const* converted);

void InitFfi(pybind11::module_& m);

}  // namespace opforge
