// The autograd bridge (see autograd.h). A call that needs a gradient records
// one OpNode, as torch's own ops record theirs; the node's inputs are the
// defined tensors of the op's tensor leaves (lists expanded), its outputs the
// op's flat tensor returns. What autograd.Function does for a Python
// Function (saved tensors with version checks, mark_dirty,
// mark_non_differentiable, set_materialize_grads, needs_input_grad) is done
// here with the same torch functions, without its Python layers.
#include "python/autograd.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/GradMode.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable_info.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "python/boundary.h"
#include "python/ffi.h"
#include "torch/autograd_kernels.h"
#include "torch/cpp_autograd.h"
#include "torch/ivalues.h"
#include "torch/nodes.h"
#include "torch/registration.h"

namespace py = pybind11;

namespace opforge {
namespace {

using torch::autograd::Variable;
using torch::autograd::variable_list;

[[noreturn]] void ThrowPython() {
  python_error err;
  err.persist();
  throw std::move(err);
}

// opforge._codegen's error classes, which are RuntimeErrors as torch.autograd's are.
PyObject* ErrorClass(const char* name) {
  PyObject* module = PyImport_ImportModule("opforge._codegen");
  if (module == nullptr) return PyExc_RuntimeError;
  PyObject* cls = PyObject_GetAttrString(module, name);
  Py_DECREF(module);
  if (cls == nullptr) {
    PyErr_Clear();
    return PyExc_RuntimeError;
  }
  Py_DECREF(cls);  // the module keeps it
  return cls;
}

}  // namespace

// --- the op's model, as the bridge needs it -----------------------------------

class GradBridge : public std::enable_shared_from_this<GradBridge> {
 public:
  // One tensor leaf of the flat arguments (a Tensor, Tensor?, Tensor[] or Tensor?[] leaf).
  struct TensorLeaf {
    size_t flat_index;
    size_t param;
    bool is_list;
    std::string where;  // "parameter 'p', field Cfg.w"
  };
  enum class ReturnKind : uint8_t { kTensor, kTensorList, kOther };

  explicit GradBridge(py::handle opdef);
  ~GradBridge();

  const std::string& op() const { return op_; }
  const std::string& node_name() const { return node_name_; }
  Boundary& boundary() const { return *boundary_; }
  const std::vector<TensorLeaf>& leaves() const { return leaves_; }
  const std::vector<int>& param_slots() const { return param_slots_; }
  const std::vector<ReturnKind>& returns() const { return returns_; }
  bool leaf_returns() const { return boundary_->leaf_returns(); }
  bool mutates() const { return !boundary_->mutated_slots().empty(); }
  size_t num_params() const { return param_slots_.size(); }

  // The op's current backward and setup_context (register_autograd may
  // replace them): new references, setup_context null when None.
  PyObject* Backward() const;
  PyObject* SetupContext() const;
  // The op's generated flatten_grads (struct gradients -> one per flat
  // argument): a new reference.
  PyObject* FlattenGrads() const;

 private:
  void AddLeaves(const Node& node, size_t param);

