// The call boundary of opforge ops (see boundary.h); each leaf converted by
// its rule (leaf_rule.h).
#include "python/boundary.h"

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>

namespace py = pybind11;

namespace opforge {
namespace {

using Kind = LeafRule::Kind;

// --- messages ---------------------------------------------------------------

using Context = Boundary::Context;

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
  if (PyLong_Check(obj) && !PyBool_Check(obj) && expected.rfind("an int", 0) == 0) {
    // An int, but past what torch's int (int64_t) holds.
    return Fail(PyExc_OverflowError, op, where, context,
                Describe(obj) + " is outside the range of torch's int (64-bit: -2**63 to 2**63-1).",
                "Pass a value in that range, or a float or Tensor parameter for larger values.");
  }
  std::string what = "expected " + want + ", got " + Describe(obj) + ".";
  return Fail(PyExc_TypeError, op, where, context, what, Fix(context, want));
}

bool Cacheable(const Node& node) {
  switch (node.kind) {
    case Node::Kind::kLeaf: return CacheableLeaf(node.rule);
    case Node::Kind::kEnum:
    case Node::Kind::kLiteral: return !node.is_list;
    case Node::Kind::kHandle: return false;
    case Node::Kind::kStruct: return std::all_of(node.children.begin(), node.children.end(), Cacheable);
  }
  return false;
}

bool HasTensorSlots(const Node& node) {
  return node.tensor_slot >= 0 || std::any_of(node.children.begin(), node.children.end(), HasTensorSlots);
}

// An interned str: names the calls compare by identity first.
py::object Interned(const std::string& text) {
  PyObject* s = PyUnicode_InternFromString(text.c_str());
  if (s == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(s);
}

// A vectorcall's kwnames: a tuple of `names`, or null when there are none.
py::object Kwnames(const std::vector<std::string>& names) {
  if (names.empty()) return py::object();
  return py::tuple(py::cast(names));
}

// A struct node's instance, each field by keyword from `field(child)`: a new
// reference, or null with an error set.
template <class Field>
PyObject* Construct(const Node& node, Field&& field) {
  Owned fields;
  fields.items.reserve(node.children.size());
  for (const Node& child : node.children) {
    if (fields.Add(field(child)) == nullptr) return nullptr;
  }
  return PyObject_Vectorcall(node.cls.ptr(), fields.items.data(), 0, node.kwnames.ptr());
}

// An absent optional struct's leaves: its presence leaves False, every other leaf None.
void FlattenAbsent(const Node& node, PyObject** leaves) {
  if (node.kind != Node::Kind::kStruct) {
    leaves[node.leaf_index] = Py_None;
    return;
  }
  if (node.optional) leaves[node.presence_index] = Py_False;
  for (const Node& child : node.children) FlattenAbsent(child, leaves);
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

Boundary::Boundary(std::string op, const LoweredOp& lowered, const std::string& definable_schema, py::list params,
                   py::object empty, py::dict classes, py::dict enum_values, py::dict handle_classes,
                   py::object handle_check, bool duck_structs)
    : op_(std::move(op)),
      handle_check_(std::move(handle_check)),
      duck_structs_(duck_structs),
      flat_(torch::jit::parseSchema(definable_schema)) {
  if (params.size() != lowered.params.size()) {
    throw std::invalid_argument(op_ + ": the parameter list does not match the lowered spec");
  }
  std::vector<std::string> kw_names;
  for (py::handle item : params) {
    py::tuple p = item.cast<py::tuple>();
    const std::string name = p[0].cast<std::string>();
    names_.push_back(Interned(name));
    if (p[1].cast<bool>()) {
      kw_names.push_back(name);
    } else if (!kw_names.empty()) {
      throw std::invalid_argument(op_ + ": positional parameter after keyword-only");
    } else {
      ++num_positional_;
    }
    py::object def = p[2];
    defaults_.push_back(def.is(empty) ? py::object() : def);
  }
  body_kwnames_ = Kwnames(kw_names);
  for (const MappingNode& param : lowered.params) {
    const Location where{"parameter '" + param.name + "'", {}};
    params_.push_back(BuildParam(param, lowered, flat_, where, classes, enum_values, handle_classes, /*top=*/true));
  }
  // Tensor slots were numbered in flat order; find the mutated ones.
  int slot = 0;
  for (size_t i = 0; i < lowered.flat.arguments.size(); ++i) {
    if (IsTensorLike(*lowered.flat.arguments[i].type)) {
      if (lowered.leaves[i].mutated) mutated_slots_.push_back(slot);
      ++slot;
    }
  }
  if (static_cast<size_t>(slot) != num_tensor_slots_) throw std::invalid_argument(op_ + ": tensor leaves out of order");
  for (size_t i = 0; i < lowered.returns.size(); ++i) {
    const Location where{lowered.returns.size() == 1 ? "return value" : "return value " + std::to_string(i), {}};
    returns_.push_back(BuildReturn(lowered.returns[i], flat_, where, classes));
    leaf_returns_ = leaf_returns_ && returns_.back().kind != Node::Kind::kStruct;
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
  flat_kwnames_ = Kwnames(flat_kw);
  for (const auto& ret : flat_.returns()) return_rules_.push_back(MakeRule(ret.real_type(), std::nullopt));
}

PyObject* Boundary::CallHandles(PyObject* fn, const Node& node, PyObject* value) const {
  py::str at(op_ + ": " + node.where.Text());
  PyObject* call_args[] = {value, node.cls.ptr(), at.ptr()};
  return PyObject_Vectorcall(fn, call_args, 3, nullptr);
}

PyObject* Boundary::PresentLeaf(const LeafRule& rule, const c10::IValue& value) const {
  PyObject* out = Present(rule, value);
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
    node.field_names.push_back(Interned(child.name));
    kwnames[i] = node.field_names.back();
    node.children.push_back(build_child(child, node.where.Field(node.qual, child.name)));
  }
  node.kwnames = kwnames;
  node.has_tensor_slots = HasTensorSlots(node);
}

}  // namespace

Node Boundary::BuildParam(const MappingNode& m, const LoweredOp& lowered, const c10::FunctionSchema& flat,
                          const Location& where, py::dict classes, py::dict enum_values, py::dict handle_classes,
                          bool top) {
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
      node.qual = Qualname(node.cls.ptr());
      // Errors list the members in declaration order: "Mode.A, Mode.B".
      for (py::handle member : node.cls) {
        node.allowed_repr +=
            (node.allowed_repr.empty() ? "" : ", ") + node.qual + "." + py::cast<std::string>(member.attr("name"));
      }
    } else if (!info.allowed.empty()) {
      node.kind = Node::Kind::kLiteral;
      py::list values;
      for (const auto& v : info.allowed) {
        values.append(v.kind == Value::Kind::kString ? py::object(py::str(v.s)) : py::int_(v.i));
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

bool Boundary::Flatten(PyObject* const* converted, std::vector<c10::IValue>& stack) {
  const size_t n = flat_.arguments().size();
  c10::SmallVector<PyObject*, 16> leaves(n, nullptr);
  Owned owned;
  if (!FlattenLeaves(converted, leaves.data(), owned)) return false;
  stack.resize(n);
  for (size_t i = 0; i < n; ++i) stack[i] = LeafIValue(argument_rules_[i], flat_.arguments()[i], leaves[i]);
  return true;
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
      // By identity (interned names), then by value.
      size_t index = 0;
      while (index < n && names_[index].ptr() != key) ++index;
      for (size_t i = 0; index == n && i < n; ++i) {
        const int eq = PyUnicode_Compare(names_[i].ptr(), key);
        if (eq == 0) index = i;
        if (eq == -1 && PyErr_Occurred()) PyErr_Clear();
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

bool Boundary::ConvertAll(PyObject* const* values, PyObject** out, PyObject** tensors, Owned& keep) {
  for (size_t i = 0; i < params_.size(); ++i) {
    out[i] = Convert(params_[i], values[i], tensors, keep, Context::kArgument);
    if (out[i] == nullptr) {
      for (size_t j = 0; j < i; ++j) Py_CLEAR(out[j]);
      return false;
    }
  }
  return true;
}

PyObject* Boundary::Convert(Node& node, PyObject* obj, PyObject** tensors, Owned& keep, Context ctx) {
  if (node.kind == Node::Kind::kLeaf) {
    PyObject* out = ConvertLeaf(node.rule, obj);
    if (out == nullptr) return FailExpected(op_, node.where, ctx, node.rule.expected, node.optional, obj);
    if (node.tensor_slot >= 0 && tensors != nullptr) tensors[node.tensor_slot] = out;
    return out;
  }
  if (obj == Py_None) {
    if (node.optional) return Py_NewRef(Py_None);
    const std::string expected = node.kind == Node::Kind::kEnum      ? "a member of " + node.qual
                                 : node.kind == Node::Kind::kLiteral ? node.rule.expected
                                 : node.kind == Node::Kind::kHandle  ? "a " + Qualname(node.cls.ptr()) + " object"
                                                                     : "a " + node.qual;
    return FailExpected(op_, node.where, ctx, expected, false, obj);
  }
  if (node.kind == Node::Kind::kStruct) return ConvertStruct(node, obj, tensors, keep, ctx);
  if (node.kind == Node::Kind::kHandle) return CallHandles(handle_check_.ptr(), node, obj);
  // kEnum, kLiteral: one value, or a list of them.
  if (!node.is_list) return ConvertChoice(node, obj, ctx);
  if (!PyList_Check(obj) && !PyTuple_Check(obj)) {
    return FailExpected(op_, node.where, ctx, "a list", node.optional, obj);
  }
  PyObject** items = PySequence_Fast_ITEMS(obj);
  return NewList(PySequence_Fast_GET_SIZE(obj), [&](Py_ssize_t i) { return ConvertChoice(node, items[i], ctx); });
}

PyObject* Boundary::ConvertChoice(const Node& node, PyObject* item, Context ctx) {
  const bool is_enum = node.kind == Node::Kind::kEnum;
  if (is_enum) {
    const int is = PyObject_IsInstance(item, node.cls.ptr());
    if (is > 0) return Py_NewRef(item);
    if (is < 0) PyErr_Clear();
  }
  if (PyUnicode_CheckExact(item) || PyLong_CheckExact(item)) {
    if (is_enum) {
      if (PyObject* member = PyDict_GetItemWithError(node.by_value.ptr(), item)) return Py_NewRef(member);
    } else if (PySet_Contains(node.allowed.ptr(), item) > 0) {
      return Py_NewRef(item);
    }
    PyErr_Clear();
  }
  if (is_enum) {
    return Fail(PyExc_ValueError, op_, node.where, ctx, Repr(item) + " is not a member or value of " + node.qual + ".",
                "Pass one of " + node.allowed_repr + ".");
  }
  return Fail(PyExc_ValueError, op_, node.where, ctx,
              Repr(item) + " is not one of the allowed values " + node.allowed_repr + ".",
              ctx == Context::kDefault ? "Change the default." : "Pass one of them.");
}

PyObject* Boundary::ConvertStruct(Node& node, PyObject* obj, PyObject** tensors, Owned& keep, Context ctx) {
  const std::string& qual = node.qual;
  if (node.cache && node.cache->Contains(obj)) return Py_NewRef(obj);
  const bool exact = Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(node.cls.ptr());
  if (!exact) {
    const int is = PyObject_IsInstance(obj, node.cls.ptr());
    if (is < 0) return nullptr;
    if (is == 0 && !duck_structs_) return FailExpected(op_, node.where, ctx, "a " + qual + " instance", false, obj);
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
    PyObject* converted = Convert(node.children[i], value, tensors, keep, ctx);
    Py_DECREF(value);
    if (converted == nullptr) return nullptr;
    changed = changed || converted != value;
    fields.items.push_back(converted);
  }
  PyObject* out =
      changed ? PyObject_Vectorcall(node.cls.ptr(), fields.items.data(), 0, node.kwnames.ptr()) : Py_NewRef(obj);
  if (!changed && node.cache) node.cache->Add(obj);
  if (out != nullptr && node.has_tensor_slots) {
    // Tensor slots point at the converted fields: they live as long as the call.
    keep.items.append(fields.items.begin(), fields.items.end());
    fields.items.clear();
  }
  return out;
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

PyObject* Boundary::CheckReturn(PyObject* value, const BodyInputs& inputs) {
  static const Location kReturnValue{"return value", {}};
  const size_t n = returns_.size();
  if (n == 0) {
    if (value == Py_None) return Py_NewRef(Py_None);
    return Fail(PyExc_TypeError, op_, kReturnValue, Context::kReturn,
                "expected None (the op returns nothing), got " + Describe(value) + ".", "Return None.");
  }
  if (n == 1) return CheckAliases(ConvertReturnNode(returns_[0], value), inputs);
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
  PyObject** items = PySequence_Fast_ITEMS(value);
  return CheckAliases(NewTuple(got, [&](Py_ssize_t i) { return ConvertReturnNode(returns_[i], items[i]); }), inputs);
}

namespace {

using Storages = c10::SmallVector<const c10::StorageImpl*, 4>;

// The tensor's storage, or null (undefined, or a tensor without one: vmap's
// batched tensors, wrapper subclasses). Never throws.
const c10::StorageImpl* StorageOf(const at::Tensor& t) {
  return t.defined() ? t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl() : nullptr;
}

// Calls f with each tensor of a Python leaf: a tensor, a list of them or anything else.
template <class F>
void ForEachTensor(PyObject* obj, F&& f) {
  if (THPVariable_Check(obj)) return f(THPVariable_Unpack(obj));
  if (!PyList_Check(obj) && !PyTuple_Check(obj)) return;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(obj); ++i) {
    PyObject* item = PySequence_Fast_ITEMS(obj)[i];
    if (THPVariable_Check(item)) f(THPVariable_Unpack(item));
  }
}

void AddStorages(PyObject* obj, Storages& out) {
  ForEachTensor(obj, [&](const at::Tensor& t) {
    if (const c10::StorageImpl* s = StorageOf(t)) out.push_back(s);
  });
}

bool Contains(const Storages& set, const c10::StorageImpl* s) {
  return std::find(set.begin(), set.end(), s) != set.end();
}

}  // namespace

// `checked` (a new reference, or null), or null with an error set when a
// returned tensor shares storage with an input or with another return.
PyObject* Boundary::CheckAliases(PyObject* checked, const BodyInputs& inputs) {
  if (checked == nullptr || (inputs.num_slots == 0 && inputs.leaves.empty())) return checked;
  // The usual op: one tensor back, the fast path's tensor slots in.
  if (leaf_returns_ && returns_.size() == 1 && inputs.leaves.empty() && !inputs.flat_objects &&
      mutated_slots_.empty() && THPVariable_CheckExact(checked)) {
    const c10::StorageImpl* r = StorageOf(THPVariable_Unpack(checked));
    bool shared = false;
    for (size_t i = 0; i < inputs.num_slots && !shared && r != nullptr; ++i) {
      PyObject* slot = inputs.slots[i];
      if (slot == nullptr || slot == Py_None) continue;
      if (THPVariable_CheckExact(slot)) {
        shared = StorageOf(THPVariable_Unpack(slot)) == r;
      } else {
        ForEachTensor(slot, [&](const at::Tensor& t) { shared = shared || StorageOf(t) == r; });
      }
    }
    return shared ? FailAlias(checked) : checked;
  }
  Storages returned;
  if (leaf_returns_) {
    if (returns_.size() == 1) {
      AddStorages(checked, returned);
    } else {
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(checked); ++i) AddStorages(PyTuple_GET_ITEM(checked, i), returned);
    }
  } else {
    const size_t nflat = flat_.returns().size();
    c10::SmallVector<PyObject*, 8> flat(nflat, nullptr);
    const bool ok = FlattenOutput(checked, flat.data());
    for (PyObject* f : flat) {
      if (f != nullptr) AddStorages(f, returned);
    }
    for (PyObject* f : flat) Py_XDECREF(f);
    if (!ok) {
      Py_DECREF(checked);
      return nullptr;
    }
  }
  if (returned.empty()) return checked;
  // Inputs the op declares it writes may come back (ctx.mark_dirty's case).
  bool shared = false;
  auto visit = [&](const at::Tensor& t) { shared = shared || Contains(returned, StorageOf(t)); };
  auto written_leaf = [&](size_t i) {
    const auto& alias = flat_.arguments()[i].alias_info();
    return alias != nullptr && alias->isWrite();
  };
  for (size_t i = 0; i < inputs.num_slots && !shared; ++i) {
    const bool written = inputs.flat_objects ? written_leaf(i)
                                             : std::find(mutated_slots_.begin(), mutated_slots_.end(),
                                                         static_cast<int>(i)) != mutated_slots_.end();
    if (inputs.slots[i] != nullptr && !written) ForEachTensor(inputs.slots[i], visit);
  }
  for (size_t i = 0; i < inputs.leaves.size() && !shared; ++i) {
    if (written_leaf(i)) continue;
    const c10::IValue& v = inputs.leaves[i];
    if (v.isTensor()) {
      visit(v.toTensor());
    } else if (v.isList()) {
      for (const c10::IValue& item : v.toListRef()) {
        if (item.isTensor()) visit(item.toTensor());
      }
    }
  }
  for (size_t i = 0; !shared && i < returned.size(); ++i) {
    shared = std::find(returned.begin() + static_cast<std::ptrdiff_t>(i) + 1, returned.end(), returned[i]) !=
             returned.end();
  }
  return shared ? FailAlias(checked) : checked;
}

// Releases `checked` and sets the error of a return sharing storage with an input or another return.
PyObject* Boundary::FailAlias(PyObject* checked) {
  Py_DECREF(checked);
  static const Location kReturnValue{"return value", {}};
  return Fail(PyExc_RuntimeError, op_, kReturnValue, Context::kReturn,
              "a returned tensor is an input of the op, a view of one, or another returned tensor: an op's outputs "
              "are new tensors (eager would hand back the input, a compiled graph a copy).",
              "Return a copy (x.clone()), or write into the input through mutates_args and return nothing.");
}

std::string Boundary::NoneError(size_t param, const std::vector<std::string>& fields) {
  Node* node = &params_.at(param);
  for (const std::string& field : fields) {
    size_t i = 0;
    while (i < node->children.size() && py::str(node->field_names[i]).cast<std::string>() != field) ++i;
    if (i == node->children.size()) throw std::out_of_range(op_ + ": no field " + field);
    node = &node->children[i];
  }
  Owned keep;
  std::vector<PyObject*> tensors(num_tensor_slots_ + 1, nullptr);
  PyObject* out = Convert(*node, Py_None, tensors.data(), keep, Context::kArgument);
  if (out != nullptr) {
    Py_DECREF(out);
    return "";
  }
  py::error_already_set error;
  return py::str(error.value()).cast<std::string>();
}

namespace {

const char* CheckedKind(const LeafRule& rule) {
  switch (rule.kind) {
    case LeafRule::Kind::kTensor: return "tensor";
    case LeafRule::Kind::kInt: return "int";
    case LeafRule::Kind::kFloat: return "float";
    case LeafRule::Kind::kBool: return "bool";
    case LeafRule::Kind::kStr: return "str";
    default: return nullptr;
  }
}

}  // namespace

py::list Boundary::LeafChecks() const {
  py::list out;
  for (size_t i = 0; i < flat_.arguments().size(); ++i) out.append(py::none());
  auto walk = [&](const Node& node, auto& self) -> void {
    for (const Node& child : node.children) self(child, self);
    if (node.kind != Node::Kind::kLeaf || node.leaf_index < 0) return;
    std::string kind;
    if (node.rule.kind == LeafRule::Kind::kList && node.rule.element && !node.rule.element->optional) {
      if (const char* element = CheckedKind(*node.rule.element)) kind = std::string("list:") + element;
    } else if (const char* k = CheckedKind(node.rule)) {
      kind = k;
    }
    if (kind.empty()) return;
    const auto index = static_cast<size_t>(node.leaf_index);
    const bool none_ok = flat_.arguments()[index].type()->kind() == c10::TypeKind::OptionalType;
    out[index] = py::make_tuple(kind, node.where.Text(), node.rule.expected + (node.optional ? " or None" : ""),
                                none_ok);
  };
  for (const Node& param : params_) walk(param, walk);
  return out;
}

// --- the dispatcher path -----------------------------------------------------

bool Boundary::FlattenArgument(const Node& node, PyObject* value, PyObject** leaves, Owned& owned) {
  if (node.kind == Node::Kind::kStruct) {
    if (value == Py_None) {
      FlattenAbsent(node, leaves);
      return true;
    }
    if (node.optional) leaves[node.presence_index] = Py_True;
    for (size_t i = 0; i < node.children.size(); ++i) {
      PyObject* field = owned.Add(PyObject_GetAttr(value, node.field_names[i].ptr()));
      if (field == nullptr || !FlattenArgument(node.children[i], field, leaves, owned)) return false;
    }
    return true;
  }
  PyObject*& leaf = leaves[node.leaf_index];
  if (value == Py_None || node.kind == Node::Kind::kLeaf || node.kind == Node::Kind::kLiteral) {
    leaf = value;
    return true;
  }
  if (node.kind == Node::Kind::kHandle) {
    if (!handle_for_) handle_for_ = py::module_::import("opforge.handles").attr("handle_for");
    return (leaf = owned.Add(CallHandles(handle_for_.ptr(), node, value))) != nullptr;
  }
  // kEnum: the boundary made every value a member; the leaf is its raw value.
  static PyObject* const kValue = PyUnicode_InternFromString("value");
  if (!node.is_list) return (leaf = owned.Add(PyObject_GetAttr(value, kValue))) != nullptr;
  PyObject** items = PySequence_Fast_ITEMS(value);
  leaf = owned.Add(
      NewList(PySequence_Fast_GET_SIZE(value), [&](Py_ssize_t i) { return PyObject_GetAttr(items[i], kValue); }));
  return leaf != nullptr;
}

PyObject* Boundary::RebuildReturn(const Node& node, PyObject* const* flat) {
  if (node.kind != Node::Kind::kStruct) return Py_NewRef(flat[node.leaf_index]);
  return Construct(node, [&](const Node& child) { return RebuildReturn(child, flat); });
}

bool Boundary::FlattenLeaves(PyObject* const* converted, PyObject** leaves, Owned& owned) {
  for (size_t p = 0; p < params_.size(); ++p) {
    if (!FlattenArgument(params_[p], converted[p], leaves, owned)) return false;
  }
  return true;
}

PyObject* Boundary::Dispatch(PyObject* overload, PyObject* const* converted) {
  const size_t n = flat_.arguments().size();
  c10::SmallVector<PyObject*, 16> leaves(n, nullptr);
  Owned owned;
  if (!FlattenLeaves(converted, leaves.data(), owned)) return nullptr;
  PyObject* out = PyObject_Vectorcall(overload, leaves.data(), num_flat_positional_, flat_kwnames_.ptr());
  if (out == nullptr || leaf_returns_) return out;
  owned.Add(out);
  return RebuildOutput(flat_.returns().size() == 1 ? &out : PySequence_Fast_ITEMS(out));
}

PyObject* Boundary::RebuildOutput(PyObject* const* flat) {
  if (returns_.size() == 1) return RebuildReturn(returns_[0], flat);
  return NewTuple(static_cast<Py_ssize_t>(returns_.size()),
                  [&](Py_ssize_t r) { return RebuildReturn(returns_[r], flat); });
}

bool Boundary::FlattenReturn(const Node& node, PyObject* value, PyObject** flat) {
  if (node.kind != Node::Kind::kStruct) {
    Py_XSETREF(flat[node.leaf_index], Py_NewRef(value));
    return true;
  }
  Owned fields;
  for (size_t i = 0; i < node.children.size(); ++i) {
    PyObject* field = fields.Add(PyObject_GetAttr(value, node.field_names[i].ptr()));
    if (field == nullptr || !FlattenReturn(node.children[i], field, flat)) return false;
  }
  return true;
}

bool Boundary::FlattenOutput(PyObject* output, PyObject** flat) {
  for (size_t r = 0; r < returns_.size(); ++r) {
    PyObject* value = returns_.size() == 1 ? output : PySequence_Fast_ITEMS(output)[r];
    if (!FlattenReturn(returns_[r], value, flat)) return false;
  }
  return true;
}

// --- rebuilding, for the op's dispatcher kernel ------------------------------

PyObject* Boundary::Leaf(c10::ArrayRef<c10::IValue> args, size_t index, Owned& owned) {
  const c10::IValue& v = args[index];
  PyObject* out = v.isTensor() ? THPVariable_Wrap(v.toTensor()) : PresentLeaf(argument_rules_.at(index), v);
  if (out != nullptr) owned.Add(out);
  return out;
}

PyObject* Boundary::Rebuild(const Node& node, c10::ArrayRef<c10::IValue> args, Owned& owned) {
  switch (node.kind) {
    case Node::Kind::kLeaf:
    case Node::Kind::kLiteral: return Py_XNewRef(Leaf(args, static_cast<size_t>(node.leaf_index), owned));
    case Node::Kind::kEnum:
    case Node::Kind::kHandle: {
      PyObject* value = Leaf(args, static_cast<size_t>(node.leaf_index), owned);
      if (value == nullptr) return nullptr;
      if (value == Py_None) return Py_NewRef(Py_None);
      if (node.kind == Node::Kind::kHandle) {
        if (!resolve_) resolve_ = py::module_::import("opforge.handles").attr("resolve");
        return CallHandles(resolve_.ptr(), node, value);
      }
      auto member = [&](PyObject* raw) -> PyObject* {
        PyObject* m = PyDict_GetItemWithError(node.by_value.ptr(), raw);
        if (m == nullptr && !PyErr_Occurred()) {
          // A flat value no member has (a graph compiled for another version
          // of the Enum, a hand-made flat call): named as the eager boundary names it.
          std::string values;
          for (const auto& item : py::reinterpret_borrow<py::dict>(node.by_value)) {
            values += (values.empty() ? "" : ", ") + Repr(item.first.ptr());
          }
          Fail(PyExc_ValueError, op_, node.where, Context::kArgument,
               Repr(raw) + " is not a value of " + node.qual + " (its values: " + values + ").",
               "Pass one of " + node.allowed_repr + ". A compiled graph that passed it was compiled for another "
               "definition of " + node.qual + ".");
        }
        return Py_XNewRef(m);
      };
      if (!node.is_list) return member(value);
      return NewList(PyList_GET_SIZE(value), [&](Py_ssize_t i) { return member(PyList_GET_ITEM(value, i)); });
    }
    case Node::Kind::kStruct: {
      if (node.optional && !args[static_cast<size_t>(node.presence_index)].toBool()) return Py_NewRef(Py_None);
      return Construct(node, [&](const Node& child) { return Rebuild(child, args, owned); });
    }
  }
  return nullptr;
}

PyObject* Boundary::RebuildArgs(c10::ArrayRef<c10::IValue> args) {
  Owned owned;
  return NewTuple(static_cast<Py_ssize_t>(params_.size()),
                  [&](Py_ssize_t p) { return Rebuild(params_[p], args, owned); });
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
  std::vector<PyObject*> values(n), out(n), tensors(num_tensor_slots_, nullptr);
  if (!Bind(flat_args.data(), static_cast<Py_ssize_t>(args.size()), kwargs.size() ? kwnames.ptr() : nullptr,
            values.data())) {
    throw py::type_error(op_ + ": the arguments do not match the op's parameters.");
  }
  Owned keep;
  if (!ConvertAll(values.data(), out.data(), tensors.data(), keep)) throw py::error_already_set();
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
    Owned keep;
    PyObject* out = keep.Add(Convert(params_[i], defaults_[i].ptr(), nullptr, keep, Context::kDefault));
    if (out == nullptr) throw py::error_already_set();
  }
}

PyObject* Boundary::KernelFailed(PyObject* const* args) const {
  if (!kernel_error_hook_ || kernel_error_hook_.is_none()) return nullptr;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr && value != nullptr) PyException_SetTraceback(value, traceback);
  const Py_ssize_t npos = static_cast<Py_ssize_t>(num_positional_);
  PyObject* positional = PyTuple_New(npos);
  PyObject* keywords = PyDict_New();
  PyObject* replacement = nullptr;
  if (positional != nullptr && keywords != nullptr) {
    for (Py_ssize_t i = 0; i < npos; ++i) PyTuple_SET_ITEM(positional, i, Py_NewRef(args[i]));
    PyObject* names = body_kwnames_.ptr();
    const Py_ssize_t nkw = names != nullptr ? PyTuple_GET_SIZE(names) : 0;
    bool ok = true;
    for (Py_ssize_t i = 0; i < nkw && ok; ++i) {
      ok = PyDict_SetItem(keywords, PyTuple_GET_ITEM(names, i), args[npos + i]) == 0;
    }
    if (ok) {
      replacement = PyObject_CallFunctionObjArgs(kernel_error_hook_.ptr(), value ? value : Py_None, positional,
                                                 keywords, nullptr);
    }
  }
  Py_XDECREF(positional);
  Py_XDECREF(keywords);
  if (replacement == nullptr || replacement == Py_None || !PyExceptionInstance_Check(replacement)) {
    // No other error to raise (or the hook failed): the body's stands.
    Py_XDECREF(replacement);
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    return nullptr;
  }
  if (value != nullptr) PyException_SetCause(replacement, value);  // steals `value`
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(replacement)), replacement);
  Py_DECREF(replacement);
  return nullptr;
}

void InitBoundary(py::module_& m) {
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
           [](Boundary& b, py::handle value, const py::tuple& inputs) {
             const auto n = static_cast<size_t>(PyTuple_GET_SIZE(inputs.ptr()));
             PyObject* out = b.CheckReturn(value.ptr(), {PySequence_Fast_ITEMS(inputs.ptr()), n, {}, true});
             if (out == nullptr) throw py::error_already_set();
             return py::reinterpret_steal<py::object>(out);
           },
           py::arg("value"), py::arg("inputs") = py::tuple(),
           "The body's return value checked and converted against the schema's returns; with the flat `inputs`, "
           "a returned tensor sharing storage with one of them is refused.")
      .def("leaf_checks", &Boundary::LeafChecks,
           "Per flat argument: None, or (kind, where, expected, None accepted) for the traced path's value check.")
      .def("none_error", &Boundary::NoneError, py::arg("param"), py::arg("fields"),
           "The message converting None at a parameter's field path raises, or '' where None is accepted.")
      .def("flat_defaults", &Boundary::FlatDefaults,
           "Per flat argument: None, or a 1-tuple with the default a Python kernel receives for it.")
      .def("check_defaults", &Boundary::CheckDefaults, "Raises if a parameter's default does not convert to its type.")
      .def("set_kernel_error_hook", &Boundary::SetKernelErrorHook, py::arg("hook"),
           "hook(error, args, kwargs), called where the body failed: an exception to raise instead (its "
           "__cause__ the body's error), or None to keep the body's.")
      .def_property_readonly("num_tensor_slots", &Boundary::num_tensor_slots)
      .def_property_readonly("mutated_slots", &Boundary::mutated_slots);
}

}  // namespace opforge
