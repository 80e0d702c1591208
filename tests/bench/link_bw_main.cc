// tessera-link-bw: the loopback link's bandwidth, the baseline of figure 4m's buddy restore
// (tests/bench/run.sh; tests/bench/loopback_link.h says what is measured). Prints one JSON
// object: {"streams", "bytes" (all streams'), "seconds" (the best of --repeats), "bytes_per_s",
// "checked"}.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "common/program.h"
#include "tests/bench/loopback_link.h"

ABSL_FLAG(int32_t, streams, 2, "connections at once");
ABSL_FLAG(int32_t, mib, 256, "MiB each connection carries");
ABSL_FLAG(int32_t, repeats, 3, "transfers; the fastest is printed");
ABSL_FLAG(bool, check, false,
          "receivers hash what arrives, up to 1 MiB a time, as a reader that checks every byte");

int main(int argc, char** argv) {
  tessera::InitProgram("Measures loopback TCP bandwidth (figure 4m's link baseline).", argc, argv);
  const int streams = absl::GetFlag(FLAGS_streams);
  const int mib = absl::GetFlag(FLAGS_mib);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (streams < 1 || mib < 1 || repeats < 1) {
    std::fprintf(stderr, "tessera-link-bw: --streams, --mib and --repeats must be at least 1\n");
    return 2;
  }
  constexpr int kMostStreams = 1024;
  constexpr int kMostMib = 1 << 20;  // 1 TiB a stream
  if (streams > kMostStreams || mib > kMostMib) {
    std::fprintf(stderr, "tessera-link-bw: --streams is at most %d and --mib at most %d\n",
                 kMostStreams, kMostMib);
    return 2;
  }
  const uint64_t per_stream = static_cast<uint64_t>(mib) << 20;
  const uint64_t total = per_stream * static_cast<uint64_t>(streams);
  // Both in memory and faulted in (written once each), as a holder's copy and a restored
  // model's tensors are.
  std::unique_ptr<char[]> src(new char[total]);
  auto dst = std::make_unique<char[]>(total);  // zero-filled
  std::memset(src.get(), 0x5a, total);
  tessera::LoopbackTransfer transfer;
  transfer.streams = streams;
  transfer.bytes_per_stream = per_stream;
  transfer.src = src.get();
  transfer.dst = dst.get();
  transfer.check = absl::GetFlag(FLAGS_check);
  absl::Duration best = absl::InfiniteDuration();
  for (int i = 0; i < repeats; ++i) {
    absl::StatusOr<tessera::LoopbackResult> took = tessera::TimeLoopbackTransfer(transfer);
    if (!took.ok()) {
      std::fprintf(stderr, "tessera-link-bw: %s\n", took.status().ToString().c_str());
      return 1;
    }
    best = std::min(best, took->elapsed);
  }
  const double seconds = absl::ToDoubleSeconds(best);
  std::printf(
      "{\"streams\": %d, \"bytes\": %llu, \"seconds\": %.9f, \"bytes_per_s\": %.1f, "
      "\"checked\": %s}\n",
      streams, static_cast<unsigned long long>(total), seconds,
      static_cast<double>(total) / seconds, transfer.check ? "true" : "false");
  return 0;
}
