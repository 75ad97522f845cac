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

#include <tuple>
#include <utility>

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

// A leaf's kind and how messages name its values (a list's comes from its element).
std::pair<Kind, std::string> KindOf(const c10::Type& type) {
  switch (type.kind()) {
    case c10::TypeKind::TensorType: return {Kind::kTensor, "a Tensor"};
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: return {Kind::kInt, "an int"};
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType: return {Kind::kFloat, "a float"};
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType: return {Kind::kBool, "a bool"};
    case c10::TypeKind::StringType: return {Kind::kStr, "a str"};
    case c10::TypeKind::NumberType: return {Kind::kScalar, "a number (int, float, bool or complex)"};
    case c10::TypeKind::ScalarTypeType: return {Kind::kScalarType, "a torch.dtype"};
    case c10::TypeKind::LayoutType: return {Kind::kLayout, "a torch.layout"};
    case c10::TypeKind::MemoryFormatType: return {Kind::kMemoryFormat, "a torch.memory_format"};
    case c10::TypeKind::DeviceObjType: return {Kind::kDevice, "a torch.device or a device string"};
    case c10::TypeKind::GeneratorType: return {Kind::kGenerator, "a torch.Generator"};
    case c10::TypeKind::ListType: return {Kind::kList, ""};
    default: return {Kind::kOther, "a value of type " + type.str()};
  }
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
  std::tie(rule.kind, rule.expected) = KindOf(*type);
  if (rule.kind == Kind::kList) {
    rule.element =
        std::make_shared<LeafRule>(MakeRule(type->expectRef<c10::ListType>().getElementType(), std::nullopt));
    // "an int" -> "int"; "a Tensor" -> "Tensor"
    const std::string& noun = rule.element->expected;
    rule.expected = "a list of " + noun.substr(noun.find(' ') + 1) + (rule.element->optional ? " or None" : "");
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
    case Kind::kInt: return IsExactInt64(obj) ? Py_NewRef(obj) : TorchConvert(rule, obj);
    case Kind::kFloat: return PyFloat_CheckExact(obj) ? Py_NewRef(obj) : TorchConvert(rule, obj);
    case Kind::kBool: return PyBool_Check(obj) ? Py_NewRef(obj) : TorchConvert(rule, obj);
    case Kind::kStr:
      if (!PyUnicode_CheckExact(obj)) return TorchConvert(rule, obj);
      if (PyUnicode_IS_ASCII(obj) || PyUnicode_AsUTF8(obj) != nullptr) return Py_NewRef(obj);
      PyErr_Clear();
      return nullptr;  // lone surrogates: no UTF-8 form for torch
    case Kind::kScalar: {
      const bool exact = PyFloat_CheckExact(obj) || PyBool_Check(obj) || PyComplex_CheckExact(obj) || IsExactInt64(obj);
      return exact ? Py_NewRef(obj) : TorchConvert(rule, obj);
    }
    case Kind::kScalarType: return THPDtype_Check(obj) ? Py_NewRef(obj) : TorchConvert(rule, obj);
    case Kind::kLayout: return THPLayout_Check(obj) ? Py_NewRef(obj) : TorchConvert(rule, obj);
    case Kind::kMemoryFormat: return THPMemoryFormat_Check(obj) ? Py_NewRef(obj) : TorchConvert(rule, obj);
    case Kind::kDevice: return THPDevice_Check(obj) ? Py_NewRef(obj) : TorchConvert(rule, obj);
    case Kind::kGenerator: {
      const int is = THPGenerator_Check(obj);
      if (is < 0) PyErr_Clear();
      return is > 0 ? Py_NewRef(obj) : nullptr;
    }
    case Kind::kList: return ConvertList(rule, obj);
    case Kind::kOther: break;
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
  if (rule.kind == Kind::kTensor) return THPVariable_Unpack(obj);
  if (rule.kind == Kind::kInt && PyLong_CheckExact(obj)) return static_cast<int64_t>(PyLong_AsLongLong(obj));
  if (rule.kind == Kind::kFloat && PyFloat_CheckExact(obj)) return PyFloat_AS_DOUBLE(obj);
  if (rule.kind == Kind::kBool) return obj == Py_True;
  return torch::jit::toIValue(py::handle(obj), arg.real_type(), arg.N());
}

bool DispatcherValue(const LeafRule& rule, const c10::Argument& arg, PyObject* obj, c10::IValue& out) {
  const bool exact = obj == Py_None ? rule.optional
                     : rule.kind == Kind::kTensor ? THPVariable_CheckExact(obj)
                     : rule.kind == Kind::kInt    ? IsExactInt64(obj)
                     : rule.kind == Kind::kFloat  ? PyFloat_CheckExact(obj)
                                                  : rule.kind == Kind::kBool && PyBool_Check(obj);
  try {
    out = exact ? LeafIValue(rule, arg, obj) : torch::jit::toIValue(py::handle(obj), arg.real_type(), arg.N());
    return true;
  } catch (...) {
    PyErr_Clear();
    return false;
  }
}

std::string TypeName(PyObject* obj) {
  if (obj == Py_None) return "None";
  return Py_TYPE(obj)->tp_name;
}

namespace {

// The text of `str`, a new reference released here; nullopt when it is null
// or has no UTF-8 form. Clears the error either leaves.
std::optional<std::string> TakeText(PyObject* str) {
  Py_ssize_t size = 0;
  const char* text = str != nullptr ? PyUnicode_AsUTF8AndSize(str, &size) : nullptr;
  std::optional<std::string> out;
  if (text != nullptr) out.emplace(text, static_cast<size_t>(size));
  Py_XDECREF(str);
  PyErr_Clear();
  return out;
}

}  // namespace

std::string Describe(PyObject* obj) {
  if (obj == Py_None) return "None";
  std::string out = TypeName(obj);
  std::optional<std::string> r = TakeText(PyObject_Repr(obj));
  if (r && r->size() > 60) r = r->substr(0, 57) + "...";
  if (r && *r != out) out += " " + *r;
  return out;
}

std::string Repr(PyObject* obj) { return TakeText(PyObject_Repr(obj)).value_or("?"); }

std::string Qualname(PyObject* cls) {
  PyObject* q = PyObject_GetAttrString(cls, "__qualname__");
  if (q == nullptr) {
    PyErr_Clear();
    return reinterpret_cast<PyTypeObject*>(cls)->tp_name;
  }
  return TakeText(q).value_or("?");
}

}  // namespace opforge
