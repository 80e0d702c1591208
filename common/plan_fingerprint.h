// Plan fingerprints: 64-bit XXH3 digests of a canonical encoding of local plans, shared by the
// coordinator (which caches validated global plans by them, server/plan/plan_cache.h) and the agent
// (which submits a fingerprint instead of its shards when its plan is unchanged,
// coordinator.proto SubmitLocalPlanRequest). Both sides compute the same number with this one
// function, so neither trusts a value the other computed differently.
//
// The encoding covers every field of every shard (independent of protobuf's wire format and
// field order); the order of shards within a plan matters, because assignments refer to shards
// by index. Equal fingerprints mean, up to a 2^-64 collision, equal plans.
//
// Thread-safety: the free functions are pure; a LocalPlanHasher is not thread-safe.
#ifndef TESSERA_COMMON_PLAN_FINGERPRINT_H_
#define TESSERA_COMMON_PLAN_FINGERPRINT_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/types/span.h"
#include "common/layout.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// The fingerprint of one rank's local plan, fed one shard at a time in submission order:
//   LocalPlanHasher h(rank, shards.size()); for (s : shards) h.Add(s); fp = h.Finish();
// `shards` must be the number of Add calls that follow.
class LocalPlanHasher {
 public:
  LocalPlanHasher(uint32_t rank, size_t shards);
  ~LocalPlanHasher();
  LocalPlanHasher(const LocalPlanHasher&) = delete;
  LocalPlanHasher& operator=(const LocalPlanHasher&) = delete;

  void Add(const v1::ShardDesc& shard);
  // The digest; call once, after the last Add. Errors: none.
  uint64_t Finish();

 private:
  class Encoder;
  std::unique_ptr<Encoder> encoder_;
};

// LocalPlanHasher over `shards`, in order. Errors: none.
template <typename Shards>
uint64_t FingerprintShards(uint32_t rank, const Shards& shards) {
  LocalPlanHasher hasher(rank, static_cast<size_t>(shards.size()));
  for (const v1::ShardDesc& shard : shards) hasher.Add(shard);
  return hasher.Finish();
}

// The global plan's fingerprint: the layout and each rank's local-plan fingerprint, in rank
// order. Errors: none.
uint64_t CombineFingerprints(const MeshLayout& layout, absl::Span<const uint64_t> per_rank);

}  // namespace tessera

#endif  // TESSERA_COMMON_PLAN_FINGERPRINT_H_
