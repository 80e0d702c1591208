// SessionManager: drives every save session of every job — the coordinator's state machine.
//
// One session is one attempt to save (job, step). Its life (DESIGN.md "Save protocol"):
//
//   PLANNING ─1─► PINNING ─2─► COPYING ─3─► PERSISTING ─4─► COMMITTING ─5─► COMMITTED
//       └────────────┴────────────┴─────────────┴──────────────┴──6──► ABORTED
//
//   1 BeginPinning:    every rank's local plan arrived; the global plan validated (or reused
//                      from the plan cache), the node RAM budgets admit the staging, and the
//                      plan is persisted. Each agent gets PIN with its assignment.
//   2 BeginCopying:    every agent reported PINNED. Each gets COPY (its trainer may copy).
//   3 BeginPersisting: every agent reported STAGED (every trainer resumed). Each gets GATHER;
//                      once all reported GATHERED, PERSIST is handed out, at most
//                      `max_concurrent_writers` writers at a time.
//   4 BeginCommitting: every agent reported PERSISTED, every planned chunk was reported and
//                      every replica hash matches its writer's. The manifest is built and
//                      persisted with the state, then written and renamed into place by the
//                      Committer (or by a committer agent, via COMMIT).
//   5 MarkCommitted:   the checkpoint directory exists under its final name. COMMITTED, the
//                      job's latest step and the checkpoint summary are one synced batch; then
//                      agents get COMMITTED and retention runs.
//   6 Abort:           a rejected plan, a lost agent (lease expiry or a new incarnation of a
//                      participant), a phase timeout, an agent's error report (IO_ERROR ...),
//                      a diverged replica, or an operator's AbortSession. The reason is
//                      recorded; agents get ABORT; the job's latest checkpoint is untouched and
//                      the session's temporary directory is removed (by Tick, off the lock).
//                      Once COMMITTING, every chunk is written: losing or hearing an error from
//                      a rank no longer matters, and a lost committer agent is replaced by
//                      another one with the storage mounted (the commit is idempotent).
//
// Persist, then acknowledge: each transition is one synced StoreBatch before any command or
// reply that depends on it. Per-rank and per-chunk progress is not persisted: agents keep
// their reports until the session ends and re-send them when they re-register after a
// coordinator restart (Recover()), which is cheaper than a synced write per chunk and just as
// safe, because nothing is committed before the manifest is persisted in COMMITTING.
//
// Recovery (Recover): PLANNING sessions wait for agents to re-submit their plans; PINNING to
// PERSISTING sessions reload their plan and wait for re-reports; COMMITTING sessions redo the
// idempotent commit; phase deadlines restart from the recovery time.
//
// Slow work (commit I/O, timeouts, lease checks) happens in Tick(), which the coordinator runs
// on its own thread (RunUntilStopped) and tests call directly with a FakeClock. RPC-facing
// methods never wait for other ranks; they only record, persist and emit commands.
//
// Thread-safety: all public methods are safe for concurrent use. Commands are emitted to the
// CommandSink while holding no lock.
#ifndef TESSERA_SERVER_SESSION_MANAGER_H_
#define TESSERA_SERVER_SESSION_MANAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/agent_registry.h"
#include "server/planner.h"
#include "server/store/state_store.h"
#include "tessera/v1/admin.pb.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/coordinator_state.pb.h"

