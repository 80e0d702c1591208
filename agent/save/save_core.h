// SaveCore: this rank's part of every save session, as a pure state machine (STYLE.md 16).
//
// No threads, no mutex, no clock reads, no I/O, no RPCs inside. Events come in as method calls,
// each with the current time; what to do comes out as plain data (agent/save/save_effects.h): RPCs
// to send, work to run, answers to the trainer, exchanges to cancel, lines to log, and when
// the next Tick() is due. Each RPC and work item carries an id; its result comes back as an
// event with that id. The same events in the same order give the same effects, so the agent's
// shell (SaveExecutor: threads, the staging pool, storage, peers, the coordinator client) and
// a deterministic simulation drive the same core.
//
// One session on this agent (edges numbered; each is one method, or one branch of OnCommand):
//
//   BeginSave ─1─► SUBMITTING ─2 plan accepted─► PLANNED ─3 PIN─► PINNING ─4 staging ready─►
//     │ refused, or unreachable past submit_retry_window: the trainer gets the error, no session
//   PINNED ─5 COPY (or at once, if the PIN said copy_when_pinned): slots to the trainer─►
//   COPYING ─6 Staged()─► STAGED ─7 GATHER (or at once, if the PIN said write_when_staged)─►
//   GATHERING ─8 hashed, exchanged─► GATHERED ─9 PERSIST (or at once, if write_when_staged)─►
//   PERSISTING ─10 written─► PERSISTED
//   (a COMMIT for a session this agent does not know) ─11─► COMMIT_ONLY
//   PERSISTED, COMMIT_ONLY ─12 COMMIT─► (commit sub-state below; the phase stays)
//   any phase above ─13 local failure─► FAILED    (reported; waits for the verdict)
//   FAILED ─ COMMIT─► FAILED    (every report again, the failure among them: R4)
//   any phase above, FAILED ─14 ABORT─► ENDING ─15 work done, own tmp dir removed─► ABORTED
//   any phase above, FAILED ─16 COMMITTED─► COMMITTED
//
//   Commit (committer agents only):
//     IDLE ─C1 COMMIT─► RESOLVING ─C2 kCommitted: report COMMIT_WRITTEN, retention─► WRITTEN
//                       RESOLVING ─C3 kRolledBack: report COMMIT_ROLLED_BACK + reason─► ROLLED_BACK
//                       RESOLVING ─C4 kUnresolved─► BACKOFF ─C5 Tick, or a newer COMMIT─► RESOLVING
//     A COMMIT that arrives while RESOLVING runs again when the running one returns
//     (a newer one may ask to roll back). A repeated COMMIT after WRITTEN or ROLLED_BACK
//     resolves again (idempotent) and its report is not added twice.
//
// The rules, each stated once here:
//
// R1 Commands. A command whose seq is not above the last handled for its session is ignored.
//    A command for a session this agent does not know is held while a plan of its step is
//    being submitted — by a BeginSave or an R3 re-submission — (the coordinator may answer on
//    the stream before the submission's reply arrives) and handled when that submission names
//    the session; a COMMIT for an unknown
//    session is edge 11 (a fresh committer: its earlier incarnation had the session); any
//    other is ignored. A command for a phase already under way or done is ignored (the
//    stream's reconnection, which replays it, already re-sent the reports: R3) — except
//    COMMIT, which resolves again (C1).
// R2 The trainer. Every ticket gets exactly one reply. BeginSave's reply is its slots (edge 5)
//    or the error that ended its session; a newer BeginSave of the same session takes its
//    place (the older gets Aborted); TrainerGone answers its ticket Cancelled. Staged() is
//    answered at once. WaitCommitted waits for the verdict (R7), its deadline, or Shutdown.
// R3 Re-sending (coordinator.proto). Every report of a session stays in its ReportQueue until
//    the session ends. All of them are re-sent, chunks before phases, after every
//    registration (OnRegistered: the same coordinator too), every (re)connection of the
//    command stream (OnStreamConnected), a RESEND command, and when a report failed: then
//    after backoff (retry_backoff, reset by any acknowledged report), until acknowledged, the
//    session ends, or Shutdown. A report refused because the session ended (FailedPrecondition)
//    is not retried: the coordinator answers it by sending that session's verdict again. In
//    case that went to a stream this agent no longer had, one report goes again (a reminder)
//    after every (re)connection and on a timer (1 s doubling to 30 s) until the verdict is
//    here. On the same triggers a session still
//    PLANNED re-submits its plan; if the coordinator then names another session, the PLANNED
//    session moves to that id — and if the session ended here meanwhile (its ABORT came
//    first and the trainer was answered), the named session is failed at once with
//    AGENT_LOST: no trainer waits for it. A submission whose reply arrives after the stream
//    (re)connected is sent once more: that reconnection's re-submission came before the
//    session was known here, and its verdict may have gone to the stream that broke.
// R4 Paths. The directories the coordinator names — PERSIST's tmp_dir, COMMIT's tmp_dir and
//    final_dir — must equal TmpDirPath / StepDirPath (common/ids.h) of the storage root this
//    agent registered with, its job, the session's step and id; session ids must be one safe
//    path component. Anything else fails the session (edge 13) with IO_ERROR naming the path
//    received and the path expected; nothing is written, committed or removed there. Only
//    the checked tmp_dir this rank wrote into is ever removed (edge 15). A committer's
//    refusal is the one error it reports in COMMITTING (an unresolved commit it retries
//    unsaid): the coordinator asks another committer. A COMMIT that comes again to a FAILED
//    session (the coordinator restarted, or heard the refusal while this rank was not its
//    committer) is answered with every report of the session again, the refusal among
//    them; nothing is committed.
// R5 Lease. Before writing (PERSIST) the agent's lease must be current and the one the session
//    began under (OnLease). If the generation moved on, the coordinator gave this agent up
//    (it was frozen or cut off past its lease: the coordinator's judgement, told in the
//    answer to its next renewal, agent/lease_keeper.h) and the session fails with AGENT_LOST
//    instead. If no lease is current but the generation has not moved (a renewal is late: a
//    coordinator that was paused answers its queued heartbeats only when it resumes, and its
//    PERSIST may come first), the write waits for the next OnLease — at most lease_wait, then
//    the session fails with AGENT_LOST: the same generation writes, another fails the session. A commit is the coordinator's to ask of any agent at
//    any time once COMMITTING (it is idempotent), so a commit attempt needs only the lease
//    under which its COMMIT arrived to be current: a COMMIT that arrives while the lease is
//    lapsed is ignored, and one whose lease lapsed before an attempt is not retried — the
//    coordinator asks again (it re-sends COMMIT, to a live committer) and that COMMIT, under
//    the current lease, runs. Nothing stale (a COMMIT received before the agent froze) is
//    ever acted on. Until the first OnLease the lease is taken as current. A save begun while
//    no lease is current (the heartbeat found the coordinator gone, e.g. it crashed after
//    other ranks opened the session, and the agent is registering again) began under the
//    generation last held: the generation moves on only when a lease is lost, so if it is the
//    current one again by PERSIST, the coordinator never gave this agent up in between. A
//    save begun before any lease was held takes the first.
// R6 Local failures (edge 13): the failure is reported with its error; no further work starts.
//    The session still ends only by the verdict (R7), so the trainer hears the coordinator's
//    reason — which is the agent's own if it came first, and the real cause if the failure was
//    a consequence of an ABORT (the coordinator removed the directory under a writer). A DP
//    exchange that returns Aborted was cancelled for the session's ABORT: FAILED, unreported.
// R7 Verdicts. Only the coordinator's COMMITTED or ABORT ends a session (or Shutdown). ABORT
//    cancels a running exchange at once, answers a waiting BeginSave, then waits for the
//    session's running work, removes the tmp dir this rank wrote into, and only then answers
//    WaitCommitted (so a trainer that hears the abort finds nothing of it left by this rank).
// R8 Trainer death. TrainerGone for a BeginSave whose session is not yet STAGED fails the
//    session with AGENT_LOST naming this rank (edge 13), so the save aborts at once instead of
//    at the coordinator's COPYING timeout; a COPY with no BeginSave waiting does the same.
//    A later BeginSave of the same step (a retry) is not affected.
// R9 Sessions the coordinator has ended. A plan accepted for session X proves every other
//    session of this agent over on the coordinator (a job saves one session at a time): their
//    reports stop; they wait for a verdict only while among the last remember_sessions.
// R10 Cached plans (DESIGN.md "Plan caching"). The agent keeps the assignment (as its staging
//    layout) of the last PIN that carried one, under the PIN's plan fingerprint and its own
//    local-plan fingerprint (common/plan_fingerprint.h). A BeginSave whose local plan has that
//    fingerprint submits the fingerprint alone (shards_omitted) and names the plan it holds;
//    the coordinator's send_full_plan reply, or a SEND_PLAN command, makes it submit the
//    shards at once (and for the rest of the session). A PIN with assignment_omitted uses the
//    held layout; if this agent holds none of that plan the session fails (INTERNAL).
// R11 Memory tier (DESIGN.md "Memory tier"). A session that ends COMMITTED while PERSISTED —
//    this rank wrote its data file straight from staging — hands its staging to the shell as
//    `resident`, which keeps it for loads of that checkpoint unless another save has acquired
//    staging since (a verdict that arrives late; StagingPool::Retain refuses it). A session
//    that failed, never wrote, or only committed (COMMIT_ONLY) hands nothing. Every session
//    that ends COMMITTED is named to the shell (`committed`), which makes it the last commit
//    this agent handled once `resident` is kept.
// R12 Memory-only saves (DESIGN.md "Memory-only saves"). A PERSIST with memory_only names no
//    directory (R4 expects the empty path) and its work writes nothing: it checksums the data
//    file's chunks in staging and reports them (PersistWork::memory_only). Its COMMITTED names
//    no directory either; R11 keeps its staging as for any save — that is where it lives.
// R13 Writing when staged (PinCommand.write_when_staged). The coordinator told this rank it
//    exchanges no DP slices and is admitted as a writer from its PIN on: Staged() starts the
//    gather at once (hashing only, no peers), and its end starts the write at once, into
//    TmpDirPath of the registered storage root (R4's check; no root: IO_ERROR), under R5. A
//    GATHER or PERSIST that comes later is for a phase under way or done (R1).
//
// Where the code is: one class, defined in parts, one concept each (each file says which):
// save_core.cc (construction, the trainer's calls, command dispatch, the lease, time, shutdown,
// the sessions kept), submission.cc (edges 1, 2; R1's held commands, R3's re-submission, R10),
// phases.cc (edges 3–10), commit.cc (C1–C5), reports.cc (R3's reports and re-sending) and
// ending.cc (edges 13–16). This header is the whole contract.
//
// Thread-safety: none. One caller at a time (the shell holds its mutex around every call).
#ifndef TESSERA_AGENT_SAVE_SAVE_CORE_H_
#define TESSERA_AGENT_SAVE_SAVE_CORE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/backoff.h"
#include "agent/save/report_queue.h"
#include "agent/save/save_effects.h"
#include "agent/save/staging_layout.h"
#include "tessera/v1/agent.pb.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {

struct SaveCoreOptions {
  std::string job_id;
  uint32_t rank = 0;
  uint64_t incarnation = 0;
  // Longest a DP exchange may take before this rank reports TIMEOUT. Default: 10 min.
  absl::Duration gather_timeout = absl::Minutes(10);
  // Chunks per ReportChunks call. Default: 1024.
  size_t report_batch = 1024;
  // How long a plan submission keeps retrying while the coordinator is unreachable or does
  // not know this agent yet (it may be restarting); then BeginSave fails. Default: 60 s.
  absl::Duration submit_retry_window = absl::Seconds(60);
  // Between retries of plan submissions, re-sends after a failed report (R3) and commit
  // attempts that were unresolved (C4). Default: 100 ms doubling to 2 s, jitter 0.5.
  BackoffOptions retry_backoff = {absl::Milliseconds(100), absl::Seconds(2), 2.0, 0.5};
  // Seeds the backoff's jitter: the same seed, the same delays. Default: 1.
  uint64_t seed = 1;
  // Finished sessions remembered for WaitCommitted. Default: 16.
  size_t remember_sessions = 16;
  // R5: longest a write waits for this agent's lease to be renewed; then the session fails
  // with AGENT_LOST. Default: 60 s.
  absl::Duration lease_wait = absl::Seconds(60);
};

