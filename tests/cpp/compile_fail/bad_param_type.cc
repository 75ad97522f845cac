// Must not compile: a kernel parameter of a type torch cannot express.
#include <unordered_set>

#include "opforge/opforge.h"

void UseBad(at::Tensor& out, const std::unordered_set<int64_t>& ids) {}

OPFORGE_LIBRARY(bad, m) {
  m.def("f(Tensor! out, int[] ids) -> ()");
  m.impl("f", c10::kCPU, &UseBad);
}
