#include "common/program.h"

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

std::vector<char*> InitProgram(absl::string_view usage, int argc, char** argv) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "_main.cc");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  // Debian's Abseil is built with absl::Mutex's deadlock detection on: every Lock records its
  // edge in one global lock-order graph under a global lock, which at thousands of agents was
  // 3 % of the coordinator's CPU and serialized its threads. Programs turn it off; the tests
  // (gtest_main, not this) keep it, and clang's thread-safety analysis checks lock use at
  // build time.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace tessera
