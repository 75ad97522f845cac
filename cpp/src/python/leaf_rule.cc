// Leaf rules (leaf_rule.h).
#include "python/leaf_rule.h"

#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

namespace opforge {
namespace {

using Kind = LeafRule::Kind;

bool IsExactInt64(PyObject* obj) {
  if (!PyLong_CheckExact(obj)) return false;
  int overflow = 0;
  PyLong_AsLongLongAndOverflow(obj, &overflow);
  return overflow == 0;
}

// The torch object for a dtype, layout or memory-format code, or null for a code out of range.
template <class Enum, class Get>
PyObject* FromCode(const c10::IValue& value, Get get) {
  if (!value.isInt()) return nullptr;
  const int64_t code = value.toInt();
  if (code < 0 || code >= static_cast<int64_t>(Enum::NumOptions)) return nullptr;
  return Py_NewRef(reinterpret_cast<PyObject*>(get(static_cast<Enum>(code))));
}

}  // namespace

LeafRule MakeRule(c10::TypePtr type, std::optional<int32_t> N) {
  LeafRule rule;
  if (auto opt = type->cast<c10::OptionalType>()) {
    rule.optional = true;
    type = opt->getElementType();
  }
  rule.type = type;
  rule.N = N;
  switch (type->kind()) {
    case c10::TypeKind::TensorType: rule.kind = Kind::kTensor; rule.expected = "a Tensor"; break;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: rule.kind = Kind::kInt; rule.expected = "an int"; break;
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType: rule.kind = Kind::kFloat; rule.expected = "a float"; break;
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType: rule.kind = Kind::kBool; rule.expected = "a bool"; break;
    case c10::TypeKind::StringType: rule.kind = Kind::kStr; rule.expected = "a str"; break;
    case c10::TypeKind::NumberType:
      rule.kind = Kind::kScalar;
      rule.expected = "a number (int, float, bool or complex)";
      break;
    case c10::TypeKind::ScalarTypeType: rule.kind = Kind::kScalarType; rule.expected = "a torch.dtype"; break;
    case c10::TypeKind::LayoutType: rule.kind = Kind::kLayout; rule.expected = "a torch.layout"; break;
    case c10::TypeKind::MemoryFormatType:
      rule.kind = Kind::kMemoryFormat;
      rule.expected = "a torch.memory_format";
      break;
    case c10::TypeKind::DeviceObjType:
      rule.kind = Kind::kDevice;
      rule.expected = "a torch.device or a device string";
      break;
    case c10::TypeKind::GeneratorType: rule.kind = Kind::kGenerator; rule.expected = "a torch.Generator"; break;
    case c10::TypeKind::ListType: {
      rule.kind = Kind::kList;
      rule.element = std::make_shared<LeafRule>(
          MakeRule(type->expectRef<c10::ListType>().getElementType(), std::nullopt));
      std::string noun = rule.element->expected;
      // "an int" -> "int"; "a Tensor" -> "Tensor"
      noun = noun.substr(noun.find(' ') + 1);
      rule.expected = "a list of " + noun + (rule.element->optional ? " or None" : "");
      break;
    }
    default: rule.kind = Kind::kOther; rule.expected = "a value of type " + type->str(); break;
  }
  return rule;
}

bool HoldsTensors(const LeafRule& rule) {
  return rule.kind == Kind::kTensor || (rule.kind == Kind::kList && rule.element->kind == Kind::kTensor);
}

PyObject* Present(const LeafRule& rule, const c10::IValue& value) {
  if (value.isNone()) return Py_NewRef(Py_None);
  switch (rule.kind) {
    case Kind::kScalarType: return FromCode<c10::ScalarType>(value, torch::getTHPDtype);
    case Kind::kLayout: return FromCode<c10::Layout>(value, torch::getTHPLayout);
    case Kind::kMemoryFormat: return FromCode<c10::MemoryFormat>(value, torch::utils::getTHPMemoryFormat);
    default: return torch::jit::toPyObject(value).release().ptr();
  }
}

namespace {

// torch's own conversion; null (and no Python error) when torch rejects.
PyObject* TorchConvert(const LeafRule& rule, PyObject* obj) {
  try {
    c10::IValue value = torch::jit::toIValue(obj, rule.type, rule.N);
    PyObject* out = Present(rule, value);
    if (out == nullptr) PyErr_Clear();
    return out;
  } catch (...) {
    PyErr_Clear();
    return nullptr;
  }
}

PyObject* ConvertList(const LeafRule& rule, PyObject* obj) {
  if (PyUnicode_Check(obj) || PyBytes_Check(obj) || PyByteArray_Check(obj) || PyDict_Check(obj) ||
      PyAnySet_Check(obj)) {
    return nullptr;
  }
  const LeafRule& element = *rule.element;
  if (element.kind == Kind::kTensor && THPVariable_Check(obj)) return nullptr;
  if (!PyList_Check(obj) && !PyTuple_Check(obj)) return TorchConvert(rule, obj);
  PyObject** items = PySequence_Fast_ITEMS(obj);
  PyObject* out = NewList(PySequence_Fast_GET_SIZE(obj), [&](Py_ssize_t i) { return ConvertLeaf(element, items[i]); });
  if (out == nullptr) PyErr_Clear();  // a failed PyList_New; an item that does not fit sets no error
  return out;
}

}  // namespace

PyObject* ConvertLeaf(const LeafRule& rule, PyObject* obj) {
  if (obj == Py_None) return rule.optional ? Py_NewRef(Py_None) : nullptr;
  switch (rule.kind) {
    case Kind::kTensor:
      // torch hands a Python kernel the very tensor object it was given.
      return THPVariable_Check(obj) ? Py_NewRef(obj) : nullptr;
    case Kind::kInt:
      if (IsExactInt64(obj)) return Py_NewRef(obj);
      break;
    case Kind::kFloat:
      if (PyFloat_CheckExact(obj)) return Py_NewRef(obj);
      break;
    case Kind::kBool:
      if (PyBool_Check(obj)) return Py_NewRef(obj);
      break;
    case Kind::kStr:
      if (PyUnicode_CheckExact(obj)) {
        if (PyUnicode_IS_ASCII(obj) || PyUnicode_AsUTF8(obj) != nullptr) return Py_NewRef(obj);
        PyErr_Clear();
        return nullptr;  // lone surrogates: no UTF-8 form for torch
      }
      break;
    case Kind::kScalar:
      if (PyFloat_CheckExact(obj) || PyBool_Check(obj) || PyComplex_CheckExact(obj) || IsExactInt64(obj)) {
        return Py_NewRef(obj);
      }
      break;
    case Kind::kScalarType:
      if (THPDtype_Check(obj)) return Py_NewRef(obj);
      break;
    case Kind::kLayout:
      if (THPLayout_Check(obj)) return Py_NewRef(obj);
      break;
    case Kind::kMemoryFormat:
      if (THPMemoryFormat_Check(obj)) return Py_NewRef(obj);
      break;
    case Kind::kDevice:
      if (THPDevice_Check(obj)) return Py_NewRef(obj);
      break;
    case Kind::kGenerator: {
      const int is = THPGenerator_Check(obj);
      if (is < 0) PyErr_Clear();
      return is > 0 ? Py_NewRef(obj) : nullptr;
    }
    case Kind::kList:
      return ConvertList(rule, obj);
    case Kind::kOther:
      break;
  }
  return TorchConvert(rule, obj);
}

bool CacheableLeaf(const LeafRule& rule) {
  switch (rule.kind) {
    case Kind::kInt:
    case Kind::kFloat:
    case Kind::kBool:
    case Kind::kStr:
    case Kind::kScalarType:
    case Kind::kLayout:
    case Kind::kMemoryFormat:
    case Kind::kDevice:
      return true;
    default:
      return false;
  }
}

c10::IValue LeafIValue(const LeafRule& rule, const c10::Argument& arg, PyObject* obj) {
  if (obj == Py_None) return c10::IValue();
  switch (rule.kind) {
    case Kind::kTensor: return THPVariable_Unpack(obj);
    case Kind::kInt:
      if (PyLong_CheckExact(obj)) return static_cast<int64_t>(PyLong_AsLongLong(obj));
      break;
    case Kind::kFloat:
      if (PyFloat_CheckExact(obj)) return PyFloat_AS_DOUBLE(obj);
      break;
    case Kind::kBool: return obj == Py_True;
    default: break;
  }
  return torch::jit::toIValue(py::handle(obj), arg.real_type(), arg.N());
}

std::string TypeName(PyObject* obj) {
  if (obj == Py_None) return "None";
  return Py_TYPE(obj)->tp_name;
}

std::string Describe(PyObject* obj) {
  if (obj == Py_None) return "None";
  std::string out = TypeName(obj);
  PyObject* repr = PyObject_Repr(obj);
  if (repr == nullptr) {
    PyErr_Clear();
    return out;
  }
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(repr, &size);
  if (text == nullptr) {
    PyErr_Clear();
  } else {
    std::string r(text, static_cast<size_t>(size));
    if (r.size() > 60) r = r.substr(0, 57) + "...";
    if (r != out) out += " " + r;
  }
  Py_DECREF(repr);
  return out;
}

std::string Repr(PyObject* obj) {
  PyObject* repr = PyObject_Repr(obj);
  const char* text = repr ? PyUnicode_AsUTF8(repr) : nullptr;
  std::string out = text ? text : "?";
  Py_XDECREF(repr);
  PyErr_Clear();
  return out;
}

std::string Qualname(PyObject* cls) {
  PyObject* q = PyObject_GetAttrString(cls, "__qualname__");
  if (q == nullptr) {
    PyErr_Clear();
    return reinterpret_cast<PyTypeObject*>(cls)->tp_name;
  }
  const char* text = PyUnicode_AsUTF8(q);
  std::string out = text ? text : "?";
  if (!text) PyErr_Clear();
  Py_DECREF(q);
  return out;
}

}  // namespace opforge
