// OpBase, the C part of every opforge op (op_object.h): its eager call
// binds and converts the arguments with the op's Boundary, then takes one
// route, chosen once per call by ChooseRoute. FlatCall, an op's flat call
// from C for the code Inductor emits.
#include "python/op_object.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "python/autograd.h"
#include "python/boundary.h"
#include "python/capture.h"
#include "python/ffi.h"
#include "python/leaf_rule.h"
#include "torch/autograd_kernels.h"

namespace py = pybind11;

namespace opforge {
namespace {

bool g_enabled = true;

// Called with (op, error) where the boundary refused a call's arguments;
// it may raise another error in its place (opforge._in_graph: Dynamo's
// graph break, where Dynamo runs the op on fake tensors). Only the error path
// reads it.
PyObject* g_refused_hook = nullptr;

constexpr int kNumDeviceTypes = static_cast<int>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES);

// Tensor functionalities that some dispatch key would act on before the
// kernel: subclasses living in Python, functionalization, functorch wrappers,
// lazy conjugation/negation, sparse, nested and quantized tensors.
constexpr c10::DispatchKeySet kIntercepting({
    c10::DispatchKey::Python,
    c10::DispatchKey::PythonTLSSnapshot,
    c10::DispatchKey::Functionalize,
    c10::DispatchKey::FuncTorchBatched,
    c10::DispatchKey::FuncTorchGradWrapper,
    c10::DispatchKey::BatchedNestedTensor,
    c10::DispatchKey::Conjugate,
    c10::DispatchKey::Negative,
    c10::DispatchKey::ZeroTensor,
    c10::DispatchKey::Sparse,
    c10::DispatchKey::SparseCsr,
    c10::DispatchKey::NestedTensor,
    c10::DispatchKey::Quantized,
});

bool PlainDevice(c10::DeviceType type) {
  return type == c10::DeviceType::CPU || type == c10::DeviceType::CUDA || type == c10::DeviceType::HIP ||
         type == c10::DeviceType::XPU || type == c10::DeviceType::MPS;
}

struct CheckState {
  bool any_tensor = false;
  bool requires_grad = false;
  c10::DeviceType device = c10::DeviceType::CPU;
};

bool CheckTensor(PyObject* obj, CheckState& st, int depth) {
  if (obj == nullptr || obj == Py_None) return true;
  if (THPVariable_CheckExact(obj)) {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.defined()) return true;
    const c10::DispatchKeySet ks = t.key_set();
    if (ks.has_any(kIntercepting)) return false;
    // Only dense tensors: MKLDNN and other layouts have kernels of their own.
    if (!ks.has(c10::DispatchKey::Dense)) return false;
    const c10::DeviceType device = t.device().type();
    if (!PlainDevice(device)) return false;
    if (st.any_tensor && device != st.device) return false;
    st.any_tensor = true;
    st.device = device;
    // A tensor without autograd metadata cannot require grad; asking it
    // directly is a call into c10 per tensor.
    if (!st.requires_grad && t.unsafeGetTensorImpl()->autograd_meta() != nullptr) st.requires_grad = t.requires_grad();
    return true;
  }
  if (depth == 0 && (PyList_CheckExact(obj) || PyTuple_CheckExact(obj))) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    PyObject** items = PySequence_Fast_ITEMS(obj);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!CheckTensor(items[i], st, depth + 1)) return false;
    }
    return true;
  }
  return false;
}

// Calls `f` on each defined tensor of a tensor leaf's value: a Tensor, a list of them, or None.
template <class F>
void ForEachLeafTensor(PyObject* obj, F&& f) {
  if (obj == nullptr || obj == Py_None) return;
  if (THPVariable_Check(obj)) {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (t.defined()) f(t);
  } else if (PyList_Check(obj) || PyTuple_Check(obj)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    for (Py_ssize_t i = 0; i < n; ++i) ForEachLeafTensor(PySequence_Fast_ITEMS(obj)[i], f);
  }
}

}  // namespace

