// ChunkLedger: what a session's agents reported against its global plan — the chunks written
// (with their file, offset and checksums) and the replicas' hashes — and what follows from it:
// whether every chunk is in, whether every replica matches its writer, and the manifest.
//
// Reports are idempotent: a chunk reported again (an agent re-sending after a restart or a
// lost reply) replaces the earlier entry and is counted once. Not persisted: after a restart
// the agents re-send (DESIGN.md "Save protocol").
//
// Thread-safety: none; owned by one session (session_machine.h).
#ifndef TESSERA_SERVER_SESSION_CHUNK_LEDGER_H_
#define TESSERA_SERVER_SESSION_CHUNK_LEDGER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/layout.h"
#include "server/plan/planner.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/manifest.pb.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

class ChunkLedger {
 public:
  // `plan` must not be null; its chunk_index must be filled (BuildGlobalPlan, FillDerived).
  // O(chunks) pointer copies: the plan's entries are read in place, and a chunk's reported
  // entry is made when it is reported (a cached plan's session starts without copying it).
  explicit ChunkLedger(std::shared_ptr<const GlobalPlan> plan);

  // Records a chunk `rank` wrote. Returns true if it was not reported before.
  // Errors: InvalidArgument if the chunk is not in the plan, is not `rank`'s to write, or its
  // size differs from the plan's (the message names the chunk, both ranks and sizes).
  absl::StatusOr<bool> RecordChunk(uint32_t rank, const v1::ChunkReport& report);
  // Records a replica's hash (of chunk hash.chunk(), or of its hash.range() slice).
  // Errors: none (a hash nobody asked for, a chunk index outside the plan included, is never
  // compared: the replica that should have sent it is reported missing).
  void RecordHash(uint32_t rank, const v1::ReplicaHash& hash);

  uint32_t chunks_total() const { return static_cast<uint32_t>(chunks_.size()); }
  uint32_t chunks_reported() const { return reported_; }
  bool complete() const { return reported_ == chunks_.size(); }

  // The first replica (in rank order, then assignment order) whose hash is missing or differs
  // from its writer's, as REPLICA_DIVERGED naming the tensor and both ranks with their
  // coordinates in `mesh`; an ErrorDetail with code UNSPECIFIED if all match. Call once
  // complete().
  v1::ErrorDetail CheckReplicas(const MeshLayout& mesh) const;

  // The manifest: the plan's tensors with every chunk as reported. Call once complete().
  v1::Manifest BuildManifest(const std::string& job_id, int64_t step,
                             const std::string& session_id, const v1::Layout& layout,
                             int64_t committed_unix_ms) const;

 private:
  struct Entry {
    const v1::ChunkEntry* planned = nullptr;   // in plan_->tensors
    const std::string* key = nullptr;          // its tensor's, in plan_->tensors
    std::unique_ptr<v1::ChunkEntry> reported;  // null until reported
    // The reported entry, or the planned one before that.
    const v1::ChunkEntry& entry() const { return reported != nullptr ? *reported : *planned; }
  };
  // What a replica hash covers: chunk `chunk` (its index in the plan), or the slice
  // [begin, end) of it when `ranged`.
  struct HashId {
    uint32_t chunk = 0;
    bool ranged = false;
    int64_t begin = 0, end = 0;
    bool operator==(const HashId& o) const {
      return chunk == o.chunk && ranged == o.ranged && begin == o.begin && end == o.end;
    }
    template <typename H>
    friend H AbslHashValue(H h, const HashId& id) {
      return H::combine(std::move(h), id.chunk, id.ranged, id.begin, id.end);
    }
  };
  static HashId HashIdOf(uint32_t chunk, bool ranged, const v1::FlatRange& range) {
    return ranged ? HashId{chunk, true, range.begin(), range.end()} : HashId{chunk};
  }

  std::shared_ptr<const GlobalPlan> plan_;
  // Index = the chunk's index in the plan (plan_->tensors in order, each tensor's chunks in
  // order: HashItem.chunk; plan_->chunk_index maps chunk reports to it).
  std::vector<Entry> chunks_;
  uint32_t reported_ = 0;
  // -> (rank, digest) of each replica that reported.
  absl::flat_hash_map<HashId, std::vector<std::pair<uint32_t, uint64_t>>> hashes_;
};

// Appends `rank` with its coordinates in `mesh` to the ranks `error` names.
void AddRankRef(const MeshLayout& mesh, uint32_t rank, v1::ErrorDetail* error);

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_CHUNK_LEDGER_H_
