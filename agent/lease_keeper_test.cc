#include "agent/lease_keeper.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr absl::Duration kLease = absl::Seconds(10);
const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(LeaseKeeperTest, CurrentWithinTheLeaseOfTheLastRenewal) {
  LeaseKeeper keeper;
  EXPECT_FALSE(keeper.Generation(kStart).has_value()) << "never registered";
  keeper.Renewed(kStart, kLease, /*kept=*/false, 1);  // a first registration: nothing kept
  EXPECT_EQ(keeper.Generation(kStart + absl::Seconds(9)), 0u);
  EXPECT_FALSE(keeper.Lapsed(kStart + kLease));
  EXPECT_FALSE(keeper.Generation(kStart + absl::Seconds(11)).has_value());
  EXPECT_TRUE(keeper.Lapsed(kStart + absl::Seconds(11)));
}

// Issue 52, bug 1: a coordinator paused past the lease kept it; the agent's own clock alone
// moves nothing on.
TEST(LeaseKeeperTest, LapsedByTheAgentsClock_GenerationKeptIfTheCoordinatorSaysSo) {
  LeaseKeeper keeper;
  keeper.Renewed(kStart, kLease, true, 1);
  const absl::Time later = kStart + absl::Seconds(13);
  ASSERT_TRUE(keeper.Lapsed(later));
  keeper.Unregistered(later);
  EXPECT_FALSE(keeper.Generation(later).has_value()) << "nothing written until it is told";
  keeper.Renewed(later, kLease, /*kept=*/true, 1);
  EXPECT_EQ(keeper.Generation(later), 0u);
  EXPECT_EQ(keeper.leases_lost(), 0u);
}

TEST(LeaseKeeperTest, NotKept_GenerationMovesOn) {
  LeaseKeeper keeper;
  keeper.Renewed(kStart, kLease, true, 1);
  keeper.Renewed(kStart + absl::Seconds(20), kLease, /*kept=*/false, 1);
  EXPECT_EQ(keeper.Generation(kStart + absl::Seconds(20)), 1u);
  EXPECT_EQ(keeper.leases_lost(), 1u);
}

// Frozen past the lease across a coordinator restart: the new process's "kept" covers nothing
// the one before it judged (it may have aborted the save this agent was frozen in).
TEST(LeaseKeeperTest, FrozenPastTheLeaseAcrossACoordinatorRestart_GenerationMovesOn) {
  LeaseKeeper keeper;
  keeper.Renewed(kStart, kLease, true, /*coordinator=*/1);
  keeper.Renewed(kStart + absl::Seconds(2), kLease, true, /*coordinator=*/2);
  EXPECT_EQ(keeper.leases_lost(), 0u) << "a restart within the lease: nothing lapsed";
  const absl::Time thawed = kStart + absl::Seconds(15);  // frozen while registered
  ASSERT_TRUE(keeper.Lapsed(thawed));
  keeper.Unregistered(thawed);
  keeper.Renewed(thawed, kLease, true, /*coordinator=*/3);
  EXPECT_EQ(keeper.leases_lost(), 1u) << "lapsed while registered, renewed by another process";
  keeper.Renewed(kStart + absl::Seconds(30), kLease, true, /*coordinator=*/3);
  EXPECT_EQ(keeper.leases_lost(), 1u) << "lapsed, but the same process kept it (a pause)";
}

// A coordinator down longer than the lease, the agent trying to reach it all along: that
// coordinator could judge nobody; the restarted one's "kept" stands.
TEST(LeaseKeeperTest, CoordinatorDownPastTheLease_GenerationKept) {
  LeaseKeeper keeper;
  keeper.Renewed(kStart, kLease, true, /*coordinator=*/1);
  keeper.Unregistered(kStart + absl::Seconds(1));  // its heartbeat failed: the coordinator is down
  keeper.Renewed(kStart + absl::Seconds(40), kLease, true, /*coordinator=*/2);
  EXPECT_EQ(keeper.leases_lost(), 0u);
}

}  // namespace
}  // namespace tessera
