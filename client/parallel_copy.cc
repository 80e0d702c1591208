#include "client/parallel_copy.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "common/threads.h"

namespace tessera {
namespace {

void CopyAll(const std::vector<CopyItem>& items) {
  for (const CopyItem& item : items) std::memcpy(item.dst, item.src, item.size);
}

}  // namespace

std::vector<std::vector<CopyItem>> SplitIntoRuns(absl::Span<const CopyItem> items, int max_threads,
                                                 uint64_t parallel_min_bytes) {
  uint64_t total = 0;
  for (const CopyItem& item : items) total += item.size;
  std::vector<std::vector<CopyItem>> runs;
  if (total == 0) return runs;
  if (max_threads <= 1 || total <= parallel_min_bytes) {
    runs.emplace_back();
    for (const CopyItem& item : items) {
      if (item.size > 0) runs.back().push_back(item);
    }
    return runs;
  }
  // Cut the concatenated bytes into `threads` runs of `share` bytes (the last may be short).
  const int threads = static_cast<int>(std::min<uint64_t>(max_threads, total));
  const uint64_t share = (total + threads - 1) / threads;
  runs.resize(threads);
  int run = 0;
  uint64_t room = share;  // bytes left in the current run
  for (const CopyItem& item : items) {
    size_t done = 0;
    while (done < item.size) {
      if (room == 0) {
        ++run;
        room = share;
      }
      const size_t n = static_cast<size_t>(std::min<uint64_t>(room, item.size - done));
      runs[run].push_back(CopyItem{static_cast<char*>(item.dst) + done,
                                   static_cast<const char*>(item.src) + done, n});
      done += n;
      room -= n;
    }
  }
  runs.resize(run + 1);  // runs past `run` stayed empty (tiny totals)
  return runs;
}

int RunInParallel(const std::vector<std::vector<CopyItem>>& runs,
                  const std::function<void(const std::vector<CopyItem>&)>& copy_run) {
  RunOnThreads(runs.size(), [&](size_t t) { copy_run(runs[t]); });
  return static_cast<int>(runs.size());
}

int ParallelCopy(absl::Span<const CopyItem> items, int max_threads, uint64_t parallel_min_bytes) {
  return RunInParallel(SplitIntoRuns(items, max_threads, parallel_min_bytes), CopyAll);
}

}  // namespace tessera
