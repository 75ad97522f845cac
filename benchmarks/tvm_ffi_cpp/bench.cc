// From C++: opforge::Call of the op (the dispatcher, its struct flattened)
// against the function's direct call (DLTensors built by hand and the
// exported __tvm_ffi_<name> called), in alternating bursts; prints one line
// per kernel, size and way of calling (opforge::Call looks the op up by name
// each call, an OpRef once): "<kernel> <rows>x<cols> <way> <direct ns> <op ns> <q1> <median> <q3>".
//
//   bench_ffi_call libopforge_test_tvm_ffi.so libffi_module.so 41
#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <dlfcn.h>
#include <opforge/opforge.h>
#include <tvm/ffi/c_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "norm_cfg.h"


namespace {

using SafeCall = int (*)(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);

DLTensor View(const at::Tensor& t) {
  DLTensor d{};
  d.data = t.data_ptr();
  d.device = {kDLCPU, 0};
  d.ndim = static_cast<int32_t>(t.dim());
  d.dtype = at::getDLDataType(t);
  d.shape = const_cast<int64_t*>(t.sizes().data());
  d.strides = const_cast<int64_t*>(t.strides().data());
  return d;
}

// What a C++ caller of the function writes: a view per tensor, an Any per argument.
void Direct(SafeCall f, const at::Tensor& out, const at::Tensor& x, const at::Tensor& w, double eps, bool add_one) {
  DLTensor views[3] = {View(out), View(x), View(w)};
  TVMFFIAny args[5] = {};
  for (int i = 0; i < 3; ++i) {
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].v_ptr = &views[i];
  }
  args[3].type_index = kTVMFFIFloat;
  args[3].v_float64 = eps;
  args[4].type_index = kTVMFFIBool;
  args[4].v_int64 = add_one;
  TVMFFIAny result{};
  result.type_index = kTVMFFINone;
  if (f(nullptr, args, 5, &result) != 0) std::abort();
}

template <class F>
double Burst(int n, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  if (dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) return 1;
  void* module = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (module == nullptr) return 1;
  const int pairs = std::stoi(argv[3]);
  const std::pair<int64_t, int64_t> sizes[] = {{4, 128}, {256, 4096}};
  for (const char* kernel : {"noop", "rms_norm"}) {
    auto f = reinterpret_cast<SafeCall>(dlsym(module, (std::string("__tvm_ffi_") + kernel).c_str()));
    const std::string op = std::string("ffi_ext::") + kernel;
    for (auto [rows, cols] : sizes) {
      at::Tensor x = at::randn({rows, cols}), w = at::randn({cols}), out = at::empty({rows, cols});
      const ffi_ext::NormCfg cfg{1e-6, true};
      auto direct = [&] { Direct(f, out, x, w, cfg.eps, cfg.add_one); };
      const opforge::OpRef ref(op.c_str());
      const double per_call = std::max(Burst(20, direct), 1.0);
      const int n = std::max(1, std::min(20000, static_cast<int>(1e8 / per_call)));  // ~100 ms a burst
      for (const char* way : {"Call", "OpRef"}) {
      auto call = [&] {
        if (way[0] == 'C') {
          opforge::Call(op.c_str(), out, x, w, cfg);
        } else {
          ref.call(out, x, w, cfg);
        }
      };
      Burst(n, call);
      std::vector<double> ratios, mine, theirs;
      for (int p = 0; p < pairs; ++p) {
        double a, b;
        if (p % 2 == 0) {
          a = Burst(n, call);
          b = Burst(n, direct);
        } else {
          b = Burst(n, direct);
          a = Burst(n, call);
        }
        mine.push_back(a);
        theirs.push_back(b);
        ratios.push_back(a / b);
      }
      auto at_q = [](std::vector<double> v, double q) {
        std::sort(v.begin(), v.end());
        return v[static_cast<size_t>(q * (v.size() - 1) + 0.5)];
      };
      std::printf("%s %lldx%lld %s %.1f %.1f %.3f %.3f %.3f\n", kernel, static_cast<long long>(rows),
                  static_cast<long long>(cols), way, at_q(theirs, 0.5), at_q(mine, 0.5), at_q(ratios, 0.25),
                  at_q(ratios, 0.5), at_q(ratios, 0.75));
      }
    }
  }
  return 0;
}
