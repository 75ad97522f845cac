// The eager fast path of `@opforge.op` ops.
//
// An op call that nothing could intercept -- no torch function or dispatch
// mode, no functorch transform, no autocast, no profiler callbacks, plain
// dense tensors of one device type, no gradient needed -- behaves exactly
// like the dispatcher path: the dispatcher would run the autograd fallback
// (below autograd), then the kernel. This object checks those conditions in
// one C++ call and, when they hold, runs the kernel itself under the same
// TLS guard; otherwise it returns NotImplemented and the caller takes the
// dispatcher path.
//
//   fp = _C.FastPath(kernel, {"cuda": cuda_kernel}, kwnames=("mode",), mutated=(0,))
//   out = fp((q, k), q, k, cfg, mode)   # result, NotImplemented or fp.needs_autograd
#include <Python.h>
#include <pybind11/pybind11.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <array>
#include <string>
#include <vector>

namespace py = pybind11;

namespace opforge {
namespace {

bool g_enabled = true;

constexpr int kNumDeviceTypes = static_cast<int>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES);

struct FastPathObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* default_kernel;                        // may be null
  std::array<PyObject*, kNumDeviceTypes>* kernels;  // per device type, may hold nulls
  PyObject* kwnames;                               // tuple or null
  PyObject* needs_autograd;                        // the marker returned when grad is needed
  std::vector<int>* mutated;                       // positions in the tensors tuple
  bool has_backward;
};

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
  switch (type) {
    case c10::DeviceType::CPU:
    case c10::DeviceType::CUDA:
    case c10::DeviceType::HIP:
    case c10::DeviceType::XPU:
    case c10::DeviceType::MPS:
      return true;
    default:
      return false;
  }
}

struct CheckState {
  bool any_tensor = false;
  bool requires_grad = false;
  c10::DeviceType device = c10::DeviceType::CPU;
};

// False when `obj` (a tensor, None, or a list/tuple of those) rules the fast
// path out.
bool CheckTensor(PyObject* obj, CheckState& st, int depth) {
  if (obj == Py_None) return true;
  if (THPVariable_CheckExact(obj)) {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.defined()) return true;
    if (t.key_set().has_any(kIntercepting)) return false;
    const c10::DeviceType device = t.device().type();
    if (!PlainDevice(device)) return false;
    if (st.any_tensor && device != st.device) return false;
    st.any_tensor = true;
    st.device = device;
    st.requires_grad = st.requires_grad || t.requires_grad();
    return true;
  }
  if (depth == 0 && (PyList_CheckExact(obj) || PyTuple_CheckExact(obj))) {
    PyObject* seq = obj;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject** items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!CheckTensor(items[i], st, depth + 1)) return false;
    }
    return true;
  }
  return false;  // not a tensor: let the dispatcher report it
}

// -1: take the dispatcher path. 0: run the kernel. 1: a gradient is needed.
int Check(PyObject* tensors, CheckState& st) {
  if (!g_enabled) return -1;
  const auto tls = c10::impl::tls_local_dispatch_key_set();
  if (tls.included_.remove(c10::DispatchKey::ADInplaceOrView) !=
      c10::DispatchKeySet(c10::DispatchKey::BackendSelect)) {
    return -1;  // tracing, functorch, python dispatcher, ...
  }
  if (!tls.excluded_.isSupersetOf(c10::default_excluded_set)) return -1;  // autocast
  const bool below_autograd = tls.excluded_.isSupersetOf(c10::autograd_dispatch_keyset);
  const auto other_excluded = tls.excluded_ - c10::default_excluded_set -
                              c10::autograd_dispatch_keyset_with_ADInplaceOrView;
  if (!other_excluded.empty()) return -1;
  if (c10::impl::TorchDispatchModeTLS::any_modes_set()) return -1;
  if (at::impl::torch_function_mode_enabled()) return -1;
  if (at::hasCallbacks()) return -1;  // profiler, record_function observers
  if (!PyTuple_CheckExact(tensors)) return -1;
  const Py_ssize_t n = PyTuple_GET_SIZE(tensors);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!CheckTensor(PyTuple_GET_ITEM(tensors, i), st, 0)) return -1;
  }
  if (!st.any_tensor) return -1;
  return st.requires_grad && !below_autograd && c10::GradMode::is_enabled() ? 1 : 0;
}