int FastPathMode(PyObject* const* tensors, size_t n, c10::DeviceType* device) {
  if (!g_enabled) return -1;
  const auto tls = c10::impl::tls_local_dispatch_key_set();
  if (tls.included_.remove(c10::DispatchKey::ADInplaceOrView) != c10::DispatchKeySet(c10::DispatchKey::BackendSelect)) {
    return -1;  // tracing, functorch, python dispatcher, ...
  }
  if (!tls.excluded_.isSupersetOf(c10::default_excluded_set)) return -1;  // autocast
  const bool below_autograd = tls.excluded_.isSupersetOf(c10::autograd_dispatch_keyset);
  const auto other_excluded =
      tls.excluded_ - c10::default_excluded_set - c10::autograd_dispatch_keyset_with_ADInplaceOrView;
  if (!other_excluded.empty()) return -1;
  // A TorchDispatchMode includes the Python key in the TLS set checked above.
  if (at::impl::torch_function_mode_enabled()) return -1;
  // Profiler and record_function observers: ask as the dispatcher does for
  // each call (a thread-local cache; at::hasCallbacks() takes a mutex).
  if (at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION).has_value()) return -1;
  CheckState st;
  for (size_t i = 0; i < n; ++i) {
    if (!CheckTensor(tensors[i], st, 0)) return -1;
  }
  if (!st.any_tensor) return -1;
  *device = st.device;
  return st.requires_grad && !below_autograd && c10::GradMode::is_enabled() ? 1 : 0;
}

namespace {

struct OpObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* boundary_obj;  // the Python Boundary, owning `boundary`
  Boundary* boundary;
  PyObject* default_kernel;                   // the body for every device, or null
  std::array<PyObject*, kNumDeviceTypes> kernels;  // per device type: a body (register_kernel), or null
  PyObject* overload;  // the op's OpOverload
  PyObject* autograd;  // the op's _C.AutogradBridge, or null
  GradBridge* bridge;  // the bridge inside `autograd`
  PyObject* fallback;  // the class's Python __call__, for what the boundary cannot bind
  bool has_backward;   // eager calls of a body that need a gradient may take the bridge (a TVM-FFI kernel does whenever there is one)
  // Ops whose kernels torch calls (C++ libraries): the eager path calls the
  // dispatcher from here, as torch.ops would, without the Python flatten.
  c10::OperatorHandle* dispatcher_op;
  PyObject* rebuild_output;  // flat returns -> struct returns, or null when all are leaves
  // TVM-FFI kernels: per device type and for every device, each held by the
  // matching slot of `kernels` / `default_kernel`.
  std::array<PyFfiKernel*, kNumDeviceTypes> ffi;
  PyFfiKernel* ffi_default;
  // A cudagraph_unsafe op: a call made while its CUDA stream captures goes
  // through the dispatcher, to the op's capture guard (docs/cuda_graphs.md).
  bool capture_guarded;
};

// How one eager call runs.
enum class Route {
  kDispatcher,     // the generated Python flattens the call for torch's dispatcher
  kCppDispatcher,  // a C++ op: the dispatcher from C, without Python's flatten
  kBody,           // the body runs directly
  kBodyWithGrad,   // the body runs directly and the op's graph node is recorded
  kFfi,            // the op's TVM-FFI kernel is called from C with the flat leaves
  kFfiWithGrad,    // the same, and the op's graph node is recorded
};

// Bumps the versions of the tensors the op writes, as the op's
// ADInplaceOrView kernel does on the dispatcher path; false (nothing bumped)
// where a written tensor is an inference tensor outside inference mode,
// which only the dispatcher path reports as torch does.
bool BumpWritten(const Boundary& b, PyObject** tensors) {
  if (b.mutated_slots().empty() || c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView)) {
    return true;
  }
  bool inference = false;
  if (!c10::InferenceMode::is_enabled()) {
    auto note = [&](const at::Tensor& t) { inference = inference || t.is_inference(); };
    for (int slot : b.mutated_slots()) ForEachLeafTensor(tensors[slot], note);
  }
  if (inference) return false;
  for (int slot : b.mutated_slots()) ForEachLeafTensor(tensors[slot], torch::autograd::impl::bump_version);
  return true;
}

