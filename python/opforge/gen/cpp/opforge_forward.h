// Registers generated operators that forward to ATen through the boxed
// dispatcher. The table of operators is generated; this header and its .cc
// are the same for every generation, so they compile once.
//
//   constexpr opforge_gen::ForwardedOp kOps[] = {
//       {"add_scalar", "aten::add", "Scalar_out",
//        "aten::add.Scalar_out(Tensor self, Scalar other, Scalar alpha=1, *, Tensor(a!) out) -> Tensor(a!)"},
//   };
//   opforge_gen::RegisterForwardedOps("myaten", kOps, 1);  // defines myaten::add_scalar
#pragma once

#include <cstddef>

namespace opforge_gen {

struct ForwardedOp {
  const char* name;      // the generated op's name in its namespace: "add_scalar"
  const char* target;    // the ATen operator: "aten::add"
  const char* overload;  // its overload: "Scalar_out"
  const char* schema;    // the target's schema when generated, to notice another torch
  // Torch op tags the op is defined with, comma-separated ("cudagraph_unsafe"),
  // or null. A cudagraph_unsafe op is refused by a plain CUDA graph capture and
  // is an eager break of a breakable one (docs/codegen.md#op-tags).
  const char* tags = nullptr;
};

// Defines `ns::name` for each op with the target's schema and a kernel that
// hands the call to the target. Returns how many ops it defined.
int RegisterForwardedOps(const char* ns, const ForwardedOp* ops, std::size_t count);

}  // namespace opforge_gen
