// `opforge::Handle<Runner>`: a kernel parameter that receives a C++ object
// through the dispatcher as an int (docs/handles.md). The same for both torch
// ABIs: the handle table is reached through opforge's C surface.
//
//   int64_t h = opforge::RegisterHandle(std::make_shared<Runner>(plan));   // pass h to the op
//   at::Tensor run(const at::Tensor& x, opforge::Handle<Runner> r) { return r->run(x); }
#pragma once

#include <cxxabi.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <typeinfo>

#include "opforge/detail/abi_access.h"
#include "opforge/detail/nodes.h"

namespace opforge {
namespace detail {

inline std::string Demangled(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string out = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  return out;
}

template <class T>
std::string CppName() {
  return Demangled(typeid(T).name());
}

// What the table holds for a C++ object: the object itself, or a weak
// reference to it.
template <class T>
struct HandleHolder {
  std::shared_ptr<T> strong;
  std::weak_ptr<T> weak;
};

}  // namespace detail

// The handle table's name of T: its C++ name, dotted ("ext.Runner").
template <class T>
std::string HandleTypeName() {
  static const std::string name = detail::DottedName(detail::CppName<T>().c_str());
  return name;
}

// Registers a C++ object for Handle<T> parameters; the table keeps it alive
// unless `weak`.
template <class T>
int64_t RegisterHandle(std::shared_ptr<T> object, bool weak = false) {
  if (!object) throw std::invalid_argument("opforge::RegisterHandle: the object is null.");
  auto* holder = new detail::HandleHolder<T>();
  if (weak) {
    holder->weak = object;
  } else {
    holder->strong = std::move(object);
  }
  char error[512] = "";
  const int64_t h = detail::Abi().handle_register(
      holder, [](void* p) { delete static_cast<detail::HandleHolder<T>*>(p); }, HandleTypeName<T>().c_str(), 0,
      error, sizeof error);
  if (h == 0) throw std::runtime_error(error);
  return h;
}

template <class T>
class Handle {
 public:
  // Throws for a stale, released or wrong-type handle.
  explicit Handle(int64_t id) : id_(id) {
    char error[512] = "";
    void* token = nullptr;
    const auto& abi = detail::Abi();
    void* raw = abi.handle_acquire(id, HandleTypeName<T>().c_str(), &token, error, sizeof error);
    if (raw == nullptr) throw std::runtime_error(error);
    std::shared_ptr<void> keep(token, abi.handle_release);
    auto* holder = static_cast<detail::HandleHolder<T>*>(raw);
    object_ = holder->strong ? holder->strong : holder->weak.lock();
    if (!object_) {
      throw std::runtime_error("opforge: handle " + std::to_string(id) + " is stale: its " +
                               HandleTypeName<T>() + " was registered weakly and no longer exists.");
    }
  }

  // What a fake kernel gets while torch.compile traces: no object, and using
  // it throws (docs/handles.md).
  static Handle Symbolic() { return Handle(); }

  T& operator*() const { return *Object(); }
  T* operator->() const { return Object(); }
  T& get() const { return *Object(); }
  int64_t id() const {
    Object();
    return id_;
  }
  // True in a fake kernel under torch.compile.
  bool is_symbolic() const { return object_ == nullptr; }

 private:
  Handle() = default;

  T* Object() const {
    if (!object_) {
      throw std::runtime_error(
          "opforge::Handle<" + HandleTypeName<T>() +
          ">: is symbolic: a fake kernel runs while torch.compile traces, without the runner. "
          "Compute the fake kernel's outputs from its other arguments.");
    }
    return object_.get();
  }

  int64_t id_ = 0;
  std::shared_ptr<T> object_;
};

namespace detail {
// A handle travels as its int; while torch.compile traces it is symbolic.
template <class T>
struct LeafTraits<Handle<T>> {
  using Wide = HandleId;
  static std::string Schema() { return "Handle(" + HandleTypeName<T>() + ")"; }
  static Handle<T> FromWide(const HandleId& h) { return h.symbolic ? Handle<T>::Symbolic() : Handle<T>(h.id); }
  static HandleId ToWide(const Handle<T>& h) { return HandleId{h.id(), false}; }
};
}  // namespace detail
}  // namespace opforge
