// SaveExecutor: this rank's part of every save session — it answers the trainer and follows
// the coordinator's commands. Core logic: no gRPC; the coordinator, staging, storage and peers
// are interfaces (STYLE.md 7).
//
// One session on the agent:
//
//   BeginSave ──► SUBMITTED ─PIN─► PINNED ─COPY─► COPYING ─Staged()─► STAGED ─GATHER─► GATHERED
//                                                   (BeginSave returns)          │
//      ┌─────────────────────────────────────────────────────────────────────────┘
//      └─PERSIST─► PERSISTED [─COMMIT─► COMMIT_WRITTEN] ─COMMITTED─► COMMITTED
//   any ─ABORT (or a local failure reported to the coordinator)─► ABORTED
//
//   PIN      lay out staging for the assignment (agent/staging_layout.h), acquire and zero the
//            padding, report PINNED.
//   COPY     hand the trainer its slots (BeginSave completes); the trainer copies and calls
//            Staged(), which reports STAGED.
//   GATHER   exchange DP optimizer slices with peers (PeerTransport), hash replicas, report
//            the hashes, then GATHERED.
//   PERSIST  write the data file straight from staging (ShardWriter), report its chunks, then
//            PERSISTED. Any I/O error is reported as IO_ERROR with the path, which aborts.
//   COMMIT   (committer agents only) commit the directory (format/commit.h), COMMIT_WRITTEN.
//   COMMITTED / ABORT  wake WaitCommitted callers; the staging region stays in the pool for
//                      the next save.
//
// Every report of the current session is remembered; after a coordinator restart
// (OnRegistered with a new coordinator incarnation) they are re-sent, and a plan still waiting
// for its verdict is re-submitted, so the coordinator can resume (SessionManager::Recover).
//
// Blocking work (RPCs, peer exchange, writes) runs on one worker thread, in order; commands
// and trainer calls only enqueue, except the two steps the trainer waits on: COPY hands out
// the slots and Staged() answers the trainer at once, on the caller's thread (both only
// change the session under the lock). ABORT also cancels an exchange in progress at once.
//
// Thread-safety: all public methods are safe for concurrent use; callbacks run with no lock
// held, on the worker thread or on the thread of the call that decided them (OnCommand for
// BeginSave's slots, Staged(), WaitCommitted() when the outcome is known).
#ifndef TESSERA_AGENT_SAVE_EXECUTOR_H_
#define TESSERA_AGENT_SAVE_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/backoff.h"
#include "agent/coordinator_client.h"
#include "agent/peer/peer_transport.h"
#include "format/shard_writer.h"
#include "agent/staging_layout.h"
#include "agent/staging_pool.h"
#include "storage/storage.h"
#include "tessera/v1/agent.pb.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {

struct SaveExecutorOptions {
  std::string job_id;
  uint32_t rank = 0;
  uint64_t incarnation = 0;
  // Longest a DP exchange may take before this rank reports TIMEOUT. Default: 10 min.
  absl::Duration gather_timeout = absl::Minutes(10);
  // Chunks per ReportChunks call. Default: 1024.
  size_t report_batch = 1024;
  // How long a plan submission keeps retrying while the coordinator is unreachable or does
  // not know this agent yet (it may be restarting). Default: 60 s.
  absl::Duration submit_retry_window = absl::Seconds(60);
  // Likewise for phase and chunk reports; a longer outage is covered by re-sending every
  // report after re-registration. Default: 3 s.
  absl::Duration report_retry_window = absl::Seconds(3);
  // Finished sessions remembered for WaitCommitted. Default: 16.
  size_t remember_sessions = 16;
  ShardWriterOptions writer;
  // The agent's lease generation if its lease is current, else nullopt (Lifeline::
  // LeaseGeneration). Before writing (PERSIST, COMMIT) the executor checks it is current and
  // unchanged since the session began on this agent; otherwise the agent was frozen or cut
  // off past its lease, the coordinator has given it up, and the session is failed with
  // AGENT_LOST instead of writing. Default: none (the lease is always taken as current).
  std::function<std::optional<uint64_t>()> lease_generation;
  // Told the peers' addresses of a session before its DP exchange (GatherCommand), so the
  // transport's resolver can find them. Default: none.
  std::function<void(const std::string& session_id, const std::map<uint32_t, std::string>&)>
      on_peer_addresses;
};

