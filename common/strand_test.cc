#include "common/strand.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(Strand, TasksRunInOrderNeverConcurrently) {
  ThreadPool pool(4);
  Strand strand(&pool);
  absl::Mutex mu;
  std::vector<int> order;
  std::atomic<int> running{0};
  std::atomic<bool> overlapped{false};
  absl::Notification done;
  for (int i = 0; i < 1000; ++i) {
    strand.Post([&, i] {
      if (running.fetch_add(1) != 0) overlapped = true;
      {
        absl::MutexLock lock(&mu);
        order.push_back(i);
      }
      running.fetch_sub(1);
      if (i == 999) done.Notify();
    });
  }
  done.WaitForNotification();
  EXPECT_FALSE(overlapped);
  absl::MutexLock lock(&mu);
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(order[i], i);
}

TEST(Strand, BlockedStrandDoesNotBlockAnother) {
  ThreadPool pool(2);
  Strand slow(&pool), fast(&pool);
  absl::Notification release, fast_ran;
  slow.Post([&] { release.WaitForNotification(); });
  fast.Post([&] { fast_ran.Notify(); });
  // The other strand's task runs while the first strand's task is still blocked.
  fast_ran.WaitForNotification();
  release.Notify();
}

TEST(Strand, TaskPostedFromATaskRunsAfterIt) {
  ThreadPool pool(2);
  Strand strand(&pool);
  std::vector<int> order;
  absl::Notification done;
  strand.Post([&] {
    strand.Post([&] {
      order.push_back(2);
      done.Notify();
    });
    order.push_back(1);
  });
  done.WaitForNotification();
  EXPECT_THAT(order, ::testing::ElementsAre(1, 2));
}

TEST(ThreadPool, DestructorRunsWhatWasPosted) {
  std::atomic<int> ran{0};
  auto pool = std::make_unique<ThreadPool>(1);
  Strand strand(pool.get());  // outlives the pool's threads: they finish its tasks first
  for (int i = 0; i < 100; ++i) strand.Post([&] { ran.fetch_add(1); });
  pool.reset();
  EXPECT_EQ(ran.load(), 100);
}

}  // namespace
}  // namespace tessera