  std::string op_;
  std::string node_name_;
  std::shared_ptr<Boundary> boundary_;
  PyObject* state_ = nullptr;  // the op's _State: .backward, .setup_context
  PyObject* code_ = nullptr;   // the op's OpCode
  std::vector<TensorLeaf> leaves_;
  std::vector<int> param_slots_;  // per original parameter: a Tensor parameter's tensor leaf, else -1
  std::vector<ReturnKind> returns_;
};

GradBridge::GradBridge(py::handle opdef) {
  op_ = py::cast<std::string>(opdef.attr("name"));
  node_name_ = op_ + "Backward";
  boundary_ = py::cast<std::shared_ptr<Boundary>>(opdef.attr("boundary"));
  state_ = py::object(opdef.attr("_state")).release().ptr();
  code_ = py::object(opdef.attr("_code")).release().ptr();
  const auto& params = boundary_->params();
  for (size_t p = 0; p < params.size(); ++p) {
    AddLeaves(params[p], p);
    param_slots_.push_back(params[p].tensor_slot);  // -1 but for a kLeaf holding tensors
  }
  // Tensor slots are numbered in flat order, so leaves_ is in slot order once sorted.
  std::sort(leaves_.begin(), leaves_.end(),
            [](const TensorLeaf& a, const TensorLeaf& b) { return a.flat_index < b.flat_index; });
  for (const LeafRule& rule : boundary_->return_rules()) {
    returns_.push_back(!HoldsTensors(rule)                 ? ReturnKind::kOther
                       : rule.kind == LeafRule::Kind::kList ? ReturnKind::kTensorList
                                                             : ReturnKind::kTensor);
  }
}

void GradBridge::AddLeaves(const Node& node, size_t param) {
  for (const Node& child : node.children) AddLeaves(child, param);
  if (node.kind == Node::Kind::kLeaf && node.tensor_slot >= 0) {
    leaves_.push_back({static_cast<size_t>(node.leaf_index), param, node.rule.kind == LeafRule::Kind::kList,
                       node.where.Text()});
  }
}

GradBridge::~GradBridge() {
  if (!Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  Py_CLEAR(state_);
  Py_CLEAR(code_);
  boundary_.reset();  // holds Python objects
}

PyObject* GradBridge::Backward() const {
  static PyObject* const kBackward = PyUnicode_InternFromString("backward");
  return PyObject_GetAttr(state_, kBackward);
}

PyObject* GradBridge::SetupContext() const {
  static PyObject* const kSetupContext = PyUnicode_InternFromString("setup_context");
  PyObject* fn = PyObject_GetAttr(state_, kSetupContext);
  if (fn == Py_None) {
    Py_DECREF(fn);
    return nullptr;
  }
  if (fn == nullptr) throw py::error_already_set();
  return fn;
}

PyObject* GradBridge::FlattenGrads() const {
  static PyObject* const kFlattenGrads = PyUnicode_InternFromString("flatten_grads");
  PyObject* fn = PyObject_GetAttr(code_, kFlattenGrads);
  if (fn == nullptr) ThrowPython();
  return fn;
}

namespace {

class OpNode;

// --- ctx --------------------------------------------------------------------------

// The `ctx` that setup_context and backward receive: what
// torch.autograd.function.FunctionCtx offers, and any attribute the user sets.
struct CtxObject {
  PyObject_HEAD
  PyObject* dict;
  PyObject* weakrefs;
  OpNode* node;                 // null once the node is gone
  PyObject* to_save;            // save_for_backward's tuple, until the forward ends
  PyObject* dirty;              // mark_dirty's tuple, until the forward ends
  PyObject* non_differentiable;  // mark_non_differentiable's tuple, until the forward ends
  PyObject* needs_input_grad;   // one bool per original parameter, made on first use
};

PyTypeObject CtxType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// --- the node ---------------------------------------------------------------------

class OpNode : public torch::autograd::Node {
 public:
  explicit OpNode(std::shared_ptr<GradBridge> bridge) : bridge_(std::move(bridge)) {}
  ~OpNode() override;

  variable_list apply(variable_list&& grads) override;
  std::string name() const override { return bridge_->node_name(); }
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs&) const override {
    TORCH_CHECK_NOT_IMPLEMENTED(false, bridge_->op(),
                                ": compiled autograd does not run opforge's autograd node (a backward written in "
                                "Python). torch.compile the forward instead, where AOTAutograd compiles the "
                                "backward, or run this backward outside compiled autograd.");
  }
  void release_variables() override {
    saved_.clear();
    has_freed_buffers_ = true;
  }

  // The inputs of one call, which the node's next edges lead from: the
  // defined tensors of every tensor leaf, which `leaf(s, add)` hands over one
  // by one (null for None).
  template <class LeafValue>
  variable_list CollectInputs(LeafValue leaf);

  // The ctx object, made on first use. Borrowed.
  PyObject* Ctx();
  // ctx.needs_input_grad: a new reference.
  PyObject* NeedsInputGrad();

  // After the forward: wraps the flat tensor outputs (one entry per flat
  // tensor, None for a non-tensor return), saves what setup_context saved.
  // Needs the GIL when ctx_ exists.
  OptionalVariables Finish(const variable_list& inputs, const OptionalVariables& raw);

  // Per flat return, in the forward: how many outputs it gave (a list's length, else 1).
  void AddReturnCount(int32_t count) { return_counts_.push_back(count); }
  int32_t return_count(size_t r) const { return return_counts_[r]; }

  void set_materialize_grads(bool value) { materialize_grads_ = value; }
  bool has_freed_buffers() const { return has_freed_buffers_; }
  const std::vector<torch::autograd::SavedVariable>& saved() const { return saved_; }

 private:
  variable_list ToEdges(PyObject* const* per_leaf);

  std::shared_ptr<GradBridge> bridge_;
  PyObject* ctx_ = nullptr;
  c10::SmallVector<int32_t, 4> return_counts_;
  bool materialize_grads_ = true;
  std::vector<torch::autograd::SavedVariable> saved_;
  std::vector<torch::autograd::VariableInfo> output_info_;
  c10::SmallVector<int32_t, 8> counts_;  // per tensor leaf: its entries (list length, 1 otherwise)
  c10::SmallVector<bool, 8> is_var_;     // per entry: a defined tensor, which has an edge
  std::vector<bool> needs_param_;         // per original parameter
  bool has_freed_buffers_ = false;
};

OpNode::~OpNode() {
  if (ctx_ == nullptr || !Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  reinterpret_cast<CtxObject*>(ctx_)->node = nullptr;
  Py_CLEAR(ctx_);
}

template <class LeafValue>
variable_list OpNode::CollectInputs(LeafValue leaf) {
  const auto& leaves = bridge_->leaves();
  variable_list inputs;
  inputs.reserve(leaves.size());
  counts_.resize(leaves.size());
  needs_param_.assign(bridge_->num_params(), false);
  for (size_t s = 0; s < leaves.size(); ++s) {
    int32_t count = 0;
    leaf(s, [&](const at::Tensor* t) {
      ++count;
      const bool defined = t != nullptr && t->defined();
      is_var_.push_back(defined);
      if (!defined) return;
      inputs.push_back(*t);
      if (t->requires_grad()) needs_param_[leaves[s].param] = true;
    });
    counts_[s] = count;
  }
  set_next_edges(torch::autograd::collect_next_edges(inputs));
  return inputs;
}

PyObject* OpNode::Ctx() {
  if (ctx_ == nullptr) {
    PyObject* obj = CtxType.tp_alloc(&CtxType, 0);
    if (obj == nullptr) ThrowPython();
    reinterpret_cast<CtxObject*>(obj)->node = this;
    ctx_ = obj;
  }
  return ctx_;
}

PyObject* OpNode::NeedsInputGrad() {
  return NewTuple(static_cast<Py_ssize_t>(needs_param_.size()),
                  [&](Py_ssize_t p) { return Py_NewRef(needs_param_[p] ? Py_True : Py_False); });
}

// ctx tuples as TensorImpl sets; `what` names the ctx method for errors.
ImplSet TensorSet(PyObject* tuple, const char* what, bool bump) {
  ImplSet out;
  if (tuple == nullptr) return out;
  const Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* obj = PyTuple_GET_ITEM(tuple, i);
    // A RuntimeError, as autograd.Function raises.
    TORCH_CHECK(THPVariable_Check(obj), what, " only accepts tensors, but argument ", i, " is of type ", TypeName(obj));
    const at::Tensor& t = THPVariable_Unpack(obj);
    out.insert(t.unsafeGetTensorImpl());
    if (bump) torch::autograd::impl::bump_version(t);
  }
  return out;
}

OptionalVariables OpNode::Finish(const variable_list& inputs, const OptionalVariables& raw) {
  std::vector<at::Tensor> to_save;  // undefined for None
  ImplSet non_differentiable, dirty;
  auto* ctx = reinterpret_cast<CtxObject*>(ctx_);
  if (ctx != nullptr) {
    if (ctx->to_save != nullptr) {
      const Py_ssize_t n = PyTuple_GET_SIZE(ctx->to_save);
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* obj = PyTuple_GET_ITEM(ctx->to_save, i);
        TORCH_CHECK_TYPE(obj == Py_None || THPVariable_Check(obj),
                         "save_for_backward can only save tensors, but argument ", i, " is of type ", TypeName(obj));
        to_save.push_back(obj == Py_None ? at::Tensor() : THPVariable_Unpack(obj));
      }
      Py_CLEAR(ctx->to_save);
    }
    non_differentiable = TensorSet(ctx->non_differentiable, "mark_non_differentiable", false);
    Py_CLEAR(ctx->non_differentiable);
    dirty = TensorSet(ctx->dirty, "mark_dirty", true);
    Py_CLEAR(ctx->dirty);
  }
  NodePtr self = SelfPtr(this);
  NodePtr attached;
  OptionalVariables wrapped = WrapOutputs(inputs, non_differentiable, dirty, raw, self, attached);
  output_info_.reserve(wrapped.size());
  ImplSet outputs;
  for (const auto& out : wrapped) {
    output_info_.push_back(out.has_value() ? torch::autograd::VariableInfo(*out) : torch::autograd::VariableInfo());
    if (out.has_value()) outputs.insert(out->unsafeGetTensorImpl());
  }
  saved_.reserve(to_save.size());
  // An undefined tensor saves as a default SavedVariable does: unpacked, undefined.
  for (const auto& t : to_save) saved_.emplace_back(t, outputs.count(t.unsafeGetTensorImpl()) > 0);
  if (attached) FireCreationHooks(0, attached);
  return wrapped;
}

variable_list OpNode::apply(variable_list&& grads) {
  py::gil_scoped_acquire gil;
  at::OptionalDeviceGuard device_guard;
  const GradBridge& b = *bridge_;
  Owned owned;
  // One Python gradient per flat return, zeros for undefined ones.
  const auto& kinds = b.returns();
  c10::SmallVector<PyObject*, 8> flat;
  size_t entry = 0;
  auto grad_of = [&](size_t e) -> PyObject* {
    const Variable& g = grads[e];
    if (g.defined()) return THPVariable_Wrap(g);
    if (materialize_grads_ && e < output_info_.size() && !output_info_[e].is_empty) {
      return THPVariable_Wrap(output_info_[e].zeros(device_guard));
    }
    return Py_NewRef(Py_None);
  };
  for (size_t r = 0; r < kinds.size(); ++r) {
    // A non-tensor return's output has no metadata (an empty VariableInfo) and gets no gradient: None.
    PyObject* value = owned.Add(kinds[r] == GradBridge::ReturnKind::kTensorList
                                    ? NewList(return_counts_[r], [&](Py_ssize_t) { return grad_of(entry++); })
                                    : grad_of(entry++));
    if (value == nullptr) ThrowPython();
    flat.push_back(value);
  }
  grads.clear();
  // The gradients in the form of the original returns.
  c10::SmallVector<PyObject*, 8> args{Ctx()};
  if (b.leaf_returns()) {
    args.append(flat.begin(), flat.end());
  } else {
    PyObject* original = owned.Add(b.boundary().RebuildOutput(flat.data()));
    if (original == nullptr) ThrowPython();
    if (b.boundary().returns().size() == 1) {
      args.push_back(original);
    } else {
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(original); ++i) args.push_back(PyTuple_GET_ITEM(original, i));
    }
  }
  PyObject* backward = owned.Add(b.Backward());
  if (backward == nullptr) ThrowPython();
  PyObject* result = owned.Add(PyObject_Vectorcall(backward, args.data(), args.size(), nullptr));
  if (result == nullptr) ThrowPython();
  if (!PyTuple_Check(result)) {
    result = owned.Add(PyTuple_Pack(1, result));
    if (result == nullptr) ThrowPython();
  }
  // One gradient (or list of them) per tensor leaf.
  const auto& leaves = b.leaves();
  c10::SmallVector<PyObject*, 8> per_leaf(leaves.size(), Py_None);
  const size_t nparams = b.num_params();
  bool simple = static_cast<size_t>(PyTuple_GET_SIZE(result)) == nparams;
  for (size_t p = 0; simple && p < nparams; ++p) {
    PyObject* g = PyTuple_GET_ITEM(result, static_cast<Py_ssize_t>(p));
    const int slot = b.param_slots()[p];
    if (slot >= 0) {
      per_leaf[static_cast<size_t>(slot)] = g;
    } else {
      // Anything but None for another parameter takes the general path,
      // which builds the gradients of a struct or raises the error naming the field.
      simple = g == Py_None;
    }
  }
  if (!simple) {
    PyObject* flatten = owned.Add(b.FlattenGrads());
    PyObject* per_flat = owned.Add(PyObject_CallOneArg(flatten, result));
    if (per_flat == nullptr) ThrowPython();
    PyObject* seq = owned.Add(PySequence_Fast(per_flat, "flatten_grads returns a sequence"));
    if (seq == nullptr) ThrowPython();
    for (size_t s = 0; s < leaves.size(); ++s) {
      per_leaf[s] = PySequence_Fast_GET_ITEM(seq, static_cast<Py_ssize_t>(leaves[s].flat_index));
    }
  }
  return ToEdges(per_leaf.data());
}

