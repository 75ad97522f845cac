// An op's kernel that is a function exported through Apache TVM-FFI
// (docs/tvm_ffi.md): the op's flat arguments, in schema order, reach the
// function through TVM-FFI's C ABI (tensors as DLTensors over the tensors'
// own memory, no copy), on torch's current stream; its result comes back as
// the schema's returns. No Python on the way.
//
//   auto kernel = FfiKernel::Make("mylib::rms_norm", "rms_norm", function_handle, api);
//   kernel->Call(schema, args, out);   // args: the flat IValues, out: the returns
#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <string>
#include <vector>

#include "torch/tvm_ffi_abi.h"

namespace torch {
class CppFunction;
}

namespace opforge {

// The libtvm_ffi functions, found in the loaded library at `path` (the
// one `tvm_ffi.libinfo.find_libtvm_ffi()` names); a message naming what is
// missing otherwise. Found once per process.
const OpforgeFfiApi* LoadFfiApi(const std::string& path, std::string* error);
// The same, from a loaded library that links libtvm_ffi (a module .so).
const OpforgeFfiApi* LoadFfiApi(void* handle, const std::string& what, std::string* error);

class FfiKernel {
 public:
  // `function`: a TVM-FFI Function object (a reference is taken).
  FfiKernel(std::string op, std::string function_name, void* function, const OpforgeFfiApi* api);
  ~FfiKernel();
  FfiKernel(const FfiKernel&) = delete;
  FfiKernel& operator=(const FfiKernel&) = delete;

  // Calls the function on `args`, the op's flat arguments in schema order,
  // and appends the schema's returns to `out`. Throws c10 errors that name
  // the op (a kernel's TypeError as c10::TypeError, ...).
  void Call(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args, std::vector<c10::IValue>& out);

  const std::string& op() const { return op_; }
  // " name" for messages, or "" where the function has no name.
  const std::string& function_name() const { return function_name_; }
  // Whether tensors go as owned TVM-FFI Tensors (the function takes
  // `ffi::Tensor`) rather than DLTensor views (`ffi::TensorView`).
  bool owned_tensors() const { return owned_tensors_; }

 private:
  std::string op_;
  std::string function_name_;
  void* function_;
  const OpforgeFfiApi* api_;
  bool owned_tensors_ = false;
};

// The op's boxed dispatcher kernel: the arguments off the stack, the returns on.
torch::CppFunction MakeFfiDispatcherKernel(std::shared_ptr<FfiKernel> kernel);

}  // namespace opforge