namespace tessera {

// Delivers commands to agents. The gRPC Commands stream implements it; tests record.
// Send must not block on the network, and must not call back into the SessionManager.
class CommandSink {
 public:
  virtual ~CommandSink() = default;
  virtual void Send(const std::string& job_id, uint32_t rank, const v1::Command& command) = 0;
  // Sends `command`, a PIN whose pin().assignment() is left empty, with `assignment` (an
  // encoded v1::RankAssignment, the plan's bytes) as its assignment. This default parses the
  // assignment into a copy of the command and calls Send; a sink that serializes anyway can
  // append the bytes instead (CommandStreams), so that a million-piece plan is never parsed
  // back into messages to be sent.
  virtual void SendPin(const std::string& job_id, uint32_t rank, const v1::Command& command,
                       absl::string_view assignment);
};

// Commits a checkpoint directory where the coordinator has the storage mounted.
class Committer {
 public:
  virtual ~Committer() = default;
  // Writes the manifest into tmp_dir, renames it to final_dir, fsyncs. Idempotent: OK if
  // final_dir already holds this session's manifest. Errors: FailedPrecondition + STEP_EXISTS
  // if final_dir holds another session's checkpoint; IO_ERROR payload otherwise.
  virtual absl::Status Commit(const v1::Manifest& manifest, const std::string& tmp_dir,
                              const std::string& final_dir) = 0;
  // Removes an aborted session's directory. Idempotent. Errors: IO_ERROR payload.
  virtual absl::Status RemoveDir(const std::string& tmp_dir) = 0;
  // Applies retention to a job's directory, keeping the newest `keep_last` checkpoints
  // (0 keeps all) and removing orphaned temporary directories except `protect_session_id`'s.
  virtual absl::Status CollectGarbage(const std::string& job_dir, int keep_last,
                                      const std::string& protect_session_id) = 0;
};

struct SessionManagerOptions {
  // Directory under which each job's checkpoints live (<root>/<job>/step-N). Required.
  std::string storage_root;
  // True if the coordinator can write under storage_root itself (then it commits); false to
  // have a committer agent (one that registered storage_root_mounted) do it. Default: true.
  bool coordinator_commits = true;
  // Phase deadlines, measured from entering the phase. Defaults: 120 s, 120 s, 600 s,
  // 1800 s, 120 s.
  absl::Duration planning_timeout = absl::Seconds(120);
  absl::Duration pinning_timeout = absl::Seconds(120);
  absl::Duration copying_timeout = absl::Seconds(600);
  absl::Duration persisting_timeout = absl::Seconds(1800);
  absl::Duration committing_timeout = absl::Seconds(120);
  // Most agents writing at once to the storage target. Default: 64.
  uint32_t max_concurrent_writers = 64;
  // Committed checkpoints kept per job; older ones are deleted after each commit. 0 keeps
  // all. Default: 0.
  int keep_last = 0;
  PlannerOptions planner;
  // Called after each state transition is persisted, before its commands go out. For fault
  // injection in tests (the coordinator's --crash_in_state). Default: none.
  std::function<void(v1::SessionState)> on_state_persisted;
};

// Counters since the coordinator started, for metrics (server/metrics.h).
struct SessionStats {
  uint64_t commits = 0;
  uint64_t bytes_committed = 0;
  std::map<std::string, uint64_t> aborts_by_reason;  // "AGENT_LOST" -> count
  struct Timing {
    uint64_t count = 0;
    double seconds = 0;
  };
  std::map<std::string, Timing> phase_seconds;  // "PERSISTING" -> completed phases
  Timing trainer_stall;                         // one sample per rank per save
  uint64_t sessions_in_flight = 0;
};

class SessionManager {
 public:
  // Every pointer must outlive the manager.
  SessionManager(StateStore* store, AgentRegistry* registry, CommandSink* sink,
                 Committer* committer, const Clock* clock, SessionManagerOptions options);

  // Loads jobs and unfinished sessions from the store. Call once, before serving.
  // Errors: what the store returns; DataLoss if a record does not parse.
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_);