variable_list OpNode::ToEdges(PyObject* const* per_leaf) {
  const GradBridge& b = *bridge_;
  const auto& leaves = b.leaves();
  variable_list out;
  out.reserve(num_outputs());
  size_t entry = 0;
  auto bad_type = [&](size_t s, PyObject* g) {
    PyErr_Format(ErrorClass("GradientTypeError"),
                 "%s: backward returned a %s for %s, which is not a Tensor; return a Tensor or None.", b.op().c_str(),
                 TypeName(g).c_str(), leaves[s].where.c_str());
    ThrowPython();
  };
  auto push = [&](size_t s, PyObject* g) {
    const bool var = is_var_[entry++];
    if (g == Py_None) {
      if (var) out.emplace_back();
      return;
    }
    if (!THPVariable_Check(g)) bad_type(s, g);
    if (!var) {
      PyErr_Format(PyExc_RuntimeError,
                   "%s: backward returned a gradient for %s, which was None in the forward; return None there.",
                   b.op().c_str(), leaves[s].where.c_str());
      ThrowPython();
    }
    out.push_back(THPVariable_Unpack(g));
  };
  for (size_t s = 0; s < leaves.size(); ++s) {
    PyObject* g = per_leaf[s];
    const int32_t count = counts_[s];
    if (!leaves[s].is_list) {
      push(s, g);
      continue;
    }
    if (g == Py_None) {
      for (int32_t i = 0; i < count; ++i) push(s, Py_None);
      continue;
    }
    if (!PyList_Check(g) && !PyTuple_Check(g)) bad_type(s, g);
    const Py_ssize_t got = PySequence_Fast_GET_SIZE(g);
    if (got != count) {
      PyErr_Format(ErrorClass("GradientCountError"),
                   "%s: backward returned %zd gradients for %s, a list of %d tensors; return one per tensor "
                   "(None where there is none).",
                   b.op().c_str(), got, leaves[s].where.c_str(), static_cast<int>(count));
      ThrowPython();
    }
    for (Py_ssize_t i = 0; i < got; ++i) push(s, PySequence_Fast_ITEMS(g)[i]);
  }
  return out;
}

