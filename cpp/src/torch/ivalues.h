// Walking the tensors of a boxed argument, for the torch layer's kernels.
#pragma once

#include <ATen/core/ivalue.h>

#include <functional>

namespace opforge {

// Calls `f` for the tensor of a Tensor argument, and for each item of a
// Tensor[] or Tensor?[] argument (an undefined tensor for a None item).
inline void ForEachTensor(const c10::IValue& v, const std::function<void(const at::Tensor&)>& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& item : v.toListRef()) f(item.isTensor() ? item.toTensor() : at::Tensor());
  }
}

}  // namespace opforge
