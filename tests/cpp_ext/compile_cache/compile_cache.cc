// One library, two definitions (CC_VERSION): build 2 puts a member in front
// of an Enum (so Act::kGelu's value goes from 1 to 2) and changes a struct
// field's default and a parameter's default. CC_BODY changes the kernels
// alone. tests/python/test_compile_cache.py loads one build per process on
// one compile cache.
#include <opforge/opforge.h>

#include <ATen/ops/empty_like.h>

#include <stdexcept>

#ifndef CC_VERSION
#error "CC_VERSION must be 1 or 2"
#endif
#ifndef CC_BODY
#define CC_BODY 1
#endif

namespace compile_cache {

using opforge::Tensor;

#if CC_VERSION == 1
enum class Act : int64_t { kSilu = 0, kGelu = 1 };
OPFORGE_ENUM(Act, kSilu, kGelu);
#else
enum class Act : int64_t { kRelu = 0, kSilu = 1, kGelu = 2 };
OPFORGE_ENUM(Act, kRelu, kSilu, kGelu);
#endif

struct ActCfg {
  Act act = Act::kSilu;
};
OPFORGE_STRUCT(ActCfg, act);

struct ScaleCfg {
#if CC_VERSION == 1
  double scale = 2.0;
#else
  double scale = 3.0;
#endif
};
OPFORGE_STRUCT(ScaleCfg, scale);

double Factor(Act act) {
  switch (act) {
#if CC_VERSION != 1
    case Act::kRelu:
      return 30.0;
#endif
    case Act::kSilu:
      return 10.0;
    case Act::kGelu:
      return 20.0;
  }
  throw std::invalid_argument("compile_cache: unknown Act");
}

// out[i] = x[i] * s * CC_BODY (float32, CPU).
Tensor Times(const Tensor& input, double s) {
  if (input.scalar_type() != c10::ScalarType::Float) throw std::invalid_argument("compile_cache: x must be float32");
  Tensor x = input.contiguous();
  Tensor out = at::empty_like(x);
  const float* in = x.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) o[i] = static_cast<float>(in[i] * s * CC_BODY);
  return out;
}

Tensor ActParam(const Tensor& x, Act act) { return Times(x, Factor(act)); }
Tensor ActField(const Tensor& x, const ActCfg& cfg) { return Times(x, Factor(cfg.act)); }
Tensor FieldDefault(const Tensor& x, const ScaleCfg& cfg) { return Times(x, cfg.scale); }
Tensor ParamDefault(const Tensor& x, double s) { return Times(x, s); }
Tensor Body(const Tensor& x) { return Times(x, 1.0); }

// The fakes (the kernels read data pointers): an output like x.
Tensor ActParamFake(const Tensor& x, Act) { return at::empty_like(x); }
Tensor ActFieldFake(const Tensor& x, const ActCfg&) { return at::empty_like(x); }
Tensor FieldDefaultFake(const Tensor& x, const ScaleCfg&) { return at::empty_like(x); }
Tensor ParamDefaultFake(const Tensor& x, double) { return at::empty_like(x); }
Tensor BodyFake(const Tensor& x) { return at::empty_like(x); }

}  // namespace compile_cache

OPFORGE_LIBRARY(cc_cpp, m) {
  m.def("act_param(Tensor x, Act act) -> Tensor", &compile_cache::ActParam);
  m.def("act_field(Tensor x, ActCfg cfg) -> Tensor", &compile_cache::ActField);
  m.def("field_default(Tensor x, ScaleCfg cfg) -> Tensor", &compile_cache::FieldDefault);
#if CC_VERSION == 1
  m.def("param_default(Tensor x, float s=2.0) -> Tensor", &compile_cache::ParamDefault);
#else
  m.def("param_default(Tensor x, float s=3.0) -> Tensor", &compile_cache::ParamDefault);
#endif
  m.def("body(Tensor x) -> Tensor", &compile_cache::Body);
  m.fake("act_param", &compile_cache::ActParamFake);
  m.fake("act_field", &compile_cache::ActFieldFake);
  m.fake("field_default", &compile_cache::FieldDefaultFake);
  m.fake("param_default", &compile_cache::ParamDefaultFake);
  m.fake("body", &compile_cache::BodyFake);
}
