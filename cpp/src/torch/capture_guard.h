// Ops tagged torch.Tag.cudagraph_unsafe (docs/cuda_graphs.md): a boxed
// kernel on their BackendSelect key that looks, before any launch, whether
// the call's CUDA stream is being captured into a CUDA graph. Outside a
// capture it hands the call on unchanged; inside one it hands it to the
// break handler (opforge._C sets one: a breakable capture ends its segment
// and runs the op eagerly), or refuses it with an error naming the op.
//
//   auto reg = RegisterCaptureGuard("mylib::paged_attn");   // kept while `reg` lives
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "torch/registration.h"

namespace opforge {

// Whether work launched now on `device`'s current stream would be recorded
// into a CUDA graph: a CUDA device whose current stream captures. CPU and
// other devices: false (unless a test set the probe).
bool CaptureUnderway(c10::Device device);

// The cudaStream_t of a CUDA c10::Stream. c10::Stream::native_handle() came
// with torch 2.11; on 2.9 and 2.10 it is c10::cuda::CUDAStream::stream() from
// libc10_cuda.so (loaded wherever a CUDA stream exists), found with dlsym so
// that opforge needs no CUDA headers.
void* CudaStreamHandle(const c10::Stream& stream);

// Whether `t`'s device decides if a call is captured: a CUDA tensor (or,
// with the test probe set, any tensor but a meta one).
bool DecidesCapture(const at::Tensor& t);

// The device whose capture decides for a call's flat arguments (the last
// `num_args` of `stack`): the first tensor's that DecidesCapture, or none.
std::optional<c10::Device> CaptureDevice(const torch::jit::Stack& stack, size_t num_args);

// For tests on machines without a GPU: 1 makes every device answer "a
// capture is under way", 0 "none"; -1 (the default) asks the device.
void SetCaptureProbeForTesting(int value);
int CaptureProbeForTesting();

// Handles a guarded op's call made while a capture is under way: leaves the
// op's returns on the stack, or throws. `below` is the key set that reaches
// the op's kernels (past the guard). Returns false to let the call be
// captured as it is (the caller opted out).
using CaptureBreakHandler = bool (*)(const c10::OperatorHandle& op, c10::DispatchKeySet below,
                                     torch::jit::Stack* stack);
void SetCaptureBreakHandler(CaptureBreakHandler handler);

// Held while a recorded break runs its call (opforge._C.CapturedCall): the
// guard lets every call on this thread through, as the call is the break. A
// kernel that meets the guard again on its way (a generated op's forwarding
// kernel sits on every key) runs, rather than breaking once more.
class RecordedCallScope {
 public:
  RecordedCallScope();
  ~RecordedCallScope();
  RecordedCallScope(const RecordedCallScope&) = delete;
  RecordedCallScope& operator=(const RecordedCallScope&) = delete;
};

// The guard's decision for one call of a cudagraph_unsafe op: false where no
// capture is under way on the call's device, the caller opted out, or inside
// a RecordedCallScope, and the call goes on; true where the break handler ran
// it (its returns are on the stack). Throws, naming the op, where the capture
// cannot break.
bool BreakIfCapturing(const c10::OperatorHandle& op, c10::DispatchKeySet below, torch::jit::Stack* stack);

// What a capture that cannot break around `op` says.
std::string PlainCaptureMessage(const std::string& op);

// The guard on `qualname`'s BackendSelect key, kept while the result lives.
std::unique_ptr<KernelRegistration> RegisterCaptureGuard(const std::string& qualname);

// Defines `schema` ("ns::op(Tensor x) -> Tensor") with torch op tags by name
// ("cudagraph_unsafe", ...), and a capture guard when cudagraph_unsafe is
// among them; undone when the result is destroyed. Throws std::exception
// naming the op for a tag this torch does not know.
void* DefineTagged(const std::string& schema, const std::vector<std::string>& tags);
void ReleaseTagged(void* registration);

}  // namespace opforge

// The guard for kernels built without opforge (`opforge gen aten`'s forwarding
// kernel, docs/codegen.md#op-tags), found with dlsym in the loaded
// libopforge_torch.so: BreakIfCapturing with `keys` as DispatchKeySet's raw
// bits; 1 where the break handler ran the call, 0 where it goes on. Throws
// c10::Error naming the op where the capture cannot break. Versioned: a
// changed contract is a new name.
extern "C" int opforge_capture_guard_v1(const c10::OperatorHandle* op, uint64_t keys, torch::jit::Stack* stack);
