// The call boundary of opforge ops (see boundary.h), and the eager fast path.
//
// A leaf is converted exactly as torch's dispatcher converts a Python value
// for its schema type: values of the exact type pass through untouched, any
// other value goes through torch's own converter (torch::jit::toIValue, then
// the conversion a Python kernel's arguments get). On top of torch, opforge
// rejects a few values torch accepts by accident: None for a leaf that is not
// optional, a str, bytes, dict, set or Tensor where a list is expected (torch
// iterates them), and dtype/layout/memory-format codes out of range (torch
// returns another kind of object for them, or crashes).
#include "boundary.h"

#include "autograd.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/record_function.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <cstring>
#include <functional>

namespace py = pybind11;

namespace opforge {
namespace {

using Kind = LeafRule::Kind;

bool g_enabled = true;

constexpr int kNumDeviceTypes = static_cast<int>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES);

// --- messages ---------------------------------------------------------------

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

enum class Context { kArgument, kDefault, kReturn };

const char* Suffix(Context context) { return context == Context::kDefault ? " (its default)" : ""; }

std::string Fix(Context context, const std::string& what) {
  switch (context) {
    case Context::kArgument: return "Pass " + what + ".";
    case Context::kDefault: return "Change the default to " + what + ", or the annotation.";
    case Context::kReturn: return "Return " + what + ".";
  }
  return "";
}

}  // namespace

Location Location::Field(const std::string& qual, const std::string& name) const {
  Location out = *this;
  out.fields.push_back(qual + "." + name);
  return out;
}

std::string Location::Text() const {
  std::string out = top;
  for (const auto& field : fields) out += ", field " + field;
  return out;
}

namespace {

PyObject* Fail(PyObject* exc, const std::string& op, const Location& where, Context context,
               const std::string& what, const std::string& fix) {
  const std::string message = op + ": " + where.Text() + Suffix(context) + ": " + what + " " + fix;
  PyErr_SetString(exc, message.c_str());
  return nullptr;
}

PyObject* FailExpected(const std::string& op, const Location& where, Context context,
                       const std::string& expected, bool optional, PyObject* obj) {
  const std::string want = optional ? expected + " or None" : expected;
  if (context == Context::kDefault && obj == Py_None) {
    return Fail(PyExc_TypeError, op, where, context, "the default is None but the type is not Optional.",
                "Annotate it as Optional[...], or change the default to " + want + ".");
  }
  std::string what = "expected " + want + ", got " + Describe(obj) + ".";
  return Fail(PyExc_TypeError, op, where, context, what, Fix(context, want));
}

// --- leaf rules --------------------------------------------------------------

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

// torch's presentation of a converted argument to a Python kernel.
PyObject* Present(const LeafRule& rule, const c10::IValue& value) {
  if (value.isNone()) return Py_NewRef(Py_None);
  switch (rule.kind) {
    case Kind::kScalarType: {
      if (!value.isInt()) return nullptr;
      const int64_t code = value.toInt();
      if (code < 0 || code >= static_cast<int64_t>(c10::ScalarType::NumOptions)) return nullptr;
      return Py_NewRef(reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(code))));
    }
    case Kind::kLayout: {
      if (!value.isInt()) return nullptr;
      const int64_t code = value.toInt();
      if (code < 0 || code >= static_cast<int64_t>(c10::Layout::NumOptions)) return nullptr;
      return Py_NewRef(reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(code))));
    }
    case Kind::kMemoryFormat: {
      if (!value.isInt()) return nullptr;
      const int64_t code = value.toInt();
      if (code < 0 || code >= static_cast<int64_t>(c10::MemoryFormat::NumOptions)) return nullptr;
      return Py_NewRef(torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(code)));
    }
    default:
      return torch::jit::toPyObject(value).release().ptr();
  }
}

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

bool IsExactInt64(PyObject* obj) {
  if (!PyLong_CheckExact(obj)) return false;
  int overflow = 0;
  PyLong_AsLongLongAndOverflow(obj, &overflow);
  return overflow == 0;
}

PyObject* ConvertLeaf(const LeafRule& rule, PyObject* obj);

PyObject* ConvertList(const LeafRule& rule, PyObject* obj) {
  if (PyUnicode_Check(obj) || PyBytes_Check(obj) || PyByteArray_Check(obj) || PyDict_Check(obj) ||
      PyAnySet_Check(obj)) {
    return nullptr;
  }
  const LeafRule& element = *rule.element;
  if (element.kind == Kind::kTensor && THPVariable_Check(obj)) return nullptr;
  if (!PyList_Check(obj) && !PyTuple_Check(obj)) return TorchConvert(rule, obj);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
  PyObject* out = PyList_New(n);
  if (out == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject** items = PySequence_Fast_ITEMS(obj);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = ConvertLeaf(element, items[i]);
    if (item == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SET_ITEM(out, i, item);
  }
  return out;
}

// A new reference to the converted value, or null (no Python error set)
// when the value does not fit the rule.
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

// Whether a leaf's values may stand for a struct built from them: immutable,
// and equal only when they rebuild the same. A Scalar is not: 1, 1.0 and True
// are equal but reach the body as three types. StructCache follows this rule.
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

bool Cacheable(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kLeaf: return CacheableLeaf(node.rule);
    case Node::Kind::kEnum:
    case Node::Kind::kLiteral: return !node.is_list;
    case Node::Kind::kHandle: return false;
    case Node::Kind::kStruct:
      for (const auto& child : node.children) {
        if (!Cacheable(child)) return false;
      }
      return true;
  }
  return false;
}

bool HasTensorSlots(const Node& node) {
  if (node.kind == Node::Kind::kLeaf) return node.tensor_slot >= 0;
  for (const auto& child : node.children) {
    if (HasTensorSlots(child)) return true;
  }
  return false;
}

}  // namespace

void StructCache::Add(PyObject* obj) {
  PyObject*& slot = items[next];
  next = (next + 1) % items.size();
  PyObject* old = slot;
  slot = Py_NewRef(obj);
  Py_XDECREF(old);
}

