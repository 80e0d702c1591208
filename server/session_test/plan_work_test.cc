// DecidePlan's contract with the shell: what it gives back and what it leaves to the caller.
#include "server/session/plan_work.h"

#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "server/agent_registry.h"
#include "server/plan/fingerprint.h"
#include "server/plan/plan_cache.h"
#include "server/plan/planner.h"
#include "server/testing/plan_fixtures.h"

namespace tessera {
namespace {

PlanWork TwoRankWork() {
  PlanWork work;
  work.job_id = "job";
  work.session_id = "s1";
  work.attempt = 1;
  work.layout = *MeshLayout::FromProto(*ParseLayoutSpec("dp=2"));
  for (uint32_t r = 0; r < 2; ++r) {
    LocalPlan plan;
    plan.rank = r;
    plan.shards = {Whole("w", {4, 4}, {"dp"}), Param("x", {4, 4}, {2 * r, 0}, {2, 4}, {})};
    work.fingerprints.push_back(FingerprintLocalPlan(plan));
    work.plans.push_back(std::move(plan));
  }
  return work;
}

// A plan built, then the same plan found in the cache: either way the local plans stay in the
// work for the caller to free where it does not delay the PINs (the coordinator's janitor);
// DecidePlan does not spend the save's time freeing them.
TEST(DecidePlan, PlanBuiltOrCached_LocalPlansLeftToTheCaller) {
  FakeClock clock;
  AgentRegistry registry(&clock, AgentRegistryOptions{});
  PlanCache cache;
  for (bool cached : {false, true}) {
    SCOPED_TRACE(cached ? "cached" : "built");
    PlanWork work = TwoRankWork();
    PlanVerdict verdict = DecidePlan(work, cache, registry, PlannerOptions{});
    ASSERT_TRUE(verdict.plan.ok()) << verdict.plan.status();
    ASSERT_NE(*verdict.plan, nullptr);
    EXPECT_EQ(verdict.cached, cached);
    EXPECT_TRUE(verdict.missing.empty());
    EXPECT_TRUE(verdict.plans.empty());
    ASSERT_EQ(work.plans.size(), 2u);
    EXPECT_EQ(work.plans[1].shards.size(), 2u);
  }
}

// A rank that sent only its fingerprint, and no cached plan: the verdict names it and gives
// the plans it has back (planning waits for the missing shards).
TEST(DecidePlan, FingerprintOnlyAndNoCachedPlan_MissingRankNamedPlansGivenBack) {
  FakeClock clock;
  AgentRegistry registry(&clock, AgentRegistryOptions{});
  PlanCache cache;
  PlanWork work = TwoRankWork();
  work.plans.pop_back();  // rank 1 sent its fingerprint alone
  PlanVerdict verdict = DecidePlan(work, cache, registry, PlannerOptions{});
  EXPECT_EQ(verdict.missing, std::vector<uint32_t>{1});
  ASSERT_EQ(verdict.plans.size(), 1u);
  EXPECT_EQ(verdict.plans[0].rank, 0u);
  EXPECT_TRUE(work.plans.empty());
}

}  // namespace
}  // namespace tessera
