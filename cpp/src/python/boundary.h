// The call boundary of opforge ops: binding a call to the original
// signature, converting every leaf the way torch's dispatcher converts it,
// rebuilding structs, and checking what the body returns.
//
//   b = _C.Boundary(op, lowered, definable_schema, params, classes, handle_check)
//   b.convert((x, Cfg(2, True)), {})  # (x, Cfg(scale=2.0, causal=True))
//   b.check_return(out)                # out, converted like a return of the schema
//
// One Boundary serves every path: the eager fast path (op_object.cc), the
// dispatcher path (the generated Python calls convert/check_return), the
// op's dispatcher kernel (kernel.cc) and the autograd bridge (autograd.cc),
// so they cannot disagree.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "core/spec.h"
#include "python/leaf_rule.h"

namespace opforge {

// Python references released at scope exit (with the GIL held there).
struct Owned {
  c10::SmallVector<PyObject*, 16> items;
  PyObject* Add(PyObject* p) {
    items.push_back(p);
    return p;
  }
  ~Owned() {
    for (PyObject* p : items) Py_XDECREF(p);
  }
};

// The tensors a body was called with: the fast path's tensor slots (each a
// tensor, None or a list of tensors), the flat leaves as Python objects
// (`flat_objects`), or the dispatcher's flat leaves.
struct BodyInputs {
  PyObject* const* slots = nullptr;
  size_t num_slots = 0;
  c10::ArrayRef<c10::IValue> leaves;
  bool flat_objects = false;
};

// A small cache of struct instances that passed unchanged: frozen
// dataclasses of scalars cannot change, so the next call with the same
// instance needs no check. Holds strong references.
struct StructCache {
  std::array<PyObject*, 8> items{};
  size_t next = 0;
  bool Contains(PyObject* obj) const { return std::find(items.begin(), items.end(), obj) != items.end(); }
  void Add(PyObject* obj);
  ~StructCache();
};

// Where a node sits, for error messages: "parameter 'cfg'", and for a
// field of a struct the path to it, "parameter 'cfg', field Cfg.inner,
// field Inner.scale".
struct Location {
  std::string top;                  // "parameter 'cfg'", "return value", "return value 1"
  std::vector<std::string> fields;  // "Cfg.inner", "Inner.scale"; empty for the parameter itself
  Location Field(const std::string& qual, const std::string& name) const;
  std::string Text() const;
};

// One original parameter (or return), as a tree over the flat leaves.
struct Node {
  enum class Kind : uint8_t { kLeaf, kEnum, kLiteral, kHandle, kStruct };
  Kind kind = Kind::kLeaf;
  bool optional = false;
  bool is_list = false;  // kEnum/kLiteral: a list of them
  LeafRule rule;         // kLeaf; the raw value's rule for kEnum/kLiteral
  int tensor_slot = -1;  // kLeaf holding tensors: its index among the tensor leaves
  int leaf_index = -1;   // kLeaf/kEnum/kLiteral/kHandle: its flat argument (or return)
  int presence_index = -1;  // kStruct of an Optional[Struct]: its `__is_set` flat argument
  Location where;
  pybind11::object cls;       // kStruct/kEnum/kHandle
  pybind11::object by_value;  // kEnum: raw value -> member
  pybind11::object allowed;   // kLiteral: frozenset of values
  std::string allowed_repr;   // kLiteral, kEnum: the values or members in declaration order, for errors
  std::vector<pybind11::object> field_names;  // kStruct, interned
  pybind11::object kwnames;  // kStruct: tuple of field names, for construction
  std::vector<Node> children;  // kStruct
  bool cacheable = false;      // kStruct: only immutable scalar leaves below
  bool has_tensor_slots = false;  // kStruct: a tensor leaf somewhere below
  std::string qual;               // kStruct, kEnum: the class's qualified name, for errors
  std::shared_ptr<StructCache> cache;  // kStruct at the top, when cacheable
};

class Boundary {
 public:
  // Builds the plan. `params`: [(name, kw_only, default or `empty`)];
  // `classes`: registered struct/enum name -> Python class; `enum_values`:
  // enum name -> {raw value: member}; `handle_classes`: handle type -> class.
  Boundary(std::string op, const LoweredOp& lowered, const std::string& definable_schema, pybind11::list params,
           pybind11::object empty, pybind11::dict classes, pybind11::dict enum_values, pybind11::dict handle_classes,
           pybind11::object handle_check, bool duck_structs);