// Where a session is, as the core sees it (for tests and the simulation's invariants).
enum class SavePhase {
  kPlanned,
  kPinning,
  kPinned,
  kCopying,
  kStaged,
  kGathering,
  kGathered,
  kPersisting,
  kPersisted,
  kCommitOnly,
  kFailed,
  kEnding,
  kCommitted,
  kAborted,
};
absl::string_view SavePhaseName(SavePhase phase);

// A command's kind as its body's field name in coordinator.proto: "pin", "copy", ..., "resend";
// "empty" without a body.
std::string CommandName(const v1::Command& command);

// How the commit of a committer's session stands (the commit sub-state).
enum class CommitState { kIdle, kResolving, kBackoff, kWritten, kRolledBack };

struct SessionView {
  std::string id;
  int64_t step = 0;
  SavePhase phase = SavePhase::kPlanned;
  CommitState commit = CommitState::kIdle;
  absl::Status outcome;        // COMMITTED: OK; ABORTED/ENDING: the verdict; FAILED: the failure
  std::string written_dir;     // the checked tmp dir this rank wrote into, if any
  size_t reports = 0;          // reports kept for re-sending
  bool reports_closed = false;
};

class SaveCore {
 public:
  explicit SaveCore(SaveCoreOptions options);

  // --- The trainer (R2). Tickets are chosen by the caller, unique per call.

