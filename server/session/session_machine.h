// SessionMachine: one save session — one attempt to save (job, step) — as a pure state
// machine. Every rule of DESIGN.md's save protocol lives here, once.
//
//   PLANNING ─1─► PINNING ─2─► COPYING ─3─► PERSISTING ─4─► COMMITTING ─5─► COMMITTED
//       │             │           │              │  │            │                ▲
//       │             │           │              │  └──────8 (memory-only)────────┘
//       └──────6──────┴─────6─────┴──────6───────┘               └───7───► ABORTED
//       (6 also from PLANNING, PINNING, COPYING, PERSISTING)        ▲
//                                                                   └── only 6 and 7 lead here
//
//   1 PlanDecided:      every rank's local plan arrived (SubmitPlan); the shell validated the
//                       global plan off the lock (PlanWork; or reused the job's cached one)
//                       and the node RAM budgets admit its staging. Each rank gets PIN (the
//                       plan's fingerprint only, to an agent that holds its assignment).
//                       Ranks that sent only a fingerprint, when no cached plan matches, are
//                       sent SEND_PLAN first, and planning runs again with their shards.
//   2 (ReportPhase)     every rank reported PINNED. If the PINs said copy_when_pinned
//                       (SessionOptions, and every agent registered copies_when_pinned;
//                       decided at 1 and kept in the record), each trainer copied once its
//                       own agent pinned, and a rank's STAGED that came after its PINNED
//                       while PINNING is counted; if every rank is STAGED too, 3 follows at
//                       once. Otherwise each rank gets COPY (its trainer may copy).
//   3 (ReportPhase)     every rank reported STAGED (every trainer resumed). Each gets GATHER
//                       with its peers' addresses; once all reported GATHERED, PERSIST is
//                       handed out, at most `max_concurrent_writers` writers at a time
//                       (a memory-only save's PERSIST writes nothing: all at once).
//                       A rank whose PIN said write_when_staged (SessionOptions, off by
//                       default; every agent registered writes_when_staged, not
//                       memory-only; the ranks that exchange no DP slices, the first
//                       max_concurrent_writers writers among them; decided at 1 and kept
//                       in the record) gets neither: it
//                       hashes and writes once its own trainer's copy is staged, its PIN
//                       being its write permit, and its GATHERED, chunks and PERSISTED count
//                       while PINNING or COPYING, after its STAGED.
//   4 (Report*)         every rank reported PERSISTED, every planned chunk was reported, and
//                       every replica's hash matches its writer's (else 6, REPLICA_DIVERGED).
//                       The manifest is built and persisted with the state; the coordinator
//                       commits (CommitAttempt) or a committer agent does (COMMIT). With no live
//                       committer agent, 6 (IO_ERROR) instead: nothing has been renamed yet.
//   5 CommitResolved /  the commit is resolved from the disk as committed: the final
//     COMMIT_WRITTEN    directory holds this session's manifest, durably.
//   6 Abort:            a rejected plan (or ADMISSION_DENIED, or a rank's own refusal of its
//                       tensors: job_core.h), a lost agent (the roster's kLost: its lease
//                       expired, its process was found dead, or its registration was
//                       refused; or a participant's new incarnation), a phase deadline, an
//                       agent's error report (IO_ERROR ...), a diverged replica, an operator's
//                       abort, or a newer step superseding a re-opened one. Only before
//                       COMMITTING.
//   7 CommitResolved /  the commit is resolved from the disk as rolled back: the directory is
//     COMMIT_ROLLED_BACK provably out of the committed namespace (the commit was refused for
//                       good, or it was rolled back because the COMMITTING deadline passed
//                       and it still had not completed).
//   8 (Report*)         a memory-only save (memory_only.h): as 4 — every rank PERSISTED (its
//                       chunks checksummed in staging, nothing written), every chunk reported,
//                       replicas match — and the manifest goes into the job's
//                       MemoryCheckpointRecord (JobCore) with COMMITTED in the same batch.
//                       Nothing is on disk to resolve, so there is no COMMITTING. Before that,
//                       when every plan is in, MemoryOnlyRefusal may abort it (6).
//
// The commit edge. Once COMMITTING, every chunk is written: a lost agent, an error report or
// an operator no longer ends the session, and nothing ends it by a timer alone. The deadline
// only changes what is asked: commit or, if that does not complete, roll back. An unresolved
// attempt (an I/O error) is retried with backoff (the coordinator's own commit) or by the
// committer agent (which retries until resolved); a committer agent that is lost
// (CommitterLost: its lease expired, or it never registered with a restarted coordinator or
// a job's new mesh) or that refused the COMMIT (its error report: agent/save/save_core.h R4) is
// replaced by another live one with the storage mounted (the commit is idempotent). With no
// other, the session waits for one: an agent that registers, or the refusing one restarted.
//
// Persist, then act: a transition puts the session record into the step's batch
// (Effects::persisted_state names the new state); the shell makes it durable before it sends
// the step's commands. Progress inside a phase (which rank reported what, which chunk was
// written) is not persisted: agents re-send their reports after any reconnection, and after
// RESEND, which Recover emits (DESIGN.md "Save protocol"). Reports are idempotent.
//
// Not here: opening sessions and the rules between them (job_core.h), planning (plan_work.h),
// storage I/O (commit_driver.h), persistence and delivery (the shell).
//
// Thread-safety: none. A SessionMachine belongs to its JobCore, which one strand drives.
#ifndef TESSERA_SERVER_SESSION_SESSION_MACHINE_H_
#define TESSERA_SERVER_SESSION_SESSION_MACHINE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/layout.h"
#include "format/commit.h"
#include "server/plan/planner.h"
#include "server/session/agent_roster.h"
#include "server/session/chunk_ledger.h"
#include "server/session/effects.h"
#include "server/session/options.h"
#include "tessera/v1/admin.pb.h"
#include "tessera/v1/coordinator.pb.h"
#include "tessera/v1/coordinator_state.pb.h"

