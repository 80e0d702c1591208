// JobCore: one job's saves as a pure state machine — which session is in flight, the rules
// between sessions, and what the job remembers of the ones that ended. The session's own
// protocol is SessionMachine's (session_machine.h); JobCore opens sessions and folds their
// transitions into the job's record:
//
//   no session ──SubmitPlan(step)──► session in flight ──COMMITTED / ABORTED──► no session
//                    │                                   (the job records latest step,
//                    │                                    checkpoints, and the outcome to
//                    │                                    replay to agents that missed it;
//                    │                                    a memory-only commit is recorded as
//                    │                                    the job's memory checkpoint instead)
//                    └── refused: STEP_EXISTS (step committed, or not newer than the latest),
//                        SESSION_IN_PROGRESS (another step is in flight), PLAN_TOO_LARGE
//
//   A newer step supersedes (SUPERSEDED) a PLANNING session that re-opened a step every
//   other rank saw abort (a frozen agent's late plan): the others have moved on. Otherwise a
//   newer step while one is in flight is refused.
//   A job's layout is the registry's whenever no session is in flight (a job may resume on
//   another mesh); a session keeps the layout it began with.
//
//   Memory-only commits (memory_only.h; DESIGN.md "Memory-only saves"). The job keeps at most
//   one: the newest commit, if it is memory-only (agents hold one committed save in memory).
//   A memory-only commit replaces the previous one; a disk commit deletes it. Neither kind
//   moves the other's records: latest_committed_step and checkpoints are the disk's alone, so
//   STEP_EXISTS is the disk's too (a step lost from memory may be saved again).
//
// Like SessionMachine, every event returns Effects (effects.h) that the shell carries out:
// persist the batch, then send and reply. After the shell delivered a step's commands it calls
// Delivered(), which makes them what a reconnecting command stream replays (CurrentCommand):
// only commands whose step is durable are ever replayed. If a batch cannot be persisted, the
// shell discards this JobCore and recovers the job from the store (Recover): the one path
// back to a known state, which tells every agent to re-send what the store does not keep.
//
// Thread-safety: none. One strand drives a JobCore; readers synchronize with it.
#ifndef TESSERA_SERVER_SESSION_JOB_CORE_H_
#define TESSERA_SERVER_SESSION_JOB_CORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/layout.h"
#include "format/commit.h"
#include "server/agent_liveness.h"
#include "server/session/agent_roster.h"
#include "server/session/effects.h"
#include "server/session/options.h"
#include "server/session/session_machine.h"
#include "server/store/state_store.h"
#include "tessera/v1/admin.pb.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/coordinator_state.pb.h"

namespace tessera {

struct JobContext {
  const SessionOptions* options = nullptr;  // outlives the core
  // The coordinator's epoch (schema.h NextEpoch): command sequence numbers begin with it.
  uint64_t epoch = 0;
  // The coordinator process's count of commands emitted (the rest of each sequence number):
  // the shell's, shared by its jobs, so that a job recovered from the store after a refused
  // write never emits a number its agents have seen. Outlives the core.
  std::atomic<uint64_t>* commands_emitted = nullptr;
  // Names a new session of `step`. Default: NewSessionId (random). The simulation makes
  // them deterministic.
  std::function<std::string(int64_t step)> new_session_id;
};

class JobCore {
 public:
  // A job the store has no record of yet.
  JobCore(JobContext context, std::string job_id);
  ~JobCore();
  JobCore(const JobCore&) = delete;  // its sessions point into it (the roster)
  JobCore& operator=(const JobCore&) = delete;

  // The job as `store` holds it: its record, checkpoints, and its session in flight (which
  // resumes: every agent is told RESEND and the phase's command, in `out`) or else the last
  // one that ended (whose outcome is replayed to agents that reconnect).
  // Errors: the store's; DataLoss if a record is missing or corrupt.
  static absl::StatusOr<std::unique_ptr<JobCore>> Recover(JobContext context,
                                                          const StateStore& store,
                                                          const std::string& job_id,
                                                          absl::Time now, Effects& out);

  // --- Events

