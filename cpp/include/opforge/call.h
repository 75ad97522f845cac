// Calling an op with structs from C++, through torch's dispatcher (so that,
// inside a C++ backward, torch.compile traces the call like any other op).
// The arguments are the op's own (struct) parameters; opforge flattens them.
//
//   auto y = opforge::Call<at::Tensor>("kernels::rms_norm_fn", x, w, NormCfg{1e-5});
//   opforge::Call("kernels::rms_norm", out, x, w, cfg);                         // -> ()
//   static const opforge::OpRef bwd("kernels::rms_norm_backward");           // looked up once
//   auto [gx, gw] = bwd.call<std::tuple<at::Tensor, at::Tensor>>(grad, x, w, cfg);
//
// A struct return comes back as the struct.
#pragma once

#ifdef OPFORGE_STABLE_ABI
#error "opforge/call.h is the libtorch C++ API mode; stable-ABI libraries get opforge::Call from <opforge/opforge.h>"
#endif

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "opforge/detail/reader.h"
#include "opforge/handle.h"

namespace opforge {
namespace detail {

// Slots of a boxed call: the dispatcher's IValue stack. A read takes the
// value off a stack it may change, and copies it from a const one.
struct IValueSlots {
  template <class W, size_t I, class Stack>
  static W Get(Stack& stack) {
    if constexpr (std::is_const_v<std::remove_reference_t<decltype(stack[I])>>) {
      return Take<W>(c10::IValue(stack[I]));
    } else {
      return Take<W>(std::move(stack[I]));
    }
  }
  template <class W>
  static W Take(c10::IValue&& v) {
    if constexpr (IsOptional<W>::value) {
      if (v.isNone()) return std::nullopt;
      return Take<typename W::value_type>(std::move(v));
    } else if constexpr (std::is_same_v<W, at::Tensor>) {
      return std::move(v).toTensor();
    } else if constexpr (std::is_same_v<W, std::vector<at::Tensor>>) {
      return std::move(v).toTensorVector();
    } else if constexpr (std::is_same_v<W, HandleId>) {
      return HandleId{v.toInt(), false};
    } else {
      return v.to<W>();
    }
  }
  template <class W>
  static void Put(std::vector<c10::IValue>& stack, size_t i, const W& v) {
    if constexpr (IsOptional<W>::value) {
      if (v.has_value()) {
        Put(stack, i, *v);
      } else {
        stack[i] = c10::IValue();
      }
    } else if constexpr (std::is_same_v<W, HandleId>) {
      stack[i] = v.id;
    } else {
      stack[i] = c10::IValue(v);
    }
  }
  static void PutNone(std::vector<c10::IValue>& stack, size_t i) { stack[i] = c10::IValue(); }
};

}  // namespace detail

// One op, looked up once.
class OpRef {
 public:
  explicit OpRef(const char* qualified) : op_(Find(qualified)) {}

  template <class R = void, class... Args>
  R call(const Args&... args) const {
    std::vector<c10::IValue> stack(detail::kLeafCount<Args...>);
    detail::PutArgs<detail::IValueSlots>(stack, args...);
    TORCH_CHECK(stack.size() == op_.schema().arguments().size(), op_.schema().name(), ": opforge::Call got ",
                stack.size(), " flat arguments but the op takes ", op_.schema().arguments().size(),
                "; pass the op's parameters as its kernel takes them (structs whole).");
    // Checked before the call: reading more returns than the op has would
    // read past them (R = void discards whatever it returns).
    const size_t returns = op_.schema().returns().size();
    TORCH_CHECK(std::is_void_v<R> || returns == detail::ResultCount<R>(), op_.schema().name(),
                ": opforge::Call<R> reads ", detail::ResultCount<R>(), " returns but the op has ", returns,
                "; name the op's own return type as R (a tuple for several returns).");
    op_.callBoxed(&stack);
    return detail::ReadResults<R, detail::IValueSlots>(stack);
  }

  const c10::OperatorHandle& handle() const { return op_; }

 private:
  // "ns::op" or "ns::op.overload", as the stable mode's Call takes it.
  static c10::OperatorHandle Find(const char* qualified) {
    std::string name(qualified);
    std::string overload;
    if (auto dot = name.find('.', name.find("::")); dot != std::string::npos) {
      overload = name.substr(dot + 1);
      name = name.substr(0, dot);
    }
    auto op = c10::Dispatcher::singleton().findSchema({name, overload});
    if (!op) {
      throw std::runtime_error(name + ": opforge::Call could not call this op. No op of this name is registered "
                               "with torch's dispatcher: check it ('namespace::op' or 'namespace::op.overload') "
                               "and load the library that defines it before the call.");
    }
    return *op;
  }

  c10::OperatorHandle op_;
};

template <class R = void, class... Args>
R Call(const char* qualified, const Args&... args) {
  return OpRef(qualified).call<R>(args...);
}

}  // namespace opforge