// The route of a call whose converted tensor leaves are `tensors`; `kernel`
// gets the body a kBody or kBodyWithGrad route runs.
Route ChooseRoute(OpObject* op, PyObject** tensors, PyObject** kernel, PyFfiKernel** ffi) {
  const Boundary& b = *op->boundary;
  c10::DeviceType device = c10::DeviceType::CPU;
  const int mode = FastPathMode(tensors, b.num_tensor_slots(), &device);
  if (mode < 0) return Route::kDispatcher;
  if (op->capture_guarded && LeavesCaptureUnderway(tensors, b.num_tensor_slots())) return Route::kDispatcher;
  {
    const size_t d = static_cast<size_t>(device);
    *ffi = op->ffi[d] != nullptr ? op->ffi[d] : op->kernels[d] == nullptr ? op->ffi_default : nullptr;
  }
  if (*ffi != nullptr) {
    // With a gradient to record, the op's graph node (its backward's bridge)
    // around the same call from C; without a backward, torch's Autograd kernel.
    if (mode == 1 && op->bridge == nullptr) return Route::kDispatcher;
    if (!BumpWritten(b, tensors)) return Route::kDispatcher;
    return mode == 1 ? Route::kFfiWithGrad : Route::kFfi;
  }
  // A Python kernel for the device (register_kernel) runs directly, as for a
  // Python op; a C++ op's kernels, autograd and version bumps are torch's.
  *kernel = mode == 0 ? op->kernels[static_cast<size_t>(device)] : nullptr;
  if (*kernel == nullptr && op->dispatcher_op != nullptr) return Route::kCppDispatcher;
  if (mode == 0 && *kernel == nullptr) *kernel = op->default_kernel;
  if (mode == 1) {
    // Recorded directly when the op has a backward and one body for every device.
    if (!op->has_backward || op->bridge == nullptr || op->default_kernel == nullptr) return Route::kDispatcher;
    *kernel = op->default_kernel;
  }
  if (*kernel == nullptr || AsFfiKernel(*kernel) != nullptr) return Route::kDispatcher;
  if (!BumpWritten(b, tensors)) return Route::kDispatcher;
  return mode == 1 ? Route::kBodyWithGrad : Route::kBody;
}

// The exception in flight as the Python error torch.ops raises for it, so
// that its type does not depend on the path: c10's errors as torch
// translates them (TypeError, IndexError, ...); other std::exceptions as
// torch.ops does, which is torch's own translation from torch 2.15
// (RuntimeError, IndexError for std::out_of_range) and pybind11's before
// (MemoryError, IndexError, ValueError, RuntimeError); anything else
// (`throw 42;` reaching here) a RuntimeError, never an abort.
void RaiseCppError() {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const python_error&) {
    torch::translate_exception_to_python(std::current_exception());
  } catch (const c10::Error&) {
    torch::translate_exception_to_python(std::current_exception());
  } catch (const std::exception&) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
    torch::translate_exception_to_python(std::current_exception());
#else
    py::detail::try_translate_exceptions();
#endif
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "opforge: a C++ exception that is not a std::exception reached Python.");
  }
}

// The dispatcher's call of `op` on `stack`, from C, as torch.ops makes it
// (the GIL released while it runs): its returns as Python objects.
py::object CallBoxed(const c10::OperatorHandle& op, std::vector<c10::IValue>& stack) {
  {
    py::gil_scoped_release no_gil;
    op.callBoxed(stack);
  }
  return torch::jit::createPyObjectForStack(std::move(stack));
}

// A C++ op's call through the dispatcher, from C.
PyObject* CallDispatcher(OpObject* op, PyObject* const* converted) {
  std::vector<c10::IValue> stack;
  if (!op->boundary->Flatten(converted, stack)) return nullptr;
  try {
    py::object out = CallBoxed(*op->dispatcher_op, stack);
    if (op->rebuild_output == nullptr) return out.release().ptr();
    return PyObject_CallOneArg(op->rebuild_output, out.ptr());
  } catch (...) {
    RaiseCppError();
  }
  return nullptr;
}

