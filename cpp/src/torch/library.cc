// The libtorch C++ API backend of OPFORGE_LIBRARY (opforge/library.h).
#include "opforge/library.h"

#include <c10/core/DispatchKey.h>

#include <cstdlib>
#include <cstring>

namespace opforge::detail {
namespace {

char* Message(const std::string& text) { return strdup(text.c_str()); }

template <class F>
char* Catch(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const c10::Error& e) {
    return Message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Message(e.what());
  }
}

// torch's errors without their C++ backtrace.
std::string Describe(const std::exception& e) {
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

}  // namespace

std::string KeyName(c10::DeviceType device) {
  const char* name = DeviceKeyName(device);
  return name != nullptr ? name : c10::DeviceTypeName(device, /*lower_case=*/false);
}

std::string KeyName(c10::DispatchKey key) { return c10::toString(key); }

UnstableBackend::UnstableBackend(torch::Library::Kind kind, const char* ns, std::optional<c10::DispatchKey> key,
                                 const char* file, uint32_t line)
    : kind_(kind), ns_(ns), key_(key), file_(file), line_(line),
      lib_(std::make_unique<torch::Library>(kind, ns, key, file, line)) {}

OpforgeBackendV1 UnstableBackend::backend() {
  OpforgeBackendV1 b{};
  b.ctx = this;
  b.def = &Def;
  b.impl = &Impl;
  b.autograd = &Autograd;
  b.rollback = &Rollback;
  b.warn = &Warn;
  return b;
}

char* UnstableBackend::Def(void* ctx, const char* schema) {
  auto* self = static_cast<UnstableBackend*>(ctx);
  return Catch([&] { self->lib_->def(schema); });
}

char* UnstableBackend::Impl(void* ctx, const char* op, const char* key, void* kernel) {
  auto* self = static_cast<UnstableBackend*>(ctx);
  return Catch([&] {
    auto* fn = static_cast<torch::CppFunction*>(kernel);
    self->lib_->impl(op, torch::dispatch(c10::parseDispatchKey(key), std::move(*fn)));
  });
}

char* UnstableBackend::Autograd(void* ctx, const char* qualified, void* registrar) {
  auto* self = static_cast<UnstableBackend*>(ctx);
  return Catch([&] { reinterpret_cast<AutogradRegistrarFn>(registrar)(*self->lib_, qualified); });
}

void UnstableBackend::Rollback(void* ctx) {
  auto* self = static_cast<UnstableBackend*>(ctx);
  // A torch::Library undoes its registrations when destroyed.
  self->lib_.reset();
}

void UnstableBackend::Warn(void* /*ctx*/, const char* message) { TORCH_WARN(message); }

void UnstableBackend::Finish(bool ok) {
  kernels_.clear();
  if (!ok) lib_.reset();
}

LibraryInit::LibraryInit(torch::Library::Kind kind, const char* ns, std::optional<c10::DispatchKey> key,
                         void (*init)(Library&), const char* file, uint32_t line)
    : backend_(kind, ns, key, file, line) {
  const std::string key_name = key ? KeyName(*key) : std::string();
  LibraryPlan plan(ns, key ? key_name.c_str() : nullptr, file, line, reinterpret_cast<const void*>(init),
                   "unstable", 0);
  error_ = RunBlock(plan, backend_, init, &Describe);
}

}  // namespace opforge::detail
