// Slots of a stable-ABI call: torch's StableIValue stack. A read takes what
// the slot owns (a tensor handle, a list, a string); a write gives the slot a
// new one, as torch's stable conversions do.
#pragma once

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "opforge/detail/leaves.h"

namespace opforge::detail {

using torch::stable::detail::from;
using torch::stable::detail::to;

struct StableSlots {
  template <class W, size_t I>
  static W Get(StableIValue* stack) {
    return Read<W>(stack[I]);
  }
  template <class W>
  static void Put(StableIValue* stack, size_t i, const W& v) {
    stack[i] = Write(v);
  }
  static void PutNone(StableIValue* stack, size_t i) { stack[i] = from(std::nullopt); }

  template <class W>
  static W Read(StableIValue v) {
    if constexpr (IsOptional<W>::value) {
      // None, or a pointer to the value's own slot.
      if (v == from(std::nullopt)) return std::nullopt;
      auto* slot = to<StableIValue*>(v);
      W value = Read<typename W::value_type>(*slot);
#if defined(TORCH_VERSION_2_13_0) && TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0
      TORCH_ERROR_CODE_CHECK(torch_delete_stable_ivalue(slot));
#else
      delete slot;
#endif
      return value;
    } else if constexpr (std::is_same_v<W, std::string>) {
      // Not torch's to<std::string>, which does not free the string it copies.
      auto handle = to<StringHandle>(v);
      size_t length = 0;
      const char* data = nullptr;
      TORCH_ERROR_CODE_CHECK(torch_string_length(handle, &length));
      TORCH_ERROR_CODE_CHECK(torch_string_c_str(handle, &data));
      std::string out(data, length);
      TORCH_ERROR_CODE_CHECK(torch_delete_string(handle));
      return out;
    } else if constexpr (std::is_same_v<W, HandleId>) {
      return HandleId{to<int64_t>(v), false};
    } else {
      return to<W>(v);
    }
  }

  template <class W>
  static StableIValue Write(const W& v) {
    if constexpr (IsOptional<W>::value) {
      if (!v.has_value()) return from(std::nullopt);
      return from(new StableIValue(Write(*v)));
    } else if constexpr (std::is_same_v<W, HandleId>) {
      return from(v.id);
    } else if constexpr (IsVector<W>::value) {
      // Item by item: torch's from(std::vector<T>) views the vector's data,
      // which std::vector<bool> does not have.
      StableListHandle list = nullptr;
      TORCH_ERROR_CODE_CHECK(torch_new_list_reserve_size(v.size(), &list));
      for (const auto& item : v) {
        TORCH_ERROR_CODE_CHECK(torch_list_push_back(list, Write(static_cast<typename W::value_type>(item))));
      }
      return torch::stable::detail::from(list);
    } else {
      return from(v);
    }
  }
};

}  // namespace opforge::detail