class SaveExecutor {
 public:
  using BeginSaveDone = std::function<void(absl::StatusOr<v1::BeginSaveResponse>)>;
  using StatusDone = std::function<void(absl::Status)>;
  using CommitDone = std::function<void(absl::StatusOr<std::string> checkpoint_dir)>;

  // Every pointer must outlive the executor. Starts the worker thread.
  SaveExecutor(CoordinatorClient* coordinator, StagingPool* staging, Storage* storage,
               PeerTransport* peers, SaveExecutorOptions options);
  ~SaveExecutor();  // Shutdown()s.

  // Trainer: start a save. `done` gets the staging slots once every rank pinned (COPY), or
  // the error: the planner's (InvalidArgument + DUPLICATE_FQN ...) before any copy,
  // FailedPrecondition (STEP_EXISTS, SESSION_IN_PROGRESS), Aborted (AGENT_LOST, TIMEOUT ...),
  // Unavailable if the coordinator cannot be reached.
  // Returns a ticket naming this call for TrainerGone.
  uint64_t BeginSave(v1::BeginSaveRequest request, BeginSaveDone done) ABSL_LOCKS_EXCLUDED(mu_);

  // Trainer: the BeginSave call `ticket` was cancelled — the trainer died (or gave up) while
  // waiting for its slots, or before it received them. If that call's session has not been
  // staged, it is failed with AGENT_LOST naming this rank, so the save aborts at once instead
  // of at the coordinator's COPYING timeout. A later call of the same step (a retry) is not
  // affected.
  void TrainerGone(uint64_t ticket) ABSL_LOCKS_EXCLUDED(mu_);

  // Trainer: finished copying into `session_id`'s slots. Records STAGED and calls `done` at
  // once, on the calling thread; the STAGED report to the coordinator follows on the worker
  // (the trainer's blocked time does not include that round trip; a refused report surfaces
  // through WaitCommitted).
  // Errors: NotFound for an unknown session; the abort error if it aborted (as this agent
  // knows); FailedPrecondition before the slots were handed out.
  void Staged(const std::string& session_id, uint64_t stall_ns, StatusDone done)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Trainer: the save of `step` is over. `done` gets the checkpoint directory when it is
  // COMMITTED, the abort error when ABORTED, DeadlineExceeded at `deadline`, NotFound if no
  // session of that step is known. Called at once if the outcome is already known.
  void WaitCommitted(int64_t step, absl::Time deadline, CommitDone done) ABSL_LOCKS_EXCLUDED(mu_);

  // Coordinator: a command from the Commands stream.
  void OnCommand(const v1::Command& command) ABSL_LOCKS_EXCLUDED(mu_);

  // Coordinator: the agent (re)registered. If the coordinator's incarnation changed, the
  // current session's reports are re-sent.
  void OnRegistered(uint64_t coordinator_incarnation) ABSL_LOCKS_EXCLUDED(mu_);