StructCache::~StructCache() {
  if (!Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  for (PyObject*& p : items) Py_CLEAR(p);
}

// --- the plan --------------------------------------------------------------

Boundary::Boundary(std::string op, const LoweredOp& lowered, const std::string& definable_schema,
                   py::list params, py::object empty, py::dict classes, py::dict enum_values,
                   py::dict handle_classes, py::object handle_check, bool duck_structs)
    : op_(std::move(op)),
      handle_check_(std::move(handle_check)),
      duck_structs_(duck_structs),
      flat_(torch::jit::parseSchema(definable_schema)) {
  if (params.size() != lowered.params.size()) {
    throw std::invalid_argument(op_ + ": the parameter list does not match the lowered spec");
  }
  std::vector<std::string> kw_names;
  for (size_t i = 0; i < params.size(); ++i) {
    py::tuple p = params[i].cast<py::tuple>();
    py::str name = p[0].cast<py::str>();
    PyObject* raw = name.release().ptr();
    PyUnicode_InternInPlace(&raw);
    names_.push_back(py::reinterpret_steal<py::object>(raw));
    const bool kw = p[1].cast<bool>();
    if (kw) {
      kw_names.push_back(p[0].cast<std::string>());
    } else {
      if (!kw_names.empty()) throw std::invalid_argument(op_ + ": positional parameter after keyword-only");
      ++num_positional_;
    }
    py::object def = p[2];
    defaults_.push_back(def.is(empty) ? py::object() : def);
  }
  if (!kw_names.empty()) {
    py::tuple t(kw_names.size());
    for (size_t i = 0; i < kw_names.size(); ++i) t[i] = py::str(kw_names[i]);
    body_kwnames_ = t;
  }
  std::vector<int> slot_of_leaf(lowered.flat.arguments.size(), -1);
  for (size_t i = 0; i < lowered.params.size(); ++i) {
    const Location where{"parameter '" + lowered.params[i].name + "'", {}};
    params_.push_back(BuildParam(lowered.params[i], lowered, flat_, where, classes, enum_values,
                                 handle_classes, /*top=*/true));
  }
  // Tensor slots were numbered in flat order; find the mutated ones.
  int slot = 0;
  for (size_t i = 0; i < lowered.flat.arguments.size(); ++i) {
    if (IsTensorLike(*lowered.flat.arguments[i].type)) {
      if (lowered.leaves[i].mutated) mutated_slots_.push_back(slot);
      ++slot;
    }
  }
  if (static_cast<size_t>(slot) != num_tensor_slots_) {
    throw std::invalid_argument(op_ + ": tensor leaves out of order");
  }
  for (size_t i = 0; i < lowered.returns.size(); ++i) {
    const Location where{lowered.returns.size() == 1 ? "return value" : "return value " + std::to_string(i), {}};
    returns_.push_back(BuildReturn(lowered.returns[i], flat_, where, classes));
  }
  std::vector<std::string> flat_kw;
  for (const auto& arg : flat_.arguments()) {
    argument_rules_.push_back(MakeRule(arg.real_type(), arg.N()));
    if (arg.kwarg_only()) {
      flat_kw.push_back(arg.name());
    } else {
      ++num_flat_positional_;
    }
  }
  if (!flat_kw.empty()) {
    py::tuple t(flat_kw.size());
    for (size_t i = 0; i < flat_kw.size(); ++i) t[i] = py::str(flat_kw[i]);
    flat_kwnames_ = t;
  }
  for (const auto& ret : flat_.returns()) return_rules_.push_back(MakeRule(ret.real_type(), std::nullopt));
}

Boundary::~Boundary() = default;

PyObject* Boundary::PresentArgument(size_t index, const c10::IValue& value) const {
  PyObject* out = Present(argument_rules_.at(index), value);
  if (out == nullptr && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, (op_ + ": a value out of range").c_str());
  return out;
}

PyObject* Boundary::PresentReturn(size_t index, const c10::IValue& value) const {
  PyObject* out = Present(return_rules_.at(index), value);
  if (out == nullptr && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, (op_ + ": a value out of range").c_str());
  return out;
}

namespace {

// A struct node's class, field names and children; `build_child(child,
// where)` builds each child as a parameter or a return.
template <class BuildChild>
void FillStruct(Node& node, const MappingNode& m, py::dict classes, BuildChild build_child) {
  node.kind = Node::Kind::kStruct;
  node.cls = classes[py::str(m.struct_name)];
  node.qual = Qualname(node.cls.ptr());
  py::tuple kwnames(m.children.size());
  for (size_t i = 0; i < m.children.size(); ++i) {
    const MappingNode& child = m.children[i];
    PyObject* raw = PyUnicode_FromString(child.name.c_str());
    PyUnicode_InternInPlace(&raw);
    node.field_names.push_back(py::reinterpret_steal<py::object>(raw));
    kwnames[i] = node.field_names.back();
    node.children.push_back(build_child(child, node.where.Field(node.qual, child.name)));
  }
  node.kwnames = kwnames;
  node.has_tensor_slots = HasTensorSlots(node);
}

}  // namespace

Node Boundary::BuildParam(const MappingNode& m, const LoweredOp& lowered,
                          const c10::FunctionSchema& flat, const Location& where,
                          py::dict classes, py::dict enum_values, py::dict handle_classes, bool top) {
  Node node;
  node.where = where;
  node.leaf_index = m.leaf_index;
  node.presence_index = m.presence_index;
  if (m.kind == MappingNode::Kind::kLeaf) {
    const size_t index = static_cast<size_t>(m.leaf_index);
    const LeafInfo& info = lowered.leaves[index];
    const c10::Argument& arg = flat.arguments().at(index);
    node.rule = MakeRule(arg.real_type(), arg.N());
    // A field of an Optional struct: the flat leaf takes None (for an absent
    // struct), but a caller passing the struct must give the field.
    node.optional = node.rule.optional && !info.forced_optional;
    node.rule.optional = node.optional;
    node.is_list = node.rule.kind == Kind::kList;
    if (!info.handle_type.empty() && handle_classes.contains(py::str(info.handle_type))) {
      node.kind = Node::Kind::kHandle;
      node.cls = handle_classes[py::str(info.handle_type)];
    } else if (!info.handle_type.empty()) {
      // A C++ handle seen from Python: the caller passes the int.
      node.kind = Node::Kind::kLeaf;
    } else if (!info.enum_name.empty()) {
      node.kind = Node::Kind::kEnum;
      node.cls = classes[py::str(info.enum_name)];
      node.by_value = enum_values[py::str(info.enum_name)];
    } else if (!info.allowed.empty()) {
      node.kind = Node::Kind::kLiteral;
      py::list values;
      for (const auto& v : info.allowed) {
        if (v.kind == Value::Kind::kString) {
          values.append(py::str(v.s));
        } else {
          values.append(py::int_(v.i));
        }
      }
      node.allowed = py::reinterpret_steal<py::object>(PyFrozenSet_New(values.ptr()));
      if (!node.allowed) throw py::error_already_set();
      // Errors list the values in the order the signature declares them.
      node.allowed_repr = py::repr(values).cast<std::string>();
    } else {
      node.kind = Node::Kind::kLeaf;
      if (HoldsTensors(node.rule)) node.tensor_slot = static_cast<int>(num_tensor_slots_++);
    }
    return node;
  }
  node.optional = m.optional;
  FillStruct(node, m, classes, [&](const MappingNode& child, const Location& child_where) {
    return BuildParam(child, lowered, flat, child_where, classes, enum_values, handle_classes, false);
  });
  node.cacheable = Cacheable(node);
  if (top && node.cacheable) node.cache = std::make_shared<StructCache>();
  return node;
}

Node Boundary::BuildReturn(const MappingNode& m, const c10::FunctionSchema& flat, const Location& where,
                           py::dict classes) {
  Node node;
  node.where = where;
  if (m.kind == MappingNode::Kind::kLeaf) {
    const c10::Argument& ret = flat.returns().at(static_cast<size_t>(m.leaf_index));
    node.leaf_index = m.leaf_index;
    node.rule = MakeRule(ret.real_type(), std::nullopt);
    node.optional = node.rule.optional;
    return node;
  }
  FillStruct(node, m, classes, [&](const MappingNode& child, const Location& child_where) {
    return BuildReturn(child, flat, child_where, classes);
  });
  return node;
}

// --- flattening, for ops whose kernels torch calls ----------------------------

namespace {

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

}  // namespace

bool Boundary::Flatten(PyObject* const* converted, std::vector<c10::IValue>& stack) {
  const size_t n = flat_.arguments().size();
  c10::SmallVector<PyObject*, 16> leaves(n, nullptr);
  std::vector<PyObject*> owned;
  const bool ok = FlattenLeaves(converted, leaves.data(), owned);
  if (ok) {
    stack.resize(n);
    for (size_t i = 0; i < n; ++i) stack[i] = LeafIValue(argument_rules_[i], flat_.arguments()[i], leaves[i]);
  }
  for (PyObject* p : owned) Py_DECREF(p);
  return ok;
}

// --- binding and conversion --------------------------------------------------

bool Boundary::Bind(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** out) const {
  const size_t n = names_.size();
  if (static_cast<size_t>(nargs) > num_positional_) return false;
  for (size_t i = 0; i < n; ++i) out[i] = nullptr;
  for (Py_ssize_t i = 0; i < nargs; ++i) out[i] = args[i];
  if (kwnames != nullptr) {
    const Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t j = 0; j < nk; ++j) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, j);
      size_t index = n;
      for (size_t i = 0; i < n; ++i) {
        if (names_[i].ptr() == key) {
          index = i;
          break;
        }
      }
      if (index == n) {
        for (size_t i = 0; i < n; ++i) {
          const int eq = PyUnicode_Compare(names_[i].ptr(), key);
          if (eq == 0) {
            index = i;
            break;
          }
          if (eq == -1 && PyErr_Occurred()) PyErr_Clear();
        }
      }
      if (index == n || out[index] != nullptr) return false;
      out[index] = args[nargs + j];
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (out[i] == nullptr) {
      if (!defaults_[i]) return false;
      out[i] = defaults_[i].ptr();
    }
  }
  return true;
}

