#include "common/clock.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(FakeClock, DefaultStart_IsEpochPlusOneDay) {
  FakeClock clock;
  EXPECT_EQ(clock.Now(), absl::UnixEpoch() + absl::Hours(24));
}

TEST(FakeClock, StandsStillUntilAdvanced) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1000));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1000));
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(clock.Now(), absl::FromUnixMillis(1001500));
  clock.Advance(absl::ZeroDuration());
  EXPECT_EQ(clock.Now(), absl::FromUnixMillis(1001500));
  clock.Advance(absl::Seconds(-1));  // negative steps are allowed (tests of clock skew)
  EXPECT_EQ(clock.Now(), absl::FromUnixMillis(1000500));
}

TEST(FakeClock, Set_JumpsAnywhere) {
  FakeClock clock;
  clock.Set(absl::FromUnixSeconds(42));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(42));
  clock.Set(absl::FromUnixSeconds(7));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(7));
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(10));
}

TEST(FakeClock, UsableThroughClockInterface) {
  FakeClock fake(absl::FromUnixSeconds(5));
  const Clock& clock = fake;
  fake.Advance(absl::Seconds(1));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(6));
}

TEST(RealClock, Get_IsSingleton) { EXPECT_EQ(RealClock::Get(), RealClock::Get()); }

TEST(RealClock, NowIsCurrentAndNeverGoesBackwardsWhileSpinning) {
  const Clock* clock = RealClock::Get();
  absl::Time before = absl::Now();
  absl::Time first = clock->Now();
  EXPECT_GE(first, before);
  // After 2020 and within a minute of absl::Now().
  EXPECT_GT(first, absl::FromUnixSeconds(1577836800));
  EXPECT_LT(first - before, absl::Minutes(1));
  // Spin (no sleep) until the clock moves; it must move forward.
  absl::Time later = clock->Now();
  for (int i = 0; i < 100000000 && later == first; ++i) later = clock->Now();
  EXPECT_GT(later, first);
}

}  // namespace
}  // namespace tessera