  const std::string& op() const { return op_; }
  size_t num_params() const { return params_.size(); }
  size_t num_positional() const { return num_positional_; }
  size_t num_tensor_slots() const { return num_tensor_slots_; }
  PyObject* body_kwnames() const { return body_kwnames_.ptr(); }  // may be null

  // Called where a call of the op's body (original arguments `args`, as the
  // body gets them) failed with the Python error set: the hook a kernel kind
  // set (`set_kernel_error_hook`, e.g. a Triton op naming a tensor on the
  // wrong device) may raise another error from it. Returns nullptr. Only the
  // error path reads it.
  PyObject* KernelFailed(PyObject* const* args) const;
  void SetKernelErrorHook(pybind11::object hook) { kernel_error_hook_ = std::move(hook); }

  // Binds a vectorcall to the parameters (borrowed references in `out`,
  // defaults filled in). False when Python's own binding would raise; the
  // caller then lets Python raise its message.
  bool Bind(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** out) const;

  // Converts bound values in place into new references (`out`), noting the
  // tensor leaves (borrowed from `out`'s objects, or from `keep`) in
  // `tensors`. Sets a Python error and returns false on bad input; `out` then
  // holds nothing.
  bool ConvertAll(PyObject* const* values, PyObject** out, PyObject** tensors, Owned& keep);

  // A new reference to the converted return value, or null with an error set.
  // With the body's inputs, a returned tensor that shares storage with one of
  // them or with another return is refused, as torch.library.custom_op does:
  // the compiled graph would give the caller a fresh tensor where eager gives
  // the input itself.
  PyObject* CheckReturn(PyObject* value, const BodyInputs& inputs = {});

  // The flat arguments of converted values (ConvertAll's `out`), in schema
  // order, as the dispatcher takes them. False with an error set.
  bool Flatten(PyObject* const* converted, std::vector<c10::IValue>& stack);

  // Positions (among the tensor leaves) of mutated tensors.
  const std::vector<int>& mutated_slots() const { return mutated_slots_; }

  // The parameters and returns as trees over the flat leaves, and the flat schema.
  const std::vector<Node>& params() const { return params_; }
  const std::vector<Node>& returns() const { return returns_; }
  const c10::FunctionSchema& flat() const { return flat_; }
  const std::vector<LeafRule>& return_rules() const { return return_rules_; }

  // The dispatcher path of an eager call: the converted arguments flattened
  // into leaves, `overload` called with them, its output rebuilt in the
  // original form. A new reference, or null with a Python error set.
  //
  //   Dispatch(ns.attn.default, [q, AttnCfg(0.5, True)])  # ns.attn.default(q, 0.5, True)
  PyObject* Dispatch(PyObject* overload, PyObject* const* converted);

  // A flat return value from the dispatcher, as torch hands it to a Python
  // kernel (dtype codes as torch.dtype, ...). A new reference, or null with a
  // Python error set.
  PyObject* PresentReturn(size_t index, const c10::IValue& value) const {
    return PresentLeaf(return_rules_.at(index), value);
  }

  // A parameter's original value from a dispatcher call's flat leaves, as
  // the body receives it (structs and enums rebuilt, handles resolved): a new
  // reference, or null with an error set. `owned` keeps the leaves it made.
  PyObject* Rebuild(const Node& node, c10::ArrayRef<c10::IValue> args, Owned& owned);
  // Every parameter's, as a tuple.
  PyObject* RebuildArgs(c10::ArrayRef<c10::IValue> args);

  // The original output from the flat return values (struct returns
  // rebuilt), and the flat values of an original output (new references in
  // `flat`). Null / false with an error set.
  PyObject* RebuildOutput(PyObject* const* flat);
  bool FlattenOutput(PyObject* output, PyObject** flat);
  // Whether every original return is a leaf: the flat output is the output.
  bool leaf_returns() const { return leaf_returns_; }

