#include "common/log.h"

#include <cstdio>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tessera {
namespace {

absl::Mutex log_mu(absl::kConstInit);
std::string* component ABSL_GUARDED_BY(log_mu) = nullptr;
LogLevel min_level ABSL_GUARDED_BY(log_mu) = LogLevel::kInfo;

char LevelChar(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kWarning:
      return 'W';
    case LogLevel::kError:
      return 'E';
    case LogLevel::kSilent:
      break;
  }
  return '?';
}

}  // namespace

void InitLog(absl::string_view name, LogLevel level) {
  absl::MutexLock lock(&log_mu);
  delete component;
  component = new std::string(name);
  min_level = level;
}

void Log(LogLevel level, absl::string_view message) {
  const std::string when =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  absl::MutexLock lock(&log_mu);
  if (level < min_level) return;
  std::fprintf(stderr, "%s %c %s: %.*s\n", when.c_str(), LevelChar(level),
               component == nullptr ? "tessera" : component->c_str(),
               static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
}

}  // namespace tessera
