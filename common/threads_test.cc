#include "common/threads.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(RunOnThreadsTest, EveryPartOnceEachOnItsOwnThreadTheFirstOnTheCallers) {
  constexpr size_t kThreads = 5;
  std::vector<std::thread::id> ran_on(kThreads);
  std::vector<int> runs(kThreads, 0);
  RunOnThreads(kThreads, [&](size_t t) {
    ran_on[t] = std::this_thread::get_id();
    ++runs[t];  // each t is written by one thread only
  });
  EXPECT_EQ(runs, std::vector<int>(kThreads, 1));
  EXPECT_EQ(ran_on[0], std::this_thread::get_id());
  EXPECT_EQ(std::set<std::thread::id>(ran_on.begin(), ran_on.end()).size(), kThreads);
}

TEST(RunOnThreadsTest, ZeroThreads_RunsNothing) {
  std::atomic<int> calls{0};
  RunOnThreads(0, [&](size_t) { ++calls; });
  EXPECT_EQ(calls.load(), 0);
}

TEST(UsableCpusTest, AtLeastOneAtMostTheMachines) {
  const int cpus = UsableCpus();
  EXPECT_GE(cpus, 1);
  const unsigned machine = std::thread::hardware_concurrency();
  if (machine > 0) {
    EXPECT_LE(cpus, static_cast<int>(machine));
  }
}

}  // namespace
}  // namespace tessera