bool Boundary::ConvertAll(PyObject* const* values, PyObject** out, PyObject** tensors,
                          std::vector<PyObject*>& keep) {
  for (size_t i = 0; i < params_.size(); ++i) {
    out[i] = Convert(params_[i], values[i], tensors, keep, nullptr);
    if (out[i] == nullptr) {
      for (size_t j = 0; j < i; ++j) Py_CLEAR(out[j]);
      return false;
    }
  }
  return true;
}

PyObject* Boundary::Convert(Node& node, PyObject* obj, PyObject** tensors, std::vector<PyObject*>& keep,
                            const char* context) {
  const Context ctx = context == nullptr ? Context::kArgument : Context::kDefault;
  switch (node.kind) {
    case Node::Kind::kLeaf: {
      PyObject* out = ConvertLeaf(node.rule, obj);
      if (out == nullptr) return FailExpected(op_, node.where, ctx, node.rule.expected, node.optional, obj);
      if (node.tensor_slot >= 0 && tensors != nullptr) tensors[node.tensor_slot] = out;
      return out;
    }
    case Node::Kind::kEnum:
    case Node::Kind::kLiteral: {
      if (obj == Py_None) {
        if (node.optional) return Py_NewRef(Py_None);
        return FailExpected(op_, node.where, ctx,
                            node.kind == Node::Kind::kEnum ? "a member of " + Qualname(node.cls.ptr())
                                                           : node.rule.expected,
                            false, obj);
      }
      auto one = [&](PyObject* item) -> PyObject* {
        if (node.kind == Node::Kind::kEnum) {
          const int is = PyObject_IsInstance(item, node.cls.ptr());
          if (is > 0) return Py_NewRef(item);
          if (is < 0) PyErr_Clear();
          if (PyUnicode_CheckExact(item) || PyLong_CheckExact(item)) {
            PyObject* member = PyDict_GetItemWithError(node.by_value.ptr(), item);
            if (member != nullptr) return Py_NewRef(member);
            PyErr_Clear();
          }
          std::string names;
          PyObject* iter = PyObject_GetIter(node.cls.ptr());
          const std::string cls = Qualname(node.cls.ptr());
          if (iter != nullptr) {
            while (PyObject* m = PyIter_Next(iter)) {
              PyObject* mname = PyObject_GetAttrString(m, "name");
              if (mname != nullptr) {
                const char* t = PyUnicode_AsUTF8(mname);
                if (t) names += (names.empty() ? "" : ", ") + cls + "." + t;
                Py_DECREF(mname);
              }
              Py_DECREF(m);
            }
            Py_DECREF(iter);
          }
          PyErr_Clear();
          PyObject* repr = PyObject_Repr(item);
          std::string r = repr && PyUnicode_AsUTF8(repr) ? PyUnicode_AsUTF8(repr) : "?";
          Py_XDECREF(repr);
          PyErr_Clear();
          return Fail(PyExc_ValueError, op_, node.where, ctx,
                      r + " is not a member or value of " + cls + ".", "Pass one of " + names + ".");
        }
        if (PyUnicode_CheckExact(item) || PyLong_CheckExact(item)) {
          const int in = PySet_Contains(node.allowed.ptr(), item);
          if (in > 0) return Py_NewRef(item);
          if (in < 0) PyErr_Clear();
        }
        PyObject* repr = PyObject_Repr(item);
        std::string r = repr && PyUnicode_AsUTF8(repr) ? PyUnicode_AsUTF8(repr) : "?";
        Py_XDECREF(repr);
        PyErr_Clear();
        return Fail(PyExc_ValueError, op_, node.where, ctx,
                    r + " is not one of the allowed values " + node.allowed_repr + ".",
                    ctx == Context::kDefault ? "Change the default." : "Pass one of them.");
      };
      if (!node.is_list) return one(obj);
      if (!PyList_Check(obj) && !PyTuple_Check(obj)) {
        return FailExpected(op_, node.where, ctx, "a list", node.optional, obj);
      }
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
      PyObject* out = PyList_New(n);
      if (out == nullptr) return nullptr;
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = one(PySequence_Fast_ITEMS(obj)[i]);
        if (item == nullptr) {
          Py_DECREF(out);
          return nullptr;
        }
        PyList_SET_ITEM(out, i, item);
      }
      return out;
    }
    case Node::Kind::kHandle: {
      if (obj == Py_None) {
        if (node.optional) return Py_NewRef(Py_None);
        return FailExpected(op_, node.where, ctx, "a " + Qualname(node.cls.ptr()) + " object", false, obj);
      }
      const std::string at = op_ + ": " + node.where.Text();
      py::str where_text(at);
      PyObject* call_args[] = {obj, node.cls.ptr(), where_text.ptr()};
      return PyObject_Vectorcall(handle_check_.ptr(), call_args, 3, nullptr);
    }
    case Node::Kind::kStruct:
      return ConvertStruct(node, obj, tensors, keep, context);
  }
  return nullptr;
}

