// The one way opforge's torch layer and Python extension register a kernel
// they make at run time: a boxed kernel on a list of dispatch keys, kept
// registered while the returned object lives.
//
//   auto reg = RegisterBoxed("mylib::op", {c10::DispatchKey::ADInplaceOrView},
//                            [] { return torch::CppFunction::makeFromBoxedFunction<&Kernel>(); });
#pragma once

#include <torch/library.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace opforge {

// Keeps kernels registered for as long as it lives.
class KernelRegistration {
 public:
  explicit KernelRegistration(std::unique_ptr<torch::Library> lib) : lib_(std::move(lib)) {}

 private:
  std::unique_ptr<torch::Library> lib_;  // a torch::Library undoes its registrations when destroyed
};

// Registers `make_kernel()`, made anew for each key, as op `qualname`'s
// ("ns::op") kernel for each of `keys`.
std::unique_ptr<KernelRegistration> RegisterBoxed(const std::string& qualname,
                                                  const std::vector<c10::DispatchKey>& keys,
                                                  const std::function<torch::CppFunction()>& make_kernel);

// Keeps a registration for the life of the process: the kernels the torch
// layer gives the ops of C++ libraries, which are never unloaded.
void KeepForever(std::unique_ptr<KernelRegistration> registration);

}  // namespace opforge
