// The kernel an op registers with the dispatcher (see RegisterKernel in
// boundary.h): a boxed C++ kernel that takes the flat leaves off the stack,
// rebuilds the original arguments from the boundary's parameter trees (an
// all-scalar struct from a cache keyed on the leaf values, so no Python
// objects are made for its leaves), calls the body, and pushes its checked
// output back flattened. No Python is generated per op for this path, and
// it skips what torch does around a Python kernel (an args tuple and kwargs
// dict, built twice, and the output parsed back).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "python/boundary.h"
#include "torch/registration.h"

namespace py = pybind11;

namespace opforge {
namespace {

// Leaf values as a cache key compares them: the same kind and value, a
// float by its bits (so 0.0 and -0.0 differ). False for kinds no key holds.
bool SameLeaf(const c10::IValue& a, const c10::IValue& b) {
  if (a.isDouble()) {
    if (!b.isDouble()) return false;
    const double x = a.toDouble(), y = b.toDouble();
    return std::memcmp(&x, &y, sizeof(double)) == 0;
  }
  if (a.isInt()) return b.isInt() && a.toInt() == b.toInt();
  if (a.isBool()) return b.isBool() && a.toBool() == b.toBool();
  if (a.isNone()) return b.isNone();
  if (a.isString()) return b.isString() && a.toStringRef() == b.toStringRef();
  if (a.isDevice()) return b.isDevice() && a.toDevice() == b.toDevice();
  return false;
}

// A hash of a leaf a key may hold, or false for other kinds.
bool HashLeaf(const c10::IValue& v, size_t& hash) {
  size_t h;
  if (v.isDouble()) {
    const double d = v.toDouble();
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof(bits));
    h = std::hash<uint64_t>()(bits);
  } else if (v.isInt()) {
    h = std::hash<int64_t>()(v.toInt());
  } else if (v.isBool()) {
    h = v.toBool() ? 0x9e3779b9 : 0x7f4a7c15;
  } else if (v.isNone()) {
    h = 0x5bd1e995;
  } else if (v.isString()) {
    h = std::hash<std::string>()(v.toStringRef());
  } else if (v.isDevice()) {
    h = std::hash<c10::Device>()(v.toDevice());
  } else {
    return false;
  }
  hash = hash * 1000003 ^ h;
  return true;
}

// Instances of an all-scalar frozen struct by the leaf values they were
// built from: a model calls an op with few distinct configs, and a loop
// often with the same one again.
class RebuildCache {
 public:
  using Key = c10::SmallVector<const c10::IValue*, 16>;  // the leaves a struct was built from

  ~RebuildCache() {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    Clear();
  }

  PyObject* FindLast(const Key& key) const { return last_ != nullptr && Same(*last_, key) ? last_->value : nullptr; }

  PyObject* Find(size_t hash, const Key& key) {
    auto it = entries_.find(hash);
    if (it == entries_.end() || !Same(it->second, key)) return nullptr;
    last_ = &it->second;
    return it->second.value;
  }

  void Store(size_t hash, const Key& key, PyObject* value) {
    if (entries_.size() >= 256) Clear();
    Entry& e = entries_[hash];
    e.key.clear();
    for (const c10::IValue* v : key) e.key.push_back(*v);
    Py_XSETREF(e.value, Py_NewRef(value));
    last_ = &e;
  }

 private:
  struct Entry {
    std::vector<c10::IValue> key;
    PyObject* value = nullptr;
  };

  static bool Same(const Entry& e, const Key& key) {
    return std::equal(e.key.begin(), e.key.end(), key.begin(), key.end(),
                      [](const c10::IValue& a, const c10::IValue* b) { return SameLeaf(a, *b); });
  }

  void Clear() {
    for (auto& entry : entries_) Py_XDECREF(entry.second.value);
    entries_.clear();
    last_ = nullptr;
  }

  std::unordered_map<size_t, Entry> entries_;  // node-based: `last_` stays valid until Clear
  const Entry* last_ = nullptr;
};

void LeafIndices(const Node& node, std::vector<int>& out) {
  if (node.kind != Node::Kind::kStruct) {
    out.push_back(node.leaf_index);
    return;
  }
  if (node.optional) out.push_back(node.presence_index);
  for (const Node& child : node.children) LeafIndices(child, out);
}

// One op's kernel for one dispatch key. `fn` may be replaced (register_kernel again).
class OpKernel : public c10::OperatorKernel {
 public:
  OpKernel(std::shared_ptr<Boundary> boundary, PyObject* fn);
  ~OpKernel() override;

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);
  void SetFn(PyObject* fn) { Py_XSETREF(fn_, Py_NewRef(fn)); }

 private:
  PyObject* Call(c10::ArrayRef<c10::IValue> args);
  void Push(PyObject* checked, torch::jit::Stack* stack);

  std::shared_ptr<Boundary> boundary_;
  PyObject* fn_;
  std::vector<std::unique_ptr<RebuildCache>> caches_;  // per parameter: an all-scalar struct's cache
  std::vector<std::vector<int>> cache_keys_;          // per parameter: the leaves its cache keys on
  std::vector<c10::TypePtr> return_types_;
};

