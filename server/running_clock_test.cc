#include "server/running_clock.h"

#include "common/clock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(RunningClockTest, KeepsPaceWithTheWallWhileReadEveryStep) {
  FakeClock wall;
  RunningClock running(&wall, absl::Seconds(1));
  const absl::Time start = running.Now();
  for (int i = 0; i < 50; ++i) {
    wall.Advance(absl::Milliseconds(200));
    running.Now();
  }
  EXPECT_EQ(running.Now() - start, absl::Seconds(10));
  EXPECT_EQ(running.paused(), absl::ZeroDuration());
}

TEST(RunningClockTest, APauseCountsAsOneStep) {
  FakeClock wall;
  RunningClock running(&wall, absl::Seconds(1));
  const absl::Time start = running.Now();
  wall.Advance(absl::Seconds(13));  // SIGSTOP, a VM freeze: nobody read the clock
  EXPECT_EQ(running.Now() - start, absl::Seconds(1));
  EXPECT_EQ(running.paused(), absl::Seconds(12));
  wall.Advance(absl::Milliseconds(300));
  EXPECT_EQ(running.Now() - start, absl::Milliseconds(1300));
}

TEST(RunningClockTest, AWallClockGoingBackAdvancesNothingAndCountingResumesFromThere) {
  FakeClock wall;
  RunningClock running(&wall, absl::Seconds(1));
  const absl::Time start = running.Now();
  wall.Advance(-absl::Hours(1));
  EXPECT_EQ(running.Now(), start);
  wall.Advance(absl::Milliseconds(500));
  EXPECT_EQ(running.Now() - start, absl::Milliseconds(500));
}

}  // namespace
}  // namespace tessera
