// A kernel as torch's stable ABI calls it: a boxed function that reads its
// leaves off the stack (structs rebuilt on the stack, no heap allocation for
// scalar fields), calls the kernel and writes its results back.
//
// torch takes a plain function pointer per kernel, with no data, so a
// library's kernels are bound to a fixed set of trampolines (per shared
// library, hidden), each calling its kernel's Invoker.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "opforge/detail/library_api.h"
#include "opforge/detail/reader.h"
#include "opforge/stable/slots.h"

namespace opforge::detail {

// One kernel as its trampoline calls it.
struct KernelSlot;
using Invoke = void (*)(const KernelSlot&, StableIValue*, uint64_t, uint64_t);
struct KernelSlot {
  Invoke invoke;
  void* fn;
  const KernelName* name;  // kept while the library is loaded
};

template <class R, class... Args>
struct Invoker {
  static void Call(const KernelSlot& slot, StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
    constexpr size_t kArgs = kLeafCount<Args...>;
    if (num_args != kArgs || num_outputs != ResultCount<R>()) {
      throw std::runtime_error(slot.name->op + ": the registered schema has " + std::to_string(num_args) +
                               " arguments and " + std::to_string(num_outputs) + " returns, the kernel's flat "
                               "signature " + std::to_string(kArgs) + " and " + std::to_string(ResultCount<R>()) + ".");
    }
    try {
      Reader<StableSlots, StableIValue*> r{stack};
      auto args = ReadParams<Args...>(r);
      auto f = reinterpret_cast<R (*)(Args...)>(slot.fn);
      if constexpr (std::is_void_v<R>) {
        std::apply(f, args);
      } else {
        R out = std::apply(f, args);
        CheckReturned(out, *slot.name);
        WriteResults<StableSlots>(stack, std::move(out));
      }
    } catch (...) {
      Rethrow(*slot.name);
    }
  }
};

#ifndef OPFORGE_STABLE_MAX_KERNELS
#define OPFORGE_STABLE_MAX_KERNELS 512
#endif

using BoxedKernel = void (*)(StableIValue*, uint64_t, uint64_t);

#pragma GCC visibility push(hidden)
inline KernelSlot* KernelSlots() {
  static KernelSlot slots[OPFORGE_STABLE_MAX_KERNELS];
  return slots;
}
inline size_t& KernelSlotsUsed() {
  static size_t used = 0;
  return used;
}
template <size_t I>
void Trampoline(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  const KernelSlot& slot = KernelSlots()[I];
  slot.invoke(slot, stack, num_args, num_outputs);
}
template <size_t... I>
constexpr std::array<BoxedKernel, sizeof...(I)> MakeTrampolines(std::index_sequence<I...>) {
  return {&Trampoline<I>...};
}
inline BoxedKernel BindKernel(Invoke invoke, void* fn, KernelName name) {
  static constexpr auto kTrampolines = MakeTrampolines(std::make_index_sequence<OPFORGE_STABLE_MAX_KERNELS>{});
  size_t& used = KernelSlotsUsed();
  if (used == kTrampolines.size()) {
    throw std::runtime_error("opforge: more than " + std::to_string(kTrampolines.size()) +
                             " kernels in one stable-ABI library; build it with a larger "
                             "-DOPFORGE_STABLE_MAX_KERNELS=N.");
  }
  KernelSlots()[used] = KernelSlot{invoke, fn, new KernelName(std::move(name))};
  return kTrampolines[used++];
}
#pragma GCC visibility pop

template <class R, class... Args>
BoxedKernel MakeStableKernel(R (*fn)(Args...), KernelName name) {
  return BindKernel(&Invoker<R, Args...>::Call, reinterpret_cast<void*>(fn), std::move(name));
}

}  // namespace opforge::detail
