#include "server/plan/plan_cache.h"

#include <algorithm>
#include <utility>

namespace tessera {

PlanCache::PlanCache(PlanCacheOptions options) : options_(options) {}

std::shared_ptr<const GlobalPlan> PlanCache::Lookup(absl::string_view job_id,
                                                    uint64_t fingerprint) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(job_id);
  if (it == entries_.end() || it->second.plan->fingerprint != fingerprint) return nullptr;
  it->second.last_used = ++clock_;
  return it->second.plan;
}

void PlanCache::Insert(absl::string_view job_id, std::shared_ptr<const GlobalPlan> plan) {
  if (plan == nullptr) {
    Erase(job_id);
    return;
  }
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(job_id);
  if (it == entries_.end() && entries_.size() >= std::max<size_t>(options_.max_jobs, 1)) {
    // O(jobs) eviction; the cache is small and inserts happen once per changed plan.
    auto victim = entries_.begin();
    for (auto e = entries_.begin(); e != entries_.end(); ++e) {
      if (e->second.last_used < victim->second.last_used) victim = e;
    }
    entries_.erase(victim);
  }
  Entry& entry = entries_[job_id];
  entry.plan = std::move(plan);
  entry.last_used = ++clock_;
}

void PlanCache::Erase(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  entries_.erase(job_id);
}

size_t PlanCache::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace tessera
