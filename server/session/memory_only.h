// Memory-only saves at the coordinator (DESIGN.md "Memory-only saves"): the rules a session of
// a memory-only save adds to the save protocol, and the record its commit leaves.
//
// A memory-only save goes through SessionMachine like any save, with three differences, each
// stated here once:
//   - admission (PLANNING, when every rank's plan is in): every rank asked for a memory-only
//     save, and every rank's agent registered with its memory tier on — else the session aborts
//     with MEMORY_ONLY_REFUSED before a byte is staged (MemoryOnlyRefusal);
//   - PERSIST writes nothing: the agents checksum their chunks in staging and report them;
//   - the commit is the store's, not the disk's: once every chunk is reported (and replicas
//     match) the session goes from PERSISTING straight to COMMITTED, and the job records a
//     MemoryCheckpointRecord — the manifest with every block checksum — in the same batch
//     (MakeMemoryCheckpoint). It never moves the job's latest, never retires a checkpoint.
//     Before its COMMITTED commands go out, the shell notes in the registry that no agent has
//     kept it yet (Effects::memory_committed, AgentRegistry::NoteMemoryCommit): until each
//     says so (for at most a lease), its copies are "not yet" — unknown — rather than lost;
//     a recovered job whose last session is that commit notes it again.
//
// Thread-safety: free functions; the registry (ListCheckpointsWithMemory: the shell's read)
// is thread-safe.
#ifndef TESSERA_SERVER_SESSION_MEMORY_ONLY_H_
#define TESSERA_SERVER_SESSION_MEMORY_ONLY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/layout.h"
#include "server/agent_registry.h"
#include "server/session/agent_roster.h"
#include "tessera/v1/admin.pb.h"
#include "tessera/v1/coordinator_state.pb.h"
#include "tessera/v1/manifest.pb.h"
#include "tessera/v1/types.pb.h"

namespace tessera {

// Why a save whose ranks asked `asked` (rank -> memory_only, every rank of `mesh`) cannot go
// ahead as the session's kind (`memory_only`), or nullopt if it can: ranks that asked another
// kind than the session's, or — for a memory-only save — ranks whose agent is not registered
// with its memory tier on. The error (MEMORY_ONLY_REFUSED) names the ranks and their coords.
std::optional<v1::ErrorDetail> MemoryOnlyRefusal(bool memory_only,
                                                 const std::map<uint32_t, bool>& asked,
                                                 const AgentRoster& agents,
                                                 const MeshLayout& mesh);

// The record of a memory-only commit: its listing (memory_only set, no directory) and its
// manifest.
v1::MemoryCheckpointRecord MakeMemoryCheckpoint(const v1::Manifest& manifest,
                                                const v1::SessionRecord& session,
                                                uint32_t tensors, int64_t committed_unix_ms);

// The data files `manifest` names that none of `copies` (Coordinator.FindMemoryCopies of its
// step and session) holds, ascending. Empty: every file is in some agent's memory.
std::vector<std::string> FilesNotInMemory(const v1::Manifest& manifest,
                                          const std::vector<v1::MemoryCopy>& copies);

// The job's checkpoints as Admin.ListCheckpoints lists them, newest first: its disk
// checkpoints (`disk`, newest first) and its memory-only commit (`memory`), if any, with
// files_not_in_memory from the copies `registry` knows live agents hold — or, while the
// registry may not know every copy (AgentRegistry::MemoryCopies' may_miss),
// memory_copies_unknown.
std::vector<v1::CheckpointInfo> ListCheckpointsWithMemory(
    const std::vector<v1::CheckpointInfo>& disk,
    const std::optional<v1::MemoryCheckpointRecord>& memory, const AgentRegistry& registry,
    const std::string& job_id);

// The manifest of the job's memory-only commit of `step` (-1: whatever its step).
// Errors: InvalidArgument if `step` < -1; NotFound + CHECKPOINT_NOT_FOUND naming the job and
// step (and the memory-only step the job has, if another) if it has none of that step.
absl::StatusOr<v1::Manifest> MemoryManifest(const std::optional<v1::MemoryCheckpointRecord>& memory,
                                            const std::string& job_id, int64_t step);

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_MEMORY_ONLY_H_