void BumpVersion(PyObject* obj) {
  if (THPVariable_CheckExact(obj)) {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (t.defined()) torch::autograd::impl::bump_version(t);
  } else if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    PyObject** items = PySequence_Fast_ITEMS(obj);
    for (Py_ssize_t i = 0; i < n; ++i) BumpVersion(items[i]);
  }
}

PyObject* FastPathCall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* fp = reinterpret_cast<FastPathObject*>(self);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr || nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "FastPath takes (tensors, *args) positionally");
    return nullptr;
  }
  CheckState st;
  int mode;
  try {
    mode = Check(args[0], st);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  if (mode < 0) return Py_NewRef(Py_NotImplemented);
  if (mode == 1) {
    return Py_NewRef(fp->has_backward ? fp->needs_autograd : Py_NotImplemented);
  }
  PyObject* kernel = (*fp->kernels)[static_cast<size_t>(st.device)];
  if (kernel == nullptr) kernel = fp->default_kernel;
  if (kernel == nullptr) return Py_NewRef(Py_NotImplemented);
  PyObject* result;
  {
    // What the dispatcher's autograd step does before calling the kernel.
    at::AutoDispatchBelowAutograd guard;
    result = PyObject_Vectorcall(kernel, args + 1, static_cast<size_t>(nargs - 1) -
                                                       (fp->kwnames ? PyTuple_GET_SIZE(fp->kwnames) : 0),
                                 fp->kwnames);
  }
  if (result != nullptr && !fp->mutated->empty()) {
    PyObject* tensors = args[0];
    for (int index : *fp->mutated) BumpVersion(PyTuple_GET_ITEM(tensors, index));
  }
  return result;
}

void FastPathDealloc(PyObject* self) {
  auto* fp = reinterpret_cast<FastPathObject*>(self);
  PyObject_GC_UnTrack(self);
  Py_CLEAR(fp->default_kernel);
  if (fp->kernels) {
    for (auto& k : *fp->kernels) Py_CLEAR(k);
    delete fp->kernels;
  }
  Py_CLEAR(fp->kwnames);
  Py_CLEAR(fp->needs_autograd);
  delete fp->mutated;
  Py_TYPE(self)->tp_free(self);
}

int FastPathTraverse(PyObject* self, visitproc visit, void* arg) {
  auto* fp = reinterpret_cast<FastPathObject*>(self);
  Py_VISIT(fp->default_kernel);
  if (fp->kernels) {
    for (auto* k : *fp->kernels) Py_VISIT(k);
  }
  Py_VISIT(fp->needs_autograd);
  return 0;
}

int FastPathClear(PyObject* self) {
  auto* fp = reinterpret_cast<FastPathObject*>(self);
  Py_CLEAR(fp->default_kernel);
  if (fp->kernels) {
    for (auto& k : *fp->kernels) Py_CLEAR(k);
  }
  Py_CLEAR(fp->needs_autograd);
  return 0;
}

c10::DeviceType ParseDeviceType(PyObject* name) {
  const char* text = PyUnicode_AsUTF8(name);
  if (text == nullptr) throw py::error_already_set();
  return c10::Device(text).type();
}

