#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/handles.h"

namespace opforge {
namespace {

struct Runner {
  int id;
};

ErrorKind KindOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "expected an error";
  return ErrorKind::kValueError;
}

TEST(HandleTable, ResolveGivesBackTheRegisteredObject) {
  HandleTable table;
  auto r = std::make_shared<Runner>(Runner{7});
  int64_t h = table.Register(r, "Runner");
  EXPECT_TRUE(HandleTable::LooksLikeHandle(h));
  EXPECT_EQ(std::static_pointer_cast<Runner>(table.Resolve(h, "Runner"))->id, 7);
  EXPECT_EQ(table.TypeOf(h), "Runner");
  EXPECT_EQ(table.size(), 1u);
}

TEST(HandleTable, ReleasedHandleIsStaleEvenAfterItsSlotIsReused) {
  HandleTable table;
  int64_t first = table.Register(std::make_shared<Runner>(Runner{1}), "Runner");
  ASSERT_TRUE(table.Release(first));
  EXPECT_FALSE(table.Release(first));
  int64_t second = table.Register(std::make_shared<Runner>(Runner{2}), "Runner");
  EXPECT_NE(first, second);  // same slot, new generation
  EXPECT_EQ(KindOf([&] { table.Resolve(first); }), ErrorKind::kLookupError);
  EXPECT_EQ(std::static_pointer_cast<Runner>(table.Resolve(second))->id, 2);
}

TEST(HandleTable, PlainIntsAreNotHandles) {
  HandleTable table;
  table.Register(std::make_shared<Runner>(Runner{1}), "Runner");
  for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{-1}, int64_t{1} << 40}) {
    EXPECT_FALSE(HandleTable::LooksLikeHandle(v));
    EXPECT_EQ(KindOf([&] { table.Resolve(v); }), ErrorKind::kLookupError);
  }
}

TEST(HandleTable, WrongTypeIsATypeError) {
  HandleTable table;
  int64_t h = table.Register(std::make_shared<Runner>(Runner{1}), "Runner");
  try {
    table.Resolve(h, "Plan");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTypeError);
    EXPECT_NE(std::string(e.what()).find("refers to a Runner, not a Plan"), std::string::npos);
  }
}

TEST(HandleTable, WeakHandlesGoStaleWhenTheObjectDies) {
  HandleTable table;
  auto r = std::make_shared<Runner>(Runner{3});
  int64_t h = table.Register(r, "Runner", /*weak=*/true);
  EXPECT_EQ(std::static_pointer_cast<Runner>(table.Resolve(h))->id, 3);
  r.reset();
  EXPECT_EQ(KindOf([&] { table.Resolve(h); }), ErrorKind::kLookupError);
}

TEST(HandleTable, SetWeakAndSetStrongSwitchOwnership) {
  HandleTable table;
  auto r = std::make_shared<Runner>(Runner{4});
  int64_t h = table.Register(r, "Runner");
  table.SetWeak(h);
  EXPECT_EQ(r.use_count(), 1);
  table.SetStrong(h, r);
  EXPECT_EQ(r.use_count(), 2);
}

// N threads register, resolve and release concurrently: every handle
// resolves to its own object until released, and nothing is lost.
TEST(HandleTable, ConcurrentRegisterResolveReleaseLosesNothing) {
  HandleTable table;
  constexpr int kThreads = 8;
  constexpr int kPerThread = 2000;
  std::atomic<int> wrong{0};
  std::atomic<int> resolved{0};
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> kept(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<std::pair<int64_t, int>> live;
      for (int i = 0; i < kPerThread; ++i) {
        int id = t * kPerThread + i;
        live.emplace_back(table.Register(std::make_shared<Runner>(Runner{id}), "Runner"), id);
        auto& [h, expect] = live[rng() % live.size()];
        if (std::static_pointer_cast<Runner>(table.Resolve(h, "Runner"))->id != expect) ++wrong;
        ++resolved;
        if (rng() % 2) {
          size_t k = rng() % live.size();
          if (!table.Release(live[k].first)) ++wrong;
          live.erase(live.begin() + static_cast<long>(k));
        }
      }
      for (auto& [h, id] : live) kept[t].push_back(h);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(resolved.load(), kThreads * kPerThread);
  size_t expected = 0;
  for (const auto& v : kept) expected += v.size();
  EXPECT_EQ(table.size(), expected);
  for (const auto& v : kept) {
    for (int64_t h : v) EXPECT_TRUE(table.Release(h));
  }
  EXPECT_EQ(table.size(), 0u);
}

}  // namespace
}  // namespace opforge
