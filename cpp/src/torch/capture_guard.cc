// The capture guard of cudagraph_unsafe ops (capture_guard.h).
#include "torch/capture_guard.h"

#include <ATen/core/ivalue.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <torch/library.h>
#include <torch/version.h>

#include <atomic>
#include <stdexcept>
#include <utility>

namespace opforge {
namespace {

std::atomic<int> g_probe{-1};
// How many recorded calls (RecordedCallScope) this thread is inside.
thread_local int t_recorded_calls = 0;
std::atomic<CaptureBreakHandler> g_handler{nullptr};

// CUDA's driver entry point, looked up in the libcuda the running torch
// loaded (the torch layer builds without CUDA): CUresult (CUstream, int*).
using IsCapturingFn = int (*)(void* stream, int* status);
constexpr int kCudaErrorStreamCaptureImplicit = 906;

IsCapturingFn LoadIsCapturing() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (driver == nullptr) return nullptr;  // CUDA was never initialized: nothing can be capturing
  return reinterpret_cast<IsCapturingFn>(dlsym(driver, "cuStreamIsCapturing"));
}

IsCapturingFn IsCapturing() {
  static std::atomic<IsCapturingFn> fn{nullptr};
  IsCapturingFn f = fn.load(std::memory_order_acquire);
  if (f == nullptr) {
    f = LoadIsCapturing();
    if (f != nullptr) fn.store(f, std::memory_order_release);
  }
  return f;
}

// Torch op tags a C++ library may give an op by name, as torch.Tag spells them.
const std::pair<const char*, at::Tag> kTags[] = {
    {"cudagraph_unsafe", at::Tag::cudagraph_unsafe},
    {"needs_fixed_stride_order", at::Tag::needs_fixed_stride_order},
    {"flexible_layout", at::Tag::flexible_layout},
    {"nondeterministic_seeded", at::Tag::nondeterministic_seeded},
    {"nondeterministic_bitwise", at::Tag::nondeterministic_bitwise},
    {"pt2_compliant_tag", at::Tag::pt2_compliant_tag},
};

void CaptureGuard(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const c10::DispatchKeySet below = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER,
                                                             c10::DispatchKey::BackendSelect);
  if (BreakIfCapturing(op, below, stack)) return;
  op.redispatchBoxed(below, stack);
}

torch::CppFunction GuardKernel() { return torch::CppFunction::makeFromBoxedFunction<&CaptureGuard>(); }

}  // namespace

RecordedCallScope::RecordedCallScope() { ++t_recorded_calls; }
RecordedCallScope::~RecordedCallScope() { --t_recorded_calls; }

bool BreakIfCapturing(const c10::OperatorHandle& op, c10::DispatchKeySet below, torch::jit::Stack* stack) {
  if (t_recorded_calls > 0) return false;  // a recorded call's kernel: it is the break
  const std::optional<c10::Device> device = CaptureDevice(*stack, op.schema().arguments().size());
  if (!device || !CaptureUnderway(*device)) return false;
  CaptureBreakHandler handler = g_handler.load(std::memory_order_acquire);
  if (handler == nullptr) TORCH_CHECK(false, PlainCaptureMessage(op.schema().name()));
  return handler(op, below, stack);
}

void* CudaStreamHandle(const c10::Stream& stream) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
  return stream.native_handle();
#else
  // A c10::cuda::CUDAStream holds only its c10::Stream, so the Stream is the
  // `this` of CUDAStream::stream() const.
  using StreamFn = void* (*)(const c10::Stream*);
  static const StreamFn fn = [] {
    void* lib = dlopen("libc10_cuda.so", RTLD_NOW | RTLD_NOLOAD);
    return lib == nullptr ? nullptr : reinterpret_cast<StreamFn>(dlsym(lib, "_ZNK3c104cuda10CUDAStream6streamEv"));
  }();
  TORCH_CHECK(fn != nullptr, "opforge: libc10_cuda.so is not loaded, so the CUDA stream's handle is unknown");
  return fn(&stream);
#endif
}