// --- ctx's methods ---------------------------------------------------------------

PyObject* CtxNew(PyTypeObject* type, PyObject*, PyObject*) {
  PyErr_Format(PyExc_TypeError, "cannot create '%s' instances; opforge makes one per call", type->tp_name);
  return nullptr;
}

// The references a ctx holds, for the garbage collector.
constexpr PyObject* CtxObject::*kCtxRefs[] = {&CtxObject::dict, &CtxObject::to_save, &CtxObject::dirty,
                                              &CtxObject::non_differentiable, &CtxObject::needs_input_grad};

int CtxTraverse(PyObject* self, visitproc visit, void* arg) {
  for (PyObject* CtxObject::*field : kCtxRefs) Py_VISIT(reinterpret_cast<CtxObject*>(self)->*field);
  return 0;
}

int CtxClear(PyObject* self) {
  for (PyObject* CtxObject::*field : kCtxRefs) Py_CLEAR(reinterpret_cast<CtxObject*>(self)->*field);
  return 0;
}

void CtxDealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  auto* ctx = reinterpret_cast<CtxObject*>(self);
  if (ctx->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
  CtxClear(self);
  Py_TYPE(self)->tp_free(self);
}

// save_for_backward, mark_dirty, mark_non_differentiable: each keeps its
// tensors until the forward ends.
template <PyObject* CtxObject::*kField>
PyObject* CtxKeep(PyObject* self, PyObject* args) {
  Py_XSETREF(reinterpret_cast<CtxObject*>(self)->*kField, Py_NewRef(args));
  Py_RETURN_NONE;
}

