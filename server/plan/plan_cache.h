// PlanCache: the last validated global plan of each job, looked up by the fingerprint of its
// local plans (fingerprint.h), so that a save whose local plans are unchanged skips the planner.
//
// Thread-safety: every method may be called concurrently (one mutex, held only for the map).
#ifndef TESSERA_SERVER_PLAN_PLAN_CACHE_H_
#define TESSERA_SERVER_PLAN_PLAN_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/plan/planner.h"

namespace tessera {

struct PlanCacheOptions {
  // Most jobs whose last plan is kept; inserting one more evicts the least recently used.
  // Default: 1024.
  size_t max_jobs = 1024;
};

// The last validated global plan of each job, so that a save whose local plans are unchanged
// (every save after the first, usually) skips validation. Plans are shared, immutable.
//
// Thread-safety: every method may be called concurrently.
class PlanCache {
 public:
  explicit PlanCache(PlanCacheOptions options = {});

  // The cached plan of `job_id` if its fingerprint equals `fingerprint`, else nullptr.
  // Errors: none.
  std::shared_ptr<const GlobalPlan> Lookup(absl::string_view job_id, uint64_t fingerprint);

  // Makes `plan` the cached plan of `job_id`, replacing any previous one. A null plan erases.
  // Errors: none.
  void Insert(absl::string_view job_id, std::shared_ptr<const GlobalPlan> plan);

  // Forgets `job_id`'s plan (e.g. when the job's layout changes or the job is deleted).
  // Errors: none.
  void Erase(absl::string_view job_id);

  // Jobs with a cached plan. Errors: none.
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<const GlobalPlan> plan;
    uint64_t last_used = 0;
  };

  const PlanCacheOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;  // LRU stamp, bumped on every use
};

}  // namespace tessera

#endif  // TESSERA_SERVER_PLAN_PLAN_CACHE_H_
