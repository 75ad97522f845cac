// An op's kernel that is a function exported through Apache TVM-FFI
// (docs/tvm_ffi.md): the op's flat arguments, in schema order, reach the
// function through TVM-FFI's C ABI (tensors as DLTensors over the tensors'
// own memory, no copy), on torch's current stream; its result comes back as
// the schema's returns. No Python on the way.
//
//   auto kernel = std::make_shared<FfiKernel>("mylib::rms_norm", "rms_norm", function_handle, api, options);
//   kernel->Plan(schema);              // once, when it is registered
//   kernel->Call(schema, args, out);   // args: the flat IValues, out: the returns
#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <atomic>

#include <memory>
#include <mutex>
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

// How one flat argument travels to the function, read from its schema type
// once (FfiKernel::Plan):
//
//   Tensor x          -> {kTensor}                 a DLTensor view (an owned Tensor with owned_tensors)
//   float? eps        -> {kFloat, optional}        None or a double
//   ScalarType dt     -> {kDataType}               a DLDataType
//   SymInt[] sizes    -> {kList, item: kInt}       an Array of int64
//   Tensor[] ts       -> {kList, item: kTensor}    an Array of owned Tensors
//   Scalar s          -> {kByTag}                  whatever the value holds (int, double, ...)
// A value that is not what its leaf's plan says (a SymInt that is a symbol)
// goes as its IValue's tag says, to the error of a value TVM-FFI cannot hold.
enum class LeafWay : uint8_t { kTensor, kInt, kFloat, kBool, kStr, kDataType, kDevice, kList, kByTag };

struct LeafPlan {
  LeafWay way = LeafWay::kByTag;
  bool optional = false;          // None travels as None
  LeafWay item = LeafWay::kByTag;  // a list's items
};

// What the schema type `type` makes of a leaf (the table above).
LeafPlan PlanLeaf(const c10::TypePtr& type);

struct FfiKernelOptions {
  // Tensors travel as owned TVM-FFI Tensors (the function takes
  // `ffi::Tensor`) rather than DLTensor views (`ffi::TensorView`).
  bool owned_tensors = false;
  // How the user asks for owned tensors where this kernel was made, for the
  // error of a function that wants them: "kernel=opforge.TvmFfiKernel(f, owned_tensors=True)".
  std::string owned_tensors_hint;
};

class FfiKernel {
 public:
  // `function`: a TVM-FFI Function object (a reference is taken).
  FfiKernel(std::string op, std::string function_name, void* function, const OpforgeFfiApi* api,
            FfiKernelOptions options = {});
  ~FfiKernel();
  FfiKernel(const FfiKernel&) = delete;
  FfiKernel& operator=(const FfiKernel&) = delete;

  // Reads how each of the op's flat arguments travels from its schema, once:
  // when the kernel is registered, or at its first call where nothing
  // registered it. Later calls keep the first plan.
  void Plan(const c10::FunctionSchema& schema);

  // Calls the function on `args`, the op's flat arguments in schema order,
  // and appends the schema's returns to `out`. Throws c10 errors that name
  // the op (a kernel's TypeError as c10::TypeError, ...).
  void Call(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args, std::vector<c10::IValue>& out);

  const std::string& op() const { return op_; }
  // " name" for messages, or "" where the function has no name.
  const std::string& function_name() const { return function_name_; }
  bool owned_tensors() const { return options_.owned_tensors; }
  const std::vector<LeafPlan>& plan() const { return plan_; }

 private:
  std::string op_;
  std::string function_name_;
  void* function_;
  const OpforgeFfiApi* api_;
  FfiKernelOptions options_;
  std::mutex plan_mu_;
  std::atomic<bool> planned_{false};
  std::vector<LeafPlan> plan_;
  size_t num_tensor_leaves_ = 0;  // leaves that may travel as DLTensor views
};

// The op's boxed dispatcher kernel: the arguments off the stack, the returns on.
torch::CppFunction MakeFfiDispatcherKernel(std::shared_ptr<FfiKernel> kernel);

// The op's kernel for `key` when its TVM-FFI function could not be found as
// its library loaded: every call raises `message`.
torch::CppFunction MakeUnavailableKernel(std::string message);

// Whether the TVM-FFI type schema of a function (TVM-FFI's
// `__tvm_ffi__metadata_<name>` export, JSON) has a parameter that takes an
// owned ffi::Tensor:
//   {"type":"ffi.Function","named_args":{"return":[...],"params":[{"type":"ffi.Tensor"}]}}  -> true
bool SchemaTakesOwnedTensors(const std::string& type_schema);

struct TorchLayerFfiKernel;

namespace detail {
// The torch layer's register_ffi_kernel (core/torch_layer.h, torch/layer.cc).
void* RegisterFfiKernel(const TorchLayerFfiKernel& kernel, std::string* unavailable);
}  // namespace detail

}  // namespace opforge
