// The libtorch C++ API backend of OPFORGE_LIBRARY (opforge/library.h).
#include "opforge/library.h"

#include <c10/core/DispatchKey.h>

namespace opforge::detail {
namespace {

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

char* UnstableBackend::Def(const char* schema) {
  return Catch([&] { lib_->def(schema); }, "torch::Library::def", &Describe);
}

// A kernel registers with the C++ signature its op has recorded, where an
// earlier block's kernel recorded one; else with its own when every kernel of
// the op in this block agrees on one (TORCH_LIBRARY's rule), and with
// opforge's flat signature otherwise.
char* UnstableBackend::Impl(const char* op, const char* key, void* kernel) {
  return Catch([&] {
    auto& forms = *static_cast<KernelForms*>(kernel);
    torch::CppFunction* fn = forms.flat.get();
    if (forms.own) {
      const auto handle = c10::Dispatcher::singleton().findSchema({forms.op, ""});
      const bool own_fits = !handle || forms.own_fits(*handle);
      const bool flat_fits = !handle || forms.flat_fits(*handle);
      if (own_fits && (!flat_fits || own_signatures_[forms.op] != nullptr)) fn = forms.own.get();
    }
    lib_->impl(op, torch::dispatch(c10::parseDispatchKey(key), std::move(*fn)));
  }, "torch::Library::impl", &Describe);
}

char* UnstableBackend::Autograd(const char* qualified, void* registrar) {
  auto wire = [&] { reinterpret_cast<AutogradRegistrarFn>(registrar)(*lib_, qualified); };
  return Catch(wire, "the backward's registration", &Describe);
}

void UnstableBackend::Warn(const char* message) { TORCH_WARN(message); }

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