OpKernel::OpKernel(std::shared_ptr<Boundary> boundary, PyObject* fn)
    : boundary_(std::move(boundary)), fn_(Py_NewRef(fn)) {
  for (const Node& param : boundary_->params()) {
    const bool cached = param.kind == Node::Kind::kStruct && param.cacheable;
    caches_.push_back(cached ? std::make_unique<RebuildCache>() : nullptr);
    cache_keys_.emplace_back();
    if (cached) LeafIndices(param, cache_keys_.back());
  }
  for (const auto& ret : boundary_->flat().returns()) return_types_.push_back(ret.real_type());
}

OpKernel::~OpKernel() {
  if (!Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  caches_.clear();
  Py_CLEAR(fn_);
  boundary_.reset();
}

// The body's checked output for these leaves: a new reference, or null with an error set.
PyObject* OpKernel::Call(c10::ArrayRef<c10::IValue> args) {
  const auto& params = boundary_->params();
  const size_t np = params.size();
  Owned owned;  // Python leaves and rebuilt values
  c10::SmallVector<PyObject*, 16> originals(np, nullptr);
  RebuildCache::Key key;
  for (size_t p = 0; p < np; ++p) {
    const Node& param = params[p];
    RebuildCache* cache = caches_[p].get();  // null but for an all-scalar struct
    PyObject* value = nullptr;
    size_t hash = 0x345678;
    if (cache != nullptr) {
      key.clear();
      for (int i : cache_keys_[p]) key.push_back(&args[static_cast<size_t>(i)]);
      value = cache->FindLast(key);
      for (size_t i = 0; value == nullptr && cache != nullptr && i < key.size(); ++i) {
        if (!HashLeaf(*key[i], hash)) cache = nullptr;
      }
      if (value == nullptr && cache != nullptr) value = cache->Find(hash, key);
    }
    if (value == nullptr) {
      value = boundary_->Rebuild(param, args, owned);
      if (value == nullptr) return nullptr;
      owned.Add(value);
      if (cache != nullptr) cache->Store(hash, key, value);
    }
    originals[p] = value;
  }
  PyObject* result = PyObject_Vectorcall(fn_, originals.data(), boundary_->num_positional(), boundary_->body_kwnames());
  if (result == nullptr) return boundary_->KernelFailed(originals.data());
  PyObject* checked = boundary_->CheckReturn(result, {nullptr, 0, args});
  Py_DECREF(result);
  return checked;
}

// Pushes the checked output as the flat returns.
void OpKernel::Push(PyObject* checked, torch::jit::Stack* stack) {
  const size_t nflat = return_types_.size();
  Owned flat;
  PyObject* const* values = &checked;
  if (!boundary_->leaf_returns()) {
    flat.items.assign(nflat, nullptr);
    if (!boundary_->FlattenOutput(checked, flat.items.data())) throw python_error();
    values = flat.items.data();
  } else if (nflat > 1) {
    values = PySequence_Fast_ITEMS(checked);
  }
  for (size_t i = 0; i < nflat; ++i) {
    PyObject* v = values[i];
    stack->push_back(THPVariable_Check(v) ? c10::IValue(THPVariable_Unpack(v))
                                          : torch::jit::toIValue(v, return_types_[i]));
  }
}

void OpKernel::operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const size_t nargs = op.schema().arguments().size();
  py::gil_scoped_acquire gil;
  Owned hold;
  PyObject* checked = hold.Add(Call(torch::jit::last(stack, nargs)));
  if (checked == nullptr) throw python_error();
  torch::jit::drop(stack, nargs);
  Push(checked, stack);
}

// Keeps an op's kernel registered for one dispatch key while it lives.
struct KernelHandle {
  std::unique_ptr<KernelRegistration> registration;
  OpKernel* kernel;  // owned by the dispatcher while `registration` lives
};

}  // namespace

void InitKernels(py::module_& m) {
  py::class_<KernelHandle>(m, "OpKernel", "An op's kernel for one dispatch key, registered while this object lives.")
      .def("set_fn", [](KernelHandle& h, py::handle fn) { h.kernel->SetFn(fn.ptr()); }, py::arg("fn"),
           "Replaces the function the kernel calls.");
  m.def(
      "register_kernel",
      [](std::shared_ptr<Boundary> boundary, py::handle fn, const std::string& key) {
        OpKernel* raw = nullptr;
        auto registration = RegisterBoxed(boundary->op(), {c10::parseDispatchKey(key)}, [&] {
          auto kernel = std::make_unique<OpKernel>(boundary, fn.ptr());
          raw = kernel.get();
          return torch::CppFunction::makeFromBoxedFunctor(std::move(kernel));
        });
        return std::make_unique<KernelHandle>(KernelHandle{std::move(registration), raw});
      },
      py::arg("boundary"), py::arg("fn"), py::arg("dispatch_key"),
      "Registers the op's kernel for `dispatch_key`: flat leaves in, `fn` called with the original arguments.");
}

}  // namespace opforge
