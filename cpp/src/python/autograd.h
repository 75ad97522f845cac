// The autograd bridge of opforge ops whose backward is written in Python:
// one graph node per call, made in C++ (as torch makes one for its own ops),
// which calls the user's backward with structs rebuilt.
//
//   bridge = _C.AutogradBridge(opdef)     # reads opdef.boundary, ._state, ._code
//   reg = bridge.register()               # the op's Autograd kernel, kept while reg lives
//   opdef._set_autograd(bridge)           # eager calls that need a gradient
//
// The same node serves the eager call that runs the body directly and the
// dispatcher's Autograd kernel that redispatches below autograd (compiled
// graphs, torch.ops, a C++ kernel behind the op).
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

namespace opforge {

class GradBridge;
struct PyFfiKernel;

// The bridge inside a Python object made by _C.AutogradBridge, or null.
GradBridge* AsGradBridge(PyObject* obj);

// An eager call that needs a gradient: runs `kernel` (the body) on the
// converted arguments below autograd, then setup_context, and records the
// node. `tensors` are the tensor leaves as the boundary found them. A new
// reference to the original output, or null with a Python error set.
PyObject* CallWithGrad(GradBridge& bridge, PyObject* kernel, PyObject* const* args, PyObject* const* tensors);
// The same with the op's TVM-FFI kernel, called from C (CallFfi).
PyObject* CallWithGrad(GradBridge& bridge, const PyFfiKernel* kernel, PyObject* const* args, PyObject* const* tensors);

void InitAutograd(pybind11::module_& m);

}  // namespace opforge