  // Edge 1: submits the plan. Replies to `ticket`: BeginSaveReply with the slots (edge 5), or
  // the error: the coordinator's refusal (InvalidArgument + DUPLICATE_FQN ..., FailedPrecondition
  // + STEP_EXISTS / SESSION_IN_PROGRESS), Unavailable past submit_retry_window, Internal if the
  // coordinator named an unusable session id, the verdict's error if the session ended first,
  // Aborted if a newer BeginSave of the session took its place, Unavailable after Shutdown.
  SaveEffects BeginSave(absl::Time now, uint64_t ticket, v1::BeginSaveRequest request);

  // R8: the BeginSave call `ticket` was cancelled (its trainer died or gave up). Replies
  // Cancelled to it if it had no reply yet. Errors: none (an unknown ticket is ignored).
  SaveEffects TrainerGone(absl::Time now, uint64_t ticket);

  // Edge 6: the trainer copied into `session_id`'s slots. Replies StagedReply to `ticket` at
  // once: OK, or NotFound for an unknown session, the session's failure or verdict if it
  // failed or ended, FailedPrecondition if its slots were not handed out (or it already staged).
  // With `withdrawn` (an overlapped save whose tensors changed before its fence), a session
  // still COPYING fails instead (edge 13, with that error) and OK is replied.
  SaveEffects Staged(absl::Time now, uint64_t ticket, const std::string& session_id,
                     uint64_t stall_ns, const v1::ErrorDetail* withdrawn = nullptr);

  // Replies WaitCommittedReply to `ticket`: the checkpoint directory once the latest session
  // of `step` is COMMITTED; its verdict's error once ABORTED; DeadlineExceeded at `deadline`;
  // NotFound if this agent has no session of `step`; Unavailable after Shutdown.
  SaveEffects WaitCommitted(absl::Time now, uint64_t ticket, int64_t step, absl::Time deadline);

  // --- The coordinator and the link to it.

  // A command from the stream (R1; edges 3, 5, 7, 9, 11, 12, 14, 16; RESEND is R3).
  SaveEffects OnCommand(absl::Time now, const v1::Command& command);

  // The agent (re)registered: R3 re-sends. `storage_root` (RegisterAgentResponse) is where
  // R4's paths are computed from.
  SaveEffects OnRegistered(absl::Time now, uint64_t coordinator_incarnation,
                           const std::string& storage_root);

  // The command stream (re)connected: R3 re-sends.
  SaveEffects OnStreamConnected(absl::Time now);

  // The agent's lease generation now (R5): nullopt while lapsed. Call whenever it may have
  // changed; the shell calls it before every other event.
  SaveEffects OnLease(absl::Time now, std::optional<uint64_t> generation);

  // The result of the SubmitLocalPlan RPC `rpc_id` (edge 2, or a retry, or an R3 re-submit).
  SaveEffects OnPlanSubmitted(absl::Time now, uint64_t rpc_id,
                              const absl::StatusOr<v1::SubmitLocalPlanResponse>& result);

  // The result of the ReportPhase / ReportChunks RPC `rpc_id` (R3).
  SaveEffects OnReportDone(absl::Time now, uint64_t rpc_id, const absl::Status& result);

  // --- Work results, by the work item's id. A result for a session that ended meanwhile only
  // lets its ending go on (R7).

