// SyncSessions: the session core (server/session/) driven synchronously, on the calling
// thread, for tests: every call carries out its step's effects (effects_carrier.h) before it
// returns. Planning runs inside the call that completes the plans; commits, retention and
// removals run in Tick(), through a CommitEdge the test controls. A refused store write
// recovers the job from the store, as SessionManager does.
//
// Thread-safety: none; one test thread.
#ifndef TESSERA_SERVER_SESSION_TEST_SYNC_SESSIONS_H_
#define TESSERA_SERVER_SESSION_TEST_SYNC_SESSIONS_H_

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "server/agent_registry.h"
#include "server/command_sink.h"
#include "server/liveness_feed.h"
#include "server/plan/plan_cache.h"
#include "server/relay.h"
#include "server/session/commit_driver.h"
#include "server/session/effects_carrier.h"
#include "server/session/job_core.h"
#include "server/store/state_store.h"

namespace tessera {

class SyncSessions {
 public:
  // Every pointer must outlive this.
  SyncSessions(StateStore* store, AgentRegistry* registry, CommandSink* sink, CommitEdge* edge,
               const Clock* clock, SessionOptions options);
  ~SyncSessions();

  absl::Status Recover();
  absl::StatusOr<v1::SubmitLocalPlanResponse> SubmitLocalPlan(v1::SubmitLocalPlanRequest request);
  absl::StatusOr<v1::SessionState> ReportPhase(const v1::ReportPhaseRequest& request);
  absl::StatusOr<v1::SessionState> ReportChunks(const v1::ReportChunksRequest& request);
  // As SessionManager::AgentsChanged: a test that registers an agent calls it, as
  // CoordinatorService does. A new or recovered core is told every verdict; a Tick judges
  // the leases and tells what changed.
  void AgentsChanged(const std::string& job_id);
  absl::StatusOr<v1::SessionStatus> AbortSession(const std::string& job_id,
                                                 const std::string& reason);
  // Ticks every job, then runs the commits queued before this call (a retry or a recovery a
  // result leads to waits for the next Tick) and the clean-ups.
  void Tick();

  std::optional<v1::Command> CurrentCommand(const std::string& job_id, uint32_t rank) const;
  absl::StatusOr<v1::SessionStatus> GetSession(const std::string& job_id,
                                               const std::string& session_id) const;
  absl::StatusOr<std::vector<v1::CheckpointInfo>> ListCheckpoints(
      const std::string& job_id) const;
  absl::StatusOr<v1::Manifest> GetMemoryCheckpoint(const std::string& job_id, int64_t step) const;
  std::vector<v1::JobInfo> ListJobs() const;
  // JobCore::trainers_blocked of `job_id`; false for an unknown job.
  bool TrainersBlocked(const std::string& job_id) const;
  const SessionStats& stats() const { return stats_; }

 private:
  class Port;
  JobCore* Core(const std::string& job_id);
  // Core(job_id), told what the registry judged of its agents since the last time (with
  // `tick`, leases judged and the core ticked too).
  JobCore* Told(const std::string& job_id, bool tick);
  // Carries out `effects` of `job_id`; false if the store refused them.
  bool Carry(const std::string& job_id, Effects effects);
  void Reload(const std::string& job_id);

  StateStore* const store_;
  AgentRegistry* const registry_;
  CommandSink* const sink_;
  CommitEdge* const edge_;
  const Clock* const clock_;
  const SessionOptions options_;
  PlanCache plan_cache_;
  uint64_t epoch_ = 1;
  std::atomic<uint64_t> commands_emitted_{0};
  std::map<std::string, std::unique_ptr<JobCore>> jobs_;
  std::map<std::string, LivenessFeed> liveness_;  // by job, with jobs_
  std::map<std::string, RelayedCommands> relayed_;  // by job: replayed with their relay_to
  std::deque<std::pair<std::string, CommitAttempt>> commits_;
  struct Cleanup {
    std::string job_id;
    std::optional<RetentionWork> retention;
    std::vector<std::string> dirs;
  };
  std::deque<Cleanup> cleanups_;
  SessionStats stats_;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_TEST_SYNC_SESSIONS_H_