PyObject* CallFallback(OpObject* op, PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (op->fallback == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "opforge: this op is not fully defined yet.");
    return nullptr;
  }
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  std::vector<PyObject*> full{self};
  full.insert(full.end(), args, args + nargs + nkw);
  return PyObject_Vectorcall(op->fallback, full.data(), static_cast<size_t>(nargs + 1), kwnames);
}

// The boundary's error for a refused call, or the hook's in its place.
PyObject* Refused(PyObject* self) {
  if (g_refused_hook == nullptr) return nullptr;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr && value != nullptr) PyException_SetTraceback(value, traceback);
  PyObject* kept = PyObject_CallFunctionObjArgs(g_refused_hook, self, value ? value : Py_None, nullptr);
  if (kept == nullptr) {  // the hook's error replaces the boundary's
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return nullptr;
  }
  Py_DECREF(kept);
  PyErr_Restore(type, value, traceback);
  return nullptr;
}

PyObject* CallOp(OpObject* op, PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  Boundary* b = op->boundary;
  if (b == nullptr) return CallFallback(op, self, args, nargs, kwnames);
  const size_t n = b->num_params();
  const size_t nslots = b->num_tensor_slots();
  // Uninitialized stack arrays for the usual op (a SmallVector's zeroing and
  // size bookkeeping show per call); a heap vector past 16.
  constexpr size_t kSmall = 16;
  PyObject *small_values[kSmall], *small_out[kSmall], *small_tensors[kSmall];
  std::vector<PyObject*> big_values, big_out, big_tensors;
  PyObject** values = n > kSmall ? (big_values.resize(n), big_values.data()) : small_values;
  PyObject** out = n > kSmall ? (big_out.resize(n), big_out.data()) : small_out;
  PyObject** tensors = nslots > kSmall ? (big_tensors.resize(nslots), big_tensors.data()) : small_tensors;
  std::fill(tensors, tensors + nslots, nullptr);
  if (!b->Bind(args, nargs, kwnames, values)) return CallFallback(op, self, args, nargs, kwnames);
  Owned keep;
  if (!b->ConvertAll(values, out, tensors, keep)) return Refused(self);
  // The converted values, released however the call ends (ConvertAll filled every one).
  struct Release {
    PyObject** items;
    size_t n;
    ~Release() {
      for (size_t i = 0; i < n; ++i) Py_DECREF(items[i]);
    }
  } release{out, n};

  PyObject* kernel = nullptr;
  PyFfiKernel* ffi = nullptr;
  switch (ChooseRoute(op, tensors, &kernel, &ffi)) {
    case Route::kFfi:
      return CallFfi(*ffi, *b, out);
    case Route::kCppDispatcher:
      return CallDispatcher(op, out);
    case Route::kBody: {
      PyObject* result;
      {
        // What the dispatcher's autograd step does before calling the kernel.
        BelowAutograd guard(!b->mutated_slots().empty());
        result = PyObject_Vectorcall(kernel, out, b->num_positional(), b->body_kwnames());
      }
      if (result == nullptr) return b->KernelFailed(out);
      PyObject* checked = b->CheckReturn(result, {tensors, nslots, {}});
      Py_DECREF(result);
      return checked;
    }
    case Route::kBodyWithGrad:
      return CallWithGrad(*op->bridge, kernel, out, tensors);
    case Route::kFfiWithGrad:
      return CallWithGrad(*op->bridge, ffi, out, tensors);
    case Route::kDispatcher:
      break;
  }
  return b->Dispatch(op->overload, out);
}

PyObject* OpCall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* op = reinterpret_cast<OpObject*>(self);
  // Nothing thrown in C++ may reach the interpreter: it would abort.
  try {
    return CallOp(op, self, args, PyVectorcall_NARGS(nargsf), kwnames);
  } catch (...) {
    RaiseCppError();
  }
  return nullptr;
}

