#include "server/plan/fingerprint.h"

#include <algorithm>
#include <vector>

#include "common/threads.h"
#include "server/plan/parallel_runs.h"

namespace tessera {

using plan_internal::PassThreads;

uint64_t FingerprintLocalPlan(const LocalPlan& plan) {
  return FingerprintShards(plan.rank, plan.shards);
}

uint64_t FingerprintPlans(const MeshLayout& layout, const std::vector<LocalPlan>& plans) {
  std::vector<const LocalPlan*> ordered;
  ordered.reserve(plans.size());
  size_t shards = 0;
  for (const LocalPlan& plan : plans) {
    ordered.push_back(&plan);
    shards += plan.shards.size();
  }
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const LocalPlan* a, const LocalPlan* b) { return a->rank < b->rank; });
  std::vector<uint64_t> per_rank(ordered.size());
  const size_t threads = PassThreads(shards);
  RunOnThreads(threads, [&](size_t first) {
    for (size_t i = first; i < ordered.size(); i += threads) {
      per_rank[i] = FingerprintLocalPlan(*ordered[i]);
    }
  });
  return CombineFingerprints(layout, per_rank);
}

}  // namespace tessera
