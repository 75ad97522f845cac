// A library whose second block names a type no one declared: loading it must
// raise in Python and register nothing of that block, never end the process.
#include <ATen/ops/empty_like.h>

#include <opforge/opforge.h>

namespace bad {
at::Tensor Good(const at::Tensor& x) { return x.clone(); }
void Write(at::Tensor& out, double v) { out.fill_(v); }
}  // namespace bad

OPFORGE_LIBRARY(opforge_bad_ok, m) { m.def("good(Tensor x) -> Tensor", &bad::Good); }

OPFORGE_LIBRARY(opforge_bad, m) {
  m.def("write(Tensor! out, float v) -> ()", &bad::Write);
  m.def("broken(Tensor! out, NoSuchCfg cfg) -> ()");
}