PyObject* OpNew(PyTypeObject* type, PyObject* /*args*/, PyObject* /*kwargs*/) {
  auto* op = reinterpret_cast<OpObject*>(type->tp_alloc(type, 0));  // zeroed
  if (op != nullptr) op->vectorcall = OpCall;
  return reinterpret_cast<PyObject*>(op);
}

// The references an op holds besides `kernels`, for the garbage collector.
constexpr PyObject* OpObject::*kOpRefs[] = {&OpObject::boundary_obj, &OpObject::default_kernel,
                                            &OpObject::overload,     &OpObject::autograd,
                                            &OpObject::fallback,     &OpObject::rebuild_output};

int OpTraverse(PyObject* self, visitproc visit, void* arg) {
  auto* op = reinterpret_cast<OpObject*>(self);
  for (PyObject* OpObject::*field : kOpRefs) Py_VISIT(op->*field);
  for (PyObject* k : op->kernels) Py_VISIT(k);
  return 0;
}

int OpClear(PyObject* self) {
  auto* op = reinterpret_cast<OpObject*>(self);
  op->boundary = nullptr;  // owned by boundary_obj
  op->bridge = nullptr;    // owned by autograd
  for (PyObject* OpObject::*field : kOpRefs) Py_CLEAR(op->*field);
  for (PyObject*& k : op->kernels) Py_CLEAR(k);
  op->ffi.fill(nullptr);
  op->ffi_default = nullptr;
  return 0;
}

void OpDealloc(PyObject* self) {
  auto* op = reinterpret_cast<OpObject*>(self);
  PyObject_GC_UnTrack(self);
  OpClear(self);
  delete op->dispatcher_op;
  op->dispatcher_op = nullptr;
  Py_TYPE(self)->tp_free(self);
}

c10::DeviceType ParseDeviceType(PyObject* name) {
  const char* text = PyUnicode_AsUTF8(name);
  if (text == nullptr) throw py::error_already_set();
  return c10::Device(text).type();
}

