// One boxed kernel serves every generated op: the generated schema is the
// target's schema renamed, so the argument stack can be passed on unchanged.
// Only the dispatcher headers are included, never <torch/torch.h>.
#include "opforge_forward.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/library.h>
#include <torch/csrc/api/include/torch/version.h>  // the version macros, without the API include folder

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace opforge_gen {
namespace {

// Torch op tags a generated op may carry, as torch.Tag spells them.
const std::pair<const char*, at::Tag> kTags[] = {
    {"cudagraph_unsafe", at::Tag::cudagraph_unsafe},
    {"needs_fixed_stride_order", at::Tag::needs_fixed_stride_order},
    {"flexible_layout", at::Tag::flexible_layout},
    {"nondeterministic_seeded", at::Tag::nondeterministic_seeded},
    {"nondeterministic_bitwise", at::Tag::nondeterministic_bitwise},
    {"pt2_compliant_tag", at::Tag::pt2_compliant_tag},
};

// opforge's capture guard (docs/cuda_graphs.md), in its torch layer where
// `import opforge` (or an OPFORGE_LIBRARY) loaded it: 1 where a breakable
// capture ran the call as an eager break, 0 where the call goes on; throws
// where the capture cannot break around the op.
using OpforgeGuard = int (*)(const c10::OperatorHandle*, uint64_t, torch::jit::Stack*);

OpforgeGuard FindOpforgeGuard() {
  static std::atomic<OpforgeGuard> found{nullptr};
  OpforgeGuard guard = found.load(std::memory_order_acquire);
  if (guard == nullptr) {
    // Looked for again until found: opforge may be imported after this library.
    if (void* layer = dlopen("libopforge_torch.so", RTLD_NOW | RTLD_NOLOAD)) {
      guard = reinterpret_cast<OpforgeGuard>(dlsym(layer, "opforge_capture_guard_v1"));
      if (guard != nullptr) found.store(guard, std::memory_order_release);
    }
  }
  return guard;
}

// Without opforge loaded: whether the current stream of the call's first
// CUDA tensor's device is being captured (CUDA's driver, in the libcuda the
// running torch loaded; nothing captures before CUDA is initialized).
bool CapturingWithoutOpforge(const torch::jit::Stack& stack, size_t num_args) {
  using IsCapturing = int (*)(void* stream, int* status);
  static const IsCapturing is_capturing = [] {
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return driver == nullptr ? nullptr : reinterpret_cast<IsCapturing>(dlsym(driver, "cuStreamIsCapturing"));
  }();
  if (is_capturing == nullptr) return false;
  std::optional<c10::Device> device;
  for (size_t i = stack.size() - std::min(num_args, stack.size()); i < stack.size() && !device; ++i) {
    if (stack[i].isTensor() && stack[i].toTensor().is_cuda()) device = stack[i].toTensor().device();
    if (stack[i].isTensorList()) {
      for (const at::Tensor& t : stack[i].toTensorList().vec()) {
        if (t.defined() && t.is_cuda()) device = t.device();
      }
    }
  }
  if (!device) return false;
  const c10::Stream stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(*device);
  int status = 0;
  const int result = is_capturing(
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11)
      stream.native_handle(),
#else  // torch 2.9, 2.10: no native_handle(); c10::cuda::CUDAStream::stream(), whose `this` is the c10::Stream
      [&] {
        using StreamFn = void* (*)(const c10::Stream*);
        static const StreamFn fn = [] {
          void* lib = dlopen("libc10_cuda.so", RTLD_NOW | RTLD_NOLOAD);
          return lib == nullptr ? nullptr : reinterpret_cast<StreamFn>(dlsym(lib, "_ZNK3c104cuda10CUDAStream6streamEv"));
        }();
        TORCH_CHECK(fn != nullptr, "libc10_cuda.so is not loaded, so the CUDA stream's handle is unknown");
        return fn(&stream);
      }(),
#endif
      &status);
  return result == 906 /* the legacy stream while another captures */ || (result == 0 && status != 0);
}

class ForwardKernel final : public c10::OperatorKernel {
 public:
  ForwardKernel(c10::OperatorHandle target, bool unsafe) : target_(std::move(target)), unsafe_(unsafe) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    if (unsafe_ && Broke(op, keys, stack)) return;
    // A fresh call, not a redispatch: the target then sees every dispatch
    // key (autograd, functionalization, modes) as a direct call would.
    target_.callBoxed(stack);
  }

 private:
  // A cudagraph_unsafe op, before anything is launched: inside a capture it
  // is an eager break (its recorded call comes back here with no capture
  // under way), or refused.
  static bool Broke(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    if (OpforgeGuard guard = FindOpforgeGuard()) return guard(&op, keys.raw_repr(), stack) != 0;
    TORCH_CHECK(!CapturingWithoutOpforge(*stack, op.schema().arguments().size()), op.schema().name(),
                ": this op is tagged torch.Tag.cudagraph_unsafe and was called while its CUDA stream is being "
                "captured into a CUDA graph. Nothing was launched. `import opforge` and capture with "
                "opforge.cuda_graphs.BreakableGraph (or an engine's breakable capture registered with "
                "opforge.cuda_graphs.register_capture) to run it as an eager break (docs/cuda_graphs.md).");
    return false;
  }

  c10::OperatorHandle target_;  // looked up once, at registration
  bool unsafe_;                 // tagged cudagraph_unsafe
};