PyObject* Boundary::ConvertStruct(Node& node, PyObject* obj, PyObject** tensors, std::vector<PyObject*>& keep,
                                  const char* context) {
  const Context ctx = context == nullptr ? Context::kArgument : Context::kDefault;
  const std::string& qual = node.qual;
  if (obj == Py_None) {
    if (node.optional) return Py_NewRef(Py_None);
    return FailExpected(op_, node.where, ctx, "a " + qual, false, obj);
  }
  if (node.cache && node.cache->Contains(obj)) return Py_NewRef(obj);
  const bool exact = Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(node.cls.ptr());
  if (!exact) {
    const int is = PyObject_IsInstance(obj, node.cls.ptr());
    if (is < 0) return nullptr;
    if (is == 0 && !duck_structs_) {
      return FailExpected(op_, node.where, ctx, "a " + qual + " instance", false, obj);
    }
  }
  const size_t n = node.children.size();
  Owned fields;
  fields.items.reserve(n);
  bool changed = !exact;
  for (size_t i = 0; i < n; ++i) {
    PyObject* value = PyObject_GetAttr(obj, node.field_names[i].ptr());
    if (value == nullptr) {
      if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return nullptr;
      PyErr_Clear();
      std::string names;
      for (const auto& f : node.field_names) names += (names.empty() ? "" : ", ") + f.cast<std::string>();
      return Fail(PyExc_TypeError, op_, node.where, ctx,
                  "expected an object with the fields of " + qual + " (" + names + "), got " + Describe(obj) +
                      ", which has no field '" + node.field_names[i].cast<std::string>() + "'.",
                  Fix(ctx, "a " + qual));
    }
    PyObject* converted = Convert(node.children[i], value, tensors, keep, context);
    if (converted == nullptr) {
      Py_DECREF(value);
      return nullptr;
    }
    changed = changed || converted != value;
    Py_DECREF(value);
    fields.items.push_back(converted);
  }
  if (!changed) {
    // The fields stay where they are; tensor slots may point at them.
    if (node.has_tensor_slots) {
      for (PyObject*& f : fields.items) {
        keep.push_back(f);
        f = nullptr;
      }
    }
    if (node.cache) node.cache->Add(obj);
    return Py_NewRef(obj);
  }
  PyObject* rebuilt = PyObject_Vectorcall(node.cls.ptr(), fields.items.data(), 0, node.kwnames.ptr());
  if (rebuilt != nullptr && node.has_tensor_slots) {
    for (PyObject*& f : fields.items) {
      keep.push_back(f);
      f = nullptr;
    }
  }
  return rebuilt;
}

PyObject* Boundary::ConvertReturnNode(Node& node, PyObject* obj) {
  if (node.kind == Node::Kind::kLeaf) {
    PyObject* out = ConvertLeaf(node.rule, obj);
    if (out == nullptr) return FailExpected(op_, node.where, Context::kReturn, node.rule.expected, node.optional, obj);
    return out;
  }
  const std::string& qual = node.qual;
  const int is = obj == Py_None ? 0 : PyObject_IsInstance(obj, node.cls.ptr());
  if (is < 0) return nullptr;
  if (is == 0) return FailExpected(op_, node.where, Context::kReturn, "a " + qual, false, obj);
  const size_t n = node.children.size();
  Owned fields;
  bool changed = Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(node.cls.ptr());
  for (size_t i = 0; i < n; ++i) {
    PyObject* value = PyObject_GetAttr(obj, node.field_names[i].ptr());
    if (value == nullptr) return nullptr;
    PyObject* converted = ConvertReturnNode(node.children[i], value);
    Py_DECREF(value);
    if (converted == nullptr) return nullptr;
    changed = changed || converted != value;
    fields.items.push_back(converted);
  }
  if (!changed) return Py_NewRef(obj);
  return PyObject_Vectorcall(node.cls.ptr(), fields.items.data(), 0, node.kwnames.ptr());
}

