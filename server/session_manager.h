// SessionManager: the coordinator's shell around the session core (server/session/). It owns
// one JobCore per job and carries out what the core decides:
//
//   RPC / tick / work result ──► job's strand: core step ──► persist the batch (one synced
//   write) ──► record the commands as current ──► send them, answer the caller, start the
//   step's work (planning and commits on the job's strand, retention and removals on the
//   janitor thread once due: RunDueCleanups) ──► work result ──► ...
//
// Per-job serialization, nothing global but the janitor's timing (disk clean-up of any job
// waits while some job's trainers are blocked in a save, since all jobs' saves sync on the
// one state store; at most cleanup_max_wait, and it never blocks a thread while waiting): each
// job has a Strand (common/strand.h) on a shared
// thread pool, so a job's events, store writes, planning and commit I/O run one at a time,
// and never on a gRPC callback thread (the RPC-facing methods only post and return; `done`
// runs later on a pool thread). One job's long plan or slow write never delays another job,
// and heartbeats never touch this class at all (AgentRegistry).
//
// A failed store write: the caller is answered Unavailable (agents retry their reports), the
// job's in-memory core is dropped, and the job is recovered from the store (JobCore::Recover),
// which tells its agents to re-send everything the store does not keep. Until that succeeds
// the job answers Unavailable and retries recovery on every tick.
//
// Readers (CurrentCommand, GetSession, ListJobs ...) take the job's mutex only around the
// core's in-memory state, never across a store write or any I/O, and see only commands whose
// step is durable.
//
// Thread-safety: all public methods are safe for concurrent use.
#ifndef TESSERA_SERVER_SESSION_MANAGER_H_
#define TESSERA_SERVER_SESSION_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/strand.h"
#include "server/agent_registry.h"
#include "server/command_sink.h"
#include "server/liveness_feed.h"
#include "server/plan/plan_cache.h"
#include "server/session/job_core.h"
#include "server/session/options.h"
#include "server/store/state_store.h"
#include "server/session/commit_driver.h"
#include "tessera/v1/admin.pb.h"
#include "tessera/v1/coordinator.pb.h"

namespace tessera {

struct SessionManagerOptions {
  SessionOptions session;
  // Threads running the jobs' strands (the janitor has a thread of its own). Default: 4.
  int threads = 4;
  // Threads that hand a large fan-out of commands to the sink (hand_out.h); 0: one per usable
  // core, at most 8. Default: 0.
  size_t hand_out_threads = 0;
  // How often every job's deadlines and leases are checked. Default: 200 ms.
  absl::Duration tick_period = absl::Milliseconds(200);
  // Called after a transition is durable, before its commands go out: the coordinator's
  // --crash_in_state fault injection. Default: none.
  std::function<void(v1::SessionState)> on_state_persisted;
  // Called on a job's strand before its global plan is decided: the coordinator's
  // --inject_plan_hold fault injection. Default: none.
  std::function<void(const std::string& job_id)> before_plan_decided;
  // Disk clean-up (retention, removing an aborted save's directory) starts this long after it
  // is due, and then only while no job's trainers are blocked in a save, unless it has waited
  // cleanup_max_wait (DESIGN.md "Disk clean-up waits for the trainers"). Defaults: 50 ms, 10 s.
  absl::Duration cleanup_grace = absl::Milliseconds(50);
  absl::Duration cleanup_max_wait = absl::Seconds(10);
};

class SessionManager {
 public:
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;

  // Every pointer must outlive the manager. `edge` does the coordinator's commits, retention
  // and removals on the checkpoint storage (commit_driver.h); null if it has none mounted
  // (then options.session must have coordinator_commits = false).
  SessionManager(StateStore* store, AgentRegistry* registry, CommandSink* sink,
                 CommitEdge* edge, const Clock* clock, SessionManagerOptions options);
  ~SessionManager();  // Stop()s.

  // Raises the coordinator's epoch and recovers every job from the store, then starts the
  // periodic tick. Call once, before serving. Errors: the store's; DataLoss for a corrupt
  // record.
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // --- Agent RPCs: each returns at once; `done` runs once the answer is durable.