namespace tessera {

// What a session needs from its job. Pointers outlive the session.
struct SessionContext {
  const SessionOptions* options = nullptr;
  // The job's agents as its JobCore was last told (agent_roster.h).
  const AgentRoster* agents = nullptr;
  std::string job_id;
  MeshLayout mesh;
  v1::Layout layout;
  // The job's committed checkpoints, newest first (retention decides from them).
  const std::vector<v1::CheckpointInfo>* checkpoints = nullptr;
  // Steps an earlier retention left on disk (JobRecord.retention_pending): the commit's
  // retire_steps include them.
  const google::protobuf::RepeatedField<int64_t>* retention_pending = nullptr;
  // Command sequence numbers: CommandSeq(epoch, ++*commands_emitted). The counter is the
  // coordinator process's (JobContext), so they only grow, also across a job's reload.
  uint64_t epoch = 0;
  std::atomic<uint64_t>* commands_emitted = nullptr;
};

// Committed steps to retire when `committing_step` commits, so that `keep_last` remain (0
// keeps all). `checkpoints` newest first, all older than committing_step.
std::vector<int64_t> RetireSteps(const std::vector<v1::CheckpointInfo>& checkpoints,
                                 int keep_last);
// `a` and `b` merged, ascending, without repeats.
std::vector<int64_t> StepUnion(std::vector<int64_t> a, const std::vector<int64_t>& b);
// The COMMITTED command of `session` (a COMMITTED record): its directory, or memory_only.
void SetCommitted(const v1::SessionRecord& session, v1::Command* command);

class SessionMachine {
 public:
  // A new session in PLANNING; its opening is persisted in `out`. `memory_only`: a memory-only
  // save (memory_only.h), as its first rank asked; the others must ask the same.
  SessionMachine(SessionContext context, std::string session_id, int64_t step, bool memory_only,
                 absl::Time now, Effects& out);

  // A session recovered from the store in `record`'s state (not ended), with its plan
  // (PINNING and later) and manifest (COMMITTING). Every rank is told RESEND, then the current
  // phase's command again; deadlines restart at `now`.
  // Errors: DataLoss if the plan or manifest the state needs is missing or inconsistent.
  static absl::StatusOr<std::unique_ptr<SessionMachine>> Recover(
      SessionContext context, v1::SessionRecord record, std::shared_ptr<const GlobalPlan> plan,
      std::shared_ptr<const v1::Manifest> manifest, absl::Time now, Effects& out);

  // --- Events