PyObject* CtxSetMaterializeGrads(PyObject* self, PyObject* value) {
  auto* ctx = reinterpret_cast<CtxObject*>(self);
  if (!PyBool_Check(value)) {
    PyErr_Format(PyExc_TypeError, "set_materialize_grads takes a bool, got %s", Py_TYPE(value)->tp_name);
    return nullptr;
  }
  if (ctx->node != nullptr) ctx->node->set_materialize_grads(value == Py_True);
  Py_RETURN_NONE;
}

PyObject* CtxSavedTensors(PyObject* self, void*) {
  auto* ctx = reinterpret_cast<CtxObject*>(self);
  try {
    OpNode* node = ctx->node;
    TORCH_CHECK(node != nullptr && !node->has_freed_buffers(), torch::autograd::ERR_BACKWARD_TWICE);
    const auto& saved = node->saved();
    NodePtr self_ptr = SelfPtr(node);
    return NewTuple(static_cast<Py_ssize_t>(saved.size()), [&](Py_ssize_t i) {
      Variable v = saved[i].unpack(self_ptr);
      return v.defined() ? THPVariable_Wrap(std::move(v)) : Py_NewRef(Py_None);
    });
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
    return nullptr;
  }
}

PyObject* CtxGetNeedsInputGrad(PyObject* self, void*) {
  auto* ctx = reinterpret_cast<CtxObject*>(self);
  if (ctx->needs_input_grad == nullptr) {
    if (ctx->node == nullptr) Py_RETURN_NONE;
    ctx->needs_input_grad = ctx->node->NeedsInputGrad();
    if (ctx->needs_input_grad == nullptr) return nullptr;
  }
  return Py_NewRef(ctx->needs_input_grad);
}

int CtxSetNeedsInputGrad(PyObject* self, PyObject* value, void*) {
  Py_XSETREF(reinterpret_cast<CtxObject*>(self)->needs_input_grad, Py_XNewRef(value));
  return 0;
}