  // A rank's local plan for `step` (shards are taken from `request`). `layout` is the job's
  // mesh as the registry has it. Replies with the session id; and with send_full_plan, having
  // recorded nothing, if the shards were omitted and the fingerprint is not the rank's in the
  // job's last plan (none after a restart: DESIGN.md "Plan caching").
  // A refusal (request.refusal: the rank's client refused its own tensors) aborts the step's
  // session if it is PLANNING, with the refusal naming the rank, and is remembered for that
  // attempt of the step: the next submission of the step from each rank that neither refused
  // nor was told yet is answered Aborted with it (a rank that arrives after the refusal). The
  // attempt is over, and the refusal forgotten, once every rank of the mesh refused or was
  // told, or once an agent of the job restarted (a new run of its trainers); a refusing rank's
  // own submission of the step (a retry) no longer counts it as refusing. Kept in memory only,
  // for the last kRecentFinals steps refused. Replies OK to the
  // refusal itself. A plan this refuses (PLAN_TOO_LARGE, MALFORMED_SHARD) is that rank's
  // refusal of the step as well.
  // Errors: FailedPrecondition + STEP_EXISTS if `step` is committed or not newer than the
  // latest (on disk); FailedPrecondition + SESSION_IN_PROGRESS if another step is in flight;
  // Aborted with a rank's refusal of the step; FailedPrecondition for a refusal of a step
  // whose session is past PLANNING;
  // InvalidArgument + PLAN_TOO_LARGE over the shard limit; InvalidArgument + MALFORMED_SHARD
  // for shards sent with shards_omitted.
  Outcome<v1::SubmitLocalPlanResponse> SubmitPlan(v1::SubmitLocalPlanRequest&& request,
                                                  const MeshLayout& layout, absl::Time now);
  // The verdict of the PlanWork `attempt` of `session_id` (ignored for any other).
  Effects PlanDecided(const std::string& session_id, uint64_t attempt, PlanVerdict verdict,
                      absl::Time now);
  // Replies with the session's state after the report.
  // Errors: NotFound for an unknown session; FailedPrecondition if it already ended (the
  // message names its state); InvalidArgument as SessionMachine::ReportPhase.
  Outcome<v1::SessionState> ReportPhase(const v1::ReportPhaseRequest& request, absl::Time now);
  // Errors: as ReportPhase; InvalidArgument and FailedPrecondition as
  // SessionMachine::ReportChunks.
  Outcome<v1::SessionState> ReportChunks(const v1::ReportChunksRequest& request, absl::Time now);
  // The registry's verdicts on the job's agents that changed (AgentRegistry::Liveness; all of
  // them for a new core): a rank whose agent registered with another incarnation than the
  // one known restarted (its session in flight learns it: SessionMachine::AgentRestarted);
  // then the session acts on lost agents as a Tick does.
  Effects AgentsChanged(const std::vector<AgentLiveness>& verdicts, absl::Time now);
  // Replies with the ended session's status.
  // Errors: NotFound if the job has no session; FailedPrecondition if it ended or is
  // COMMITTING.
  Outcome<v1::SessionStatus> OperatorAbort(const std::string& reason, absl::Time now);
  // Lease expiry, deadlines, commit retries.
  Effects Tick(absl::Time now);
  // A retention (Effects::retention) removed every step of `retired`: they are no longer
  // pending (JobRecord.retention_pending). Persists the job's record if that changed it.
  Effects RetentionDone(const std::vector<int64_t>& retired);
  // The outcome of the CommitAttempt of `session_id` (ignored for any other).
  Effects CommitResolved(const std::string& session_id, const CommitResolution& resolution,
                         absl::Time now);
  // `commands` (of one step's Effects) were delivered after their batch was durable.
  void Delivered(const std::vector<Outgoing>& commands);

  // --- Reads

  const std::string& job_id() const { return job_id_; }
  // What `rank` should be executing now (for replay when its command stream connects): its
  // latest delivered command in the session in flight, else the last session's outcome once
  // delivered (nothing while the write that ended the session is in flight).
  std::optional<Outgoing> CurrentCommand(uint32_t rank) const;
  // `session_id`'s status, or with an empty id the session in flight or else the last one.
  // nullopt if this core does not hold it (it may be in the store).
  std::optional<v1::SessionStatus> GetSession(const std::string& session_id) const;
  const std::vector<v1::CheckpointInfo>& checkpoints() const { return checkpoints_; }
  // The job's memory-only commit, if its newest commit is one.
  const std::optional<v1::MemoryCheckpointRecord>& memory_checkpoint() const {
    return memory_checkpoint_;
  }
  v1::JobInfo Info() const;
  bool in_flight() const { return current_ != nullptr; }
  // The world size of the job's mesh as this core knows it (its session's, or its record's);
  // 0 before any.
  uint32_t world() const { return mesh_.has_value() ? mesh_->world_size() : 0; }
  // Whether the job's trainers are blocked in a save: its session is PLANNING, PINNING or
  // COPYING (the shell's disk clean-up waits outside it: SessionManager::RunDueCleanups).
  bool trainers_blocked() const;
  // When Tick next has something to do (InfiniteFuture if nothing is in flight).
  absl::Time next_tick() const;

