#include "core/handles.h"

#include <unistd.h>

#include <chrono>
#include <random>

#include "core/error.h"

namespace opforge {
namespace {

// Handles look like 0x4000'GGGG'GGGG'IIII'IIII'... : a marker bit, the slot's
// generation (30 bits) and the slot index (32 bits). Small ints are never
// handles, so passing a plain number by mistake is caught.
constexpr int64_t kMarker = int64_t{1} << 62;
constexpr uint32_t kGenerationMask = (1u << 30) - 1;

int64_t Encode(uint32_t index, uint32_t generation) {
  return kMarker | (static_cast<int64_t>(generation & kGenerationMask) << 32) | index;
}
uint32_t IndexOf(int64_t handle) { return static_cast<uint32_t>(handle & 0xffffffff); }
uint32_t GenerationOf(int64_t handle) { return static_cast<uint32_t>((handle >> 32) & kGenerationMask); }

std::string Show(int64_t handle) { return "handle " + std::to_string(handle); }

// A new slot's first generation, drawn per process: the same number names
// another object, or none, in every other process, so a handle from a saved
// program or another process is stale here (but for a 1 in 2^30 chance), never
// the object this process registered first.
uint32_t FirstGeneration() {
  static std::mt19937_64 draw = [] {
    std::random_device device;
    std::seed_seq seed{static_cast<uint64_t>(device()), static_cast<uint64_t>(device()),
                       static_cast<uint64_t>(getpid()),
                       static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
    return std::mt19937_64(seed);
  }();
  return static_cast<uint32_t>(draw()) & kGenerationMask;
}

constexpr const char* kStale =
    "is stale: its object was released or is gone, or another process made it (a saved or exported program, "
    "a number passed by hand): a handle is this process's state.";

}  // namespace

HandleTable& HandleTable::Global() {
  static auto* table = new HandleTable();
  return *table;
}

bool HandleTable::LooksLikeHandle(int64_t value) { return value > 0 && (value >> 62) == 1; }

int64_t HandleTable::Register(std::shared_ptr<void> object, std::string type, bool weak) {
  if (!object) {
    throw Error(ErrorKind::kValueError, "", "handles", "cannot register a null object.");
  }
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    if (slots_.size() >= 0xffffffffu) {
      throw Error(ErrorKind::kValueError, "", "handles", "the handle table is full.");
    }
    index = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
    slots_.back().generation = FirstGeneration();  // under mu_: one draw at a time
  }
  Slot& slot = slots_[index];
  slot.generation = (slot.generation + 1) & kGenerationMask;
  if (slot.generation == 0) slot.generation = 1;
  slot.type = std::move(type);
  slot.live = true;
  // A free slot holds nothing: Release empties it.
  if (weak) {
    slot.weak = object;
  } else {
    slot.strong = std::move(object);
  }
  ++live_;
  return Encode(index, slot.generation);
}

const HandleTable::Slot& HandleTable::LiveSlot(int64_t handle) const {
  if (!LooksLikeHandle(handle)) {
    throw Error(ErrorKind::kLookupError, "", Show(handle), "is not an opforge handle.",
                "Pass the object itself, or a handle from opforge.handles.register().");
  }
  const uint32_t index = IndexOf(handle);
  if (index >= slots_.size() || !slots_[index].live || slots_[index].generation != GenerationOf(handle)) {
    throw Error(ErrorKind::kLookupError, "", Show(handle), kStale,
                "Pass the object itself, or register it in this process and use the new handle.");
  }
  return slots_[index];
}

std::shared_ptr<void> HandleTable::Resolve(int64_t handle, std::string_view type) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Slot& slot = LiveSlot(handle);
  if (!type.empty() && slot.type != type) {
    throw Error(ErrorKind::kTypeError, "", Show(handle),
                "refers to a " + slot.type + ", not a " + std::string(type) + ".",
                "Pass an object of the type the op expects.");
  }
  if (slot.strong) return slot.strong;
  auto object = slot.weak.lock();
  if (!object) {
    throw Error(ErrorKind::kLookupError, "", Show(handle), "is stale: its object was released or is gone.",
                "Keep the object alive (or opforge.handles.pin it) while ops use it.");
  }
  return object;
}

std::string HandleTable::TypeOf(int64_t handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  return LiveSlot(handle).type;
}

bool HandleTable::Release(int64_t handle) {
  std::shared_ptr<void> doomed;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  if (!LooksLikeHandle(handle)) return false;
  const uint32_t index = IndexOf(handle);
  if (index >= slots_.size()) return false;
  Slot& slot = slots_[index];
  if (!slot.live || slot.generation != GenerationOf(handle)) return false;
  doomed = std::move(slot.strong);
  slot.weak.reset();
  slot.type.clear();
  slot.live = false;
  free_.push_back(index);
  --live_;
  return true;
}

void HandleTable::SetStrong(int64_t handle, std::shared_ptr<void> object) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = const_cast<Slot&>(LiveSlot(handle));
  slot.strong = std::move(object);
}

void HandleTable::SetWeak(int64_t handle) {
  std::shared_ptr<void> doomed;
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = const_cast<Slot&>(LiveSlot(handle));
  if (slot.strong) {
    slot.weak = slot.strong;
    doomed = std::move(slot.strong);
  }
}

size_t HandleTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_;
}

}  // namespace opforge