  // Python-facing helpers.
  pybind11::tuple ConvertCall(pybind11::args args, pybind11::kwargs kwargs);

  // The error converting None at parameter `param`, field path `fields`,
  // gives ("" where None is accepted): for the traced path, which cannot
  // call into C++ to raise it.
  std::string NoneError(size_t param, const std::vector<std::string>& fields);

  // Per flat argument, for the traced path's check of leaf values: None, or
  // (kind, where, expected, None accepted) for a plain leaf of a kind the
  // traced path checks ("tensor", "int", "float", "bool", "str", "list:<kind>").
  pybind11::list LeafChecks() const;
  pybind11::list FlatDefaults();
  void CheckDefaults();

  // What a converted value is, for messages.
  enum class Context { kArgument, kDefault, kReturn };

 private:
  PyObject* Convert(Node& node, PyObject* obj, PyObject** tensors, Owned& keep, Context ctx);
  PyObject* ConvertStruct(Node& node, PyObject* obj, PyObject** tensors, Owned& keep, Context ctx);
  // One enum member or Literal value (kEnum, kLiteral).
  PyObject* ConvertChoice(const Node& node, PyObject* item, Context ctx);
  PyObject* ConvertReturnNode(Node& node, PyObject* obj);
  PyObject* CheckAliases(PyObject* checked, const BodyInputs& inputs);
  PyObject* FailAlias(PyObject* checked);
  // The flat leaves of converted values, borrowed from them or from `owned`
  // (new references: enum values, handles). False with an error set.
  bool FlattenLeaves(PyObject* const* converted, PyObject** leaves, Owned& owned);
  bool FlattenArgument(const Node& node, PyObject* value, PyObject** leaves, Owned& owned);
  bool FlattenReturn(const Node& node, PyObject* value, PyObject** flat);
  PyObject* RebuildReturn(const Node& node, PyObject* const* flat);
  PyObject* Leaf(c10::ArrayRef<c10::IValue> args, size_t index, Owned& owned);
  // `fn` (a function of opforge.handles) called with a kHandle node's value,
  // its class and "op: where": a new reference, or null with an error set.
  PyObject* CallHandles(PyObject* fn, const Node& node, PyObject* value) const;
  // Present() with an error set for a code out of range.
  PyObject* PresentLeaf(const LeafRule& rule, const c10::IValue& value) const;
  Node BuildParam(const MappingNode& m, const LoweredOp& lowered, const c10::FunctionSchema& flat,
                  const Location& where, pybind11::dict classes, pybind11::dict enum_values,
                  pybind11::dict handle_classes, bool top);
  Node BuildReturn(const MappingNode& m, const c10::FunctionSchema& flat, const Location& where,
                   pybind11::dict classes);

  std::string op_;
  std::vector<pybind11::object> names_;      // interned parameter names
  std::vector<pybind11::object> defaults_;   // null object: required
  size_t num_positional_ = 0;
  std::vector<Node> params_;
  std::vector<Node> returns_;
  size_t num_tensor_slots_ = 0;
  std::vector<int> mutated_slots_;
  pybind11::object body_kwnames_;
  pybind11::object handle_check_;
  pybind11::object handle_for_;  // opforge.handles.handle_for, loaded when a handle is first flattened
  pybind11::object resolve_;     // opforge.handles.resolve, loaded when a handle is first rebuilt
  bool leaf_returns_ = true;
  pybind11::object flat_kwnames_;  // the keyword-only flat arguments' names, or null
  size_t num_flat_positional_ = 0;
  bool duck_structs_ = false;
  c10::FunctionSchema flat_;
  std::vector<LeafRule> argument_rules_;  // per flat argument
  std::vector<LeafRule> return_rules_;    // per flat return
  // Read on the error path only, so kept after what every call reads.
  pybind11::object kernel_error_hook_;  // hook(error, args, kwargs) -> an error to raise instead, or None
};

// _C.Boundary.
void InitBoundary(pybind11::module_& m);

}  // namespace opforge
