// CarryEffects: the one place that says in which order a shell carries out a step's Effects
// (effects.h): persist the batch; only once it is durable, make the commands current, send
// them and start the work. A shell (the coordinator's SessionManager, a test's synchronous
// driver, the deterministic simulation) implements the EffectsPort for one job.
#ifndef TESSERA_SERVER_SESSION_EFFECTS_CARRIER_H_
#define TESSERA_SERVER_SESSION_EFFECTS_CARRIER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/session/effects.h"

namespace tessera {

// What a shell does for one job's steps.
class EffectsPort {
 public:
  virtual ~EffectsPort() = default;
  // One synced write of `batch` to the state store.
  virtual absl::Status Persist(const StoreBatch& batch) = 0;
  // `state` was just made durable (fault injection hooks in here). Default: nothing.
  virtual void Persisted(v1::SessionState state) {}
  // The store refused a batch: the job's core is stale; recover it from the store.
  virtual void Recover() = 0;
  // A memory-only session committed (Effects::memory_committed). Default: nothing.
  virtual void MemoryCommitted(const std::string& session_id) {}
  // Makes `commands` the job's current ones (JobCore::Delivered), then sends them.
  virtual void Deliver(std::vector<Outgoing> commands) = 0;
  virtual void StartPlan(PlanWork work) = 0;
  virtual void StartCommit(CommitAttempt work) = 0;
  // Retention and removals of aborted sessions' directories.
  virtual void StartCleanup(std::optional<RetentionWork> retention,
                            std::vector<std::string> remove_dirs) = 0;
  // Counts the step's stats and changes (metrics, watchers). Default: nothing.
  virtual void Observe(const Effects& effects) {}
};

// Carries out `effects` through `port`: Persist; if that fails, Recover and nothing else
// (returns false: answer the step's caller Unavailable); else Persisted, Observe,
// MemoryCommitted, Deliver and the work.
bool CarryEffects(Effects effects, EffectsPort& port);

}  // namespace tessera

#endif  // TESSERA_SERVER_SESSION_EFFECTS_CARRIER_H_
