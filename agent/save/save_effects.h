// What the agent's save core (agent/save/save_core.h) asks of the world, and what comes back: plain
// data, so that the agent's shell (SaveExecutor) and a deterministic simulation can both carry
// them out. Every request carries an id; its result is fed back to the core with that id.
//
//   CoordinatorRpc  a plan submission or a report to send; its result comes back through
//                   SaveCore::OnPlanSubmitted / OnReportDone.
//   SaveWork        memory and storage work to run (agent/save/save_work.h runs each kind); its
//                   result comes back through SaveCore::OnStagingReady / OnGathered /
//                   OnPersisted / OnCommitResolved / OnRemoved.
//   TrainerReply    the answer to a trainer's call, keyed by the ticket the caller gave it.
//   cancel_exchanges  sessions whose DP exchange must stop now (PeerTransport::CancelSession).
//   LogLine         what to log, in order.
//   next_tick       when the core next needs SaveCore::Tick (timers: re-sends, retries,
//                   WaitCommitted deadlines); InfiniteFuture if never.
//
// Every CoordinatorRpc and SaveWork handed out must get exactly one result event: the core
// keeps one report of a session out at a time and waits for a session's running work before
// it ends it, so a result that never comes stalls that session. A lost request or reply is a
// result too (DeadlineExceeded or Unavailable, as gRPC gives after its deadline); a result
// for a session that ended meanwhile is harmless. Work items of one session are handed out one
// at a time; items of different sessions may run concurrently.
//
// Thread-safety: values; the pointers they hold are to immutable objects (shared_ptr<const>)
// or to staging memory, which the work that receives it may use until it returns.
#ifndef TESSERA_AGENT_SAVE_SAVE_EFFECTS_H_
#define TESSERA_AGENT_SAVE_SAVE_EFFECTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/save/staging_layout.h"
#include "format/commit.h"
#include "tessera/v1/agent.pb.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {

// A session's staging memory, as the shell acquired it (the StagingPool's shared memory, or
// plain memory in a simulation).
struct StagingMemory {
  std::string name;       // what the trainer maps (BeginSaveResponse.shm_name)
  void* data = nullptr;   // `capacity` bytes, page-aligned
  uint64_t capacity = 0;
  uint64_t acquisition = 0;  // StagingSlot.acquisition, for StagingPool::Retain
};

// A save that committed while its staging still begins with the body of the data file this
// rank wrote (it wrote it, and nothing was staged since): the shell may keep that staging
// resident for loads of the checkpoint (agent/memory_tier.h).
struct ResidentSave {
  int64_t step = 0;
  std::string session_id;
  std::string file;          // data file name
  uint64_t file_offset = 0;  // FileLayout.data_start
  uint64_t nbytes = 0;       // FileLayout.data_size
  StagingMemory memory;
};

// ---------------------------------------------------------------------------------------------
// RPCs to the coordinator.

struct CoordinatorRpc {
  uint64_t id = 0;
  std::variant<std::shared_ptr<const v1::SubmitLocalPlanRequest>,
               std::shared_ptr<const v1::ReportPhaseRequest>,
               std::shared_ptr<const v1::ReportChunksRequest>>
      request;
};

// ---------------------------------------------------------------------------------------------
// Work items. Each names the session it is for; at most one runs per session at a time.

// Acquire staging of layout->total_bytes, then PrepareStaging (agent/save/save_work.h).
struct PinWork {
  std::shared_ptr<const StagingLayout> layout;
};

// GatherSlices: hash the replicas, exchange DP slices with peers (agent/save/save_work.h).
struct GatherWork {
  std::map<uint32_t, std::string> peer_addresses;  // for the transport's resolver
  std::shared_ptr<const StagingLayout> layout;
  void* staging = nullptr;  // the session's staging memory
  absl::Time deadline;      // of the exchange
};

// WriteShards: write this rank's data file into `dir` (agent/save/save_work.h).
struct PersistWork {
  std::string dir;  // the session's temporary directory, checked by the core; empty if memory_only
  std::shared_ptr<const StagingLayout> layout;
  const void* staging = nullptr;
  // Checksum the chunks in staging and write nothing (save_core.h R12): DescribeShards.
  bool memory_only = false;
};

// ResolveAndRetain: resolve the commit from the disk, then apply retention if committed.
struct CommitWork {
  std::string tmp_dir;    // checked by the core
  std::string final_dir;  // checked by the core
  std::string job_dir;    // where retention applies
  int64_t step = 0;
  std::shared_ptr<const v1::CommitCommand> commit;  // manifest, roll back, retire_steps
};

// RemoveSessionDir: remove the temporary directory this rank wrote into (its session aborted).
struct RemoveWork {
  std::string dir;  // checked by the core when it was written
};

struct SaveWork {
  uint64_t id = 0;
  std::string session_id;
  std::variant<PinWork, GatherWork, PersistWork, CommitWork, RemoveWork> item;
};

// What ResolveAndRetain found.
struct CommitWorkResult {
  CommitResolution resolution;
  // Set when retention ran (only after kCommitted): what it removed and failed to remove, or
  // why it could not run.
  std::optional<absl::StatusOr<RetentionReport>> retention;
};

// ---------------------------------------------------------------------------------------------
// Answers to the trainer.

struct BeginSaveReply {
  absl::StatusOr<v1::BeginSaveResponse> result;
};
struct StagedReply {
  absl::Status result;
};
struct WaitCommittedReply {
  absl::StatusOr<std::string> result;  // the checkpoint directory
};

struct TrainerReply {
  uint64_t ticket = 0;
  std::variant<BeginSaveReply, StagedReply, WaitCommittedReply> reply;
};

struct LogLine {
  enum class Severity { kInfo, kWarning, kError };
  Severity severity = Severity::kInfo;
  std::string text;
};

struct SaveEffects {
  std::vector<CoordinatorRpc> rpcs;  // send in this order
  std::vector<SaveWork> work;        // run; items of one session in this order
  std::vector<TrainerReply> replies;
  std::vector<std::string> cancel_exchanges;
  std::vector<LogLine> logs;
  std::optional<ResidentSave> resident;  // a committed save's staging to keep resident
  // A session that ended COMMITTED: once `resident` is kept (or was not to be), it is the
  // agent's last commit handled (HeartbeatRequest.last_committed_session). Empty: none.
  std::string committed;
  absl::Time next_tick = absl::InfiniteFuture();

  bool empty() const {
    return rpcs.empty() && work.empty() && replies.empty() && cancel_exchanges.empty() &&
           logs.empty() && !resident.has_value() && committed.empty();
  }
};

}  // namespace tessera

#endif  // TESSERA_AGENT_SAVE_SAVE_EFFECTS_H_