  // PinWork (edge 4): the staging memory, or why it could not be had (ResourceExhausted +
  // ADMISSION_DENIED is reported as such; anything else as IO_ERROR).
  SaveEffects OnStagingReady(absl::Time now, uint64_t work_id,
                             absl::StatusOr<StagingMemory> memory);
  // GatherWork (edge 8): the replica hashes, or the exchange's error (R6).
  SaveEffects OnGathered(absl::Time now, uint64_t work_id,
                         absl::StatusOr<std::vector<v1::ReplicaHash>> hashes);
  // PersistWork (edge 10): the chunks written, or the I/O error.
  SaveEffects OnPersisted(absl::Time now, uint64_t work_id,
                          absl::StatusOr<std::vector<v1::ChunkReport>> chunks);
  // CommitWork (C2–C4).
  SaveEffects OnCommitResolved(absl::Time now, uint64_t work_id, const CommitWorkResult& result);
  // RemoveWork (edge 15). A failed removal is logged; the session ends anyway.
  SaveEffects OnRemoved(absl::Time now, uint64_t work_id, const absl::Status& result);

  // --- Time and the end.

  // Fires what is due at `now`: plan submission retries, R3's re-send after a failure, commit
  // retries (C5), WaitCommitted deadlines.
  SaveEffects Tick(absl::Time now);

  // Answers every open ticket with Unavailable and cancels running exchanges; afterwards
  // trainer calls are answered Unavailable and every other event is ignored. Idempotent.
  SaveEffects Shutdown(absl::Time now);

  // --- Inspection.
  std::optional<SessionView> View(const std::string& session_id) const;
  std::vector<SessionView> Sessions() const;
  // True if a trainer holds the slots of a session and has not called Staged yet (COPYING).
  bool AnyCopying() const;
  uint64_t sessions_committed() const { return committed_; }

 private:
  struct Waiter {
    uint64_t ticket = 0;
    absl::Time deadline;
  };
  struct Commit {
    CommitState state = CommitState::kIdle;
    std::shared_ptr<const v1::CommitCommand> latest;
    std::optional<uint64_t> lease;  // under which `latest` arrived (R5)
    std::string tmp_dir, final_dir, job_dir;  // checked (R4)
    bool run_again = false;  // a COMMIT arrived while RESOLVING
    bool reported = false;   // COMMIT_WRITTEN or COMMIT_ROLLED_BACK is in the report queue
    absl::Time retry_at = absl::InfiniteFuture();
    Backoff backoff;
    Commit(const BackoffOptions& options, uint64_t seed) : backoff(options, seed) {}
  };
  struct Session {
    std::string id;
    int64_t step = 0;
    uint64_t created = 0;  // creation order: WaitCommitted takes the latest of a step
    SavePhase phase = SavePhase::kPlanned;
    std::shared_ptr<const v1::SubmitLocalPlanRequest> plan;  // null for COMMIT_ONLY
    // R10: the plan as a fingerprint, while the coordinator may take it so (else null).
    std::shared_ptr<const v1::SubmitLocalPlanRequest> slim;
    std::optional<uint64_t> lease;  // generation it began under (R5); none: the next one
    // R5: its write, asked for while no lease was current but the generation had not moved:
    // the directory and memory_only, started once OnLease says which generation holds, or
    // failed at persist_wait_until.
    std::optional<std::pair<std::string, bool>> persist_awaiting_lease;
    absl::Time persist_wait_until = absl::InfiniteFuture();
    uint64_t last_seq = 0;
    uint64_t begin_ticket = 0;   // the BeginSave call that owns the session
    bool begin_waiting = false;  // ... and is still waiting for its reply
    std::vector<Waiter> waiters;
    std::shared_ptr<const StagingLayout> layout;
    StagingMemory memory;
    bool plan_cached = false;
    bool copy_when_pinned = false;  // the PIN said so: edge 5 follows edge 4 at once
    bool write_when_staged = false;  // the PIN said so: edges 7 and 9 follow 6 and 8 at once
    absl::Time write_started;  // edge 9, for the PERSISTED report
    uint64_t work = 0;            // the work item running for it, 0 if none
    std::string written_dir;      // the checked tmp dir this rank wrote into
    bool removed = false;         // written_dir's removal started (edge 15)
    ReportQueue reports;
    // R3: while the coordinator has ended the session and its verdict is not here, one
    // report goes again at remind_at, with backoff, so the verdict is sent again.
    absl::Time remind_at = absl::InfiniteFuture();
    Backoff remind_backoff{BackoffOptions{absl::Seconds(1), absl::Seconds(30), 2.0, 0.0},
                           /*seed=*/0};
    uint64_t resubmit_rpc = 0;    // an R3 re-submission out, 0 if none
    uint64_t resubmit_sent_at_connection = 0;  // connections_ when it was sent
    std::optional<Commit> commit;
    absl::Status outcome;         // the failure (FAILED) or the verdict (ENDING, ended)
    std::string checkpoint_dir;
    bool orphaned = false;        // R9
  };
  struct PendingBegin {
    uint64_t ticket = 0;
    int64_t step = 0;
    std::shared_ptr<const v1::SubmitLocalPlanRequest> plan;
    std::shared_ptr<const v1::SubmitLocalPlanRequest> slim;  // R10, as Session::slim
    absl::Time give_up_at;
    absl::Time retry_at = absl::InfiniteFuture();  // set while backing off
    uint64_t rpc = 0;                              // the submission out, 0 if none
    uint64_t sent_at_connection = 0;               // connections_ when it was sent
    bool trainer_gone = false;                     // answered Cancelled already
    Backoff backoff;
    PendingBegin(const BackoffOptions& options, uint64_t seed) : backoff(options, seed) {}
  };
  enum class RpcOwner { kBegin, kResubmit, kReport };
  struct RpcRef {
    RpcOwner owner = RpcOwner::kReport;
    uint64_t ticket = 0;   // kBegin
    std::string session;   // kResubmit, kReport
  };
  using WorkItem = std::variant<PinWork, GatherWork, PersistWork, CommitWork, RemoveWork>;
  // R10: the assignment this agent last pinned with, and the plans it belongs to.
  struct HeldPlan {
    uint64_t local_fingerprint = 0;   // SubmitLocalPlanRequest.local_plan_fingerprint
    uint64_t plan_fingerprint = 0;    // PinCommand.plan_fingerprint
    std::shared_ptr<const StagingLayout> layout;
  };

