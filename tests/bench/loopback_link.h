// The loopback link a buddy restore crosses when both "nodes" are one machine, measured as the
// restore's baseline (tests/bench/run.sh figure 4m; peer_memory_benchmark.cc): plain TCP
// connections on 127.0.0.1 moving bytes from memory into a preallocated destination — the
// kernel's two copies and nothing else, the physical limit any reader over this link is held
// to.
//
// Optionally each receiver also hashes (XXH3-64, common/checksum.h) what arrived, up to 1 MiB a
// time, right after it arrived, as a reader that checks every byte it receives does
// (client/peer_fetch.h): the limit of such a reader on the same cores. Where the link is the
// CPUs' own copies (loopback on a small machine) the hash competes with them; on a NIC it
// overlaps the wire.
//
// Thread-safety: TimeLoopbackTransfer may run concurrently with itself (each call its own
// listener and threads).
#ifndef TESSERA_TESTS_BENCH_LOOPBACK_LINK_H_
#define TESSERA_TESTS_BENCH_LOOPBACK_LINK_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera {

struct LoopbackTransfer {
  // Connections, all at once, each with a sending and a receiving thread.
  int streams = 1;
  // What each connection carries.
  uint64_t bytes_per_stream = 0;
  // streams * bytes_per_stream bytes each: stream i sends the i-th part of `src` and receives
  // into the i-th part of `dst`.
  const char* src = nullptr;
  char* dst = nullptr;
  // Receivers hash what arrives (above).
  bool check = false;
};

struct LoopbackResult {
  // From the first connect to the last byte received.
  absl::Duration elapsed;
  // With `check`: the XXH3-64 of what each stream received, by stream; else empty.
  std::vector<uint64_t> xxh3;
};

// Moves every stream's bytes at once and times it.
// Errors: InvalidArgument if streams < 1, or src or dst is null while there are bytes to move;
// else the first error any stream met, after which the others are shut down: common/
// tcp_socket.h's (DeadlineExceeded once `timeout` has passed), or DataLoss for a connection
// that names no stream of this transfer or one already taken (another process's).
absl::StatusOr<LoopbackResult> TimeLoopbackTransfer(const LoopbackTransfer& transfer,
                                                    absl::Duration timeout = absl::Minutes(2));

}  // namespace tessera

#endif  // TESSERA_TESTS_BENCH_LOOPBACK_LINK_H_
