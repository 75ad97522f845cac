// The C++ side of the benchmark: calls one op of two libraries in turn,
// through the dispatcher, and times them, as C++ code calling a kernel
// library would:
//
//   typed        torch's typed handle with the kernel's own signature
//                (findSchemaOrThrow(...).typed<decltype(rms_norm)>().call(...))
//   boxed        the op's flat arguments on an IValue stack (callBoxed)
//   call         opforge::OpRef with the flat arguments
//   call_struct  opforge::OpRef with the struct arguments (NormCfg, RopeCfg)
//
//   torch.ops.vllm_style_timing.time_pair("rms_norm", "typed:vllm_style_dropin",
//                                         "typed:vllm_style_torch", [out, x, w], 0, 2000.0, 51)
//   -> ns per call of the first, then of the second, one sample each per pair; pairs
//      alternate which runs first.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <opforge/opforge.h>

#ifdef VLLM_STYLE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "ops.h"

namespace vllm_style {
OPFORGE_STRUCT(NormCfg, epsilon);
OPFORGE_STRUCT(RopeCfg, head_size, is_neox);
}  // namespace vllm_style

namespace {

using namespace vllm_style;

constexpr double kEpsilon = 1e-6;

template <class Sig>
c10::TypedOperatorHandle<Sig> Typed(const std::string& name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "").typed<Sig>();
}

// A closure making one call of `op` of namespace `ns` the way `how` says.
// The tensors are the op's in schema order; the closure refers to them.
std::function<void()> MakeCall(const std::string& op, const std::string& how, const std::string& ns,
                               std::vector<at::Tensor>& t, int64_t head_size) {
  const std::string name = ns + "::" + op;
  if (how == "boxed") {
    std::vector<c10::IValue> flat;
    if (op == "rms_norm" || op == "fused_add_rms_norm") {
      flat = {t[0], t[1], t[2], kEpsilon};
    } else if (op == "silu_and_mul") {
      flat = {t[0], t[1]};
    } else {
      flat = {t[0], t[1], t[2], head_size, t[3], true};
    }
    auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "");
    return [handle, flat] {
      std::vector<c10::IValue> stack = flat;
      handle.callBoxed(&stack);
    };
  }
  if (how == "call" || how == "call_struct") {
    auto ref = std::make_shared<opforge::OpRef>(name.c_str());
    const bool structs = how == "call_struct";
    if (op == "rms_norm" || op == "fused_add_rms_norm") {
      if (structs) return [ref, &t] { ref->call(t[0], t[1], t[2], NormCfg{kEpsilon}); };
      return [ref, &t] { ref->call(t[0], t[1], t[2], kEpsilon); };
    }
    if (op == "silu_and_mul") return [ref, &t] { ref->call(t[0], t[1]); };
    const std::optional<at::Tensor> key = t[2];
    if (structs) return [ref, &t, key, head_size] { ref->call(t[0], t[1], key, t[3], RopeCfg{head_size, true}); };
    return [ref, &t, key, head_size] { ref->call(t[0], t[1], key, head_size, t[3], true); };
  }
  TORCH_CHECK(how == "typed", "time_pair: unknown way of calling '", how, "'");
  if (op == "rms_norm") {
    auto h = Typed<decltype(vllm_style::rms_norm)>(name);
    return [h, &t] { h.call(t[0], t[1], t[2], kEpsilon); };
  }
  if (op == "fused_add_rms_norm") {
    auto h = Typed<decltype(vllm_style::fused_add_rms_norm)>(name);
    return [h, &t] { h.call(t[0], t[1], t[2], kEpsilon); };
  }
  if (op == "silu_and_mul") {
    auto h = Typed<decltype(vllm_style::silu_and_mul)>(name);
    return [h, &t] { h.call(t[0], t[1]); };
  }
  const std::optional<at::Tensor> key = t[2];
  auto h = Typed<decltype(vllm_style::rotary_embedding)>(name);
  return [h, &t, key, head_size] { h.call(t[0], t[1], key, head_size, t[3], true); };
}

void Synchronize(bool cuda) {
#ifdef VLLM_STYLE_WITH_CUDA
  if (cuda) TORCH_CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize failed");
#else
  TORCH_CHECK(!cuda, "time_pair: this build has no CUDA");
#endif
}

// ns per call of `calls` calls, the device's work included.
double NsPerCall(const std::function<void()>& f, int64_t calls, bool cuda) {
  Synchronize(cuda);
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) f();
  Synchronize(cuda);
  std::chrono::duration<double, std::nano> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / static_cast<double>(calls);
}

std::vector<double> TimePair(const std::string& op, const std::string& first, const std::string& second,
                             std::vector<at::Tensor> tensors, int64_t head_size, double target_us, int64_t samples) {
  auto split = [](const std::string& side) {
    const auto colon = side.find(':');
    TORCH_CHECK(colon != std::string::npos, "time_pair: a side is 'how:namespace', got '", side, "'");
    return std::make_pair(side.substr(0, colon), side.substr(colon + 1));
  };
  const auto [how_a, ns_a] = split(first);
  const auto [how_b, ns_b] = split(second);
  const bool cuda = tensors.at(0).is_cuda();
  std::function<void()> a = MakeCall(op, how_a, ns_a, tensors, head_size);
  std::function<void()> b = MakeCall(op, how_b, ns_b, tensors, head_size);
  // Warm up, then size a sample to about target_us on the slower side.
  const double per_call = std::max(NsPerCall(a, 20, cuda), NsPerCall(b, 20, cuda));
  const int64_t calls = std::max<int64_t>(1, static_cast<int64_t>(target_us * 1e3 / per_call));
  std::vector<double> out_a, out_b;
  for (int64_t s = 0; s < samples; ++s) {
    if (s % 2 == 0) {
      out_a.push_back(NsPerCall(a, calls, cuda));
      out_b.push_back(NsPerCall(b, calls, cuda));
    } else {
      out_b.push_back(NsPerCall(b, calls, cuda));
      out_a.push_back(NsPerCall(a, calls, cuda));
    }
  }
  out_a.insert(out_a.end(), out_b.begin(), out_b.end());
  return out_a;
}

}  // namespace

TORCH_LIBRARY(vllm_style_timing, m) {
  m.def("time_pair(str op, str first, str second, Tensor[] tensors, int head_size, float target_us, int samples) "
        "-> float[]",
        &TimePair);
}
