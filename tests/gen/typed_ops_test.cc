// Calls generated ops through the typed header `opforge_typed_ops.h` (made by
// `opforge gen aten` for the standard 525-name allowlist) and compares each
// result with ATen's own function. Built and run by
// tests/python/test_gen_typed_header.py, which also loads the ops' library.
#include <gtest/gtest.h>

#include <ATen/TensorOperators.h>
#include <ATen/core/Formatting.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/index.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/masked_fill.h>
#include <ATen/ops/max.h>
#include <ATen/ops/narrow_copy.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/split.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/tril.h>
#include <ATen/ops/upsample_nearest2d.h>
#include <ATen/ops/var.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>

#include <vector>

#include "opforge_typed_ops.h"

namespace {

at::Tensor Empty(at::ScalarType dtype = at::kFloat) { return at::empty({0}, at::TensorOptions().dtype(dtype)); }

// Out tensors are reused; each call starts from zero elements, as ATen wants.
at::Tensor& Reset(at::Tensor& t) {
  t.resize_({0});
  return t;
}

#define EXPECT_SAME(a, b) EXPECT_TRUE(at::allclose((a), (b))) << (a) << "\nvs\n" << (b)

class TypedOps : public ::testing::Test {
 protected:
  void SetUp() override { x = at::randn({4, 6}); }
  at::Tensor x;
};

TEST_F(TypedOps, UnaryAndBinaryOpsWriteIntoOutAndReturnIt) {
  at::Tensor out = Empty();
  at::Tensor& r = opforge_typed::abs(x, Reset(out));
  EXPECT_EQ(&r, &out);
  EXPECT_SAME(out, at::abs(x));
  at::Tensor y = at::randn({4, 6});
  EXPECT_SAME(opforge_typed::sub(x, y, 0.5, Reset(out)), at::sub(x, y, 0.5));
  at::Tensor cond = x > 0;
  EXPECT_SAME(opforge_typed::where(cond, x, y, Reset(out)), at::where(cond, x, y));
}

TEST_F(TypedOps, ScalarsAndOptionalScalarsPassTyped) {
  at::Tensor a = at::randn({4, 4}), b = at::randn({4, 5}), c = at::randn({5, 4});
  at::Tensor out = Empty();
  EXPECT_SAME(opforge_typed::addmm(a, b, c, /*beta=*/0.5, /*alpha=*/2, Reset(out)), at::addmm(a, b, c, 0.5, 2));
  EXPECT_SAME(opforge_typed::clamp(x, -0.5, std::nullopt, Reset(out)), at::clamp(x, -0.5));
  EXPECT_SAME(opforge_typed::linspace(0, 1, 7, Reset(out)), at::linspace(0, 1, 7));
  EXPECT_SAME(opforge_typed::arange(5, Reset(out)), at::arange(5, at::kFloat));
}

TEST_F(TypedOps, OptionalListsDtypesAndOptionalIntsPassTyped) {
  at::Tensor sum = Empty(at::kDouble);
  EXPECT_SAME(opforge_typed::sum_intlist(x, at::IntArrayRef{1}, true, at::kDouble, Reset(sum)),
              at::sum(x, {1}, true, at::kDouble));
  at::Tensor out = Empty();
  EXPECT_SAME(opforge_typed::cumsum(x, 1, std::nullopt, Reset(out)), at::cumsum(x, 1));
  at::Tensor idx = Empty(at::kLong);
  EXPECT_TRUE(at::equal(opforge_typed::argmax(x, 1, false, Reset(idx)), at::argmax(x, 1)));
  EXPECT_TRUE(at::equal(opforge_typed::argmax(x, std::nullopt, false, Reset(idx)), at::argmax(x)));
  EXPECT_SAME(opforge_typed::var(x, at::IntArrayRef{0}, true, false, Reset(out)), at::var(x, {0}, true, false));
  EXPECT_SAME(opforge_typed::linalg_vector_norm(x, 3, at::IntArrayRef{1}, false, std::nullopt, Reset(out)),
              at::linalg_vector_norm(x, 3, at::IntArrayRef{1}));
}

TEST_F(TypedOps, SymIntParametersTakeInt64AndIntArrayRef) {
  at::Tensor out = Empty();
  EXPECT_TRUE(at::equal(opforge_typed::zeros({2, 3}, Reset(out)), at::zeros({2, 3})));
  EXPECT_TRUE(at::equal(opforge_typed::full({3, 2}, 1.5, Reset(out)), at::full({3, 2}, 1.5)));
  EXPECT_SAME(opforge_typed::narrow_copy(x, 1, 2, 3, Reset(out)), at::narrow_copy(x, 1, 2, 3));
  EXPECT_SAME(opforge_typed::tril(x, -1, Reset(out)), at::tril(x, -1));
  at::Tensor img = at::randn({1, 2, 3, 3});
  EXPECT_SAME(opforge_typed::upsample_nearest2d(img, {6, 6}, std::nullopt, std::nullopt, Reset(out)),
              at::upsample_nearest2d(img, {6, 6}));
}

TEST_F(TypedOps, MultiOutputOpsReturnATupleOfTheOutTensors) {
  at::Tensor values = Empty(), indices = Empty(at::kLong);
  auto [v, i] = opforge_typed::max_dim_max(x, 1, true, Reset(values), Reset(indices));
  EXPECT_EQ(&v, &values);
  EXPECT_EQ(&i, &indices);
  auto expected = at::max(x, 1, true);
  EXPECT_SAME(values, std::get<0>(expected));
  EXPECT_TRUE(at::equal(indices, std::get<1>(expected)));
  opforge_typed::sort_values(x, 0, true, Reset(values), Reset(indices));
  EXPECT_SAME(values, std::get<0>(at::sort(x, 0, true)));
  opforge_typed::topk(x, 2, -1, true, true, Reset(values), Reset(indices));
  EXPECT_SAME(values, std::get<0>(at::topk(x, 2)));
}

TEST_F(TypedOps, TensorListsPassAsArrayRefsAndLists) {
  at::Tensor v = at::arange(10.0);
  std::vector<at::Tensor> outs = {at::empty({3}), at::empty({3}), at::empty({3}), at::empty({1})};
  opforge_typed::split_copy(v, 3, 0, outs);  // -> (): a void function
  auto expected = at::split(v, 3);
  for (size_t k = 0; k < outs.size(); ++k) EXPECT_TRUE(at::equal(outs[k], expected[k]));
  c10::List<std::optional<at::Tensor>> indices;
  indices.push_back(at::arange(2, -1, -2, at::kLong));  // [2, 0]
  at::Tensor out = Empty();
  EXPECT_SAME(opforge_typed::index(x, indices, Reset(out)), at::index(x, indices));
}

TEST_F(TypedOps, InPlaceOpsTakeAndReturnSelf) {
  at::Tensor y = x.clone();
  at::Tensor other = at::randn({4, 6});
  at::Tensor& r = opforge_typed::add_(y, other, 2);
  EXPECT_EQ(&r, &y);
  EXPECT_SAME(y, x + other * 2);
  at::Tensor z = x.clone();
  opforge_typed::masked_fill_(z, x > 0, at::scalar_tensor(7.0));
  EXPECT_SAME(z, at::masked_fill(x, x > 0, 7.0));
  at::Tensor w = x.clone();
  opforge_typed::mul_(w, other);
  EXPECT_SAME(w, x * other);
}

}  // namespace
