// Kernel registrations (registration.h).
#include "torch/registration.h"

#include <mutex>

namespace opforge {

std::unique_ptr<KernelRegistration> RegisterBoxed(const std::string& qualname,
                                                  const std::vector<c10::DispatchKey>& keys,
                                                  const std::function<torch::CppFunction()>& make_kernel) {
  const size_t sep = qualname.find("::");
  auto lib = std::make_unique<torch::Library>(torch::Library::FRAGMENT, qualname.substr(0, sep), std::nullopt,
                                              __FILE__, __LINE__);
  const std::string name = qualname.substr(sep + 2);
  for (c10::DispatchKey key : keys) lib->impl(name.c_str(), torch::dispatch(key, make_kernel()));
  return std::make_unique<KernelRegistration>(std::move(lib));
}

void KeepForever(std::unique_ptr<KernelRegistration> registration) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::unique_ptr<KernelRegistration>>();
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(registration));
}

}  // namespace opforge
