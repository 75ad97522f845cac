// Breakable CUDA graph capture, the Python extension's part (capture.h).
#include "python/capture.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <string>
#include <utility>
#include <vector>

#include "python/op_object.h"
#include "torch/capture_guard.h"

namespace py = pybind11;

namespace opforge {
namespace {

// opforge.cuda_graphs' break(name, call): True where a breakable capture took
// the call (it ran `call` once), None to let it be captured (the caller opted
// out); raises to refuse it.
PyObject* g_break = nullptr;

// A static output tensor as the capture left it.
struct Placed {
  const void* data;
  std::vector<int64_t> sizes;
};

// One guarded op's flat call on the capture's static tensors: the arguments
// checked and converted once, at capture; each call redispatches to the op's
// kernels past the guard. The first call's returns are the static outputs;
// later calls write their returns into them (one copy each, none where the
// kernel returned the same tensor, which must then stay where it was).
struct CapturedCallObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  c10::OperatorHandle* op;
  c10::DispatchKeySet below;
  std::vector<c10::IValue>* args;
  std::vector<c10::IValue>* outputs;  // the static outputs, once run
  std::vector<Placed>* placed;  // where their tensors' data is, in order, once run
  bool ran;
};

std::string OpName(const CapturedCallObject* c) { return c->op->schema().name(); }

// What a graph segment after the break can read of one return: a tensor, or
// a list of them, on the capture's device. A value the host reads would be
// the capture's forever.
void CheckStatic(const CapturedCallObject* c, const c10::IValue& v, size_t index) {
  if (v.isNone() || v.isTensor() || v.isTensorList()) return;
  if (v.isList()) {
    bool tensors = true;
    for (const c10::IValue& item : v.toListRef()) tensors = tensors && (item.isTensor() || item.isNone());
    if (tensors) return;
  }
  throw std::runtime_error(
      OpName(c) + ": return " + std::to_string(index) + " is a " + v.tagKind() +
      ", which a breakable CUDA graph cannot replay: the value read at capture would be used on every replay. "
      "Return tensors only from a cudagraph_unsafe op (write a host value into a tensor).");
}

// Where a stack's tensors are, in order: what the graph segments after the
// break read.
void Place(const std::vector<c10::IValue>& values, std::vector<Placed>* out) {
  auto add = [out](const c10::IValue& v) {
    if (v.isTensor() && v.toTensor().defined()) {
      out->push_back({v.toTensor().data_ptr(), v.toTensor().sizes().vec()});
    }
  };
  for (const c10::IValue& v : values) {
    if (v.isList()) {
      for (const c10::IValue& item : v.toListRef()) add(item);
    } else {
      add(v);
    }
  }
}

void CopyInto(const CapturedCallObject* c, const at::Tensor& fixed, const at::Tensor& fresh, size_t index,
              size_t* tensor) {
  if (fixed.defined()) ++*tensor;
  if (!fixed.defined() || !fresh.defined()) {
    if (fixed.defined() != fresh.defined()) {
      throw std::runtime_error(OpName(c) + ": return " + std::to_string(index) +
                               " was a tensor at capture and is None at replay (or the other way): a breakable "
                               "CUDA graph needs each return to stay a tensor of one shape.");
    }
    return;
  }
  if (fresh.is_same(fixed)) {
    // The kernel wrote into the static tensor (an out= argument it returns):
    // right unless it moved the tensor's data, as a resize does.
    const Placed& was = (*c->placed)[*tensor - 1];
    if (fixed.data_ptr() != was.data || fixed.sizes() != c10::IntArrayRef(was.sizes)) {
      throw std::runtime_error(OpName(c) + ": return " + std::to_string(index) +
                               " is the captured tensor, but the kernel resized it at replay (to " +
                               c10::str(fixed.sizes()) + ", captured as " + c10::str(c10::IntArrayRef(was.sizes)) +
                               "): the graph segments after the break read it as it was captured. Keep the op's "
                               "output shape fixed for the capture's inputs.");
    }
    return;
  }
  if (fresh.sizes() != fixed.sizes() || fresh.scalar_type() != fixed.scalar_type() ||
      fresh.device() != fixed.device()) {
    throw std::runtime_error(OpName(c) + ": return " + std::to_string(index) + " changed at replay (" +
                             std::string(c10::toString(fresh.scalar_type())) + " " + c10::str(fresh.sizes()) +
                             " on " + fresh.device().str() + ", captured as " +
                             std::string(c10::toString(fixed.scalar_type())) + " " + c10::str(fixed.sizes()) +
                             " on " + fixed.device().str() + "): the graph segments after the break read the "
                             "captured tensor. Keep the op's output shape fixed for the capture's inputs.");
  }
  if (fresh.data_ptr() == fixed.data_ptr() && fresh.strides() == fixed.strides()) return;
  const_cast<at::Tensor&>(fixed).copy_(fresh);
}

void WriteOutputs(const CapturedCallObject* c, const std::vector<c10::IValue>& fresh) {
  const std::vector<c10::IValue>& fixed = *c->outputs;
  size_t tensor = 0;
  for (size_t i = 0; i < fixed.size() && i < fresh.size(); ++i) {
    if (fixed[i].isTensor()) {
      CopyInto(c, fixed[i].toTensor(), fresh[i].isTensor() ? fresh[i].toTensor() : at::Tensor(), i, &tensor);
    } else if (fixed[i].isList()) {
      const auto a = fixed[i].toListRef();
      const auto b = fresh[i].toListRef();
      if (a.size() != b.size()) {
        throw std::runtime_error(OpName(c) + ": return " + std::to_string(i) +
                                 " changed length at replay; a breakable CUDA graph needs it fixed.");
      }
      for (size_t j = 0; j < a.size(); ++j) {
        CopyInto(c, a[j].isTensor() ? a[j].toTensor() : at::Tensor(), b[j].isTensor() ? b[j].toTensor() : at::Tensor(),
                 i, &tensor);
      }
    }
  }
}

PyObject* CapturedCallCall(PyObject* self, PyObject* const* /*args*/, size_t nargsf, PyObject* kwnames) {
  auto* c = reinterpret_cast<CapturedCallObject*>(self);
  if (PyVectorcall_NARGS(nargsf) != 0 || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0)) {
    PyErr_SetString(PyExc_TypeError, "a CapturedCall takes no arguments");
    return nullptr;
  }
  try {
    std::vector<c10::IValue> stack(*c->args);
    {
      RecordedCallScope past_the_guard;
      c->op->redispatchBoxed(c->below, &stack);
    }
    if (!c->ran) {
      for (size_t i = 0; i < stack.size(); ++i) CheckStatic(c, stack[i], i);
      *c->outputs = stack;
      Place(*c->outputs, c->placed);
      c->ran = true;
      return torch::jit::createPyObjectForStack(std::move(stack)).release().ptr();
    }
    WriteOutputs(c, stack);
  } catch (...) {
    RaiseCppErrorInFlight();
    return nullptr;
  }
  Py_RETURN_NONE;
}

