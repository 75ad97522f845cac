// opforge._C.OpBase: the C part of every opforge op (Python and C++ ops
// alike), and its eager fast path. An op's eager call binds and converts its
// arguments with the op's Boundary, then takes one route: the body directly
// when nothing could intercept the dispatcher call (recording the op's graph
// node when a gradient is needed), a C++ op's dispatcher call from C, or the
// dispatcher path the generated Python takes.
//
//   class OpDef(_C.OpBase): ...
//   op._bind(boundary, body, {"cuda": cuda_body}, type(op).__call__)
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <c10/core/DeviceType.h>

namespace opforge {

// Whether the eager fast path may run for these tensor leaves:
// -1 dispatcher path, 0 run the body, 1 a gradient is needed.
int FastPathMode(PyObject* const* tensors, size_t n, c10::DeviceType* device);

// Sets the Python error for the C++ exception in flight, as torch.ops
// raises it (call inside a catch block).
void RaiseCppErrorInFlight();

// _C.OpBase, _C.FlatCall, _C.install_fast_call, _C.set_fast_path_enabled.
void InitOpObject(pybind11::module_& m);

}  // namespace opforge
