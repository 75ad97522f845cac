// The Python side of breakable CUDA graph capture (docs/cuda_graphs.md):
// _C.CapturedCall, the flat call of a cudagraph_unsafe op recorded at
// capture and replayed as an eager break; the break handler that hands a
// guarded call made during a capture to Python (opforge.cuda_graphs); and
// the capture probe the eager fast path asks for guarded ops.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

#include <cstddef>

namespace opforge {

// Whether a capture is under way on the device of the first CUDA tensor
// among these tensor leaves (each a Tensor, a list of them, or None).
bool LeavesCaptureUnderway(PyObject* const* tensors, size_t n);

// _C.CapturedCall, _C.register_capture_guard, _C.set_capture_break,
// _C.capture_underway, _C._set_capture_probe.
void InitCapture(pybind11::module_& m);

}  // namespace opforge