  // A rank's local plan (PLANNING): its fingerprint (FingerprintLocalPlan), and its shards
  // unless the agent sent only the fingerprint (`plan` empty). `held` is the global plan whose
  // assignment the agent holds (its PIN of that plan leaves the assignment out). When every
  // rank has submitted, emits PlanWork — again only if a fingerprint changed or shards asked
  // for arrived, so a repeated submission is idempotent — or aborts (6) with
  // MEMORY_ONLY_REFUSED where MemoryOnlyRefusal says so (`memory_only`: what the rank asked).
  // Errors: FailedPrecondition if the session is past PLANNING (the caller answers with the
  // session id: a re-submission after a lost reply).
  absl::Status SubmitPlan(uint32_t rank, std::optional<LocalPlan> plan, uint64_t fingerprint,
                          uint64_t held, bool memory_only, absl::Time now, Effects& out);
  // The verdict of the PlanWork of `attempt` (edge 1, or 6; or, if it names ranks whose
  // shards are missing, SEND_PLAN to each and planning waits for them). Another attempt's is
  // ignored.
  void PlanDecided(uint64_t attempt, PlanVerdict verdict, absl::Time now, Effects& out);
  // Returns the state after the report.
  // Errors: InvalidArgument for a rank outside the mesh, an unspecified phase, or a phase
  // ahead of the session's state (the message names both).
  absl::StatusOr<v1::SessionState> ReportPhase(const v1::ReportPhaseRequest& request,
                                               absl::Time now, Effects& out);
  // Errors: InvalidArgument as ChunkLedger::RecordChunk, or a rank outside the mesh;
  // FailedPrecondition if the session is not PERSISTING or COMMITTING (or PINNING or COPYING
  // for a rank told write_when_staged).
  absl::StatusOr<v1::SessionState> ReportChunks(const v1::ReportChunksRequest& request,
                                                absl::Time now, Effects& out);
  // The agent of `rank` registered with a new incarnation: before COMMITTING its staging is
  // gone (6, AGENT_LOST); in COMMITTING, if it is the committer, it is sent COMMIT again, and
  // a refusal of its previous life no longer keeps it from being picked.
  void AgentRestarted(uint32_t rank, absl::Time now, Effects& out);
  // Errors: FailedPrecondition in COMMITTING (it can no longer be aborted) or once ended.
  absl::Status OperatorAbort(const std::string& reason, absl::Time now, Effects& out);
  // Aborts the session with `error` if it is PLANNING: a newer step supersedes it, or a rank
  // refused its tensors (job_core.h decides when). Nothing of a PLANNING session is staged.
  void AbortPlanning(v1::ErrorDetail error, absl::Time now, Effects& out);
  // Lost agents (as the roster has them: after JobCore::AgentsChanged), phase deadlines,
  // commit retries.
  void Tick(absl::Time now, Effects& out);
  // The outcome of this session's CommitAttempt (edge 5, 7, or a retry).
  void CommitResolved(const CommitResolution& resolution, absl::Time now, Effects& out);

  // --- Reads

  const v1::SessionRecord& record() const { return record_; }
  // The directories the commit retires (records dropped now, and retention_pending).
  const std::vector<int64_t>& retire_steps() const { return retire_steps_; }
  // With agent commits: the COMMIT_WRITTEN that committed said its retention removed every
  // step of retire_steps().
  bool retention_complete() const { return retention_complete_; }
  v1::SessionState state() const { return record_.state(); }
  bool ended() const {
    return state() == v1::SESSION_STATE_COMMITTED || state() == v1::SESSION_STATE_ABORTED;
  }
  const std::shared_ptr<const GlobalPlan>& plan() const { return plan_; }
  // The manifest, from COMMITTING on (and once a memory-only save COMMITTED); else null.
  const std::shared_ptr<const v1::Manifest>& manifest() const { return manifest_; }
  bool memory_only() const { return record_.memory_only(); }
  // The ranks whose local plans arrived (PLANNING).
  std::vector<uint32_t> ranks_planned() const;
  // The session's status: record and live progress.
  v1::SessionStatus Status() const;
  // The next time Tick has something to do (a deadline, a commit retry).
  absl::Time next_tick() const;

 private:
  struct RankProgress {
    v1::SessionState reached = v1::SESSION_STATE_UNSPECIFIED;  // last phase completed
    bool gathered = false;
    bool persist_sent = false;
    bool persisted = false;
    // Its PIN said write_when_staged: it gathers and writes once staged, unasked.
    bool writes_when_staged = false;
    uint64_t pinned_bytes = 0;
    uint64_t stall_ns = 0;
    uint64_t write_ns = 0;
    uint64_t bytes_written = 0;
    uint32_t chunks_reported = 0;
  };

  SessionMachine(SessionContext context, v1::SessionRecord record, absl::Time now);

  uint32_t world() const { return context_.mesh.world_size(); }
  absl::Duration PhaseTimeout() const;
  absl::Time deadline() const { return phase_started_ + PhaseTimeout(); }
  // RetireSteps of the job's checkpoints, with retention_pending.
  std::vector<int64_t> DirectoriesToRetire() const;

  // Transitions, numbered as in the diagram.
  void BeginPinning(std::shared_ptr<const GlobalPlan> plan, bool cached, absl::Time now,
                    Effects& out);                              // 1
  void BeginCopying(absl::Time now, Effects& out);              // 2
  void BeginPersisting(absl::Time now, Effects& out);           // 3
  void BeginCommitting(absl::Time now, Effects& out);           // 4, or 8 when memory-only
  void MarkCommitted(absl::Time now, Effects& out);             // 5
  void Abort(v1::ErrorDetail error, absl::Time now, Effects& out);        // 6
  void EndRolledBack(v1::ErrorDetail error, absl::Time now, Effects& out);  // 7