// Runs `f`, turning a C++ exception into `exc` with its message.
template <class F>
PyObject* Guarded(PyObject* exc, F&& f) {
  try {
    f();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(exc, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* OpBind(PyObject* self, PyObject* args) {
  auto* op = reinterpret_cast<OpObject*>(self);
  PyObject *boundary, *default_kernel, *kernels, *fallback;
  if (!PyArg_ParseTuple(args, "OOO!O", &boundary, &default_kernel, &PyDict_Type, &kernels, &fallback)) return nullptr;
  return Guarded(PyExc_ValueError, [&] {
    op->boundary = py::cast<Boundary*>(py::handle(boundary));
    Py_XSETREF(op->boundary_obj, Py_NewRef(boundary));
    Py_XSETREF(op->default_kernel, default_kernel == Py_None ? nullptr : Py_NewRef(default_kernel));
    for (PyObject*& k : op->kernels) Py_CLEAR(k);
    op->ffi.fill(nullptr);
    op->ffi_default = AsFfiKernel(op->default_kernel);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kernels, &pos, &key, &value)) {
      const size_t d = static_cast<size_t>(ParseDeviceType(key));
      Py_XSETREF(op->kernels[d], Py_NewRef(value));
      op->ffi[d] = AsFfiKernel(value);
    }
    PyObject* overload = PyObject_GetAttrString(self, "overload");
    if (overload == nullptr) throw py::error_already_set();
    Py_XSETREF(op->overload, overload);
    Py_XSETREF(op->fallback, Py_NewRef(fallback));
  });
}

PyObject* OpSetKernel(PyObject* self, PyObject* args) {
  auto* op = reinterpret_cast<OpObject*>(self);
  PyObject *device, *kernel;
  if (!PyArg_ParseTuple(args, "OO", &device, &kernel)) return nullptr;
  return Guarded(PyExc_ValueError, [&] {
    // A TVM-FFI kernel (_C.FfiKernel) is called from C; any other is a Python body.
    if (device == Py_None) {
      Py_XSETREF(op->default_kernel, Py_NewRef(kernel));
      op->ffi_default = AsFfiKernel(kernel);
    } else {
      const size_t d = static_cast<size_t>(ParseDeviceType(device));
      Py_XSETREF(op->kernels[d], Py_NewRef(kernel));
      op->ffi[d] = AsFfiKernel(kernel);
    }
  });
}

PyObject* OpSetBackward(PyObject* self, PyObject* arg) {
  reinterpret_cast<OpObject*>(self)->has_backward = PyObject_IsTrue(arg) == 1;
  Py_RETURN_NONE;
}

PyObject* OpSetAutograd(PyObject* self, PyObject* bridge) {
  auto* op = reinterpret_cast<OpObject*>(self);
  return Guarded(PyExc_TypeError, [&] {
    GradBridge* b = AsGradBridge(bridge);
    Py_XSETREF(op->autograd, b == nullptr ? nullptr : Py_NewRef(bridge));
    op->bridge = b;
  });
}

PyObject* OpFastCheck(PyObject* /*self*/, PyObject* tensors) {
  if (!PyTuple_Check(tensors)) {
    PyErr_SetString(PyExc_TypeError, "_fast_check takes a tuple of tensor leaves");
    return nullptr;
  }
  c10::DeviceType device;
  const int mode =
      FastPathMode(PySequence_Fast_ITEMS(tensors), static_cast<size_t>(PyTuple_GET_SIZE(tensors)), &device);
  return PyLong_FromLong(mode);
}

PyObject* OpSetDispatcherOp(PyObject* self, PyObject* args) {
  auto* op = reinterpret_cast<OpObject*>(self);
  const char* name;
  PyObject* rebuild;
  if (!PyArg_ParseTuple(args, "sO", &name, &rebuild)) return nullptr;
  auto handle = c10::Dispatcher::singleton().findSchema({name, ""});
  if (!handle) {
    PyErr_Format(PyExc_LookupError, "%s is not registered with torch's dispatcher", name);
    return nullptr;
  }
  delete op->dispatcher_op;
  op->dispatcher_op = new c10::OperatorHandle(*handle);
  Py_XSETREF(op->rebuild_output, rebuild == Py_None ? nullptr : Py_NewRef(rebuild));
  Py_RETURN_NONE;
}

PyObject* OpSetCaptureGuarded(PyObject* self, PyObject* flag) {
  reinterpret_cast<OpObject*>(self)->capture_guarded = PyObject_IsTrue(flag) == 1;
  Py_RETURN_NONE;
}

PyMethodDef kOpMethods[] = {
    {"_set_capture_guarded", OpSetCaptureGuarded, METH_O,
     "Whether eager calls look for a CUDA graph capture first (a cudagraph_unsafe op)."},
    {"_set_dispatcher_op", OpSetDispatcherOp, METH_VARARGS,
     "_set_dispatcher_op(name, rebuild_output): eager calls go to torch's dispatcher from C (C++ ops)."},
    {"_bind", OpBind, METH_VARARGS, "_bind(boundary, default_kernel, kernels, fallback)"},
    {"_set_has_backward", OpSetBackward, METH_O, "Whether eager calls that need a gradient take the bridge."},
    {"_set_kernel", OpSetKernel, METH_VARARGS, "_set_kernel(device_type or None, kernel)"},
    {"_set_autograd", OpSetAutograd, METH_O, "_set_autograd(bridge or None): the op's _C.AutogradBridge."},
    {"_fast_check", OpFastCheck, METH_O,
     "_fast_check(tensors) -> -1 (dispatcher path), 0 (run the body), 1 (a gradient is needed)."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject OpType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "opforge._C.OpBase";
  t.tp_basicsize = sizeof(OpObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_VECTORCALL;
  t.tp_doc = "The C part of an opforge op: its call boundary and eager fast path.";
  t.tp_new = OpNew;
  t.tp_dealloc = OpDealloc;
  t.tp_traverse = OpTraverse;
  t.tp_clear = OpClear;
  t.tp_call = PyVectorcall_Call;
  t.tp_vectorcall_offset = offsetof(OpObject, vectorcall);
  t.tp_methods = kOpMethods;
  return t;
}();

// A subclass that defines __call__ in Python gets slot_tp_call from
// CPython. Dynamo reads __call__ from the class dict and traces it; eager
// calls should take the C entry instead, which runs the same boundary.
void InstallFastCall(py::handle cls) {
  if (!PyType_Check(cls.ptr()) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()), &OpType)) {
    throw py::type_error("install_fast_call needs a subclass of opforge._C.OpBase");
  }
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_vectorcall_offset = offsetof(OpObject, vectorcall);
  type->tp_call = PyVectorcall_Call;
  type->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
  PyType_Modified(type);
}

// _C.FlatCall(overload): an op's flat call, as `overload(*args, **kwargs)`
// makes it, for the code Inductor emits around an op (opforge.symm_mem): the
// arguments convert as torch.ops converts them (toIValue against the
// schema) and the dispatcher is called from C, without pybind's argument
// packing and the OpOverload's Python frame. A call this path cannot take as
// torch.ops would (a tensor subclass, a torch function mode, an argument
// that does not convert, a name the schema lacks) goes to `overload`, so its
// result or error is torch's.
struct FlatCallObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* overload;
  c10::OperatorHandle* op;
  std::vector<LeafRule>* rules;  // per argument of the schema it was made for
};

