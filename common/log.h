// Minimal structured logging to stderr: one line per event,
//   2026-11-21T12:00:00.123Z I coordinator: registered agent job=demo rank=3
// Our Abseil (20220623) has no absl/log; this keeps the format in one place.
//
// Thread-safety: lines from concurrent threads never interleave.
#ifndef TESSERA_COMMON_LOG_H_
#define TESSERA_COMMON_LOG_H_

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera {

// kSilent, as InitLog's minimum level, logs nothing (millions of simulated schedules).
enum class LogLevel { kDebug, kInfo, kWarning, kError, kSilent };

// Sets the process's component name ("coordinator", "agent[3]") and the minimum level.
void InitLog(absl::string_view component, LogLevel min_level = LogLevel::kInfo);

void Log(LogLevel level, absl::string_view message);

template <typename... Args>
void LogInfo(const Args&... args) {
  Log(LogLevel::kInfo, absl::StrCat(args...));
}
template <typename... Args>
void LogWarning(const Args&... args) {
  Log(LogLevel::kWarning, absl::StrCat(args...));
}
template <typename... Args>
void LogError(const Args&... args) {
  Log(LogLevel::kError, absl::StrCat(args...));
}

}  // namespace tessera

#endif  // TESSERA_COMMON_LOG_H_
