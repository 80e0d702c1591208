// The deterministic simulation (sim_world.h) inside ./tests/run.sh: many seeded schedules of
// the real session core and agent core under random faults, with the invariants checked after
// every event; and one seed per bug of issue 11 that exercises it. A failing seed prints its
// event trace (it replays exactly: `bazel run //tests/sim:tessera-sim -- --seed=N --trace`).
//
// TESSERA_SIM_SCHEDULES sets how many schedules this test runs (default below); the test is
// sharded, each shard running its share.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "gtest/gtest.h"
#include "tests/sim/sim_world.h"

namespace tessera::sim {
namespace {

constexpr uint64_t kDefaultSchedules = 100000;

uint64_t EnvOr(const char* name, uint64_t fallback) {
  uint64_t v = 0;
  const char* raw = std::getenv(name);
  return raw != nullptr && absl::SimpleAtoi(raw, &v) ? v : fallback;
}

// Runs `config` and fails the test with the schedule's trace if an invariant broke.
void ExpectHolds(SimConfig config) {
  SimResult result = RunSchedule(config);
  if (!result.ok) {
    config.trace = true;
    SimResult traced = RunSchedule(config);
    const size_t keep = 400;
    const size_t from = traced.trace.size() > keep ? traced.trace.size() - keep : 0;
    FAIL() << result.failure << "\nlast events of the replay:\n"
           << absl::StrJoin(traced.trace.begin() + from, traced.trace.end(), "\n");
  }
}

class Sim : public ::testing::Test {
 protected:
  void SetUp() override { InitLog("sim", LogLevel::kError); }
};

TEST_F(Sim, RandomSchedules_InvariantsHold) {
  const uint64_t total = EnvOr("TESSERA_SIM_SCHEDULES", kDefaultSchedules);
  const uint64_t shards = EnvOr("TEST_TOTAL_SHARDS", 1);
  const uint64_t shard = EnvOr("TEST_SHARD_INDEX", 0);
  const absl::Time start = absl::Now();
  uint64_t ran = 0, events = 0;
  int committed = 0, aborted = 0;
  for (uint64_t seed = 1 + shard; seed <= total; seed += shards) {
    SimConfig config;
    config.seed = seed;
    config.faults = seed % 10 == 0 ? 2 : 1;  // one schedule in ten is heavy
    SimResult result = RunSchedule(config);
    ++ran;
    events += result.events;
    committed += result.committed;
    aborted += result.aborted;
    if (!result.ok) {
      ExpectHolds(config);
      return;
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("sim: %llu schedules (%llu events, %d saves committed, %d not) in %.1f s: "
              "%.0f schedules/s\n",
              static_cast<unsigned long long>(ran), static_cast<unsigned long long>(events),
              committed, aborted, seconds, ran / seconds);
  // The faults must leave room for saves to commit, or the invariants say little.
  EXPECT_GT(committed, aborted);
}

}  // namespace
}  // namespace tessera::sim