  // --- Part 1 (save_core.cc).
  // Every event ends with Done(): forgets old sessions, sets next_tick.
  SaveEffects Done(absl::Time now, SaveEffects fx);
  void Log(SaveEffects& fx, LogLine::Severity severity, std::string text);
  void Reply(SaveEffects& fx, uint64_t ticket, BeginSaveReply reply);
  void Reply(SaveEffects& fx, uint64_t ticket, StagedReply reply);
  void Reply(SaveEffects& fx, uint64_t ticket, WaitCommittedReply reply);
  uint64_t NewSeed();
  std::string Describe(const Session& s) const;  // "session <id> (step N)"

  // Commands (R1).
  void Dispatch(absl::Time now, Session& s, const v1::Command& command, SaveEffects& fx);

  // R4, R5.
  absl::Status CheckPath(const std::string& what, const std::string& received,
                         const std::string& expected) const;
  bool LeaseAllows(const Session& s) const;
  absl::Status LeaseLapsed(absl::string_view what) const;

  Session* Find(const std::string& session_id);
  const Session* Find(const std::string& session_id) const;
  Session& NewSession(const std::string& id, int64_t step);
  void Forget(SaveEffects& fx);
  SessionView ViewOf(const Session& s) const;

  // --- Part 2 (submission.cc): plan submission (edges 1, 2).
  void SendSubmission(PendingBegin& begin, SaveEffects& fx);
  // R3, R10: the session's plan again (as a fingerprint while `slim` is set).
  void Resubmit(Session& s, SaveEffects& fx);
  void AcceptPlan(absl::Time now, PendingBegin& begin, const std::string& session_id,
                  SaveEffects& fx);
  void EndPendingBegin(uint64_t ticket, SaveEffects& fx);
  // R1: a plan of `step` is being submitted (a BeginSave, or an R3 re-submission).
  bool SubmittingStep(int64_t step) const;
  // R1: the held commands of `session_id`, removed from held_.
  std::vector<v1::Command> TakeHeld(const std::string& session_id);
  // R1: drops (and logs) held commands no submission can claim any more.
  void PruneHeld(SaveEffects& fx);
  // R3: a re-submission's reply named `moved_to`, but `s` ended here first: fail that session.
  void DisownMovedPlan(const Session& s, const std::string& moved_to, SaveEffects& fx);
  // R3: re-submits a PLANNED session whose plan was out while the stream reconnected.
  void AskAgainAfterReconnect(Session& s, SaveEffects& fx);
  v1::BeginSaveResponse SlotsOf(const Session& s) const;