PyObject* Boundary::CheckReturn(PyObject* value) {
  static const Location kReturnValue{"return value", {}};
  const size_t n = returns_.size();
  if (n == 0) {
    if (value == Py_None) return Py_NewRef(Py_None);
    return Fail(PyExc_TypeError, op_, kReturnValue, Context::kReturn,
                "expected None (the op returns nothing), got " + Describe(value) + ".", "Return None.");
  }
  if (n == 1) return ConvertReturnNode(returns_[0], value);
  if (!PyTuple_Check(value) && !PyList_Check(value)) {
    return Fail(PyExc_TypeError, op_, kReturnValue, Context::kReturn,
                "expected a tuple of " + std::to_string(n) + " values, got " + Describe(value) + ".",
                "Return a tuple of " + std::to_string(n) + " values.");
  }
  const Py_ssize_t got = PySequence_Fast_GET_SIZE(value);
  if (static_cast<size_t>(got) != n) {
    return Fail(PyExc_TypeError, op_, kReturnValue, Context::kReturn,
                "expected a tuple of " + std::to_string(n) + " values, got " + TypeName(value) + " of " +
                    std::to_string(got) + ".",
                "Return a tuple of " + std::to_string(n) + " values.");
  }
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(n));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < n; ++i) {
    PyObject* item = ConvertReturnNode(returns_[i], PySequence_Fast_ITEMS(value)[i]);
    if (item == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), item);
  }
  return out;
}

// --- the dispatcher path -----------------------------------------------------

bool Boundary::FlattenArgument(const Node& node, PyObject* value, PyObject** leaves, std::vector<PyObject*>& owned) {
  auto keep = [&](PyObject* obj) {
    if (obj != nullptr) owned.push_back(obj);
    return obj;
  };
  switch (node.kind) {
    case Node::Kind::kLeaf:
    case Node::Kind::kLiteral:
      leaves[node.leaf_index] = value;
      return true;
    case Node::Kind::kEnum: {
      // The boundary made every value a member; the leaf is its raw value.
      static PyObject* const kValue = PyUnicode_InternFromString("value");
      if (value == Py_None) {
        leaves[node.leaf_index] = value;
        return true;
      }
      if (!node.is_list) return (leaves[node.leaf_index] = keep(PyObject_GetAttr(value, kValue))) != nullptr;
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(value);
      PyObject* list = keep(PyList_New(n));
      if (list == nullptr) return false;
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* raw = PyObject_GetAttr(PySequence_Fast_ITEMS(value)[i], kValue);
        if (raw == nullptr) return false;
        PyList_SET_ITEM(list, i, raw);
      }
      leaves[node.leaf_index] = list;
      return true;
    }
    case Node::Kind::kHandle: {
      if (value == Py_None) {
        leaves[node.leaf_index] = value;
        return true;
      }
      if (!handle_for_) handle_for_ = py::module_::import("opforge.handles").attr("handle_for");
      py::str at(op_ + ": " + node.where.Text());
      PyObject* call_args[] = {value, node.cls.ptr(), at.ptr()};
      return (leaves[node.leaf_index] = keep(PyObject_Vectorcall(handle_for_.ptr(), call_args, 3, nullptr))) !=
             nullptr;
    }
    case Node::Kind::kStruct: {
      if (value == Py_None) {
        // An absent optional struct: its presence leaves False, every other leaf None.
        std::function<void(const Node&)> absent = [&](const Node& n) {
          if (n.kind != Node::Kind::kStruct) {
            leaves[n.leaf_index] = Py_None;
            return;
          }
          if (n.optional) leaves[n.presence_index] = Py_False;
          for (const Node& child : n.children) absent(child);
        };
        absent(node);
        return true;
      }
      if (node.optional) leaves[node.presence_index] = Py_True;
      for (size_t i = 0; i < node.children.size(); ++i) {
        PyObject* field = keep(PyObject_GetAttr(value, node.field_names[i].ptr()));
        if (field == nullptr || !FlattenArgument(node.children[i], field, leaves, owned)) return false;
      }
      return true;
    }
  }
  return false;
}

PyObject* Boundary::RebuildReturn(const Node& node, PyObject* const* flat) {
  if (node.kind != Node::Kind::kStruct) return Py_NewRef(flat[node.leaf_index]);
  Owned fields;
  for (const Node& child : node.children) {
    PyObject* value = RebuildReturn(child, flat);
    if (value == nullptr) return nullptr;
    fields.items.push_back(value);
  }
  return PyObject_Vectorcall(node.cls.ptr(), fields.items.data(), 0, node.kwnames.ptr());
}

bool Boundary::FlattenLeaves(PyObject* const* converted, PyObject** leaves, std::vector<PyObject*>& owned) {
  for (size_t p = 0; p < params_.size(); ++p) {
    if (!FlattenArgument(params_[p], converted[p], leaves, owned)) return false;
  }
  return true;
}

PyObject* Boundary::Dispatch(PyObject* overload, PyObject* const* converted) {
  const size_t n = flat_.arguments().size();
  c10::SmallVector<PyObject*, 16> leaves(n, nullptr);
  std::vector<PyObject*> owned;
  struct Release {
    std::vector<PyObject*>& items;
    ~Release() {
      for (PyObject* p : items) Py_DECREF(p);
    }
  } release{owned};
  if (!FlattenLeaves(converted, leaves.data(), owned)) return nullptr;
  PyObject* out = PyObject_Vectorcall(overload, leaves.data(), num_flat_positional_, flat_kwnames_.ptr());
  if (out == nullptr) return nullptr;
  bool leaf_returns = true;
  for (const Node& r : returns_) leaf_returns = leaf_returns && r.kind != Node::Kind::kStruct;
  if (leaf_returns) return out;
  owned.push_back(out);
  const size_t nflat = flat_.returns().size();
  PyObject* const* flat = nflat == 1 ? &out : PySequence_Fast_ITEMS(out);
  if (returns_.size() == 1) return RebuildReturn(returns_[0], flat);
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(returns_.size()));
  if (tuple == nullptr) return nullptr;
  for (size_t r = 0; r < returns_.size(); ++r) {
    PyObject* value = RebuildReturn(returns_[r], flat);
    if (value == nullptr) {
      Py_DECREF(tuple);
      return nullptr;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(r), value);
  }
  return tuple;
}

// --- Python-facing helpers ---------------------------------------------------