PyMethodDef kCtxMethods[] = {
    {"save_for_backward", CtxKeep<&CtxObject::to_save>, METH_VARARGS,
     "save_for_backward(*tensors): tensors for backward, read there as ctx.saved_tensors."},
    {"mark_dirty", CtxKeep<&CtxObject::dirty>, METH_VARARGS,
     "mark_dirty(*tensors): inputs the forward modified in place."},
    {"mark_non_differentiable", CtxKeep<&CtxObject::non_differentiable>, METH_VARARGS,
     "mark_non_differentiable(*tensors): outputs that get no gradient."},
    {"set_materialize_grads", CtxSetMaterializeGrads, METH_O,
     "set_materialize_grads(bool): whether backward gets zeros (True, the default) or None for unused outputs."},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef kCtxGetSet[] = {
    {"saved_tensors", CtxSavedTensors, nullptr, "The tensors given to save_for_backward, version-checked.", nullptr},
    {"needs_input_grad", CtxGetNeedsInputGrad, CtxSetNeedsInputGrad,
     "One bool per original parameter: whether any of its tensors requires grad.", nullptr},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

// --- the forward --------------------------------------------------------------------

// The body's flat return values as the node's outputs (FlatReturns is the
// dispatcher's form): per flat return how many entries it gave (a Tensor[]
// its length, anything else 1), per entry the tensor autograd sees (none for
// a non-tensor return or a None item) and its Python object.
struct FlatOutputs {
  OptionalVariables raw;
  c10::SmallVector<PyObject*, 8> objects;

  FlatOutputs(OpNode& node, const GradBridge& b, PyObject* const* flat) {
    for (size_t r = 0; r < b.returns().size(); ++r) {
      const bool list = b.returns()[r] == GradBridge::ReturnKind::kTensorList && flat[r] != Py_None;
      const Py_ssize_t n = list ? PySequence_Fast_GET_SIZE(flat[r]) : 1;
      node.AddReturnCount(static_cast<int32_t>(n));
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = list ? PySequence_Fast_ITEMS(flat[r])[i] : flat[r];
        const bool tensor = (list || b.returns()[r] == GradBridge::ReturnKind::kTensor) && THPVariable_Check(item);
        raw.emplace_back(tensor ? std::optional<Variable>(THPVariable_Unpack(item)) : std::nullopt);
        objects.push_back(tensor ? item : nullptr);
      }
    }
  }
};

}  // namespace

namespace {

// CallWithGrad, with `run` calling the kernel below autograd: the op's
// output, a new reference, or null with a Python error set.
template <class Run>
PyObject* RecordCall(GradBridge& bridge, PyObject* const* args, PyObject* const* tensors, Run run) {
  try {
    Boundary& boundary = bridge.boundary();
    auto node = MakeNode<OpNode>(bridge.shared_from_this());
    variable_list inputs = node->CollectInputs([&](size_t s, auto&& add) {
      PyObject* obj = tensors[s];
      if (obj == nullptr || obj == Py_None) {
        if (!bridge.leaves()[s].is_list) add(nullptr);
      } else if (THPVariable_Check(obj)) {
        add(&THPVariable_Unpack(obj));
      } else {
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(obj); ++i) {
          PyObject* item = PySequence_Fast_ITEMS(obj)[i];
          add(item == Py_None ? nullptr : &THPVariable_Unpack(item));
        }
      }
    });
    Owned owned;
    PyObject* setup = owned.Add(bridge.SetupContext());
    PyObject* out;
    {
      // As autograd.Function runs its forward: without grad, the body below autograd.
      torch::autograd::AutoGradMode no_grad(false);
      at::AutoFwGradMode no_fw_grad(false);
      {
        BelowAutograd below(bridge.mutates());
        out = owned.Add(run());
      }
      if (out == nullptr) return nullptr;
      if (setup != nullptr) {
        PyObject* original = owned.Add(
            NewTuple(static_cast<Py_ssize_t>(boundary.num_params()), [&](Py_ssize_t i) { return Py_NewRef(args[i]); }));
        if (original == nullptr) return nullptr;
        PyObject* call_args[] = {node->Ctx(), original, out};
        PyObject* done = PyObject_Vectorcall(setup, call_args, 3, nullptr);
        if (done == nullptr) return nullptr;
        Py_DECREF(done);
      }
    }
    // The flat return values, borrowed from `out` or from `flat`'s new references.
    const size_t nrets = bridge.returns().size();
    c10::SmallVector<PyObject*, 8> flat(nrets, nullptr);
    if (boundary.leaf_returns()) {
      for (size_t r = 0; r < nrets; ++r) flat[r] = nrets == 1 ? out : PySequence_Fast_ITEMS(out)[r];
    } else {
      if (!boundary.FlattenOutput(out, flat.data())) return nullptr;
      for (PyObject* f : flat) owned.Add(f);
    }
    FlatOutputs outputs(*node, bridge, flat.data());
    OptionalVariables wrapped = node->Finish(inputs, outputs.raw);
    // Outputs come back as the same tensors unless autograd had to replace
    // one (an input returned as is becomes a view of it); then the output is
    // rebuilt around the replacements.
    bool changed = false;
    for (size_t e = 0; e < wrapped.size(); ++e) {
      if (!wrapped[e].has_value() || outputs.objects[e] == nullptr) continue;
      PyObject* obj = owned.Add(THPVariable_Wrap(*wrapped[e]));
      if (obj == nullptr) return nullptr;
      changed = changed || obj != outputs.objects[e];
      outputs.objects[e] = obj;
    }
    if (!changed) return Py_NewRef(out);
    size_t e = 0;
    for (size_t r = 0; r < nrets; ++r) {
      const int32_t count = node->return_count(r);
      if (bridge.returns()[r] == GradBridge::ReturnKind::kTensorList && flat[r] != Py_None) {
        PyObject** items = PySequence_Fast_ITEMS(flat[r]);
        flat[r] = owned.Add(NewList(count, [&](Py_ssize_t i) {
          PyObject* replaced = outputs.objects[e++];
          return Py_NewRef(replaced ? replaced : items[i]);
        }));
        if (flat[r] == nullptr) return nullptr;
      } else {
        if (outputs.objects[e]) flat[r] = outputs.objects[e];
        ++e;
      }
    }
    return boundary.RebuildOutput(flat.data());
  } catch (python_error& e) {
    e.restore();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (...) {
    torch::translate_exception_to_python(std::current_exception());
  }
  return nullptr;
}

}  // namespace