// Whether torch.ops could route `obj` through __torch_function__ (a tensor
// subclass, alone or in a list).
bool MayOverride(PyObject* obj) {
  if (THPVariable_Check(obj)) return !THPVariable_CheckExact(obj);
  if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = PySequence_Fast_ITEMS(obj)[i];
      if (THPVariable_Check(item) && !THPVariable_CheckExact(item)) return true;
    }
  }
  return false;
}

// The dispatcher stack of one call, or false where torch.ops must take it.
bool FlatStack(const c10::FunctionSchema& schema, const std::vector<LeafRule>& rules, PyObject* const* args,
               Py_ssize_t nargs, PyObject* kwnames, std::vector<c10::IValue>& stack) {
  const auto& arguments = schema.arguments();
  const size_t n = arguments.size();
  if (static_cast<size_t>(nargs) > n || rules.size() != n) return false;
  constexpr size_t kSmall = 16;
  PyObject* small[kSmall] = {};
  std::vector<PyObject*> big;
  PyObject** values = n > kSmall ? (big.assign(n, nullptr), big.data()) : small;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    if (arguments[i].kwarg_only()) return false;
    values[i] = args[i];
  }
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
    if (name == nullptr) {
      PyErr_Clear();
      return false;
    }
    size_t i = static_cast<size_t>(nargs);
    while (i < n && arguments[i].name() != name) ++i;
    if (i == n || values[i] != nullptr) return false;
    values[i] = args[nargs + k];
  }
  stack.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (values[i] == nullptr) {
      if (!arguments[i].default_value()) return false;
      stack.push_back(*arguments[i].default_value());
    } else if (MayOverride(values[i]) || !DispatcherValue(rules[i], arguments[i], values[i], stack.emplace_back())) {
      return false;
    }
  }
  return true;
}

PyObject* FlatCallCall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* f = reinterpret_cast<FlatCallObject*>(self);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  try {
    std::vector<c10::IValue> stack;
    if (at::impl::torch_function_mode_enabled() || !f->op->hasSchema() ||
        !FlatStack(f->op->schema(), *f->rules, args, nargs, kwnames, stack)) {
      return PyObject_Vectorcall(f->overload, args, nargsf, kwnames);
    }
    return CallBoxed(*f->op, stack).release().ptr();
  } catch (...) {
    RaiseCppError();
  }
  return nullptr;
}