  // --- Part 3 (phases.cc): the commands that start a phase's work (R1), and its results.
  void HandlePin(Session& s, const v1::PinCommand& pin, SaveEffects& fx);
  void HandleCopy(Session& s, SaveEffects& fx);
  // Edge 7: hash, exchange with `peer_addresses`.
  void StartGather(absl::Time now, Session& s, std::map<uint32_t, std::string> peer_addresses,
                   SaveEffects& fx);
  // Edge 9 into `dir`, if the lease allows (R5).
  void StartPersist(absl::Time now, Session& s, std::string dir, bool memory_only,
                    SaveEffects& fx);
  void HandleGather(absl::Time now, Session& s, const v1::GatherCommand& gather,
                    SaveEffects& fx);
  void HandlePersist(absl::Time now, Session& s, const v1::PersistCommand& persist,
                     SaveEffects& fx);
  void StartWork(Session& s, WorkItem item, SaveEffects& fx);
  // The session `work_id` was for, its work slot cleared, if it is still under way (and in
  // `expected`, if given); a session ENDING goes on ending instead (R7). Null after Shutdown.
  Session* TakeWork(uint64_t work_id, std::optional<SavePhase> expected, SaveEffects& fx);

  // --- Part 4 (commit.cc): the commit sub-machine (C1–C5).
  void HandleCommit(Session& s, const v1::Command& command, SaveEffects& fx);
  void StartCommit(Session& s, SaveEffects& fx);
  // R5 for commits: the lease `latest` arrived under is current.
  bool CommitLeaseCurrent(const Commit& c) const;

  // --- Part 5 (reports.cc): reports (R3).
  // `report`: its phase and that phase's fields (PhaseReport); the rest is filled in here.
  void AddPhaseReport(Session& s, v1::ReportPhaseRequest report, SaveEffects& fx);
  void AddChunkReport(Session& s, v1::ReportChunksRequest request, SaveEffects& fx);
  void Pump(Session& s, SaveEffects& fx);
  // Logs `why` unless it is empty.
  void ResendAll(absl::string_view why, SaveEffects& fx);
  // R3: the coordinator ended the session, and its verdict has not arrived.
  bool AwaitingVerdict(const Session& s) const;

  // --- Part 6 (ending.cc): failure and the end (edges 13–16).
  void Fail(Session& s, v1::ErrorCode code, const absl::Status& cause, SaveEffects& fx);
  void BeginEnding(Session& s, absl::Status verdict, SaveEffects& fx);
  void ContinueEnding(Session& s, SaveEffects& fx);
  void End(Session& s, absl::Status outcome, std::string checkpoint_dir, SaveEffects& fx);

  const SaveCoreOptions options_;

  std::map<std::string, std::unique_ptr<Session>> sessions_;
  std::deque<std::string> finished_;  // ended or orphaned, oldest first
  std::map<uint64_t, std::unique_ptr<PendingBegin>> begins_;  // by ticket
  std::vector<v1::Command> held_;                             // R1
  std::optional<HeldPlan> held_plan_;                         // R10
  std::map<uint64_t, RpcRef> rpcs_;                           // RPCs out
  std::map<uint64_t, std::string> work_;                      // work out -> session
  std::string storage_root_;
  bool lease_known_ = false;
  std::optional<uint64_t> lease_;
  // The generation last held (R5): a save begun while no lease is current belongs to it.
  std::optional<uint64_t> last_lease_;
  absl::Time resend_at_ = absl::InfiniteFuture();  // R3, after a failed report
  Backoff resend_backoff_;
  bool reports_failing_ = false;  // logs an outage once, and its end
  uint64_t connections_ = 0;      // registrations and stream connections so far (R3)
  uint64_t next_id_ = 1;          // RPC and work ids
  uint64_t next_created_ = 1;
  uint64_t seeds_drawn_ = 0;
  uint64_t committed_ = 0;
  bool stopped_ = false;
};

}  // namespace tessera

#endif  // TESSERA_AGENT_SAVE_SAVE_CORE_H_
