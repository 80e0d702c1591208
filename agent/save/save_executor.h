// SaveExecutor: the shell around the agent's save core (agent/save/save_core.h, where the session's
// state diagram and every rule live). It owns nothing of the protocol; it carries out what the
// core asks for and feeds back what happened:
//
//   - every event (a trainer call, a command, a registration, a stream connection, an RPC's or
//     a work item's result, a timer) is handed to the core under one mutex, with absl::Now()
//     and, first, the lease generation if it changed (SaveExecutorOptions::lease_generation);
//   - RPCs to the coordinator run on their own thread, in the order the core asked for them;
//     each result goes back to the core, which decides about retries (no blocking retry loop);
//   - work (staging acquisition and zeroing, the DP exchange, writes, commits, removals) runs
//     on one worker thread in order, through agent/save/save_work.h — the functions a simulation
//     runs too;
//   - a timer thread calls the core's Tick when the core asked for one;
//   - trainer replies run on the thread of the event that decided them, with no lock held:
//     COPY hands out the slots on the command stream's thread and Staged() answers on the
//     caller's thread, so the trainer's blocked time includes no queue and no RPC.
//
// Thread-safety: all public methods are safe for concurrent use. Callbacks run with no lock
// held.
#ifndef TESSERA_AGENT_SAVE_SAVE_EXECUTOR_H_
#define TESSERA_AGENT_SAVE_SAVE_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/coordinator_client.h"
#include "agent/memory_tier.h"
#include "agent/peer/peer_transport.h"
#include "agent/save/save_core.h"
#include "agent/save/save_effects.h"
#include "agent/staging_pool.h"
#include "format/shard_writer.h"
#include "storage/storage.h"
#include "tessera/v1/agent.pb.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {

struct SaveExecutorOptions {
  // The core's options: identity, timeouts, batching, backoff (agent/save/save_core.h).
  SaveCoreOptions core;
  // How data files are written; writer_rank is set to core.rank. Default: ShardWriterOptions.
  ShardWriterOptions writer;
  // The agent's lease generation if its lease is current, else nullopt (Lifeline::
  // LeaseGeneration); the core's R5 compares it before writing and committing. Default: none
  // (the lease is always taken as current).
  std::function<std::optional<uint64_t>()> lease_generation;
  // Told the peers' addresses of a session before its DP exchange (GatherCommand), so the
  // transport's resolver can find them. Default: none.
  std::function<void(const std::string& session_id, const std::map<uint32_t, std::string>&)>
      on_peer_addresses;
  // Where committed saves' staging is kept resident for loads (SaveCore R11); must outlive
  // the executor. Default: none (the memory tier is off; staging is reused as is).
  MemoryTier* memory_tier = nullptr;
  // Called off the lock once a session ended COMMITTED and its save was kept in the memory
  // tier (or was not to be), and LastCommittedSession names it: agent_main heartbeats at
  // once, so the coordinator hears the step is held (or not) without a heartbeat interval's
  // wait. Only with `memory_tier` (without it heartbeats state no copies). Default: none.
  std::function<void()> after_keep;
  // Called on the executor's thread before a save acquires staging (PIN): lets go of what
  // holds the staging set that save reuses (agent_main: BuddyReplicator::GiveWay). Default:
  // none.
  std::function<void()> before_acquire;
  // Called off the lock at the points of a save that fault injection names (agent_main's
  // --crash_on): "copy" just before its slots go to the trainer (on COPY, or when pinned:
  // PinCommand.copy_when_pinned); "pin", "gather", "persist" and "commit" on the worker as
  // that work starts, whether a command or the PIN's write_when_staged started it; "keep" as
  // a committed save is about to be kept in the memory tier. Default: none.
  std::function<void(const std::string& point)> at_fault_point;
};

class SaveExecutor {
 public:
  using BeginSaveDone = std::function<void(absl::StatusOr<v1::BeginSaveResponse>)>;
  using StatusDone = std::function<void(absl::Status)>;
  using CommitDone = std::function<void(absl::StatusOr<std::string> checkpoint_dir)>;

  // Every pointer must outlive the executor. Starts its threads.
  SaveExecutor(CoordinatorClient* coordinator, StagingPool* staging, Storage* storage,
               PeerTransport* peers, SaveExecutorOptions options);
  ~SaveExecutor();  // Shutdown()s.

  // Trainer: start a save. `done` gets the staging slots once every rank pinned (COPY), or
  // the error: the planner's (InvalidArgument + DUPLICATE_FQN ...) before any copy,
  // FailedPrecondition (STEP_EXISTS, SESSION_IN_PROGRESS), Aborted (AGENT_LOST, TIMEOUT ...),
  // Unavailable if the coordinator cannot be reached, Cancelled after TrainerGone (SaveCore::
  // BeginSave has the full list). Returns a ticket naming this call for TrainerGone.
  uint64_t BeginSave(v1::BeginSaveRequest request, BeginSaveDone done) ABSL_LOCKS_EXCLUDED(mu_);

  // Trainer: the BeginSave call `ticket` was cancelled — the trainer died (or gave up) while
  // waiting for its slots, or before it received them. If that call's session has not been
  // staged, it fails with AGENT_LOST naming this rank, so the save aborts at once instead of
  // at the coordinator's COPYING timeout (SaveCore R8).
  void TrainerGone(uint64_t ticket) ABSL_LOCKS_EXCLUDED(mu_);

