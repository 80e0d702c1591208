// The memory and storage work of a save session (agent/save/save_effects.h's work items), as free
// functions over interfaces — Storage, PeerTransport, staging memory as a pointer — so the
// agent's shell (SaveExecutor) and a simulation of the protocol run the very same code.
//
//   PIN      PrepareStaging   the memory fits the layout; the data file's padding is zeroed
//   GATHER   GatherSlices     replicas hashed, DP slices exchanged with peers
//   PERSIST  WriteShards      the data file written from staging, its chunks described
//   COMMIT   ResolveAndRetain the commit resolved from the disk, then retention
//   ABORT    RemoveSessionDir the temporary directory this rank wrote into removed
//
// None of them checks paths or leases: the core (agent/save/save_core.h, R4 and R5) decided that
// before it asked for the work.
//
// Thread-safety: free functions; each may run concurrently with the others for different
// sessions (Storage and PeerTransport are thread-safe). The staging memory must not change
// while a function reads it.
#ifndef TESSERA_AGENT_SAVE_SAVE_WORK_H_
#define TESSERA_AGENT_SAVE_SAVE_WORK_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/peer/peer_transport.h"
#include "agent/save/save_effects.h"
#include "agent/save/staging_layout.h"
#include "format/shard_writer.h"
#include "storage/storage.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {

// PIN: zeroes the padding of the data file's section in `memory` (a reused region holds the
// previous save's bytes; ShardWriter refuses non-zero padding).
// Errors: FailedPrecondition if `memory` is smaller than layout.total_bytes or has no data.
absl::Status PrepareStaging(const StagingLayout& layout, const StagingMemory& memory);

// GATHER: hashes every replica this rank holds but does not write (ReplicaHash, as the
// coordinator compares them), then runs this rank's part of the DP exchange of `session_id`
// (PeerTransport::Exchange) with work.deadline. Returns the hashes to report.
// Errors: as PeerTransport::Exchange — Aborted if the session was cancelled, DeadlineExceeded,
// Unavailable, InvalidArgument, FailedPrecondition.
absl::StatusOr<std::vector<v1::ReplicaHash>> GatherSlices(PeerTransport& peers,
                                                          const std::string& session_id,
                                                          const GatherWork& work);

// PERSIST: creates work.dir (and parents) and writes the layout's data file from staging
// (ShardWriter::WriteFile, which records options.writer_rank as each chunk's writer); returns
// one ChunkReport per chunk written. A layout without a file writes nothing and returns none.
// With work.memory_only, nothing is created or written: the chunks are described from staging
// (ShardWriter::Describe), as they would be written.
// Errors: as Storage::CreateDirs and ShardWriter::WriteFile (IO_ERROR with the path), or
// ShardWriter::Describe.
absl::StatusOr<std::vector<v1::ChunkReport>> WriteShards(Storage& storage,
                                                         const PersistWork& work,
                                                         const ShardWriterOptions& options);

// COMMIT: ResolveCommit (format/commit.h) of work.commit's manifest between work.tmp_dir and
// work.final_dir, honouring roll_back_unless_committed; once kCommitted, ApplyRetention of
// work.commit's retire_steps in work.job_dir. Errors: none; the outcome says what happened.
CommitWorkResult ResolveAndRetain(Storage& storage, const CommitWork& work);

// ABORT: removes work.dir and everything under it. Errors: as Storage::RemoveTree (a missing
// directory is OK).
absl::Status RemoveSessionDir(Storage& storage, const RemoveWork& work);

}  // namespace tessera

#endif  // TESSERA_AGENT_SAVE_SAVE_WORK_H_
