// One process-wide table of runner objects passed through the dispatcher as
// ints (docs/handles.md).
//
//   int64_t h = HandleTable::Global().Register(std::make_shared<Runner>(plan), "mylib::Runner");
//   std::shared_ptr<void> r = HandleTable::Global().Resolve(h, "mylib::Runner");
//
// A handle encodes a slot and the slot's generation, so a released or stale
// handle, or an int that never was a handle, is an error -- never another
// object. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace opforge {

class HandleTable {
 public:
  static HandleTable& Global();

  // `weak`: the table does not keep the object alive; once it is gone the
  // handle is stale. `type` is checked on Resolve.
  int64_t Register(std::shared_ptr<void> object, std::string type, bool weak = false);

  // Throws opforge::Error (kLookupError) for a handle that is not live, or
  // (kTypeError) when `type` is given and differs from the registered one.
  std::shared_ptr<void> Resolve(int64_t handle, std::string_view type = {}) const;

  // The registered type of a live handle; throws like Resolve.
  std::string TypeOf(int64_t handle) const;

  // False when the handle was not live.
  bool Release(int64_t handle);

  // Keeps or stops keeping a weakly held object alive.
  void SetStrong(int64_t handle, std::shared_ptr<void> object);
  void SetWeak(int64_t handle);

  size_t size() const;

  static bool LooksLikeHandle(int64_t value);

 private:
  struct Slot {
    std::shared_ptr<void> strong;
    std::weak_ptr<void> weak;
    std::string type;
    uint32_t generation = 0;
    bool live = false;
  };
  const Slot& LiveSlot(int64_t handle) const;  // requires mu_

  mutable std::mutex mu_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  size_t live_ = 0;
};

}  // namespace opforge