  // JobCore::SubmitLocalPlan after the incarnation check; the shards are taken.
  // Errors: NotFound / FailedPrecondition + STALE_INCARNATION from the registry; NotFound for a
  // job no agent registered; as JobCore::SubmitPlan; Unavailable if the store failed.
  void SubmitLocalPlan(v1::SubmitLocalPlanRequest&& request,
                       Done<v1::SubmitLocalPlanResponse> done);
  // Errors: STALE_INCARNATION; as JobCore::ReportPhase; Unavailable if the store failed.
  void ReportPhase(const v1::ReportPhaseRequest& request, Done<v1::SessionState> done);
  void ReportChunks(const v1::ReportChunksRequest& request, Done<v1::SessionState> done);
  // The registry's verdict on an agent of `job_id` changed by an event — a registration (of a
  // new incarnation too), one refused, a death: the job's core is told now (LivenessFeed),
  // not at the next tick. Leases are judged on every tick.
  void AgentsChanged(const std::string& job_id);

  // A relay could not hand `request.session_id`'s command to `request.ranks` (relay.h): each
  // of them that still has a command of that session is sent it on its own stream. Logged.
  // Errors: STALE_INCARNATION (nothing is sent).
  absl::Status RelayFailed(const v1::RelayFailedRequest& request);

  // --- Operator RPCs

  // Errors: NotFound for an unknown job; as JobCore::OperatorAbort.
  void AbortSession(const std::string& job_id, const std::string& reason,
                    Done<v1::SessionStatus> done);

  // --- Reads (brief locks, no I/O except a store read for an old session's status)

  // The command (job, rank) should be executing now, with a PIN's assignment filled in: for
  // replay when its command stream (re)connects.
  std::optional<v1::Command> CurrentCommand(const std::string& job_id, uint32_t rank) const;
  // `session_id`'s status (empty: the job's current or else latest). Errors: NotFound.
  absl::StatusOr<v1::SessionStatus> GetSession(const std::string& job_id,
                                               const std::string& session_id) const;
  // Newest first, the job's memory-only commit included (memory_only.h).
  // Errors: NotFound for an unknown job.
  absl::StatusOr<std::vector<v1::CheckpointInfo>> ListCheckpoints(
      const std::string& job_id) const;
  // The manifest of the job's memory-only commit of `request.step` (-1: whatever its step),
  // for the agent (request.job_id, request.rank).
  // Errors: STALE_INCARNATION; NotFound for an unknown job; as MemoryManifest (memory_only.h).
  absl::StatusOr<v1::Manifest> GetMemoryCheckpoint(
      const v1::GetMemoryCheckpointRequest& request) const;
  std::vector<v1::JobInfo> ListJobs() const;
  SessionStats Stats() const;

  // A number that grows on every change a status watcher would see; with AwaitChange a
  // watcher streams updates without polling.
  uint64_t version() const;
  // Blocks until version() > `seen`, `deadline`, or Stop(); returns the version then.
  uint64_t AwaitChange(uint64_t seen, absl::Time deadline) const ABSL_LOCKS_EXCLUDED(version_mu_);

  // Stops the tick, finishes what is queued, and refuses what comes later with Unavailable.
  // Idempotent.
  void Stop();

  // Testing: runs, on the calling thread, every job's disk clean-up that is due (see
  // SessionManagerOptions::cleanup_grace); returns how many ran.
  int RunDueCleanupsForTesting() ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Testing: runs every job's tick now, then waits until every strand is idle (work that
  // steps start — planning, commits — included).
  void TickForTesting();
  void WaitIdleForTesting();

 private:
  struct Job;
  class Port;
  // A commit's retention and an abort's directories, waiting for the trainers (Carry counts
  // them) until `due`, or until `give_up` whatever they do.
  struct PendingCleanup {
    std::optional<RetentionWork> retention;
    std::vector<std::string> dirs;
    absl::Time due;
    absl::Time give_up;
  };

