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
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "opforge/detail/nodes.h"
#include "opforge/handle.h"

namespace opforge {
namespace detail {

template <class S, size_t... J>
void PushFields(std::vector<c10::IValue>& stack, const S& s, std::index_sequence<J...>);

template <class T>
void Push(std::vector<c10::IValue>& stack, const T& v) {
  if constexpr (kIsStruct<T>) {
    PushFields(stack, v, std::make_index_sequence<kNumFields<T>>{});
  } else if constexpr (IsOptionalStruct<T>::value) {
    using S = typename T::value_type;
    stack.emplace_back(v.has_value());
    if (v) {
      PushFields(stack, *v, std::make_index_sequence<kNumFields<S>>{});
    } else {
      for (size_t i = 0; i < StructNode<S>::kCount; ++i) stack.emplace_back();
    }
  } else if constexpr (IsOptional<T>::value) {
    if (v) {
      Push(stack, *v);
    } else {
      stack.emplace_back();
    }
  } else if constexpr (kIsEnum<T> || std::is_same_v<T, int32_t>) {
    stack.emplace_back(static_cast<int64_t>(v));
  } else if constexpr (std::is_same_v<T, float>) {
    stack.emplace_back(static_cast<double>(v));
  } else if constexpr (IsHandle<T>::value) {
    stack.emplace_back(v.id());
  } else {
    stack.emplace_back(v);
  }
}

template <class S, size_t... J>
void PushFields(std::vector<c10::IValue>& stack, const S& s, std::index_sequence<J...>) {
  (Push(stack, FieldOf<J>(s)), ...);
}

template <class T>
T Pop(c10::IValue&& v) {
  if constexpr (std::is_same_v<T, at::Tensor>) {
    return std::move(v).toTensor();
  } else if constexpr (std::is_same_v<T, std::vector<at::Tensor>>) {
    return std::move(v).toTensorVector();
  } else {
    return v.to<T>();
  }
}

template <class R, size_t... I>
R PopTuple(std::vector<c10::IValue>& stack, std::index_sequence<I...>) {
  return R(Pop<std::tuple_element_t<I, R>>(std::move(stack[I]))...);
}

template <class R>
struct IsStdTuple : std::false_type {};
template <class... T>
struct IsStdTuple<std::tuple<T...>> : std::true_type {};

template <class S, size_t... J>
S PopStruct(std::vector<c10::IValue>& stack, std::index_sequence<J...>) {
  S s{};
  ((FieldOf<J>(s) = Pop<FieldType<S, J>>(std::move(stack[J]))), ...);
  return s;
}

}  // namespace detail

// One op, looked up once.
class OpRef {
 public:
  explicit OpRef(const char* qualified) : op_(c10::Dispatcher::singleton().findSchemaOrThrow(qualified, "")) {}

  template <class R = void, class... Args>
  R call(const Args&... args) const {
    std::vector<c10::IValue> stack;
    stack.reserve(detail::kLeafCount<Args...>);
    (detail::Push(stack, args), ...);
    TORCH_CHECK(stack.size() == op_.schema().arguments().size(), op_.schema().name(), ": opforge::Call got ",
                stack.size(), " flat arguments but the op takes ", op_.schema().arguments().size(),
                "; pass the op's parameters as its kernel takes them (structs whole).");
    op_.callBoxed(&stack);
    if constexpr (std::is_void_v<R>) {
      return;
    } else if constexpr (detail::IsStdTuple<R>::value) {
      return detail::PopTuple<R>(stack, std::make_index_sequence<std::tuple_size_v<R>>{});
    } else if constexpr (kIsStruct<R>) {
      return detail::PopStruct<R>(stack, std::make_index_sequence<detail::kNumFields<R>>{});
    } else {
      return detail::Pop<R>(std::move(stack.at(0)));
    }
  }

  const c10::OperatorHandle& handle() const { return op_; }

 private:
  c10::OperatorHandle op_;
};

template <class R = void, class... Args>
R Call(const char* qualified, const Args&... args) {
  return OpRef(qualified).call<R>(args...);
}

}  // namespace opforge