bool CaptureUnderway(c10::Device device) {
  const int probe = g_probe.load(std::memory_order_relaxed);
  if (probe >= 0) return probe == 1;
  if (device.type() != c10::DeviceType::CUDA || !c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return false;
  IsCapturingFn is_capturing = IsCapturing();
  if (is_capturing == nullptr) return false;
  const c10::Stream stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device);
  int status = 0;
  const int result = is_capturing(CudaStreamHandle(stream), &status);
  // The legacy stream while another stream captures globally: launching
  // here would invalidate that capture, so it counts as one.
  if (result == kCudaErrorStreamCaptureImplicit) return true;
  return result == 0 && status != 0;  // ACTIVE or INVALIDATED
}

bool DecidesCapture(const at::Tensor& t) {
  if (!t.defined()) return false;
  if (t.is_cuda()) return true;
  return g_probe.load(std::memory_order_relaxed) >= 0 && t.device().type() != c10::DeviceType::Meta;
}

std::optional<c10::Device> CaptureDevice(const torch::jit::Stack& stack, size_t num_args) {
  const size_t first = stack.size() - std::min(num_args, stack.size());
  for (size_t i = first; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      if (DecidesCapture(v.toTensor())) return v.toTensor().device();
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) {
        if (DecidesCapture(t)) return t.device();
      }
    } else if (v.isList()) {
      for (const c10::IValue& item : v.toListRef()) {
        if (item.isTensor() && DecidesCapture(item.toTensor())) return item.toTensor().device();
      }
    }
  }
  return std::nullopt;
}

void SetCaptureProbeForTesting(int value) { g_probe.store(value < 0 ? -1 : value != 0, std::memory_order_relaxed); }

int CaptureProbeForTesting() { return g_probe.load(std::memory_order_relaxed); }

void SetCaptureBreakHandler(CaptureBreakHandler handler) { g_handler.store(handler, std::memory_order_release); }

std::string PlainCaptureMessage(const std::string& op) {
  return op + ": this op is tagged torch.Tag.cudagraph_unsafe and was called while its CUDA stream is being "
              "captured into a CUDA graph that cannot break around it (torch.cuda.graph, make_graphed_callables, "
              "or a capture opforge does not know). Nothing was launched. Capture with "
              "opforge.cuda_graphs.BreakableGraph, or register your engine's breakable capture with "
              "opforge.cuda_graphs.register_capture (docs/cuda_graphs.md); to capture the op anyway, call it inside "
              "opforge.cuda_graphs.allow_unsafe_capture().";
}

std::unique_ptr<KernelRegistration> RegisterCaptureGuard(const std::string& qualname) {
  return RegisterBoxed(qualname, {c10::DispatchKey::BackendSelect}, &GuardKernel);
}

void* DefineTagged(const std::string& schema, const std::vector<std::string>& tags) {
  const size_t sep = schema.find("::");
  const size_t paren = schema.find('(');
  if (sep == std::string::npos || paren == std::string::npos || sep > paren) {
    throw std::invalid_argument("opforge: DefineTagged takes a qualified schema, not '" + schema + "'");
  }
  const std::string op = schema.substr(0, paren);
  std::vector<at::Tag> torch_tags;
  bool guarded = false;
  for (const std::string& name : tags) {
    bool known = false;
    for (const auto& [tag_name, tag] : kTags) {
      if (name == tag_name) {
        torch_tags.push_back(tag);
        known = true;
      }
    }
    if (!known) {
      std::string names;
      for (const auto& entry : kTags) names += std::string(names.empty() ? "" : ", ") + entry.first;
      throw std::invalid_argument(op + ": '" + name + "' is not an op tag opforge can give a C++ op. Use one of: " +
                                  names + ".");
    }
    guarded = guarded || name == "cudagraph_unsafe";
  }
  auto lib = std::make_unique<torch::Library>(torch::Library::FRAGMENT, schema.substr(0, sep), std::nullopt,
                                              __FILE__, __LINE__);
  lib->def(schema.substr(sep + 2).c_str(), std::as_const(torch_tags));
  if (guarded) {
    lib->impl(op.substr(sep + 2).c_str(), torch::dispatch(c10::DispatchKey::BackendSelect, GuardKernel()));
  }
  return new KernelRegistration(std::move(lib));
}

void ReleaseTagged(void* registration) { delete static_cast<KernelRegistration*>(registration); }

}  // namespace opforge

extern "C" int opforge_capture_guard_v1(const c10::OperatorHandle* op, uint64_t keys, torch::jit::Stack* stack) {
  return opforge::BreakIfCapturing(*op, c10::DispatchKeySet(c10::DispatchKeySet::RAW, keys), stack) ? 1 : 0;
}