void CapturedCallDealloc(PyObject* self) {
  auto* c = reinterpret_cast<CapturedCallObject*>(self);
  delete c->op;
  delete c->args;
  delete c->outputs;
  delete c->placed;
  Py_TYPE(self)->tp_free(self);
}

PyObject* CapturedCallRepr(PyObject* self) {
  auto* c = reinterpret_cast<CapturedCallObject*>(self);
  return PyUnicode_FromFormat("<opforge CapturedCall %s>", OpName(c).c_str());
}

PyObject* CapturedCallName(PyObject* self, void*) {
  return PyUnicode_FromString(OpName(reinterpret_cast<CapturedCallObject*>(self)).c_str());
}

PyObject* CapturedCallRan(PyObject* self, void*) {
  return PyBool_FromLong(reinterpret_cast<CapturedCallObject*>(self)->ran);
}

PyObject* CapturedCallOutputs(PyObject* self, void*) {
  auto* c = reinterpret_cast<CapturedCallObject*>(self);
  if (!c->ran) Py_RETURN_NONE;
  try {
    return torch::jit::createPyObjectForStack(std::vector<c10::IValue>(*c->outputs)).release().ptr();
  } catch (...) {
    RaiseCppErrorInFlight();
    return nullptr;
  }
}

PyGetSetDef kCapturedCallGetSet[] = {
    {"name", CapturedCallName, nullptr, "the op's name", nullptr},
    {"ran", CapturedCallRan, nullptr, "whether it has run (its static outputs exist)", nullptr},
    {"outputs", CapturedCallOutputs, nullptr, "the static outputs, None before the first call", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject CapturedCallType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "opforge._C.CapturedCall";
  t.tp_basicsize = sizeof(CapturedCallObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  t.tp_doc = "A cudagraph_unsafe op's flat call, recorded at capture; call() runs its kernel on the static tensors.";
  t.tp_dealloc = CapturedCallDealloc;
  t.tp_repr = CapturedCallRepr;
  t.tp_call = PyVectorcall_Call;
  t.tp_vectorcall_offset = offsetof(CapturedCallObject, vectorcall);
  t.tp_getset = kCapturedCallGetSet;
  return t;
}();

// The torch layer's break handler: a guarded op called during a capture.
bool Break(const c10::OperatorHandle& op, c10::DispatchKeySet below, torch::jit::Stack* stack) {
  py::gil_scoped_acquire gil;
  if (g_break == nullptr) TORCH_CHECK(false, PlainCaptureMessage(op.schema().name()));
  const size_t nargs = op.schema().arguments().size();
  auto* c = PyObject_New(CapturedCallObject, &CapturedCallType);
  if (c == nullptr) throw python_error();
  c->vectorcall = CapturedCallCall;
  c->op = new c10::OperatorHandle(op);
  c->below = below;
  c->args = new std::vector<c10::IValue>(stack->end() - nargs, stack->end());
  c->outputs = new std::vector<c10::IValue>();
  c->placed = new std::vector<Placed>();
  c->ran = false;
  py::object call = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(c));
  py::object name = py::str(op.schema().name());
  PyObject* taken = PyObject_CallFunctionObjArgs(g_break, name.ptr(), call.ptr(), nullptr);
  if (taken == nullptr) throw python_error();
  const bool handled = taken != Py_None;
  Py_DECREF(taken);
  if (!handled) return false;
  if (!c->ran) {
    throw std::runtime_error(op.schema().name() +
                             ": the breakable capture took the op's eager break but did not run it; its add_eager(fn) "
                             "must call fn() once and return its result.");
  }
  torch::jit::drop(*stack, nargs);
  for (const c10::IValue& v : *c->outputs) stack->push_back(v);
  return true;
}

}  // namespace

