// Calling an op with structs through torch's dispatcher (torch_call_dispatcher),
// as in the C++ API mode (opforge/call.h):
//   auto y = opforge::Call<opforge::Tensor>("kernels::rms_norm_fn", x, w, NormCfg{1e-5});
#pragma once

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "opforge/detail/abi_access.h"
#include "opforge/detail/reader.h"
#include "opforge/stable/slots.h"

namespace opforge {
namespace detail {

// A failed torch_call_dispatcher as an error naming the op: the kernel's own
// message for an op opforge defined, else what to check.
[[noreturn]] inline void ThrowCallError(const std::string& name, bool defined) {
  std::string what;
#if defined(TORCH_VERSION_2_13_0) && TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0
  if (const char* text = torch_exception_get_what_without_backtrace()) what = text;
#endif
  if (defined) {
    throw std::runtime_error(what.empty() ? name + ": the op's call failed (torch printed its error above)." : what);
  }
  throw std::runtime_error(name + ": opforge::Call could not call this op" + (what.empty() ? "" : " (" + what + ")") +
                           ". No op opforge defined has this name: check it ('namespace::op' or "
                           "'namespace::op.overload') and load the library that defines it before the call.");
}

}  // namespace detail

template <class R = void, class... Args>
R Call(const char* qualified, const Args&... args) {
  std::string name(qualified);
  std::string overload;
  if (auto dot = name.find('.', name.find("::")); dot != std::string::npos) {
    overload = name.substr(dot + 1);
    name = name.substr(0, dot);
  }
  // Checked before the call, for an op opforge defined (torch's stable ABI
  // tells no schema): more returns than R reads would be written past the
  // stack, fewer read past them.
  size_t num_args = detail::kLeafCount<Args...>;
  size_t num_returns = detail::ResultCount<R>();
  const OpforgeAbiV1& abi = detail::Abi();
  const bool defined = abi.size >= offsetof(OpforgeAbiV1, op_counts) + sizeof(abi.op_counts) &&
                       abi.op_counts != nullptr && abi.op_counts(name.c_str(), &num_args, &num_returns) != 0;
  if (overload.empty() && defined) {
    if (!std::is_void_v<R> && num_returns != detail::ResultCount<R>()) {
      throw std::runtime_error(name + ": opforge::Call<R> reads " + std::to_string(detail::ResultCount<R>()) +
                               " returns but the op has " + std::to_string(num_returns) +
                               "; name the op's own return type as R (a tuple for several returns).");
    }
    if (num_args != detail::kLeafCount<Args...>) {
      throw std::runtime_error(name + ": opforge::Call passes " + std::to_string(detail::kLeafCount<Args...>) +
                               " flat arguments but the op takes " + std::to_string(num_args) +
                               "; pass the op's own parameters (structs as structs), defaults included.");
    }
  }
  std::vector<StableIValue> stack(std::max(detail::kLeafCount<Args...>, num_returns));
  StableIValue* slots = stack.data();
  detail::PutArgs<detail::StableSlots>(slots, args...);
  if (torch_call_dispatcher(name.c_str(), overload.c_str(), stack.data(), TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS) {
    detail::ThrowCallError(name, defined);
  }
  return detail::ReadResults<R, detail::StableSlots>(slots);
}

}  // namespace opforge
