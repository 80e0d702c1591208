// The planner's parallel passes: how many threads a pass over every shard, rank or key uses,
// and how the items are split into contiguous runs, one per thread, so that the first error
// and the result are those of a single thread going through every item in order. Shared by
// the planner's passes (validate.cc, encode.cc, FillDerived in planner.cc) and FingerprintPlans.
// Internal to server/plan/ (BUILD visibility).
//
// Thread-safety: pure functions; ForEachInRuns calls fn on several threads at once, one run
// each, so fn may write only what belongs to its run.
#ifndef TESSERA_SERVER_PLAN_PARALLEL_RUNS_H_
#define TESSERA_SERVER_PLAN_PARALLEL_RUNS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/threads.h"

namespace tessera {
namespace plan_internal {

// Passes over every shard (rule 1 with the ranks' fingerprints, and FingerprintPlans) run on
// several threads for plans of at least this many shards: they are bound by memory latency
// (a shard's fields live in separate allocations), and ranks are independent.
inline constexpr size_t kParallelShards = 1 << 16;
inline constexpr size_t kMaxPassThreads = 8;

// How many threads a pass over `shards` shards uses: `requested` (PlannerOptions.threads) if
// not 0, else one per core; at most kMaxPassThreads; one below kParallelShards.
inline size_t PassThreads(size_t shards, size_t requested = 0) {
  if (shards < kParallelShards) return 1;
  if (requested != 0) return std::min(requested, kMaxPassThreads);
  return std::clamp<size_t>(UsableCpus(), 1, kMaxPassThreads);
}

// Splits the items [0, n) into `parts` contiguous runs of about equal weight, where
// prefix[i] (n + 1 entries, prefix[0] = 0) is the weight of items [0, i). Run t is
// [runs[t], runs[t + 1]); runs may be empty.
inline std::vector<uint32_t> SplitRuns(const std::vector<size_t>& prefix, size_t parts) {
  const size_t total = prefix.back();
  std::vector<uint32_t> runs(parts + 1, static_cast<uint32_t>(prefix.size() - 1));
  for (size_t t = 0; t < parts; ++t) {
    const size_t weight = total / parts * t + total % parts * t / parts;  // total * t / parts
    runs[t] = static_cast<uint32_t>(std::lower_bound(prefix.begin(), prefix.end(), weight) -
                                    prefix.begin());
  }
  runs[0] = 0;
  return runs;
}

// Runs fn(t, item) for every item of every run (SplitRuns), each run in order on its own
// thread; a run stops at its first error. Returns the first run's error: runs are in item
// order, so it is the error one thread going through every item would meet first.
template <typename Fn>
absl::Status ForEachInRuns(const std::vector<uint32_t>& runs, const Fn& fn) {
  const size_t threads = runs.size() - 1;
  std::vector<absl::Status> errors(threads);
  RunOnThreads(threads, [&](size_t t) {
    for (uint32_t item = runs[t]; item < runs[t + 1] && errors[t].ok(); ++item) {
      errors[t] = fn(t, item);
    }
  });
  for (absl::Status& error : errors) {
    if (!error.ok()) return std::move(error);
  }
  return absl::OkStatus();
}

}  // namespace plan_internal
}  // namespace tessera

#endif  // TESSERA_SERVER_PLAN_PARALLEL_RUNS_H_