py::tuple Boundary::ConvertCall(py::args args, py::kwargs kwargs) {
  const size_t n = params_.size();
  std::vector<PyObject*> flat_args;
  for (auto a : args) flat_args.push_back(a.ptr());
  py::tuple kwnames(kwargs.size());
  size_t k = 0;
  for (auto item : kwargs) {
    kwnames[k++] = item.first;
    flat_args.push_back(item.second.ptr());
  }
  std::vector<PyObject*> values(n), out(n);
  if (!Bind(flat_args.data(), static_cast<Py_ssize_t>(args.size()), kwargs.size() ? kwnames.ptr() : nullptr,
            values.data())) {
    throw py::type_error(op_ + ": the arguments do not match the op's parameters.");
  }
  std::vector<PyObject*> tensors(num_tensor_slots_, nullptr);
  std::vector<PyObject*> keep;
  const bool ok = ConvertAll(values.data(), out.data(), tensors.data(), keep);
  for (PyObject* p : keep) Py_DECREF(p);
  if (!ok) throw py::error_already_set();
  py::tuple result(n);
  for (size_t i = 0; i < n; ++i) PyTuple_SET_ITEM(result.ptr(), static_cast<Py_ssize_t>(i), out[i]);
  return result;
}

py::list Boundary::FlatDefaults() {
  py::list out;
  for (size_t i = 0; i < flat_.arguments().size(); ++i) {
    const auto& arg = flat_.arguments()[i];
    if (!arg.default_value()) {
      out.append(py::none());
      continue;
    }
    PyObject* value = Present(argument_rules_[i], *arg.default_value());
    if (value == nullptr) throw py::error_already_set();
    out.append(py::make_tuple(py::reinterpret_steal<py::object>(value)));
  }
  return out;
}

void Boundary::CheckDefaults() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!defaults_[i]) continue;
    std::vector<PyObject*> keep;
    PyObject* out = Convert(params_[i], defaults_[i].ptr(), nullptr, keep, "default");
    for (PyObject* p : keep) Py_DECREF(p);
    if (out == nullptr) throw py::error_already_set();
    Py_DECREF(out);
  }
}

// --- the eager fast path -------------------------------------------------------

namespace {

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
    if (!st.requires_grad && t.unsafeGetTensorImpl()->autograd_meta() != nullptr) {
      st.requires_grad = t.requires_grad();
    }
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

bool AnyInference(PyObject* obj) {
  if (obj == nullptr || obj == Py_None) return false;
  if (THPVariable_Check(obj)) {
    const at::Tensor& t = THPVariable_Unpack(obj);
    return t.defined() && t.is_inference();
  }
  if (PyList_Check(obj) || PyTuple_Check(obj)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (AnyInference(PySequence_Fast_ITEMS(obj)[i])) return true;
    }
  }
  return false;
}

void BumpVersion(PyObject* obj) {
  if (obj == nullptr || obj == Py_None) return;
  if (THPVariable_Check(obj)) {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (t.defined()) torch::autograd::impl::bump_version(t);
  } else if (PyList_Check(obj) || PyTuple_Check(obj)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    for (Py_ssize_t i = 0; i < n; ++i) BumpVersion(PySequence_Fast_ITEMS(obj)[i]);
  }
}

}  // namespace

int FastPathMode(PyObject* const* tensors, size_t n, c10::DeviceType* device) {
  if (!g_enabled) return -1;
  const auto tls = c10::impl::tls_local_dispatch_key_set();
  if (tls.included_.remove(c10::DispatchKey::ADInplaceOrView) !=
      c10::DispatchKeySet(c10::DispatchKey::BackendSelect)) {
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
  PyObject* default_kernel;
  std::array<PyObject*, kNumDeviceTypes>* kernels;
  PyObject* dispatch;  // dispatch(*converted): the dispatcher path, or null: the boundary flattens
  PyObject* overload;  // the op's OpOverload, when dispatch is null
  PyObject* autograd;  // the op's _C.AutogradBridge, or null
  GradBridge* bridge;  // the bridge inside `autograd`
  PyObject* fallback;  // the class's Python __call__, for what the boundary cannot bind
  bool has_backward;   // eager calls that need a gradient take the bridge
  // Ops whose kernels torch calls (C++ libraries): the eager path calls the
  // dispatcher from here, as torch.ops would, without the Python flatten.
  std::optional<c10::OperatorHandle>* dispatcher_op;
  PyObject* rebuild_output;  // flat returns -> struct returns, or null when all are leaves
};

// The dispatcher call of a C++ op's eager fast path.
PyObject* CallDispatcher(OpObject* op, PyObject* const* converted) {
  std::vector<c10::IValue> stack;
  if (!op->boundary->Flatten(converted, stack)) return nullptr;
  try {
    {
      py::gil_scoped_release no_gil;
      (*op->dispatcher_op)->callBoxed(stack);
    }
    py::object out = torch::jit::createPyObjectForStack(std::move(stack));
    if (op->rebuild_output == nullptr) return out.release().ptr();
    return PyObject_CallOneArg(op->rebuild_output, out.ptr());
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
  }
  return nullptr;
}

PyObject* CallFallback(OpObject* op, PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames) {
  if (op->fallback == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "opforge: this op is not fully defined yet.");
    return nullptr;
  }
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  std::vector<PyObject*> full(static_cast<size_t>(nargs + nkw + 1));
  full[0] = self;
  for (Py_ssize_t i = 0; i < nargs + nkw; ++i) full[static_cast<size_t>(i + 1)] = args[i];
  return PyObject_Vectorcall(op->fallback, full.data(), static_cast<size_t>(nargs + 1), kwnames);
}

