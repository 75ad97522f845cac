// Walking the tensors of a boxed call's arguments and returns, for the torch
// layer's kernels.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <functional>
#include <vector>

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

// A call's Tensor and Tensor[] returns as autograd's flat outputs, one per
// tensor, and the outputs autograd gives back put in their place.
class FlatReturns {
 public:
  std::vector<at::Tensor> Expand(const c10::IValue* returns, size_t n) {
    std::vector<at::Tensor> out;
    for (size_t r = 0; r < n; ++r) {
      if (returns[r].isTensor()) {
        out.push_back(returns[r].toTensor());
        sizes_.push_back(-1);
      } else {
        std::vector<at::Tensor> list = returns[r].toTensorVector();
        sizes_.push_back(static_cast<int64_t>(list.size()));
        out.insert(out.end(), list.begin(), list.end());
      }
    }
    return out;
  }
  void Collapse(c10::IValue* returns, std::vector<at::Tensor>&& outputs) const {
    auto next = outputs.begin();
    for (size_t r = 0; r < sizes_.size(); ++r) {
      if (sizes_[r] < 0) {
        returns[r] = std::move(*next++);
      } else {
        returns[r] = std::vector<at::Tensor>(std::make_move_iterator(next), std::make_move_iterator(next + sizes_[r]));
        next += sizes_[r];
      }
    }
  }

 private:
  c10::SmallVector<int64_t, 4> sizes_;  // per return: -1 for a Tensor, else its list's length
};

}  // namespace opforge
