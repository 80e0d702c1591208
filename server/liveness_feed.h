// LivenessFeed: the one way a shell of the session core (SessionManager, the tests'
// SyncSessions, the simulation) tells a job's core what the registry judged of its agents:
// the verdicts that changed since the last feed (all of them for a new core), as one
// JobCore::AgentsChanged event on the job's strand.
//
// Feed after each registration of the job's agents (before the agent's next RPC reaches the
// core: a plan or report then finds its registration known), after a death is recorded, and
// on every tick with `judge_leases` (leases expire with time, not with an event).
//
// Thread-safety: none; one per job core, used on the job's strand.
#ifndef TESSERA_SERVER_LIVENESS_FEED_H_
#define TESSERA_SERVER_LIVENESS_FEED_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "server/agent_registry.h"
#include "server/session/effects.h"
#include "server/session/job_core.h"

namespace tessera {

class LivenessFeed {
 public:
  // The effects of handing `core` (job `core.job_id()`) the verdicts that changed, judged
  // at `registry`'s running time; nullopt if nothing changed (nothing was handed). Ranks: the
  // larger of the core's mesh and the registry's layout of the job.
  std::optional<Effects> Feed(AgentRegistry& registry, JobCore& core, bool judge_leases,
                              absl::Time now);

  // The core was replaced: the next feed hands it every verdict.
  void Reset() { since_ = 0; }

 private:
  uint64_t since_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_SERVER_LIVENESS_FEED_H_
