// Fingerprints of local plans: the key by which a job's validated global plan is cached
// (plan_cache.h, DESIGN.md "Plan caching"). Both are built on common/plan_fingerprint.h, the
// encoding the agents use for the fingerprint they submit instead of an unchanged plan.
//
// Thread-safety: pure functions. FingerprintPlans hashes plans of 65,536 shards or more on up
// to 8 threads of its own, one per core (parallel_runs.h).
#ifndef TESSERA_SERVER_PLAN_FINGERPRINT_H_
#define TESSERA_SERVER_PLAN_FINGERPRINT_H_

#include <cstdint>
#include <vector>

#include "common/layout.h"
#include "common/plan_fingerprint.h"
#include "server/plan/planner.h"

namespace tessera {

// A 64-bit XXH3 fingerprint of the layout and the local plans, over a canonical encoding of
// every field (independent of protobuf's wire format). Plans are taken in rank order whatever
// their order in `plans`; the order of shards within a plan matters (assignments refer to
// shards by index). Equal fingerprints mean, up to a 2^-64 collision, an identical global plan.
// Equals CombineFingerprints(layout, {FingerprintLocalPlan(plan) in rank order}); plans of
// 65,536 shards or more are hashed on up to 8 threads.
// Errors: none.
uint64_t FingerprintPlans(const MeshLayout& layout, const std::vector<LocalPlan>& plans);

// The fingerprint of one rank's local plan (its rank and its shards, in order). A coordinator
// computes it when the plan arrives, so that at save time the job's fingerprint is
// CombineFingerprints over one number per rank — microseconds instead of a pass over every
// shard. Errors: none.
uint64_t FingerprintLocalPlan(const LocalPlan& plan);

}  // namespace tessera

#endif  // TESSERA_SERVER_PLAN_FINGERPRINT_H_
