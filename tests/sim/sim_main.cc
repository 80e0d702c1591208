// tessera-sim: the deterministic simulation (sim_world.h) for long runs and replays.
//
//   tessera-sim --schedules=10000000            run that many seeds, print schedules/s
//   tessera-sim --seed=1234 --trace             replay one schedule with its event trace
#include <cstdint>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "tests/sim/sim_world.h"

ABSL_FLAG(uint64_t, schedules, 100000, "how many seeds to run (from --first_seed)");
ABSL_FLAG(uint64_t, first_seed, 1, "the first seed");
ABSL_FLAG(uint64_t, seed, 0, "run only this seed");
ABSL_FLAG(bool, trace, false, "print the event trace of --seed");
ABSL_FLAG(int, faults, -1, "fault intensity 0..2 (default: 2 for every tenth seed, else 1)");
ABSL_FLAG(uint64_t, report_every, 100000, "print progress every N schedules");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  tessera::InitLog("sim", tessera::LogLevel::kSilent);
  auto config_for = [](uint64_t seed) {
    tessera::sim::SimConfig config;
    config.seed = seed;
    const int faults = absl::GetFlag(FLAGS_faults);
    config.faults = faults >= 0 ? faults : (seed % 10 == 0 ? 2 : 1);
    return config;
  };
  if (const uint64_t seed = absl::GetFlag(FLAGS_seed); seed != 0) {
    tessera::sim::SimConfig config = config_for(seed);
    config.trace = absl::GetFlag(FLAGS_trace);
    tessera::sim::SimResult result = tessera::sim::RunSchedule(config);
    for (const std::string& line : result.trace) std::printf("%s\n", line.c_str());
    std::printf("seed %llu: %s (%llu events, %d committed, %d not)\n",
                static_cast<unsigned long long>(seed), result.ok ? "ok" : result.failure.c_str(),
                static_cast<unsigned long long>(result.events), result.committed,
                result.aborted);
    return result.ok ? 0 : 1;
  }
  const uint64_t first = absl::GetFlag(FLAGS_first_seed);
  const uint64_t n = absl::GetFlag(FLAGS_schedules);
  const absl::Time start = absl::Now();
  uint64_t failures = 0, events = 0;
  double simulated = 0;
  for (uint64_t i = 0; i < n; ++i) {
    tessera::sim::SimResult result = tessera::sim::RunSchedule(config_for(first + i));
    events += result.events;
    simulated += absl::ToDoubleSeconds(result.simulated);
    if (!result.ok) {
      ++failures;
      std::printf("FAIL %s\n", result.failure.c_str());
    }
    if ((i + 1) % absl::GetFlag(FLAGS_report_every) == 0 || i + 1 == n) {
      const double s = absl::ToDoubleSeconds(absl::Now() - start);
      std::printf("%llu schedules, %llu failed, %.1f s, %.0f schedules/s, %.0f events and "
                  "%.1f simulated seconds per schedule\n",
                  static_cast<unsigned long long>(i + 1),
                  static_cast<unsigned long long>(failures), s, (i + 1) / s,
                  static_cast<double>(events) / (i + 1), simulated / (i + 1));
      std::fflush(stdout);
    }
  }
  return failures == 0 ? 0 : 1;
}
