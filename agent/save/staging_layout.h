// Where each byte of one rank's save lives in its staging region.
//
// The region starts with the body of the rank's data file (the safetensors data section,
// laid out by ComputeFileLayout, chunks 4 KiB-aligned), so the writer writes the file
// straight from staging. A shard this rank writes is staged in place inside its chunk; a
// distributed-optimizer slice from a peer is received in place too. Shards that are not
// written here — replicas that are only hashed, slices sent to a DP leader — follow the data
// section, each 4 KiB-aligned.
//
//   [ data section: chunk 0 | pad | chunk 1 (own slice | peer slices) | ... ][ hashed ][ sent ]
//
// Thread-safety: pure function over values.
#ifndef TESSERA_AGENT_SAVE_STAGING_LAYOUT_H_
#define TESSERA_AGENT_SAVE_STAGING_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "format/data_file.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// A byte range of the staging region.
struct StagingRange {
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

// A replica to hash (its bytes are at `range`), of the plan's chunk `chunk` (HashItem.chunk,
// reported back in ReplicaHash). `flat` is set for a replicated flat-range slice
// (HashItem.range), whose bytes may also be sent or written in place.
struct HashTask {
  uint32_t chunk = 0;
  StagingRange range;
  std::optional<v1::FlatRange> flat;
};

// A DP slice to send to its leader, or to receive from a peer, in place. A sent slice's key
// and box are its local shard's (GatherSend names only the shard).
struct SliceTask {
  std::string key;
  v1::Box box;
  int64_t begin = 0;  // element range of the box
  int64_t end = 0;
  uint32_t peer = 0;  // leader (send) or sender (receive)
  StagingRange range;
};

struct StagingLayout {
  std::optional<FileLayout> file;     // set if the rank writes a data file
  std::string file_name;              // RankAssignment.file
  uint64_t total_bytes = 0;           // size of the staging region (>= 1 page)
  std::vector<StagingRange> shards;   // index = local shard; nbytes 0: nothing to copy
  std::vector<HashTask> hashes;
  std::vector<SliceTask> sends;
  std::vector<SliceTask> recvs;
};

// Computes the layout of `rank`'s staging for `assignment`, given the shards the rank
// submitted (in submission order).
// Errors: InvalidArgument if the assignment refers to a shard index out of range, places a
// shard twice, gives a source whose size differs from its shard's, or leaves a shard that has
// bytes unplaced; errors of ComputeFileLayout.
absl::StatusOr<StagingLayout> ComputeStagingLayout(const v1::RankAssignment& assignment,
                                                   const google::protobuf::RepeatedPtrField<v1::ShardDesc>& shards,
                                                   uint32_t rank);

// The staging a rank needs for `tensors` tensors of `bytes` bytes in all, as far as it can
// tell before the global plan: each staged kDataAlignment-aligned, so at most
// bytes + tensors * (kDataAlignment - 1). A DP leader's region also receives its peers'
// optimizer slices, which only the plan says: ReserveStaging adds the trainer's estimate of
// them to `bytes` (client/staging_estimate.h); a save that needs more makes a larger region.
// Saturates at UINT64_MAX.
uint64_t StagingBytesBound(uint64_t bytes, uint64_t tensors);

// What ReserveStaging reserves for a trainer's declaration (agent.proto ReserveStagingRequest):
// StagingBytesBound of its own `bytes` plus `gather_bytes`, its estimate of the slices its DP
// peers send it, for `tensors` tensors. Saturates at UINT64_MAX.
// Errors: InvalidArgument if `bytes` is 0 (the trainer declared nothing).
absl::StatusOr<uint64_t> ReservedStagingBytes(uint64_t bytes, uint64_t gather_bytes,
                                              uint64_t tensors);

}  // namespace tessera

#endif  // TESSERA_AGENT_SAVE_STAGING_LAYOUT_H_
