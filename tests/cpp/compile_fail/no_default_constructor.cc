// Must not compile, with opforge's message: a kernel's struct that cannot be
// default-constructed (a Handle<T> field has no default).
#include "opforge/opforge.h"

struct Runner {
  double k;
};
struct WithHandle {
  opforge::Handle<Runner> runner;
  double scale = 1.0;
};
OPFORGE_STRUCT(WithHandle, runner, scale);

at::Tensor Use(const at::Tensor& x, const WithHandle&) { return x; }

OPFORGE_LIBRARY(no_default, m) { m.def("f(Tensor x, WithHandle c) -> Tensor", &Use); }