  // The job's slot, created on first use. Null if the manager stopped.
  Job* FindOrAddJob(const std::string& job_id) ABSL_LOCKS_EXCLUDED(jobs_mu_);
  Job* FindJob(const std::string& job_id) const ABSL_LOCKS_EXCLUDED(jobs_mu_);
  // The job of an agent's report, after checking the agent's incarnation; null (and `done`
  // answered with the reason) if the incarnation is stale or the job unknown.
  template <typename T>
  Job* ReportingJob(const std::string& job_id, uint32_t rank, uint64_t incarnation,
                    Done<T>& done) ABSL_LOCKS_EXCLUDED(jobs_mu_);

  // Runs one event of `job` on its strand: the core step, then its effects; `reply` gets the
  // event's answer (Unavailable if the store refused the step).
  template <typename T>
  void Post(Job* job, std::function<Outcome<T>(JobCore&)> event, Done<T> done);
  void PostEffects(Job* job, std::function<Effects(JobCore&)> event);
  // On the job's strand: carries out a step's effects (effects_carrier.h). False if the store
  // refused the batch (the job is then being recovered).
  bool Carry(Job* job, Effects effects);
  // On the job's strand: counts the job in jobs_blocking_ while its trainers are blocked in a
  // save; with `opening_only`, only if they have just become so.
  void CountBlocked(Job* job, bool opening_only);
  // Has the janitor look at the job's pending clean-ups (at most one such task queued).
  void OfferCleanups(Job* job);
  // On the janitor (or a test's thread): runs the job's clean-ups that are due, in order:
  // past their grace while no job's trainers are blocked, or past give_up. Returns how many.
  int RunDueCleanups(Job* job);
  // On the job's strand: replaces the core with the store's view. False while it fails.
  bool Reload(Job* job);
  // On the job's strand, job->mu held: hands the core what the registry judged of its agents
  // (LivenessFeed); with `tick`, judges leases and ticks the core too.
  Effects FeedLiveness(Job* job, JobCore& core, bool tick);
  void Tick();
  void Changed(const Effects& effects);
  JobContext Context();
  void RunTicker();

  StateStore* const store_;
  AgentRegistry* const registry_;
  CommandSink* const sink_;
  CommitEdge* const edge_;
  const Clock* const clock_;
  const SessionManagerOptions options_;
  PlanCache plan_cache_;
  uint64_t epoch_ = 0;  // set by Recover, before anything else runs
  std::atomic<uint64_t> commands_emitted_{0};  // JobContext::commands_emitted, for every job

  mutable absl::Mutex jobs_mu_;
  absl::btree_map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(jobs_mu_);
  bool stopped_ ABSL_GUARDED_BY(jobs_mu_) = false;

  mutable absl::Mutex stats_mu_;
  SessionStats stats_ ABSL_GUARDED_BY(stats_mu_);

  mutable absl::Mutex version_mu_;
  uint64_t version_ ABSL_GUARDED_BY(version_mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(version_mu_) = false;

  // Tasks posted and not finished, for WaitIdleForTesting. A task posts its follow-ups before
  // it finishes, so this reaches 0 only when everything is done.
  mutable absl::Mutex idle_mu_;
  int64_t busy_ ABSL_GUARDED_BY(idle_mu_) = 0;
  void Busy(int delta) ABSL_LOCKS_EXCLUDED(idle_mu_);

  // Both reset by the destructor, the janitor's first (see there), so that every queued task
  // finishes while the jobs and everything above still exist.
  std::unique_ptr<ThreadPool> pool_;
  // Retention and removals: file-system I/O of no job's strand, on a thread of its own so that
  // unlinking gigabytes never holds up a strand.
  std::unique_ptr<ThreadPool> janitor_;
  absl::Mutex janitor_mu_;
  bool janitor_open_ ABSL_GUARDED_BY(janitor_mu_) = true;  // false once the destructor runs
  std::atomic<int> jobs_blocking_{0};  // jobs whose trainers are blocked in a save
  std::thread ticker_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_MANAGER_H_
