// Human-readable formatting for the `tessera` CLI: byte counts, durations, timestamps, shapes,
// enum names and a textual progress bar. Pure functions, so every table and display the CLI
// prints formats numbers the same way.
//
// Thread-safety: free functions, no shared state.
#ifndef TESSERA_CLIENT_CLI_FORMAT_UTIL_H_
#define TESSERA_CLIENT_CLI_FORMAT_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "tessera/v1/types.pb.h"

namespace tessera {
namespace cli {

// Binary units with one decimal above 1 KiB: "0 B", "512 B", "1.0 KiB", "1.5 GiB".
std::string FormatBytes(uint64_t bytes);

// Compact durations: "0s" for zero, "850us", "12ms", "1.2s", "2m05s", "3h07m". Negative
// durations get a leading '-'.
std::string HumanDuration(absl::Duration d);

// UTC wall-clock time "2026-11-21 12:00:00Z" of a Unix time in milliseconds; "-" for 0
// (the protos' "not set").
std::string FormatUnixMs(int64_t unix_ms);

// "52%" of done/total, rounded down (so 100% means done); "0%" when total is 0.
std::string FormatPercent(uint64_t done, uint64_t total);

// "[########------------]" of `width` cells (at least 1) between the brackets, filled in
// proportion to done/total (rounded down; empty when total is 0; full when done >= total > 0).
std::string ProgressBar(uint64_t done, uint64_t total, int width);

// "[8, 12]"; "[]" for a 0-d tensor.
std::string FormatShape(absl::Span<const int64_t> shape);

// "PERSISTING" for SESSION_STATE_PERSISTING; "-" for UNSPECIFIED; the number if unknown.
std::string StateName(v1::SessionState state);

// "param", "optimizer", "extra"; "-" for UNSPECIFIED.
std::string KindName(v1::ShardKind kind);

}  // namespace cli
}  // namespace tessera

#endif  // TESSERA_CLIENT_CLI_FORMAT_UTIL_H_
