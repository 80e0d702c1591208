#include "agent/lease_keeper.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr absl::Duration kLease = absl::Seconds(10);
const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(LeaseKeeperTest, CurrentWithinTheLeaseOfTheLastRenewal) {
  LeaseKeeper keeper;
  EXPECT_FALSE(keeper.Generation(kStart).has_value()) << "never registered";
  keeper.Renewed(kStart, kLease, /*kept=*/false);  // a first registration: nothing to keep
  EXPECT_EQ(keeper.Generation(kStart + absl::Seconds(9)), 0u);
  EXPECT_FALSE(keeper.Lapsed(kStart + kLease));
  EXPECT_FALSE(keeper.Generation(kStart + absl::Seconds(11)).has_value());
  EXPECT_TRUE(keeper.Lapsed(kStart + absl::Seconds(11)));
}

// Issue 52, bug 1: a coordinator paused past the lease kept it; the agent's own clock alone
// moves nothing on.
TEST(LeaseKeeperTest, LapsedByTheAgentsClock_GenerationKeptIfTheCoordinatorSaysSo) {
  LeaseKeeper keeper;
  keeper.Renewed(kStart, kLease, true);
  const absl::Time later = kStart + absl::Seconds(13);
  ASSERT_TRUE(keeper.Lapsed(later));
  keeper.Unregistered();
  EXPECT_FALSE(keeper.Generation(later).has_value()) << "nothing written until it is told";
  keeper.Renewed(later, kLease, /*kept=*/true);
  EXPECT_EQ(keeper.Generation(later), 0u);
  EXPECT_EQ(keeper.leases_lost(), 0u);
}

TEST(LeaseKeeperTest, NotKept_GenerationMovesOn) {
  LeaseKeeper keeper;
  keeper.Renewed(kStart, kLease, true);
  keeper.Renewed(kStart + absl::Seconds(20), kLease, /*kept=*/false);
  EXPECT_EQ(keeper.Generation(kStart + absl::Seconds(20)), 1u);
  EXPECT_EQ(keeper.leases_lost(), 1u);
}

}  // namespace
}  // namespace tessera
