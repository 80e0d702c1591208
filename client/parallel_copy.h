// Host memcpy of many buffers, split across threads when the total is large: one core's
// memcpy runs well below a socket's memory bandwidth, and the trainer is blocked while it runs.
//
// Thread-safety: a pure function; the caller owns the buffers, which must not overlap.
#ifndef TESSERA_CLIENT_PARALLEL_COPY_H_
#define TESSERA_CLIENT_PARALLEL_COPY_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace tessera {

// Copy `size` bytes from `src` to `dst`.
struct CopyItem {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t size = 0;
};

// Copies every item. When the bytes in all items exceed `parallel_min_bytes` and `max_threads`
// is above 1, the bytes (concatenated in item order) are cut into `max_threads` equal runs,
// splitting items where needed, and each run is copied by its own thread (the calling thread
// takes the first). Returns the number of threads that copied (1 for a serial copy, 0 when
// there was nothing to copy). Errors: none.
int ParallelCopy(absl::Span<const CopyItem> items, int max_threads, uint64_t parallel_min_bytes);

// The CPUs this process may run on (sched_getaffinity; std::thread::hardware_concurrency if
// that fails), at least 1. More copy threads than this only take turns on the same cores: a
// copy is memory-bound, and on a 2-core machine 4 threads copy slower than 2.
int UsableCpus();

}  // namespace tessera

#endif  // TESSERA_CLIENT_PARALLEL_COPY_H_
