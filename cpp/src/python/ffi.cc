// _C.FfiKernel and _C.register_ffi_kernel (ffi.h).
#include "python/ffi.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <string>
#include <vector>

#include "python/boundary.h"
#include "torch/registration.h"

namespace py = pybind11;

namespace opforge {

PyFfiKernel* AsFfiKernel(PyObject* obj) {
  static PyTypeObject* type = reinterpret_cast<PyTypeObject*>(py::type::of<PyFfiKernel>().ptr());
  if (obj == nullptr || Py_TYPE(obj) != type) return nullptr;
  return py::handle(obj).cast<PyFfiKernel*>();
}

PyObject* CallFfi(const PyFfiKernel& k, Boundary& boundary, PyObject* const* converted) {
  // One buffer per thread for the flat leaves, emptied after each call: an
  // eager call then allocates nothing for them.
  thread_local std::vector<c10::IValue> buffer;
  std::vector<c10::IValue> spare;
  std::vector<c10::IValue>& args = buffer.empty() ? buffer : spare;  // a kernel may call an op again
  struct Clear {
    std::vector<c10::IValue>& v;
    ~Clear() { v.clear(); }
  } clear{args};
  if (!boundary.Flatten(converted, args)) return nullptr;
  std::vector<c10::IValue> out;
  if (k.release_gil) {
    py::gil_scoped_release no_gil;
    k.kernel->Call(boundary.flat(), args, out);
  } else {
    k.kernel->Call(boundary.flat(), args, out);
  }
  if (boundary.leaf_returns()) return torch::jit::createPyObjectForStack(std::move(out)).release().ptr();
  Owned flat;
  for (const c10::IValue& v : out) {
    PyObject* obj = torch::jit::toPyObject(v).release().ptr();
    flat.Add(obj);
  }
  return boundary.RebuildOutput(flat.items.data());
}

namespace {

const char* WayName(LeafWay way) {
  switch (way) {
    case LeafWay::kTensor: return "tensor";
    case LeafWay::kInt: return "int";
    case LeafWay::kFloat: return "float";
    case LeafWay::kBool: return "bool";
    case LeafWay::kStr: return "str";
    case LeafWay::kDataType: return "dtype";
    case LeafWay::kDevice: return "device";
    case LeafWay::kList: return "list";
    case LeafWay::kByTag: return "by value";
  }
  return "?";
}

}  // namespace

void InitFfi(py::module_& m) {
  py::class_<PyFfiKernel>(m, "FfiKernel", "A TVM-FFI function as an op's kernel.")
      .def(py::init([](const std::string& op, const std::string& name, uintptr_t handle, const std::string& lib,
                       bool release_gil, bool owned_tensors) {
             std::string error;
             const OpforgeFfiApi* api = LoadFfiApi(lib, &error);
             if (api == nullptr) throw py::import_error(op + ": " + error);
             FfiKernelOptions options;
             options.owned_tensors = owned_tensors;
             options.owned_tensors_hint = "kernel=opforge.TvmFfiKernel(function, owned_tensors=True)";
             auto* k = new PyFfiKernel;
             k->kernel = std::make_shared<FfiKernel>(op, name, reinterpret_cast<void*>(handle), api, std::move(options));
             k->release_gil = release_gil;
             return k;
           }),
           py::arg("op"), py::arg("name"), py::arg("handle"), py::arg("lib"), py::arg("release_gil"),
           py::arg("owned_tensors") = false)
      .def_property_readonly("op", [](const PyFfiKernel& k) { return k.kernel->op(); })
      .def_property_readonly("name", [](const PyFfiKernel& k) { const std::string& n = k.kernel->function_name(); return n.empty() ? n : n.substr(1); })
      .def_property_readonly("owned_tensors", [](const PyFfiKernel& k) { return k.kernel->owned_tensors(); },
                             "Whether tensors reach the function as owned ffi::Tensors (it takes ffi::Tensor) "
                             "rather than DLTensor views; decided when the kernel is made.")
      .def_property_readonly(
          "plan",
          [](const PyFfiKernel& k) {
            std::vector<std::string> out;
            for (const LeafPlan& p : k.kernel->plan()) {
              std::string way = WayName(p.way);
              if (p.way == LeafWay::kList) way += std::string(" of ") + WayName(p.item);
              out.push_back(p.optional ? way + "?" : way);
            }
            return out;
          },
          "How each flat argument travels, read from the op's schema when the kernel was registered: "
          "['tensor', 'tensor', 'float', 'bool?', 'list of int'].");
  // Returns _C.KernelRegistration, as the op's other kernels do.
  m.def(
      "register_ffi_kernel",
      [](PyFfiKernel& k, const std::string& key) {
        auto kernel = k.kernel;
        auto op = c10::Dispatcher::singleton().findSchema({kernel->op(), ""});
        if (op) kernel->Plan(op->schema());
        return RegisterBoxed(kernel->op(), {c10::parseDispatchKey(key)},
                             [&] { return MakeFfiDispatcherKernel(kernel); });
      },
      py::arg("kernel"), py::arg("dispatch_key"),
      "Registers the kernel as its op's dispatcher kernel for `dispatch_key` (no Python on the call), "
      "planning how each of the op's flat arguments travels.");
}

}  // namespace opforge
