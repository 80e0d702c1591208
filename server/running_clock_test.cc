#include "server/running_clock.h"

#include <atomic>
#include <thread>
#include <vector>

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

// Readers on several threads while the wall moves: running time never runs ahead of the wall
// (a reading that raced another's update could count a stretch twice).
TEST(RunningClockTest, ConcurrentReaders_NeverAheadOfTheWall) {
  FakeClock wall;
  RunningClock running(&wall, absl::Seconds(1));
  const absl::Time wall_start = wall.Now();
  const absl::Time start = running.Now();
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&] {
      while (!stop.load()) running.Now();
    });
  }
  for (int i = 0; i < 20000; ++i) {
    wall.Advance(absl::Microseconds(100));
    running.Now();
  }
  stop = true;
  for (std::thread& t : readers) t.join();
  EXPECT_LE(running.Now() - start, wall.Now() - wall_start);
  EXPECT_EQ(running.Now() - start, absl::Seconds(2)) << "every step was read, none twice";
}

}  // namespace
}  // namespace tessera