  // Fails pending trainer calls with Unavailable and stops the worker. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Where the latest committed checkpoint of each step finished saving, for tests.
  uint64_t sessions_committed() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class Phase {
    kSubmitted,
    kPinned,
    kCopying,
    kStaged,
    kGathered,
    kPersisted,
    kCommitWritten,
    kCommitted,
    kAborted
  };
  struct Session {
    std::string id;
    int64_t step = 0;
    Phase phase = Phase::kSubmitted;
    v1::BeginSaveRequest request;
    std::optional<StagingLayout> layout;
    StagingSlot slot;
    bool has_slot = false;
    BeginSaveDone begin_done;  // until COPY or the end
    uint64_t begin_ticket = 0;  // the BeginSave call that owns begin_done (or got the slots)
    std::vector<std::pair<absl::Time, CommitDone>> waiters;
    absl::Status outcome;      // set when COMMITTED (OK) or ABORTED
    // The coordinator's ABORT reason, recorded as soon as the command arrives (before its
    // task runs), so a local failure caused by the abort (the coordinator removed the
    // temporary directory under a writer) does not replace the real reason.
    std::optional<absl::Status> coordinator_abort;
    std::optional<uint64_t> lease_generation;  // when the session began on this agent
    std::string checkpoint_dir;
    // Everything reported, for re-sending after a coordinator restart.
    std::vector<v1::ReportPhaseRequest> phase_reports;
    std::vector<v1::ReportChunksRequest> chunk_reports;
    std::string tmp_dir;
    uint64_t last_seq = 0;
    bool plan_cached = false;
  };
  using Task = std::function<void()>;

  void Post(Task task) ABSL_LOCKS_EXCLUDED(mu_);
  void RunWorker();

  // Worker-thread steps.
  void DoBeginSave(v1::BeginSaveRequest request, BeginSaveDone done, uint64_t ticket);
  void DoPin(const std::string& session_id, const v1::PinCommand& pin);
  // Runs on the command stream's thread (OnCommand), not the worker; never blocks.
  void DoCopy(const std::string& session_id);
  // Reports STAGED (Staged() already moved the session there and answered the trainer).
  void DoStaged(const std::string& session_id, uint64_t stall_ns);
  void DoGather(const std::string& session_id, const v1::GatherCommand& gather);
  void DoPersist(const std::string& session_id, const std::string& tmp_dir);
  void DoCommit(const std::string& session_id, const v1::CommitCommand& commit);
  void DoEnd(const std::string& session_id, absl::Status outcome, std::string checkpoint_dir);
  void DoResend();
  // Moves the session from `from` to `to` (unless it left `from` meanwhile) and reports.
  void AdvanceAndReport(const std::string& session_id, Phase from, Phase to,
                        v1::AgentPhase report) ABSL_LOCKS_EXCLUDED(mu_);

  // Reports a phase (remembering it); on an RPC error returns it. With `error` set the
  // session aborts on the coordinator.
  absl::Status ReportPhase(const std::string& session_id, v1::AgentPhase phase,
                           const v1::ErrorDetail* error, uint64_t pinned_bytes = 0,
                           uint64_t stall_ns = 0) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReportChunks(const std::string& session_id, v1::ReportChunksRequest request)
      ABSL_LOCKS_EXCLUDED(mu_);
  // OK if this agent's lease is current and unchanged since the session began; else the
  // AGENT_LOST status to fail the session with before `what` (a write).
  absl::Status CheckLease(const std::string& session_id, absl::string_view what)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Reports a local failure: the session aborts on the coordinator.
  void Fail(const std::string& session_id, v1::ErrorCode code, const absl::Status& cause)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `call` until it returns something other than Unavailable or NotFound (a restarted
  // coordinator that has not seen this agent re-register yet), `window` passes, or
  // Shutdown(); waits with backoff between attempts. Returns the last status.
  absl::Status RetryWhileUnavailable(absl::Duration window,
                                     const std::function<absl::Status()>& call)
      ABSL_LOCKS_EXCLUDED(mu_);
  Session* FindLocked(const std::string& session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetOldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CoordinatorClient* const coordinator_;
  StagingPool* const staging_;
  Storage* const storage_;
  PeerTransport* const peers_;
  const SaveExecutorOptions options_;

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> finished_ ABSL_GUARDED_BY(mu_);  // oldest first
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t coordinator_incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t committed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;

  std::thread worker_;  // last: started when everything above exists
};

}  // namespace tessera

#endif  // TESSERA_AGENT_SAVE_EXECUTOR_H_
