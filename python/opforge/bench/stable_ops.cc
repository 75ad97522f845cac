// The stable-ABI rows of `opforge bench`: the struct ops of cpp_ops.cc
// (1, 5 and 30 scalar leaves) in a library built on torch's stable ABI, timed
// against the flat ops of the C++ API build.
#include <opforge/opforge.h>

namespace opforge_bench_stable {

volatile double sink;

struct Cfg1 {
  double a0 = 0;
};
OPFORGE_STRUCT_NAMED(Cfg1, "opforge_bench_stable.Cfg1", a0);

struct Cfg5 {
  double a0 = 0, a1 = 1, a2 = 2, a3 = 3, a4 = 4;
};
OPFORGE_STRUCT_NAMED(Cfg5, "opforge_bench_stable.Cfg5", a0, a1, a2, a3, a4);

struct Cfg30 {
  double a0 = 0, a1 = 1, a2 = 2, a3 = 3, a4 = 4, a5 = 5, a6 = 6, a7 = 7, a8 = 8, a9 = 9, a10 = 10, a11 = 11,
         a12 = 12, a13 = 13, a14 = 14, a15 = 15, a16 = 16, a17 = 17, a18 = 18, a19 = 19, a20 = 20, a21 = 21,
         a22 = 22, a23 = 23, a24 = 24, a25 = 25, a26 = 26, a27 = 27, a28 = 28, a29 = 29;
};
OPFORGE_STRUCT_NAMED(Cfg30, "opforge_bench_stable.Cfg30", a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13,
                     a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29);

opforge::Tensor Struct1(const opforge::Tensor& x, const Cfg1& c) {
  sink = c.a0;
  return x;
}
opforge::Tensor Struct5(const opforge::Tensor& x, const Cfg5& c) {
  sink = c.a0 + c.a1 + c.a2 + c.a3 + c.a4;
  return x;
}
opforge::Tensor Struct30(const opforge::Tensor& x, const Cfg30& c) {
  sink = c.a0 + c.a1 + c.a2 + c.a3 + c.a4 + c.a5 + c.a6 + c.a7 + c.a8 + c.a9 + c.a10 + c.a11 + c.a12 + c.a13 +
         c.a14 + c.a15 + c.a16 + c.a17 + c.a18 + c.a19 + c.a20 + c.a21 + c.a22 + c.a23 + c.a24 + c.a25 + c.a26 +
         c.a27 + c.a28 + c.a29;
  return x;
}

// The same ops flat, as torch's stable ABI writes them by hand (TORCH_BOX).
torch::stable::Tensor Flat1(torch::stable::Tensor x, double a0) {
  sink = a0;
  return x;
}
torch::stable::Tensor Flat5(torch::stable::Tensor x, double a0, double a1, double a2, double a3, double a4) {
  sink = a0 + a1 + a2 + a3 + a4;
  return x;
}
torch::stable::Tensor Flat30(torch::stable::Tensor x, double a0, double a1, double a2, double a3, double a4,
                             double a5, double a6, double a7, double a8, double a9, double a10, double a11,
                             double a12, double a13, double a14, double a15, double a16, double a17, double a18,
                             double a19, double a20, double a21, double a22, double a23, double a24, double a25,
                             double a26, double a27, double a28, double a29) {
  sink = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15 + a16 + a17 + a18 +
         a19 + a20 + a21 + a22 + a23 + a24 + a25 + a26 + a27 + a28 + a29;
  return x;
}

}  // namespace opforge_bench_stable

STABLE_TORCH_LIBRARY_FRAGMENT(opforge_bench_stable, m) {
  m.def("flat1(Tensor x, float a0) -> Tensor");
  m.def("flat5(Tensor x, float a0, float a1, float a2, float a3, float a4) -> Tensor");
  m.def("flat30(Tensor x, float a0, float a1, float a2, float a3, float a4, float a5, float a6, float a7, float a8, "
        "float a9, float a10, float a11, float a12, float a13, float a14, float a15, float a16, float a17, float a18, "
        "float a19, float a20, float a21, float a22, float a23, float a24, float a25, float a26, float a27, "
        "float a28, float a29) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(opforge_bench_stable, CPU, m) {
  m.impl("flat1", TORCH_BOX(&opforge_bench_stable::Flat1));
  m.impl("flat5", TORCH_BOX(&opforge_bench_stable::Flat5));
  m.impl("flat30", TORCH_BOX(&opforge_bench_stable::Flat30));
}

OPFORGE_LIBRARY(opforge_bench_stable, m) {
  m.def("struct1(Tensor x, opforge_bench_stable.Cfg1 cfg) -> Tensor");
  m.impl("struct1", c10::kCPU, &opforge_bench_stable::Struct1);
  m.def("struct5(Tensor x, opforge_bench_stable.Cfg5 cfg) -> Tensor");
  m.impl("struct5", c10::kCPU, &opforge_bench_stable::Struct5);
  m.def("struct30(Tensor x, opforge_bench_stable.Cfg30 cfg) -> Tensor");
  m.impl("struct30", c10::kCPU, &opforge_bench_stable::Struct30);
}
