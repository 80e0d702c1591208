#include "server/trainer_window.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(TrainerWindow, NoTrainerBlocked_ReturnsAtOnce) {
  TrainerWindow window;
  EXPECT_TRUE(window.AwaitClosed(absl::ZeroDuration(), absl::InfiniteDuration()));
  window.Set(true);
  window.Set(false);
  EXPECT_TRUE(window.AwaitClosed(absl::ZeroDuration(), absl::InfiniteDuration()));
}

// Disk work waits (after its grace) while the trainers are in a save, and starts once they
// resume.
TEST(TrainerWindow, TrainersBlocked_WaitsUntilTheyResume) {
  TrainerWindow window;
  window.Set(true);
  bool closed = false;
  absl::Notification returned;
  std::thread janitor([&] {
    closed = window.AwaitClosed(absl::Milliseconds(1), absl::InfiniteDuration());
    returned.Notify();
  });
  window.AwaitWaitersForTesting(1);
  EXPECT_FALSE(returned.HasBeenNotified());
  window.Set(false);
  returned.WaitForNotification();
  janitor.join();
  EXPECT_TRUE(closed);
}

// A trainer that died mid-save keeps the window open until its session's deadline: the disk
// work goes ahead after max_wait.
TEST(TrainerWindow, TrainersStayBlocked_GivesUpAtMaxWait) {
  TrainerWindow window;
  window.Set(true);
  EXPECT_FALSE(window.AwaitClosed(absl::ZeroDuration(), absl::Milliseconds(1)));
}

TEST(TrainerWindow, Release_EndsWaitsAndLetsLaterOnesThrough) {
  TrainerWindow window;
  window.Set(true);
  bool closed = true;
  std::thread janitor([&] { closed = window.AwaitClosed(absl::ZeroDuration(), absl::InfiniteDuration()); });
  window.AwaitWaitersForTesting(1);
  window.Release();
  janitor.join();
  EXPECT_FALSE(closed);
  EXPECT_FALSE(window.AwaitClosed(absl::Hours(1), absl::InfiniteDuration()));  // no grace either
}

}  // namespace
}  // namespace tessera