PyObject* CallWithGrad(GradBridge& bridge, PyObject* kernel, PyObject* const* args, PyObject* const* tensors) {
  Boundary& boundary = bridge.boundary();
  return RecordCall(bridge, args, tensors, [&]() -> PyObject* {
    PyObject* result = PyObject_Vectorcall(kernel, args, boundary.num_positional(), boundary.body_kwnames());
    if (result == nullptr) return boundary.KernelFailed(args);
    PyObject* out = boundary.CheckReturn(result, {tensors, boundary.num_tensor_slots(), {}});
    Py_DECREF(result);
    return out;
  });
}

PyObject* CallWithGrad(GradBridge& bridge, const PyFfiKernel* kernel, PyObject* const* args, PyObject* const* tensors) {
  return RecordCall(bridge, args, tensors, [&] { return CallFfi(*kernel, bridge.boundary(), args); });
}

namespace {

// Calls `add` with each entry of a tensor leaf's value (null for None): one
// for a Tensor or Tensor? leaf, one per item of a list, none for a None list.
template <class Add>
void ForEachTensorIn(const c10::IValue& v, bool is_list, Add&& add) {
  if (!is_list) {
    add(v.isTensor() ? &v.toTensor() : nullptr);
  } else if (!v.isNone()) {
    for (const c10::IValue& item : v.toListRef()) add(item.isTensor() ? &item.toTensor() : nullptr);
  }
}

// The Autograd kernel of an op with a Python backward: without a gradient
// it redispatches below autograd, as torch's own fallback does; with one it
// records an OpNode around the redispatch.
class AutogradKernel : public c10::OperatorKernel {
 public:
  explicit AutogradKernel(std::shared_ptr<GradBridge> bridge) : bridge_(std::move(bridge)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const GradBridge& b = *bridge_;
    const size_t nargs = op.schema().arguments().size();
    const size_t base = stack->size() - nargs;
    bool needs_grad = false;
    if (c10::GradMode::is_enabled()) {
      for (const auto& leaf : b.leaves()) {
        ForEachTensorIn((*stack)[base + leaf.flat_index], leaf.is_list, [&](const at::Tensor* t) {
          if (t != nullptr && t->defined() && t->requires_grad()) needs_grad = true;
        });
      }
    }
    if (!needs_grad) {
      RedispatchBelowAutograd(op, ks, stack, b.mutates());
      return;
    }
    Record(op, ks, stack, base);
  }