  // Records a rank's local plan, opening the job's session for `step` on the first one.
  // Returns the session id. When the last rank's plan arrives, validates the global plan:
  // a rejection aborts the session and every rank gets ABORT with the planner's error.
  // Errors: NotFound / FailedPrecondition + STALE_INCARNATION if the agent is not the
  // registered one; FailedPrecondition + STEP_EXISTS if `step` is committed (or not newer
  // than the latest); FailedPrecondition + SESSION_IN_PROGRESS if another step is in flight;
  // InvalidArgument + PLAN_TOO_LARGE over the limits; Unavailable if the store failed.
  absl::StatusOr<std::string> SubmitLocalPlan(const v1::SubmitLocalPlanRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same, taking the request's shards instead of copying them.
  absl::StatusOr<std::string> SubmitLocalPlan(v1::SubmitLocalPlanRequest&& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Records that a rank reached a phase (or failed in it: `error` aborts the session).
  // Returns the session's state after the report.
  // Errors: NotFound for an unknown session; FailedPrecondition if it already ended (the
  // message names its state); STALE_INCARNATION; InvalidArgument for a phase that does not
  // belong to the session's state.
  absl::StatusOr<v1::SessionState> ReportPhase(const v1::ReportPhaseRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Records chunks written and replica hashes. Idempotent per chunk.
  // Errors: as ReportPhase; InvalidArgument if a chunk is not in the plan, is not the
  // reporter's to write, or its size differs from the plan's.
  absl::StatusOr<v1::SessionState> ReportChunks(const v1::ReportChunksRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The command (job, rank) should be executing now in the job's current session — or, with
  // no session in flight, the last session's COMMITTED/ABORT — for replay when its command
  // stream (re)connects.
  std::optional<v1::Command> CurrentCommand(const std::string& job_id, uint32_t rank) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Tells the manager that (job, rank) registered. If it replaced an incarnation that takes
  // part in the job's current session, the session aborts with AGENT_LOST.
  void OnAgentRegistered(const std::string& job_id, uint32_t rank,
                         std::optional<uint64_t> replaced_incarnation) ABSL_LOCKS_EXCLUDED(mu_);

  // Aborts the job's in-flight session with ABORTED_BY_USER.
  // Errors: NotFound if the job has no session; FailedPrecondition if it already ended, or is
  // COMMITTING (its checkpoint may already be in place; it commits or times out).
  absl::StatusOr<v1::SessionStatus> AbortSession(const std::string& job_id,
                                                 const std::string& reason)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Status of a session: `session_id`, or the job's current one, or its latest.
  // Errors: NotFound.
  absl::StatusOr<v1::SessionStatus> GetSession(const std::string& job_id,
                                               const std::string& session_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Committed checkpoints of a job, newest first. Errors: NotFound for an unknown job.
  absl::StatusOr<std::vector<v1::CheckpointInfo>> ListCheckpoints(const std::string& job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<v1::JobInfo> ListJobs() const ABSL_LOCKS_EXCLUDED(mu_);

  SessionStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // Does the slow and time-driven work: aborts sessions whose phase deadline passed or one of
  // whose agents' lease expired, commits sessions that reached COMMITTING. Returns when done.
  void Tick() ABSL_LOCKS_EXCLUDED(mu_);

  // Runs Tick() whenever work is signalled, and at least every `period`, until Stop().
  void RunUntilStopped(absl::Duration period) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // A number that grows on every change of any session; with AwaitChange, lets a watcher
  // stream status updates without polling.
  uint64_t version() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until version() > `seen` or `deadline`; returns the version then.
  uint64_t AwaitChange(uint64_t seen, absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct RankProgress {
    v1::SessionState reached = v1::SESSION_STATE_UNSPECIFIED;
    bool gathered = false;
    bool persist_sent = false;
    bool persisted = false;
    uint64_t pinned_bytes = 0;
    uint64_t stall_ns = 0;
    uint64_t bytes_written = 0;
    uint32_t chunks_reported = 0;
  };
  struct ChunkReportState {
    v1::ChunkEntry entry;
    bool reported = false;
  };
  struct Session {
    v1::SessionRecord record;
    absl::Time phase_started;
    absl::btree_map<uint32_t, LocalPlan> plans;  // PLANNING
    // FingerprintLocalPlan of each plan, computed as it arrives so that a save whose plans
    // are unchanged finds its cached global plan in microseconds.
    absl::btree_map<uint32_t, uint64_t> plan_fingerprints;
    // Bytes of each plan's shards (what the rank stages), for the host-RAM admission after
    // the plans themselves are freed.
    absl::btree_map<uint32_t, uint64_t> plan_bytes;
    std::shared_ptr<const GlobalPlan> plan;      // PINNING and later
    std::vector<RankProgress> ranks;
    // (key, box as string) -> index into the plan's chunks, and what was reported.
    absl::flat_hash_map<std::string, ChunkReportState> chunks;
    uint32_t chunks_reported = 0;
    // (key, box) -> hashes reported by replicas: rank -> digest.
    absl::flat_hash_map<std::string, std::vector<std::pair<uint32_t, uint64_t>>> replica_hashes;
    uint32_t writers_active = 0;
    // rank -> last command sent. A PIN is kept without its assignment (plan->assignments
    // has it); CurrentCommand fills it in.
    std::vector<std::pair<uint32_t, v1::Command>> latest;
    bool commit_pending = false;  // COMMITTING, Tick() must (re)do the commit
  };
  struct Job {
    v1::JobRecord record;
    std::optional<MeshLayout> mesh;  // record.layout(), parsed once
    std::unique_ptr<Session> current;
    // The last ended session's final command (COMMITTED or ABORT), replayed to agents whose
    // command stream reconnects after the end, so none waits for an outcome it missed.
    std::optional<v1::Command> last_final;
    std::vector<v1::CheckpointInfo> checkpoints;  // newest first
    std::unique_ptr<v1::SessionStatus> last_ended;  // status of the last finished session
  };
  // A command to deliver. A PIN's assignment is `pin_plan->assignments[rank]`, still encoded
  // (CommandSink::SendPin).
  struct Outgoing {
    std::string job_id;
    uint32_t rank = 0;
    v1::Command command;
    std::shared_ptr<const GlobalPlan> pin_plan;
  };
  using Outbox = std::vector<Outgoing>;

  // Transitions (numbered as in the diagram). Each persists, then queues commands.
  absl::Status BeginPinningLocked(Job& job, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BeginCopyingLocked(Job& job, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BeginPersistingLocked(Job& job, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BeginCommittingLocked(Job& job, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MarkCommittedLocked(Job& job, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortLocked(Job& job, const v1::ErrorDetail& error, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Helpers.
  void AdvanceLocked(Job& job, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandOutPersistLocked(Job& job, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Session*> FindSessionLocked(const std::string& job_id,
                                             const std::string& session_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The state to answer a report with: the session's, or the ended session's final state.
  v1::SessionState StateAfterLocked(const Job& job, const Session* session) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `command` for `rank`. With `pin_plan`, `command` is a PIN without its assignment,
  // which is pin_plan->assignments[rank].
  void EmitLocked(Job& job, uint32_t rank, v1::Command command, Outbox& out,
                  std::shared_ptr<const GlobalPlan> pin_plan = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // GATHER for `rank`: the peer addresses of the ranks it exchanges slices with.
  v1::Command GatherCommandLocked(const Session& session, uint32_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BroadcastLocked(Job& job, const v1::Command& command, Outbox& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `rank` with its mesh coordinates to the ranks an error names.
  static void AddRankRef(const Job& job, uint32_t rank, v1::ErrorDetail* error);
  // Sets the session's committer_rank to a live agent with the storage mounted; false if none.
  bool PickCommitterLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendCommitLocked(Job& job, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnterStateLocked(Session& session, v1::SessionState state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PersistSessionLocked(Job& job, StoreBatch batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration PhaseTimeoutLocked(v1::SessionState state) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::SessionStatus StatusLocked(const Job& job, const Session& session) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::ErrorDetail CheckReplicaHashesLocked(const Job& job, const Session& session) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string JobDir(const std::string& job_id) const;
  void Deliver(Outbox& out) ABSL_LOCKS_EXCLUDED(mu_);

  StateStore* const store_;
  AgentRegistry* const registry_;
  CommandSink* const sink_;
  Committer* const committer_;
  const Clock* const clock_;
  const SessionManagerOptions options_;
  PlanCache plan_cache_;

  mutable absl::Mutex mu_;
  absl::btree_map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool work_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;  // of the last command emitted
  SessionStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> removals_ ABSL_GUARDED_BY(mu_);  // aborted sessions' directories
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_MANAGER_H_