PyObject* FastPathNew(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"default_kernel", "kernels", "kwnames", "mutated", "has_backward",
                             "needs_autograd", nullptr};
  PyObject *default_kernel, *kernels, *kwnames, *mutated, *needs_autograd;
  int has_backward;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!O!pO", const_cast<char**>(kw), &default_kernel,
                                   &PyDict_Type, &kernels, &PyTuple_Type, &kwnames, &PyTuple_Type,
                                   &mutated, &has_backward, &needs_autograd)) {
    return nullptr;
  }
  auto* fp = reinterpret_cast<FastPathObject*>(type->tp_alloc(type, 0));
  if (fp == nullptr) return nullptr;
  fp->vectorcall = FastPathCall;
  fp->kernels = new std::array<PyObject*, kNumDeviceTypes>();
  fp->kernels->fill(nullptr);
  fp->mutated = new std::vector<int>();
  fp->default_kernel = default_kernel == Py_None ? nullptr : Py_NewRef(default_kernel);
  fp->kwnames = PyTuple_GET_SIZE(kwnames) ? Py_NewRef(kwnames) : nullptr;
  fp->needs_autograd = Py_NewRef(needs_autograd);
  fp->has_backward = has_backward != 0;
  try {
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kernels, &pos, &key, &value)) {
      auto& slot = (*fp->kernels)[static_cast<size_t>(ParseDeviceType(key))];
      Py_XSETREF(slot, Py_NewRef(value));
    }
  } catch (const std::exception& e) {
    Py_DECREF(fp);
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mutated); ++i) {
    fp->mutated->push_back(static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(mutated, i))));
  }
  return reinterpret_cast<PyObject*>(fp);
}

PyObject* FastPathSetKernel(PyObject* self, PyObject* args) {
  auto* fp = reinterpret_cast<FastPathObject*>(self);
  PyObject *device, *kernel;
  if (!PyArg_ParseTuple(args, "OO", &device, &kernel)) return nullptr;
  if (device == Py_None) {
    Py_XSETREF(fp->default_kernel, Py_NewRef(kernel));
    Py_RETURN_NONE;
  }
  try {
    auto& slot = (*fp->kernels)[static_cast<size_t>(ParseDeviceType(device))];
    Py_XSETREF(slot, Py_NewRef(kernel));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* FastPathSetBackward(PyObject* self, PyObject* arg) {
  reinterpret_cast<FastPathObject*>(self)->has_backward = PyObject_IsTrue(arg) == 1;
  Py_RETURN_NONE;
}

PyObject* FastPathCheck(PyObject* /*self*/, PyObject* tensors) {
  CheckState st;
  return PyLong_FromLong(Check(tensors, st));
}

PyMethodDef kFastPathMethods[] = {
    {"set_kernel", FastPathSetKernel, METH_VARARGS,
     "set_kernel(device_type or None, kernel): the kernel for a device type, or the default."},
    {"set_has_backward", FastPathSetBackward, METH_O, "Whether the op has a backward."},
    {"check", FastPathCheck, METH_O,
     "check(tensors) -> -1 (dispatcher path), 0 (kernel), 1 (gradient needed)."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject FastPathType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "opforge._C.FastPath";
  t.tp_basicsize = sizeof(FastPathObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  t.tp_doc = "The eager fast path of one op (see opforge/_op.py).";
  t.tp_new = FastPathNew;
  t.tp_dealloc = FastPathDealloc;
  t.tp_traverse = FastPathTraverse;
  t.tp_clear = FastPathClear;
  t.tp_call = PyVectorcall_Call;
  t.tp_vectorcall_offset = offsetof(FastPathObject, vectorcall);
  t.tp_methods = kFastPathMethods;
  return t;
}();

}  // namespace

void InitFastPath(py::module_& m) {
  if (PyType_Ready(&FastPathType) < 0) throw py::error_already_set();
  Py_INCREF(&FastPathType);
  m.add_object("FastPath", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&FastPathType)));
  m.def("set_fast_path_enabled", [](bool enabled) {
    bool previous = g_enabled;
    g_enabled = enabled;
    return previous;
  }, py::arg("enabled"), "Turns the eager fast path on or off for every op; returns the previous setting.");
  m.def("fast_path_enabled", [] { return g_enabled; });
}

}  // namespace opforge