  // Trainer: finished copying into `session_id`'s slots. Calls `done` at once, on the calling
  // thread; the STAGED report follows on the RPC thread (the trainer's blocked time does not
  // include that round trip; a refused report surfaces through WaitCommitted).
  // Errors: NotFound for an unknown session; the failure or abort error if the session failed
  // or ended (as this agent knows); FailedPrecondition before the slots were handed out.
  // With `withdrawn`, the trainer withdraws its snapshot instead (SaveCore::Staged).
  void Staged(const std::string& session_id, uint64_t stall_ns, StatusDone done,
              std::optional<v1::ErrorDetail> withdrawn = std::nullopt) ABSL_LOCKS_EXCLUDED(mu_);

  // Trainer: the save of `step` is over. `done` gets the checkpoint directory when it is
  // COMMITTED, the abort error when ABORTED, DeadlineExceeded at `deadline`, NotFound if no
  // session of that step is known. Called at once if the outcome is already known.
  void WaitCommitted(int64_t step, absl::Time deadline, CommitDone done) ABSL_LOCKS_EXCLUDED(mu_);

  // The lease generation (SaveExecutorOptions::lease_generation) may have changed: the core is
  // told, so that work waiting for the lease goes on (SaveCore R5). Lifeline's
  // on_lease_changed.
  void LeaseMayHaveChanged() ABSL_LOCKS_EXCLUDED(mu_);

  // Coordinator: a command from the Commands stream.
  void OnCommand(const v1::Command& command) ABSL_LOCKS_EXCLUDED(mu_);

  // Coordinator: the agent (re)registered (every registration, the same coordinator's too):
  // every report in flight is re-sent, and `response.storage_root` is where the directories
  // the coordinator names are checked against (SaveCore R3, R4).
  void OnRegistered(const v1::RegisterAgentResponse& response) ABSL_LOCKS_EXCLUDED(mu_);

  // Coordinator: the command stream (re)connected: every report in flight is re-sent.
  void OnStreamConnected() ABSL_LOCKS_EXCLUDED(mu_);

  // Fails pending trainer calls with Unavailable, cancels running exchanges and stops the
  // threads (a write or commit in progress finishes first). Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks, at most `timeout`, while a trainer waits on a save of this agent: a BeginSave not
  // answered yet, or a session whose slots are out and not yet Staged (its copy runs). Returns
  // true once none does. Background work that competes for the CPU (buddy replication) waits
  // here between pieces so the trainer's stall is its copy alone. True after Shutdown.
  bool AwaitTrainerFree(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // The last session that ended COMMITTED here, set once the memory tier has its save (or it
  // was not kept), for the heartbeat (HeartbeatRequest.last_committed_session): one that
  // reads it and then asks the tier states what the tier kept of that commit. Empty: none
  // since the agent started, or the memory tier is off.
  std::string LastCommittedSession() const ABSL_LOCKS_EXCLUDED(mu_);

  // Sessions that ended COMMITTED, for tests.
  uint64_t sessions_committed() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // What an event decided that runs after the lock is released.
  struct Outbox {
    std::vector<std::function<void()>> replies;
    std::vector<std::string> cancel_exchanges;
    std::vector<LogLine> logs;
    std::optional<ResidentSave> resident;
    std::string committed;
    uint64_t commit_order = 0;  // commits_ended_ when `committed` ended
  };
  using Event = std::function<SaveEffects(SaveCore& core, absl::Time now)>;

  // Hands `event` to the core (after the lease, if it changed), then carries out the effects.
  void Drive(const Event& event) ABSL_LOCKS_EXCLUDED(mu_);
  void ApplyLocked(SaveEffects effects, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps a committed save's staging resident in the memory tier, if it is on and the
  // staging is still that save's; returns the bytes kept (0: none). Runs after the lock is
  // released (the tier's publish hook calls out), before the event that decided it returns:
  // so before the next command can pin another save's staging.
  uint64_t KeepResident(const ResidentSave& save) ABSL_LOCKS_EXCLUDED(mu_);
  void RunWorker() ABSL_LOCKS_EXCLUDED(mu_);
  void RunRpcs() ABSL_LOCKS_EXCLUDED(mu_);
  void RunTimer() ABSL_LOCKS_EXCLUDED(mu_);
  void Run(const SaveWork& work) ABSL_LOCKS_EXCLUDED(mu_);
  void Send(const CoordinatorRpc& rpc) ABSL_LOCKS_EXCLUDED(mu_);

  CoordinatorClient* const coordinator_;
  StagingPool* const staging_;
  Storage* const storage_;
  PeerTransport* const peers_;
  const SaveExecutorOptions options_;

  mutable absl::Mutex mu_;
  SaveCore core_ ABSL_GUARDED_BY(mu_);
  // The lease generation last given to the core; unset until the first.
  std::optional<std::optional<uint64_t>> lease_told_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, BeginSaveDone> begin_calls_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, StatusDone> staged_calls_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, CommitDone> wait_calls_ ABSL_GUARDED_BY(mu_);
  std::deque<SaveWork> work_ ABSL_GUARDED_BY(mu_);
  std::string last_committed_ ABSL_GUARDED_BY(mu_);  // LastCommittedSession
  // Sessions ended COMMITTED so far, counting in the order the core ended them; and which
  // of them last_committed_ is (events that race to it after their keep leave the newer).
  uint64_t commits_ended_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_committed_order_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes of the next save's regions for the worker to make before its next work (0: none).
  uint64_t prepare_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<CoordinatorRpc> rpcs_ ABSL_GUARDED_BY(mu_);
  absl::Time next_tick_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool joined_ ABSL_GUARDED_BY(mu_) = false;

  // Last: started when everything above exists, joined before it goes away.
  std::thread worker_;
  std::thread rpc_thread_;
  std::thread timer_;
};

}  // namespace tessera

#endif  // TESSERA_AGENT_SAVE_SAVE_EXECUTOR_H_
