// Walking the tensors of a boxed call's arguments and returns, for the torch
// layer's kernels.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include <iterator>
#include <optional>
#include <vector>

namespace opforge {

// Calls `f` for the tensor of a Tensor argument, and for each item of a
// Tensor[] or Tensor?[] argument (an undefined tensor for a None item).
template <class F>
void ForEachTensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& item : v.toListRef()) f(item.isTensor() ? item.toTensor() : at::Tensor());
  }
}

// A call's returns as autograd's flat outputs and back: a tensor list return
// (Tensor[], Tensor?[]) gives one entry per item, any other return one entry,
// its tensor or an undefined one (a non-tensor return, a None item).
class FlatReturns {
 public:
  // `is_list(r)`: whether return r is a tensor list.
  template <class IsList>
  std::vector<at::Tensor> Expand(const c10::IValue* returns, size_t n, IsList&& is_list) {
    std::vector<at::Tensor> out;
    auto tensor = [](const c10::IValue& v) { return v.isTensor() ? v.toTensor() : at::Tensor(); };
    for (size_t r = 0; r < n; ++r) {
      const bool list = is_list(r) && returns[r].isList();
      sizes_.push_back(list ? static_cast<int64_t>(returns[r].toListRef().size()) : -1);
      if (!list) {
        out.push_back(tensor(returns[r]));
        continue;
      }
      for (const c10::IValue& item : returns[r].toListRef()) out.push_back(tensor(item));
    }
    return out;
  }
  // How many entries return r gave.
  int32_t count(size_t r) const { return sizes_[r] < 0 ? 1 : static_cast<int32_t>(sizes_[r]); }
  // The outputs in place of the returns they came from (a list keeps its kind).
  void Collapse(c10::IValue* returns, std::vector<at::Tensor>&& outputs) const {
    auto next = std::make_move_iterator(outputs.begin());
    for (size_t r = 0; r < sizes_.size(); ++r) {
      if (sizes_[r] < 0) {
        at::Tensor t = *next++;
        if (t.defined()) returns[r] = std::move(t);
      } else if (returns[r].isTensorList()) {
        returns[r] = std::vector<at::Tensor>(next, next + sizes_[r]);
        next += sizes_[r];
      } else {
        c10::List<std::optional<at::Tensor>> list;
        for (int64_t i = 0; i < sizes_[r]; ++i) {
          at::Tensor t = *next++;
          list.push_back(t.defined() ? std::optional<at::Tensor>(std::move(t)) : std::nullopt);
        }
        returns[r] = std::move(list);
      }
    }
  }

 private:
  c10::SmallVector<int64_t, 4> sizes_;  // per return: its list's length, or -1
};

}  // namespace opforge
