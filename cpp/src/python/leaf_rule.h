// How one flat leaf of an op is checked and converted from Python, derived
// from its torch type: exactly as torch's dispatcher converts a Python value
// for that schema type. Values of the exact type pass through untouched, any
// other value goes through torch's own converter (torch::jit::toIValue, then
// the conversion a Python kernel's arguments get). On top of torch, opforge
// rejects a few values torch accepts by accident: None for a leaf that is not
// optional, a str, bytes, dict, set or Tensor where a list is expected (torch
// iterates them), and dtype/layout/memory-format codes out of range (torch
// returns another kind of object for them, or crashes).
//
//   LeafRule rule = MakeRule(c10::IntType::get(), std::nullopt);
//   ConvertLeaf(rule, <int 3>)    // 3, the same object
//   ConvertLeaf(rule, <str "a">)  // null: not an int; rule.expected == "an int"
#pragma once

#include <Python.h>

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <optional>
#include <string>

namespace opforge {

struct LeafRule {
  enum class Kind : uint8_t {
    kTensor,
    kInt,
    kFloat,
    kBool,
    kStr,
    kScalar,
    kScalarType,
    kLayout,
    kMemoryFormat,
    kDevice,
    kGenerator,
    kList,
    kOther,
  };
  Kind kind = Kind::kOther;
  bool optional = false;
  c10::TypePtr type;  // the non-optional torch type
  std::optional<int32_t> N;
  std::string expected;  // "an int (SymInt)", for messages
  std::shared_ptr<LeafRule> element;  // kList
};

LeafRule MakeRule(c10::TypePtr type, std::optional<int32_t> N);

// A Tensor leaf, or a list of them.
bool HoldsTensors(const LeafRule& rule);

// Whether a leaf's values may stand for a struct built from them: immutable,
// and equal only when they rebuild the same. A Scalar is not: 1, 1.0 and True
// are equal but reach the body as three types.
bool CacheableLeaf(const LeafRule& rule);

// A new reference to the converted value, or null (no Python error set)
// when the value does not fit the rule.
PyObject* ConvertLeaf(const LeafRule& rule, PyObject* obj);

// torch's presentation of a converted argument to a Python kernel (dtype
// codes as torch.dtype, ...): a new reference, or null for a code out of range.
PyObject* Present(const LeafRule& rule, const c10::IValue& value);

// A converted leaf as the dispatcher takes it.
c10::IValue LeafIValue(const LeafRule& rule, const c10::Argument& arg, PyObject* obj);

// `obj` as the dispatcher takes it for argument `arg`, converted as torch.ops
// converts it (toIValue), exact tensors, ints, floats, bools and None taken
// directly; false (no Python error) where torch rejects it.
bool DispatcherValue(const LeafRule& rule, const c10::Argument& arg, PyObject* obj, c10::IValue& out);

// For messages: "None", "int", "Cfg(scale=2.0) ..." (type and a short repr),
// and a class's qualified name.
std::string TypeName(PyObject* obj);
std::string Describe(PyObject* obj);
std::string Repr(PyObject* obj);  // repr(obj), or "?"
std::string Qualname(PyObject* cls);

// A new tuple (kTuple) or list of `n` items, `item(i)` giving each as a new
// reference; null, the error as `item` left it, when an item is null.
template <bool kTuple, class Item>
PyObject* NewSequence(Py_ssize_t n, Item&& item) {
  PyObject* out = kTuple ? PyTuple_New(n) : PyList_New(n);
  for (Py_ssize_t i = 0; out != nullptr && i < n; ++i) {
    PyObject* value = item(i);
    if (value == nullptr) {
      Py_CLEAR(out);
    } else if constexpr (kTuple) {
      PyTuple_SET_ITEM(out, i, value);
    } else {
      PyList_SET_ITEM(out, i, value);
    }
  }
  return out;
}
template <class Item>
PyObject* NewList(Py_ssize_t n, Item&& item) {
  return NewSequence<false>(n, item);
}
template <class Item>
PyObject* NewTuple(Py_ssize_t n, Item&& item) {
  return NewSequence<true>(n, item);
}

}  // namespace opforge