 private:
  JobCore(JobContext context, v1::JobRecord record, std::vector<v1::CheckpointInfo> checkpoints);

  SessionContext MakeSessionContext();
  // After any event of the session in flight: folds its transition into the job's record
  // (the stored plan when it entered PINNING; latest, checkpoints and the outcome when it
  // ended) and persists the job's record with it.
  void Fold(absl::Time now, Effects& out);
  // The session (in flight) a report names. Errors: FailedPrecondition if it ended (recently:
  // the rank is sent its verdict again, in `out`); NotFound.
  absl::StatusOr<SessionMachine*> Find(const std::string& session_id, uint32_t rank,
                                       Effects& out);
  // A report of a session in flight: finds it (Find), hands it to `handle`, folds the result.
  template <typename Request, typename Handle>
  Outcome<v1::SessionState> Report(const Request& request, absl::Time now, Handle handle);
  void RememberFinal(const v1::Command& final);
  // SubmitPlan's rules for refusals (see there): the reply if the request is a refusal or is
  // refused by one, else nullopt (submit as usual).
  std::optional<absl::Status> TakeRefusal(const v1::SubmitLocalPlanRequest& request,
                                          const MeshLayout& layout, absl::Time now,
                                          Effects& out);
  // Records `rank`'s refusal of `step` (`error`, which is given the rank's RankRef), ending
  // the step's session if it is PLANNING.
  void RecordRefusal(uint32_t rank, int64_t step, v1::ErrorDetail error, const MeshLayout& mesh,
                     absl::Time now, Effects& out);
  // Forgets the refusal of `step` once every rank of a `world`-rank mesh refused or was told.
  void ForgetRefusalOnceAllKnow(int64_t step, uint32_t world);
  // The retention of JobRecord.retention_pending after the commit of `committed_step` (which
  // also removes the temporary directories of steps up to it).
  RetentionWork PendingRetention(int64_t committed_step) const;
  v1::Command Final(const v1::SessionRecord& session);

  JobContext context_;
  std::string job_id_;
  AgentRoster agents_;  // what the shell told of the job's agents (AgentsChanged)
  v1::JobRecord record_;
  std::optional<MeshLayout> mesh_;  // record_.layout(), parsed
  std::vector<v1::CheckpointInfo> checkpoints_;  // newest first
  std::optional<v1::MemoryCheckpointRecord> memory_checkpoint_;
  std::unique_ptr<SessionMachine> current_;
  // Each rank's latest delivered command of the session in flight.
  std::vector<std::optional<Outgoing>> latest_;
  // Index = rank: the local-plan fingerprints of the job's last plan (GlobalPlan
  // .rank_fingerprints), known since its PINNING in this process. A submission of only a
  // fingerprint is taken if it matches; empty after a restart, so every rank is asked.
  std::vector<uint64_t> last_plan_fingerprints_;
  // The last ended session: its outcome (COMMITTED or ABORT) and its final status.
  std::optional<v1::Command> last_final_;
  // Whether last_final_ was delivered (Delivered), which the shell does only after the write
  // that ended the session is durable: until then a reconnecting stream is replayed nothing,
  // as a refused write leaves the session open in the store (and in the recovered job).
  bool last_final_durable_ = false;
  // Index = rank: the seq each rank was sent last_final_ under (0: none sent). Its replay
  // carries the same, so an agent that gets both the send and the replay handles it once.
  std::vector<uint64_t> last_final_seqs_;
  std::optional<v1::SessionStatus> last_ended_;
  // The outcomes of the last kRecentFinals ended sessions (the last one included), newest last:
  // a rank that reports for one of them missed its verdict and is sent it again (Remind).
  static constexpr size_t kRecentFinals = 16;
  // A refused attempt of a step (SubmitPlan): the ranks that refused it, each with the error
  // the others are answered (the lowest rank's), and the ranks told so far.
  struct RefusedStep {
    std::map<uint32_t, v1::ErrorDetail> refusers;
    std::set<uint32_t> told;
  };
  std::map<int64_t, RefusedStep> refusals_;
  std::deque<v1::Command> recent_finals_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_JOB_CORE_H_