  // Takes the next step the progress allows (after any report).
  void Advance(absl::Time now, Effects& out);
  // Whether rank's PERSIST counts against max_concurrent_writers.
  bool CountsAsWriter(uint32_t rank) const;
  // Marks the ranks told write_when_staged (record_.write_when_staged_writers, the plan's
  // peers) and counts their writers as admitted: their PIN is their write permit.
  void MarkWritesWhenStaged();
  // The state `rank` must have reached for its report of `phase` to count while the session
  // is still behind that phase (copy_when_pinned: STAGED in PINNING after PINNED;
  // write_when_staged: GATHERED and PERSISTED in PINNING or COPYING after STAGED), or
  // UNSPECIFIED if it may not come ahead.
  v1::SessionState AheadAfter(uint32_t rank, v1::AgentPhase phase) const;
  // Whether `rank` was told write_when_staged and the session is still before PERSISTING:
  // its GATHERED, chunks and PERSISTED may come ahead of the session.
  bool WritingAhead(uint32_t rank) const;
  // GATHER to every rank not told write_when_staged.
  void EmitGathers(Effects& out);
  void HandOutPersist(Effects& out);
  void EnterState(v1::SessionState state, absl::Time now, Effects& out);
  void End(v1::SessionState state, v1::Command final, absl::Time now, Effects& out);

  // Commands.
  void Emit(uint32_t rank, v1::Command command, Effects& out,
            std::shared_ptr<const GlobalPlan> pin_plan = nullptr);
  void Broadcast(const v1::Command& command, Effects& out);
  void EmitCurrentPhaseCommands(Effects& out);  // after recovery
  void EmitPin(uint32_t rank, Effects& out);
  v1::Command GatherCommand(uint32_t rank) const;
  // COMMITTING: the coordinator's CommitAttempt, or COMMIT to the committer agent.
  void RequestCommit(absl::Time now, Effects& out);
  // The first rank whose agent can commit becomes the committer: registered with the storage
  // root mounted, its lease current, and it has not refused this session's COMMIT. False
  // (the committer unchanged) if there is none.
  bool PickCommitter();
  // Whether the committer agent can no longer commit: it is unavailable (AgentLiveness: lost,
  // or not registered a lease after the registry began serving — a coordinator restart it did
  // not survive, a job resumed on another mesh), its rank registered again without the
  // storage root mounted, or it refused the COMMIT. A committer not registered yet within that
  // first lease may still come back: not lost.
  bool CommitterLost() const;
  void ScheduleCommitRetry(absl::Time now);
  v1::ErrorDetail Detail(v1::ErrorCode code, std::string message) const;
  // The abort of a session in state `s` whose agents of ranks `lost` (ascending, not empty)
  // are lost, with each one's reason (AgentLiveness::lost).
  v1::ErrorDetail LostError(const std::vector<uint32_t>& lost, v1::SessionState s) const;

  SessionContext context_;
  v1::SessionRecord record_;
  absl::Time phase_started_;
  std::vector<RankProgress> ranks_;

  // PLANNING: what each rank submitted, until the plan is decided.
  struct Submission {
    uint64_t fingerprint = 0;       // FingerprintLocalPlan
    bool memory_only = false;       // what the rank asked
    std::optional<LocalPlan> plan;  // its shards, while this machine holds them
  };
  absl::btree_map<uint32_t, Submission> submissions_;
  absl::btree_set<uint32_t> awaiting_shards_;  // sent SEND_PLAN, shards not here yet
  uint64_t plan_attempt_ = 0;
  bool planning_ = false;  // a PlanWork of plan_attempt_ is out
  // Index = rank: the global plan whose assignment the rank's agent holds (0: none, or not
  // known — after a recovery). A PIN of that plan leaves the assignment out.
  std::vector<uint64_t> held_;

  // PINNING and later.
  std::shared_ptr<const GlobalPlan> plan_;
  std::unique_ptr<ChunkLedger> ledger_;
  uint32_t writers_active_ = 0;

  // COMMITTING.
  std::shared_ptr<const v1::Manifest> manifest_;
  std::vector<int64_t> retire_steps_;
  bool retention_complete_ = false;  // COMMIT_WRITTEN said its retention removed them all
  bool commit_in_flight_ = false;    // a CommitAttempt is out
  bool roll_back_requested_ = false;  // asked of the committer agent
  // Ranks whose agent refused this session's COMMIT (reported an error as its committer:
  // agent/save/save_core.h R4), never picked again — until that agent restarts (AgentRestarted).
  // Not persisted: after a coordinator restart an agent asked again repeats its refusal.
  absl::btree_set<uint32_t> refused_commit_;
  absl::Time next_commit_attempt_ = absl::InfinitePast();
  absl::Duration commit_backoff_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_SESSION_MACHINE_H_
