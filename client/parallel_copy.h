// Host memcpy of many buffers, split across threads when the total is large: one core's
// memcpy runs well below a socket's memory bandwidth, and the trainer is blocked while it runs.
//
// Thread-safety: a pure function; the caller owns the buffers, which must not overlap.
#ifndef TESSERA_CLIENT_PARALLEL_COPY_H_
#define TESSERA_CLIENT_PARALLEL_COPY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

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

// The runs ParallelCopy gives its threads: the items' bytes, concatenated in item order, cut
// into at most `max_threads` runs of equal size (the last may be shorter; none is empty),
// items split where a run ends. One run of the items as they are when the bytes do not exceed
// `parallel_min_bytes` or `max_threads` is 1 or less; none when there are no bytes. Items of
// size 0 are left out.
std::vector<std::vector<CopyItem>> SplitIntoRuns(absl::Span<const CopyItem> items, int max_threads,
                                                 uint64_t parallel_min_bytes);

// Runs `copy_run(run)` for every run, the first on the calling thread and each other on its
// own thread, and returns when all have returned. Returns the number of runs.
int RunInParallel(const std::vector<std::vector<CopyItem>>& runs,
                  const std::function<void(const std::vector<CopyItem>&)>& copy_run);

}  // namespace tessera

#endif  // TESSERA_CLIENT_PARALLEL_COPY_H_
