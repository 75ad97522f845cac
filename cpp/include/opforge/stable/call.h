// Calling an op with structs through torch's dispatcher (torch_call_dispatcher),
// as in the C++ API mode (opforge/call.h):
//   auto y = opforge::Call<opforge::Tensor>("kernels::rms_norm_fn", x, w, NormCfg{1e-5});
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "opforge/detail/reader.h"
#include "opforge/stable/slots.h"

namespace opforge {

template <class R = void, class... Args>
R Call(const char* qualified, const Args&... args) {
  std::string name(qualified);
  std::string overload;
  if (auto dot = name.find('.', name.find("::")); dot != std::string::npos) {
    overload = name.substr(dot + 1);
    name = name.substr(0, dot);
  }
  std::vector<StableIValue> stack(std::max(detail::kLeafCount<Args...>, detail::ResultCount<R>()));
  StableIValue* slots = stack.data();
  detail::PutArgs<detail::StableSlots>(slots, args...);
  TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(name.c_str(), overload.c_str(), stack.data(), TORCH_ABI_VERSION));
  return detail::ReadResults<R, detail::StableSlots>(slots);
}

}  // namespace opforge
