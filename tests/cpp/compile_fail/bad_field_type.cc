// Must not compile: std::map has no torch schema equivalent.
#include <map>

#include "opforge/opforge.h"

struct BadCfg {
  std::map<int, int> table;
};
OPFORGE_STRUCT(BadCfg, table);

at::Tensor UseBad(const at::Tensor& x, const BadCfg&) { return x; }

OPFORGE_LIBRARY(bad, m) { m.def("f(Tensor x, BadCfg cfg) -> Tensor", &UseBad); }
