#include "server/plan/plan_cache.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(Planner, PlanCache_HitOnlyForSameJobAndFingerprint) {
  PlanCache cache;
  EXPECT_EQ(cache.Lookup("job", 1), nullptr);
  auto plan = std::make_shared<GlobalPlan>();
  plan->fingerprint = 1;
  plan->total_bytes = 42;
  cache.Insert("job", plan);
  std::shared_ptr<const GlobalPlan> hit = cache.Lookup("job", 1);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->total_bytes, 42u);
  EXPECT_EQ(cache.Lookup("job", 2), nullptr);
  EXPECT_EQ(cache.Lookup("other", 1), nullptr);

  auto newer = std::make_shared<GlobalPlan>();
  newer->fingerprint = 2;
  cache.Insert("job", newer);
  EXPECT_EQ(cache.Lookup("job", 1), nullptr);
  EXPECT_EQ(cache.Lookup("job", 2), newer);
  EXPECT_EQ(hit->total_bytes, 42u);  // a plan in use outlives its replacement
  cache.Erase("job");
  EXPECT_EQ(cache.Lookup("job", 2), nullptr);
  EXPECT_EQ(cache.size(), 0u);
}

TEST(Planner, PlanCache_OverCapacity_EvictsLeastRecentlyUsed) {
  PlanCache cache(PlanCacheOptions{2});
  auto plan = std::make_shared<GlobalPlan>();
  cache.Insert("a", plan);
  cache.Insert("b", plan);
  EXPECT_NE(cache.Lookup("a", 0), nullptr);  // "b" is now the least recently used
  cache.Insert("c", plan);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_NE(cache.Lookup("a", 0), nullptr);
  EXPECT_EQ(cache.Lookup("b", 0), nullptr);
  EXPECT_NE(cache.Lookup("c", 0), nullptr);
  cache.Insert("c", nullptr);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(Planner, PlanCache_ConcurrentUse_Consistent) {
  PlanCache cache(PlanCacheOptions{4});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 2000; ++i) {
        const std::string job = absl::StrCat("job", (t + i) % 6);
        auto plan = std::make_shared<GlobalPlan>();
        plan->fingerprint = i;
        cache.Insert(job, plan);
        std::shared_ptr<const GlobalPlan> got = cache.Lookup(job, i);
        if (got != nullptr) {
          ASSERT_EQ(got->fingerprint, static_cast<uint64_t>(i));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(cache.size(), 4u);
}

}  // namespace
}  // namespace tessera