PyObject* FlatCallNew(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* overload;
  static const char* kKeywords[] = {"overload", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:FlatCall", const_cast<char**>(kKeywords), &overload)) {
    return nullptr;
  }
  std::string name, overload_name;
  try {
    py::object schema = py::handle(overload).attr("_schema");
    name = schema.attr("name").cast<std::string>();
    overload_name = schema.attr("overload_name").cast<std::string>();
  } catch (py::error_already_set& e) {
    PyErr_Format(PyExc_TypeError, "FlatCall takes an OpOverload (torch.ops.ns.op.overload), not %R", overload);
    return nullptr;
  }
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload_name});
  if (!handle) {
    PyErr_Format(PyExc_LookupError, "%s.%s is not registered with torch's dispatcher", name.c_str(),
                 overload_name.empty() ? "default" : overload_name.c_str());
    return nullptr;
  }
  auto* f = reinterpret_cast<FlatCallObject*>(type->tp_alloc(type, 0));
  if (f == nullptr) return nullptr;
  f->vectorcall = FlatCallCall;
  f->overload = Py_NewRef(overload);
  f->op = new c10::OperatorHandle(*handle);
  f->rules = new std::vector<LeafRule>();
  for (const auto& arg : handle->schema().arguments()) f->rules->push_back(MakeRule(arg.real_type(), arg.N()));
  return reinterpret_cast<PyObject*>(f);
}

int FlatCallTraverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(reinterpret_cast<FlatCallObject*>(self)->overload);
  return 0;
}

int FlatCallClear(PyObject* self) {
  Py_CLEAR(reinterpret_cast<FlatCallObject*>(self)->overload);
  return 0;
}

void FlatCallDealloc(PyObject* self) {
  auto* f = reinterpret_cast<FlatCallObject*>(self);
  PyObject_GC_UnTrack(self);
  FlatCallClear(self);
  delete f->op;
  delete f->rules;
  Py_TYPE(self)->tp_free(self);
}

PyObject* FlatCallRepr(PyObject* self) {
  return PyUnicode_FromFormat("<opforge FlatCall %R>", reinterpret_cast<FlatCallObject*>(self)->overload);
}

PyObject* FlatCallOverload(PyObject* self, void*) {
  PyObject* overload = reinterpret_cast<FlatCallObject*>(self)->overload;
  return Py_NewRef(overload != nullptr ? overload : Py_None);
}

PyGetSetDef kFlatCallGetSet[] = {{"overload", FlatCallOverload, nullptr, "the OpOverload it calls", nullptr},
                                 {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject FlatCallType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "opforge._C.FlatCall";
  t.tp_basicsize = sizeof(FlatCallObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  t.tp_doc = "FlatCall(overload): overload(*args, **kwargs), with the dispatcher called from C.";
  t.tp_new = FlatCallNew;
  t.tp_dealloc = FlatCallDealloc;
  t.tp_traverse = FlatCallTraverse;
  t.tp_clear = FlatCallClear;
  t.tp_repr = FlatCallRepr;
  t.tp_call = PyVectorcall_Call;
  t.tp_vectorcall_offset = offsetof(FlatCallObject, vectorcall);
  t.tp_getset = kFlatCallGetSet;
  return t;
}();

}  // namespace

void RaiseCppErrorInFlight() { RaiseCppError(); }

void InitOpObject(py::module_& m) {
  if (PyType_Ready(&OpType) < 0) throw py::error_already_set();
  Py_INCREF(&OpType);
  m.add_object("OpBase", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&OpType)));
  if (PyType_Ready(&FlatCallType) < 0) throw py::error_already_set();
  Py_INCREF(&FlatCallType);
  m.add_object("FlatCall", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&FlatCallType)));
  m.def("install_fast_call", &InstallFastCall, py::arg("cls"),
        "Makes eager calls of instances of `cls` (an OpBase subclass) take the C entry.");
  m.def("set_refused_hook",
        [](py::object hook) {
          Py_XSETREF(g_refused_hook, hook.is_none() ? nullptr : Py_NewRef(hook.ptr()));
        },
        py::arg("hook"),
        "hook(op, error), called where an op's boundary refuses a call's arguments; it may raise in the "
        "error's place. None: no hook.");
  m.def("set_fast_path_enabled", [](bool enabled) { return std::exchange(g_enabled, enabled); }, py::arg("enabled"),
        "Turns the eager fast path on or off for every op; returns the previous setting.");
}

}  // namespace opforge