PyObject* CallOp(OpObject* op, PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  Boundary* b = op->boundary;
  if (b == nullptr) return CallFallback(op, self, args, nargs, kwnames);
  const size_t n = b->num_params();
  constexpr size_t kSmall = 16;
  PyObject* small_values[kSmall];
  PyObject* small_out[kSmall];
  PyObject* small_tensors[kSmall];
  std::vector<PyObject*> big_values, big_out, big_tensors;
  PyObject** values = small_values;
  PyObject** out = small_out;
  PyObject** tensors = small_tensors;
  if (n > kSmall) {
    big_values.resize(n);
    big_out.resize(n);
    values = big_values.data();
    out = big_out.data();
  }
  const size_t nslots = b->num_tensor_slots();
  if (nslots > kSmall) {
    big_tensors.resize(nslots);
    tensors = big_tensors.data();
  }
  for (size_t i = 0; i < nslots; ++i) tensors[i] = nullptr;
  if (!b->Bind(args, nargs, kwnames, values)) return CallFallback(op, self, args, nargs, kwnames);
  std::vector<PyObject*> keep;
  if (!b->ConvertAll(values, out, tensors, keep)) {
    for (PyObject* p : keep) Py_DECREF(p);
    return nullptr;
  }
  struct Release {
    PyObject** items;
    size_t n;
    std::vector<PyObject*>& keep;
    ~Release() {
      for (size_t i = 0; i < n; ++i) Py_DECREF(items[i]);
      for (PyObject* p : keep) Py_DECREF(p);
    }
  } release{out, n, keep};

  c10::DeviceType device = c10::DeviceType::CPU;
  int mode = FastPathMode(tensors, nslots, &device);
  PyObject* kernel = nullptr;
  if (mode >= 0 && op->dispatcher_op->has_value()) {
    // A C++ op: torch's dispatcher runs its kernels, autograd and version
    // bumps, as for torch.ops.ns.op, but without Python's flatten. A Python
    // kernel for the device (register_kernel) runs directly, as for a
    // Python op.
    PyObject* python_kernel = mode == 0 ? (*op->kernels)[static_cast<size_t>(device)] : nullptr;
    if (python_kernel == nullptr) return CallDispatcher(op, out);
  }
  if (mode == 0) {
    kernel = (*op->kernels)[static_cast<size_t>(device)];
    if (kernel == nullptr) kernel = op->default_kernel;
    if (kernel == nullptr) mode = -1;
  }
  // A call that needs a gradient records the op's node directly (below)
  // when the op has a backward and a Python body for every device.
  const bool direct_grad = mode == 1 && op->has_backward && op->bridge != nullptr && op->default_kernel != nullptr;
  if (mode == 1 && !direct_grad) mode = -1;
  // Mutated tensors get their version bumped, as the op's ADInplaceOrView
  // kernel does on the dispatcher path.
  const bool bump = mode >= 0 && !b->mutated_slots().empty() &&
                    !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView);
  if (bump && !c10::InferenceMode::is_enabled()) {
    // Bumping an inference tensor's version outside inference mode is an
    // error; let the dispatcher path raise it as it always does.
    for (int slot : b->mutated_slots()) {
      if (AnyInference(tensors[slot])) mode = -1;
    }
  }
  if (mode >= 0 && bump) {
    for (int slot : b->mutated_slots()) BumpVersion(tensors[slot]);
  }
  if (mode == 0) {
    PyObject* result;
    {
      // What the dispatcher's autograd step does before calling the kernel.
      BelowAutograd guard(!b->mutated_slots().empty());
      result = PyObject_Vectorcall(kernel, out, b->num_positional(), b->body_kwnames());
    }
    if (result == nullptr) return nullptr;
    PyObject* checked = b->CheckReturn(result);
    Py_DECREF(result);
    return checked;
  }
  if (mode == 1) return CallWithGrad(*op->bridge, op->default_kernel, out, tensors);
  if (op->dispatch != nullptr) return PyObject_Vectorcall(op->dispatch, out, n, nullptr);
  return b->Dispatch(op->overload, out);
}