 private:
  void Record(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack, size_t base) {
    GradBridge& b = *bridge_;
    auto node = MakeNode<OpNode>(bridge_);
    variable_list inputs = node->CollectInputs([&](size_t s, auto&& add) {
      const auto& leaf = b.leaves()[s];
      ForEachTensorIn((*stack)[base + leaf.flat_index], leaf.is_list, add);
    });
    // The dispatcher runs this kernel without the GIL: the reference is
    // dropped under it, however the call ends.
    struct SetupRef {
      PyObject* fn = nullptr;
      ~SetupRef() {
        if (fn == nullptr) return;
        py::gil_scoped_acquire gil;
        Py_DECREF(fn);
      }
    } setup;
    {
      py::gil_scoped_acquire gil;
      setup.fn = b.SetupContext();
    }
    std::vector<c10::IValue> args;
    if (setup.fn != nullptr) args.assign(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
    {
      torch::autograd::AutoGradMode no_grad(false);
      at::AutoFwGradMode no_fw_grad(false);
      RedispatchBelowAutograd(op, ks, stack, b.mutates());
    }
    const size_t nrets = b.returns().size();
    c10::IValue* returns = stack->data() + (stack->size() - nrets);
    FlatReturns flat;
    OptionalVariables raw;
    auto is_list = [&](size_t r) { return b.returns()[r] == GradBridge::ReturnKind::kTensorList; };
    for (at::Tensor& t : flat.Expand(returns, nrets, is_list)) {
      raw.emplace_back(t.defined() ? std::optional<Variable>(std::move(t)) : std::nullopt);
    }
    for (size_t r = 0; r < nrets; ++r) node->AddReturnCount(flat.count(r));
    OptionalVariables wrapped;
    if (setup.fn != nullptr) {
      py::gil_scoped_acquire gil;
      RunSetupContext(*node, setup.fn, args, returns);
      wrapped = node->Finish(inputs, raw);
    } else {
      wrapped = node->Finish(inputs, raw);
    }
    std::vector<at::Tensor> outputs;
    for (auto& t : wrapped) outputs.push_back(t.has_value() ? std::move(*t) : at::Tensor());
    flat.Collapse(returns, std::move(outputs));
  }

  // setup_context(ctx, original inputs, original output), inputs and output
  // rebuilt from the flat values as the body receives them.
  void RunSetupContext(OpNode& node, PyObject* setup, const std::vector<c10::IValue>& args,
                       const c10::IValue* returns) {
    const GradBridge& b = *bridge_;
    Boundary& boundary = b.boundary();
    Owned owned;
    PyObject* inputs = owned.Add(boundary.RebuildArgs(args));
    if (inputs == nullptr) ThrowPython();
    const size_t nrets = b.returns().size();
    c10::SmallVector<PyObject*, 8> flat(nrets, nullptr);
    for (size_t r = 0; r < nrets; ++r) {
      flat[r] = owned.Add(boundary.PresentReturn(r, returns[r]));
      if (flat[r] == nullptr) ThrowPython();
    }
    PyObject* output = owned.Add(nrets == 0 ? Py_NewRef(Py_None) : boundary.RebuildOutput(flat.data()));
    if (output == nullptr) ThrowPython();
    torch::autograd::AutoGradMode no_grad(false);
    PyObject* call_args[] = {node.Ctx(), inputs, output};
    PyObject* done = PyObject_Vectorcall(setup, call_args, 3, nullptr);
    if (done == nullptr) ThrowPython();
    Py_DECREF(done);
  }

  std::shared_ptr<GradBridge> bridge_;
};

}  // namespace

GradBridge* AsGradBridge(PyObject* obj) {
  if (obj == nullptr || obj == Py_None) return nullptr;
  return py::cast<GradBridge*>(py::handle(obj));
}

void InitAutograd(py::module_& m) {
  CtxType.tp_name = "opforge._C.AutogradContext";
  CtxType.tp_basicsize = sizeof(CtxObject);
  CtxType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  CtxType.tp_doc = "ctx of an opforge op's setup_context and backward.";
  CtxType.tp_new = CtxNew;
  CtxType.tp_dealloc = CtxDealloc;
  CtxType.tp_traverse = CtxTraverse;
  CtxType.tp_clear = CtxClear;
  CtxType.tp_methods = kCtxMethods;
  CtxType.tp_getset = kCtxGetSet;
  CtxType.tp_dictoffset = offsetof(CtxObject, dict);
  CtxType.tp_weaklistoffset = offsetof(CtxObject, weakrefs);
  if (PyType_Ready(&CtxType) < 0) throw py::error_already_set();
  Py_INCREF(&CtxType);
  m.add_object("AutogradContext", py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&CtxType)));
  py::class_<GradBridge, std::shared_ptr<GradBridge>>(m, "AutogradBridge")
      .def(py::init([](py::handle opdef) { return std::make_shared<GradBridge>(opdef); }), py::arg("opdef"),
           "The autograd bridge of an op: reads opdef.name, .boundary, ._state (backward, setup_context) "
           "and ._code.")
      .def("register",
           [](const std::shared_ptr<GradBridge>& b) {
             return RegisterBoxed(b->op(), detail::AutogradRuntimeKeys(), [&] {
               return torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutogradKernel>(b));
             });
           },
           "Registers the op's Autograd kernel (every runtime autograd key); it stays while the result lives.");
}

}  // namespace opforge