bool LeavesCaptureUnderway(PyObject* const* tensors, size_t n) {
  // The first tensor that decides, as the guard finds it among the flat arguments.
  auto deciding = [](PyObject* item) -> const at::Tensor* {
    if (!THPVariable_Check(item)) return nullptr;
    const at::Tensor& t = THPVariable_Unpack(item);
    return DecidesCapture(t) ? &t : nullptr;
  };
  for (size_t i = 0; i < n; ++i) {
    PyObject* obj = tensors[i];
    if (obj == nullptr || obj == Py_None) continue;
    const bool sequence = PyList_Check(obj) || PyTuple_Check(obj);
    const Py_ssize_t m = sequence ? PySequence_Fast_GET_SIZE(obj) : 1;
    PyObject* const* items = sequence ? PySequence_Fast_ITEMS(obj) : &obj;
    for (Py_ssize_t j = 0; j < m; ++j) {
      if (const at::Tensor* t = deciding(items[j])) return CaptureUnderway(t->device());
    }
  }
  return false;
}

void InitCapture(py::module_& m) {
  if (PyType_Ready(&CapturedCallType) < 0) throw py::error_already_set();
  Py_INCREF(&CapturedCallType);
  m.add_object("CapturedCall", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&CapturedCallType)));
  SetCaptureBreakHandler(&Break);
  m.def("register_capture_guard", &RegisterCaptureGuard, py::arg("qualname"),
        "Installs the BackendSelect kernel of a cudagraph_unsafe op that looks for a CUDA graph capture before "
        "any launch (docs/cuda_graphs.md); it stays while the result lives.");
  m.def("set_capture_break",
        [](py::object fn) { Py_XSETREF(g_break, fn.is_none() ? nullptr : Py_NewRef(fn.ptr())); }, py::arg("fn"),
        "fn(name, call) for a cudagraph_unsafe op called during a capture: True where a breakable capture ran "
        "`call`, None to capture the op as it is; raising refuses the call. None: every such call is refused.");
  m.def("capture_underway", [](const std::string& device) { return CaptureUnderway(c10::Device(device)); },
        py::arg("device"), "Whether work launched now on `device`'s current stream would be captured.");
  m.def("_set_capture_probe", [](int value) {
          const int before = CaptureProbeForTesting();
          SetCaptureProbeForTesting(value);
          return before;
        }, py::arg("value"),
        "For tests without a GPU: 1 makes every device report a capture under way, 0 none, -1 (default) asks "
        "the device. Returns the previous setting.");
  m.def("plain_capture_message", &PlainCaptureMessage, py::arg("op"));
}

}  // namespace opforge
