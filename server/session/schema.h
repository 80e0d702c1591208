// The coordinator's store schema for jobs and sessions: every key and record encoding in one
// place (tables in server/store/state_store.h, messages in coordinator_state.proto).
//
//   table        key                         value
//   jobs         job_id                      JobRecord
//   sessions     (job_id, session_id)        SessionRecord
//   plans        (job_id, fingerprint)       PlanRecord (only the job's latest plan)
//   registry     (job_id, session_id)        Manifest of a COMMITTING session
//   checkpoints  (job_id, step)              CheckpointInfo of a committed checkpoint
//   memory_checkpoints  job_id               MemoryCheckpointRecord: the job's memory-only
//                                            commit, while it is the newest commit
//   meta         "epoch"                     the coordinator's epoch (decimal)
//   meta         "peer_key"                  the coordinator's key for the jobs' peer secrets
//                                            (kPeerSecretBytes raw bytes; common/peer_auth.h)
//
// Writers add to a StoreBatch; the caller commits the batch as one synced write. Readers
// return DataLoss naming the record if it does not parse.
//
// Thread-safety: free functions; the store is thread-safe.
#ifndef TESSERA_SERVER_SESSION_SCHEMA_H_
#define TESSERA_SERVER_SESSION_SCHEMA_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/plan/planner.h"
#include "server/store/state_store.h"
#include "tessera/v1/admin.pb.h"
#include "tessera/v1/coordinator_state.pb.h"
#include "tessera/v1/manifest.pb.h"

namespace tessera {

void PutJob(StoreBatch& batch, const v1::JobRecord& job);
void PutSession(StoreBatch& batch, const v1::SessionRecord& session);
// Replaces the job's stored plan with `plan`.
void PutPlan(StoreBatch& batch, const std::string& job_id, const GlobalPlan& plan);
void PutManifest(StoreBatch& batch, const v1::Manifest& manifest);
void DeleteManifest(StoreBatch& batch, const std::string& job_id, const std::string& session_id);
void PutCheckpoint(StoreBatch& batch, const std::string& job_id, const v1::CheckpointInfo& info);
void DeleteCheckpoint(StoreBatch& batch, const std::string& job_id, int64_t step);
void PutMemoryCheckpoint(StoreBatch& batch, const std::string& job_id,
                         const v1::MemoryCheckpointRecord& record);
void DeleteMemoryCheckpoint(StoreBatch& batch, const std::string& job_id);

// Every job record. Errors: the store's; DataLoss if one does not parse.
absl::StatusOr<std::vector<v1::JobRecord>> ReadJobs(const StateStore& store);
// The job's record, nullopt if it has none. Errors as ReadJobs.
absl::StatusOr<std::optional<v1::JobRecord>> ReadJob(const StateStore& store,
                                                     const std::string& job_id);
// A session record, nullopt if it has none. Errors as ReadJobs.
absl::StatusOr<std::optional<v1::SessionRecord>> ReadSession(const StateStore& store,
                                                             const std::string& job_id,
                                                             const std::string& session_id);
// The job's stored plan of `fingerprint`, with its peers filled in.
// Errors: DataLoss if it is missing or does not parse; the store's.
absl::StatusOr<std::shared_ptr<const GlobalPlan>> ReadPlan(const StateStore& store,
                                                           const std::string& job_id,
                                                           uint64_t fingerprint);
// The manifest of a COMMITTING session. Errors: DataLoss if missing or corrupt; the store's.
absl::StatusOr<std::shared_ptr<const v1::Manifest>> ReadStoredManifest(
    const StateStore& store, const std::string& job_id, const std::string& session_id);
// The job's committed checkpoints, newest first. Errors as ReadJobs.
absl::StatusOr<std::vector<v1::CheckpointInfo>> ReadCheckpoints(const StateStore& store,
                                                                const std::string& job_id);

// The job's memory-only commit, nullopt if it has none. Errors as ReadJobs.
absl::StatusOr<std::optional<v1::MemoryCheckpointRecord>> ReadMemoryCheckpoint(
    const StateStore& store, const std::string& job_id);

// Raises the stored epoch by one (one synced write) and returns it: call once per coordinator
// start. The first start gets 1. Errors: the store's; DataLoss if the record is corrupt.
absl::StatusOr<uint64_t> NextEpoch(StateStore& store);

// The coordinator's key for its jobs' peer secrets (common/peer_auth.h JobPeerSecret): the
// stored one, else a new random one, stored (one synced write) before it is returned — so a
// restarted coordinator hands every job the secret its agents already hold.
// Errors: the store's; DataLoss if the stored key is not kPeerSecretBytes long; Internal if no
// random bytes can be drawn.
absl::StatusOr<std::string> PeerKey(StateStore& store);

// The sequence number of the `n`-th command (n >= 1) a coordinator of `epoch` emits for a
// job: above every number an earlier epoch emitted, as long as each emits fewer than 2^40.
uint64_t CommandSeq(uint64_t epoch, uint64_t n);

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_SCHEMA_H_