// The torch tags of a row's comma-separated `tags` (none for null); nullopt,
// with a warning, for a name this file does not know (a hand-edited table, or
// one from another opforge): that op is then skipped, as a missing target is.
std::optional<std::vector<at::Tag>> ParseTags(const char* ns, const ForwardedOp& op) {
  std::vector<at::Tag> tags;
  if (op.tags == nullptr || *op.tags == '\0') return tags;
  const std::string text = op.tags;
  for (size_t start = 0; start <= text.size();) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string name = text.substr(start, end - start);
    bool known = false;
    for (const auto& [tag_name, tag] : kTags) {
      if (name == tag_name) {
        tags.push_back(tag);
        known = true;
      }
    }
    if (!known) {
      TORCH_WARN("opforge gen: ", ns, "::", op.name, " is skipped: its tag '", name,
                 "' is not one opforge_forward.cc knows. Regenerate the ops with opforge gen aten.");
      return std::nullopt;
    }
    start = end + 1;
  }
  return tags;
}

bool HasTag(const std::vector<at::Tag>& tags, at::Tag tag) {
  for (at::Tag t : tags) {
    if (t == tag) return true;
  }
  return false;
}

std::vector<std::unique_ptr<torch::Library>>& Libraries() {
  // Function-local, so the generated table's static initializer may run
  // before or after this file's.
  static std::vector<std::unique_ptr<torch::Library>> libraries;
  return libraries;
}

}  // namespace

int RegisterForwardedOps(const char* ns, const ForwardedOp* ops, std::size_t count) {
  // A fragment, so the namespace may also hold ops defined elsewhere.
  auto library = std::make_unique<torch::Library>(torch::Library::FRAGMENT, ns, std::nullopt,
                                                  __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  int defined = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const ForwardedOp& op = ops[i];
    const std::optional<std::vector<at::Tag>> tags = ParseTags(ns, op);
    if (!tags) continue;
    auto target = dispatcher.findSchema({op.target, op.overload});
    if (!target.has_value()) {
      TORCH_WARN("opforge gen: ", ns, "::", op.name, " is skipped: this torch has no ", op.target,
                 ".", op.overload, ". Regenerate the ops with this torch.");
      continue;
    }
    // Compared parsed, not printed: no iostreams on the load path, which
    // some toolchains (a compiler newer than the runtime libstdc++) break.
    if (!(torch::jit::parseSchema(op.schema) == target->schema())) {
      TORCH_WARN("opforge gen: ", ns, "::", op.name, " was generated from '", op.schema,
                 "' but this torch has '", c10::toString(target->schema()),
                 "'; the live schema is used. Regenerate the ops with this torch to update "
                 "stubs and tests.");
    }
    // Defining from the live schema keeps the stack layout right by construction.
    c10::FunctionSchema schema =
        target->schema().cloneWithName(std::string(ns) + "::" + op.name, "");
    // A catch-all kernel is CompositeImplicitAutograd: autograd, fake tensors
    // and torch.compile all see the ATen call the op forwards to.
    const bool unsafe = HasTag(*tags, at::Tag::cudagraph_unsafe);
    library->def(std::move(schema),
                 torch::CppFunction::makeFromBoxedFunctor(std::make_unique<ForwardKernel>(*target, unsafe)),
                 *tags);
    ++defined;
  }
  Libraries().push_back(std::move(library));
  return defined;
}

}  // namespace opforge_gen