PyObject* OpCall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* op = reinterpret_cast<OpObject*>(self);
  // Nothing thrown in C++ may reach the interpreter: it would abort.
  try {
    return CallOp(op, self, args, PyVectorcall_NARGS(nargsf), kwnames);
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyObject* OpNew(PyTypeObject* type, PyObject* /*args*/, PyObject* /*kwargs*/) {
  auto* op = reinterpret_cast<OpObject*>(type->tp_alloc(type, 0));
  if (op == nullptr) return nullptr;
  op->vectorcall = OpCall;
  op->kernels = new std::array<PyObject*, kNumDeviceTypes>();
  op->kernels->fill(nullptr);
  op->dispatcher_op = new std::optional<c10::OperatorHandle>();
  return reinterpret_cast<PyObject*>(op);
}

int OpTraverse(PyObject* self, visitproc visit, void* arg) {
  auto* op = reinterpret_cast<OpObject*>(self);
  Py_VISIT(op->boundary_obj);
  Py_VISIT(op->default_kernel);
  if (op->kernels) {
    for (PyObject* k : *op->kernels) Py_VISIT(k);
  }
  Py_VISIT(op->dispatch);
  Py_VISIT(op->overload);
  Py_VISIT(op->autograd);
  Py_VISIT(op->fallback);
  Py_VISIT(op->rebuild_output);
  return 0;
}

int OpClear(PyObject* self) {
  auto* op = reinterpret_cast<OpObject*>(self);
  op->boundary = nullptr;
  Py_CLEAR(op->boundary_obj);
  Py_CLEAR(op->default_kernel);
  if (op->kernels) {
    for (PyObject*& k : *op->kernels) Py_CLEAR(k);
  }
  Py_CLEAR(op->dispatch);
  Py_CLEAR(op->overload);
  op->bridge = nullptr;
  Py_CLEAR(op->autograd);
  Py_CLEAR(op->fallback);
  Py_CLEAR(op->rebuild_output);
  return 0;
}

void OpDealloc(PyObject* self) {
  auto* op = reinterpret_cast<OpObject*>(self);
  PyObject_GC_UnTrack(self);
  OpClear(self);
  delete op->kernels;
  op->kernels = nullptr;
  delete op->dispatcher_op;
  op->dispatcher_op = nullptr;
  Py_TYPE(self)->tp_free(self);
}

c10::DeviceType ParseDeviceType(PyObject* name) {
  const char* text = PyUnicode_AsUTF8(name);
  if (text == nullptr) throw py::error_already_set();
  return c10::Device(text).type();
}

// The op's autograd bridge, or None.
void SetBridge(OpObject* op, PyObject* bridge) {
  GradBridge* b = AsGradBridge(bridge);
  Py_XSETREF(op->autograd, b == nullptr ? nullptr : Py_NewRef(bridge));
  op->bridge = b;
}

// _bind(boundary, default_kernel, kernels, dispatch, autograd, fallback, has_backward);
// dispatch None: the boundary flattens the call for self.overload.
PyObject* OpBind(PyObject* self, PyObject* args) {
  auto* op = reinterpret_cast<OpObject*>(self);
  PyObject *boundary, *default_kernel, *kernels, *dispatch, *autograd, *fallback;
  int has_backward;
  if (!PyArg_ParseTuple(args, "OOO!OOOp", &boundary, &default_kernel, &PyDict_Type, &kernels, &dispatch,
                        &autograd, &fallback, &has_backward)) {
    return nullptr;
  }
  try {
    Boundary* b = py::cast<Boundary*>(py::handle(boundary));
    Py_XSETREF(op->boundary_obj, Py_NewRef(boundary));
    op->boundary = b;
    Py_XSETREF(op->default_kernel, default_kernel == Py_None ? nullptr : Py_NewRef(default_kernel));
    for (PyObject*& k : *op->kernels) Py_CLEAR(k);
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kernels, &pos, &key, &value)) {
      Py_XSETREF((*op->kernels)[static_cast<size_t>(ParseDeviceType(key))], Py_NewRef(value));
    }
    if (dispatch == Py_None) {
      PyObject* overload = PyObject_GetAttrString(self, "overload");
      if (overload == nullptr) return nullptr;
      Py_XSETREF(op->overload, overload);
      Py_CLEAR(op->dispatch);
    } else {
      Py_XSETREF(op->dispatch, Py_NewRef(dispatch));
    }
    SetBridge(op, autograd);
    Py_XSETREF(op->fallback, Py_NewRef(fallback));
    op->has_backward = has_backward != 0;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* OpSetKernel(PyObject* self, PyObject* args) {
  auto* op = reinterpret_cast<OpObject*>(self);
  PyObject *device, *kernel;
  if (!PyArg_ParseTuple(args, "OO", &device, &kernel)) return nullptr;
  if (device == Py_None) {
    Py_XSETREF(op->default_kernel, Py_NewRef(kernel));
    Py_RETURN_NONE;
  }
  try {
    Py_XSETREF((*op->kernels)[static_cast<size_t>(ParseDeviceType(device))], Py_NewRef(kernel));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* OpSetBackward(PyObject* self, PyObject* arg) {
  reinterpret_cast<OpObject*>(self)->has_backward = PyObject_IsTrue(arg) == 1;
  Py_RETURN_NONE;
}

PyObject* OpSetAutograd(PyObject* self, PyObject* bridge) {
  try {
    SetBridge(reinterpret_cast<OpObject*>(self), bridge);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
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

// _set_dispatcher_op(qualified_name, rebuild_output or None)
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
  *op->dispatcher_op = *handle;
  Py_XSETREF(op->rebuild_output, rebuild == Py_None ? nullptr : Py_NewRef(rebuild));
  Py_RETURN_NONE;
}

PyMethodDef kOpMethods[] = {
    {"_set_dispatcher_op", OpSetDispatcherOp, METH_VARARGS,
     "_set_dispatcher_op(name, rebuild_output): eager calls go to torch's dispatcher from C (C++ ops)."},
    {"_bind", OpBind, METH_VARARGS,
     "_bind(boundary, default_kernel, kernels, dispatch, autograd, fallback, has_backward)"},
    {"_set_has_backward", OpSetBackward, METH_O, "Whether eager calls that need a gradient take the bridge."},
    {"_set_kernel", OpSetKernel, METH_VARARGS, "_set_kernel(device_type or None, kernel)"},
    {"_set_autograd", OpSetAutograd, METH_O,
     "_set_autograd(bridge or None): the op's _C.AutogradBridge."},
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
  if (!PyType_Check(cls.ptr()) ||
      !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()), &OpType)) {
    throw py::type_error("install_fast_call needs a subclass of opforge._C.OpBase");
  }
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_vectorcall_offset = offsetof(OpObject, vectorcall);
  type->tp_call = PyVectorcall_Call;
  type->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL;
  PyType_Modified(type);
}

}  // namespace

void InitBoundary(py::module_& m) {
  if (PyType_Ready(&OpType) < 0) throw py::error_already_set();
  Py_INCREF(&OpType);
  m.add_object("OpBase", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&OpType)));
  m.def("install_fast_call", &InstallFastCall, py::arg("cls"),
        "Makes eager calls of instances of `cls` (an OpBase subclass) take the C entry.");

  py::class_<Boundary, std::shared_ptr<Boundary>>(m, "Boundary")
      .def(py::init([](const std::string& op, const LoweredOp& lowered, const std::string& definable_schema,
                       py::list params, py::object empty, py::dict classes, py::dict enum_values,
                       py::dict handle_classes, py::object handle_check, bool duck_structs) {
             return std::make_shared<Boundary>(op, lowered, definable_schema, params, empty, classes,
                                               enum_values, handle_classes, handle_check, duck_structs);
           }),
           py::arg("op"), py::arg("lowered"), py::arg("definable_schema"), py::arg("params"), py::arg("empty"),
           py::arg("classes"), py::arg("enum_values"), py::arg("handle_classes"), py::arg("handle_check"),
           py::arg("duck_structs") = false)
      .def("convert", &Boundary::ConvertCall,
           "The call's arguments bound to the original parameters and converted: a tuple, one per parameter.")
      .def("check_return",
           [](Boundary& b, py::handle value) {
             PyObject* out = b.CheckReturn(value.ptr());
             if (out == nullptr) throw py::error_already_set();
             return py::reinterpret_steal<py::object>(out);
           },
           py::arg("value"), "The body's return value checked and converted against the schema's returns.")
      .def("flat_defaults", &Boundary::FlatDefaults,
           "Per flat argument: None, or a 1-tuple with the default a Python kernel receives for it.")
      .def("check_defaults", &Boundary::CheckDefaults,
           "Raises if a parameter's default does not convert to its type.")
      .def_property_readonly("num_tensor_slots", &Boundary::num_tensor_slots)
      .def_property_readonly("mutated_slots", &Boundary::mutated_slots);

  m.def("set_fast_path_enabled", [](bool enabled) {
    bool previous = g_enabled;
    g_enabled = enabled;
    return previous;
  }, py::arg("enabled"), "Turns the eager fast path on or off for every op; returns the previous setting.");
  m.def("fast_path_enabled", [] { return g_enabled; });
}

}  // namespace opforge
