#include "client/cli/format_util.h"

#include <cinttypes>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tessera {
namespace cli {

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  // 1023.96 KiB would print as "1024.0 KiB"; move it to the next unit instead.
  if (value >= 1023.95 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string HumanDuration(absl::Duration d) {
  if (d < absl::ZeroDuration()) return absl::StrCat("-", HumanDuration(-d));
  if (d == absl::ZeroDuration()) return "0s";
  if (d < absl::Milliseconds(1)) {
    return absl::StrCat(absl::ToInt64Microseconds(d), "us");
  }
  if (d < absl::Seconds(1)) return absl::StrCat(absl::ToInt64Milliseconds(d), "ms");
  if (d < absl::Minutes(1)) {
    // Truncate, so 59.99s never prints as "60.0s".
    int64_t tenths = absl::ToInt64Milliseconds(d) / 100;
    return absl::StrFormat("%d.%ds", tenths / 10, tenths % 10);
  }
  int64_t seconds = absl::ToInt64Seconds(d);
  if (d < absl::Hours(1)) return absl::StrFormat("%dm%02ds", seconds / 60, seconds % 60);
  int64_t minutes = seconds / 60;
  return absl::StrFormat("%dh%02dm", minutes / 60, minutes % 60);
}

std::string FormatUnixMs(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%SZ", absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

namespace {

// floor(done * scale / total) without overflow for any uint64 inputs; total > 0.
uint64_t Scaled(uint64_t done, uint64_t total, uint64_t scale) {
  if (done >= total) return scale;
  return static_cast<uint64_t>(static_cast<unsigned __int128>(done) * scale / total);
}

}  // namespace

std::string FormatPercent(uint64_t done, uint64_t total) {
  if (total == 0) return "0%";
  return absl::StrCat(Scaled(done, total, 100), "%");
}

std::string ProgressBar(uint64_t done, uint64_t total, int width) {
  if (width < 1) width = 1;
  uint64_t filled = total == 0 ? 0 : Scaled(done, total, static_cast<uint64_t>(width));
  std::string bar = "[";
  bar.append(filled, '#');
  bar.append(static_cast<size_t>(width) - filled, '-');
  bar.push_back(']');
  return bar;
}

std::string FormatShape(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string StateName(v1::SessionState state) {
  if (state == v1::SESSION_STATE_UNSPECIFIED) return "-";
  const std::string& name = v1::SessionState_Name(state);
  if (name.empty()) return absl::StrCat(static_cast<int>(state));
  constexpr absl::string_view kPrefix = "SESSION_STATE_";
  return absl::StartsWith(name, kPrefix) ? name.substr(kPrefix.size()) : name;
}

std::string KindName(v1::ShardKind kind) {
  if (kind == v1::SHARD_KIND_UNSPECIFIED) return "-";
  const std::string& name = v1::ShardKind_Name(kind);
  if (name.empty()) return absl::StrCat(static_cast<int>(kind));
  constexpr absl::string_view kPrefix = "SHARD_KIND_";
  std::string out = absl::StartsWith(name, kPrefix) ? name.substr(kPrefix.size()) : name;
  absl::AsciiStrToLower(&out);
  return out;
}

}  // namespace cli
}  // namespace tessera
